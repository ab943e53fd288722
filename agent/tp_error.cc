#include "agent/tp_error.h"

#include <tensorpipe/common/error.h>
#include <tensorpipe/core/error.h>

#include "absl/strings/str_cat.h"

namespace tpd::agent {

absl::Status TensorPipeErrorToStatus(const tensorpipe::Error& error, absl::string_view what) {
  if (!error) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", error.what());
  if (error.isOfType<tensorpipe::LogicError>()) return absl::InternalError(std::move(message));
  return absl::UnavailableError(std::move(message));
}

}  // namespace tpd::agent
