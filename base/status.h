// Re-wrapping a status from below with what it concerns.

#ifndef TPD_BASE_STATUS_H_
#define TPD_BASE_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpd {

// `status` with its code kept and `prefix` (pieces as absl::StrCat takes them) before its
// message: how a layer says which call, worker or node an error from below concerns. OK stays
// OK.
template <typename... Prefix>
absl::Status Prefixed(const absl::Status& status, const Prefix&... prefix) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix..., status.message()));
}

}  // namespace tpd

#endif  // TPD_BASE_STATUS_H_
