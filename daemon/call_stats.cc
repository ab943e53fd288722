#include "daemon/call_stats.h"

namespace tpd {

void CallStats::Record(const char* method, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  ++calls_[method];
  if (!status.ok()) ++errors_[absl::StatusCodeToString(status.code())];
}

std::map<std::string, int64_t> CallStats::Calls() const {
  absl::MutexLock lock(&mu_);
  return {calls_.begin(), calls_.end()};
}

std::map<std::string, int64_t> CallStats::Errors() const {
  absl::MutexLock lock(&mu_);
  return {errors_.begin(), errors_.end()};
}

}  // namespace tpd
