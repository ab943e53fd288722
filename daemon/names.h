// The names a local client sends: groups, workers and store namespaces. They end up in store
// keys, files (file:// rendezvous logs), log lines and other daemons' records, so each is
// checked before the daemon uses it, with an INVALID_ARGUMENT that names the request field,
// the rule with its limit, and the first offending character.
//
//   group name   1 to 128 bytes of [A-Za-z0-9._:@-]; "" means the group "default"
//   worker name  PyTorch's WorkerInfo rule: 1 to 127 characters of [A-Za-z0-9-_:], with
//                PyTorch's message ("Worker name must match ^[A-Za-z0-9-_:]*$, ...")
//   namespace    0 to [store] max_namespace_bytes bytes, no control characters (NUL,
//                newline, tab, DEL, ...); other bytes, UTF-8 included, are kept as sent
//
// Thread safety: pure functions of their arguments.

#ifndef TPD_DAEMON_NAMES_H_
#define TPD_DAEMON_NAMES_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tpd {

inline constexpr size_t kMaxGroupNameBytes = 128;
// PyTorch's MAX_NAME_LEN: a worker name is "shorter than 128 chars".
inline constexpr size_t kMaxWorkerNameLength = 128;

// `field` names the request field in the message, e.g. "JoinRequest.group" ("" for none:
// negotiation checks names read from records with PyTorch's bare wording).
absl::Status ValidateGroupName(absl::string_view field, absl::string_view name);
absl::Status ValidateWorkerName(absl::string_view field, absl::string_view name);
absl::Status ValidateNamespace(absl::string_view field, absl::string_view name_space,
                               int64_t max_bytes);

}  // namespace tpd

#endif  // TPD_DAEMON_NAMES_H_
