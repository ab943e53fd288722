// Counters of calls served and errors answered, by method and by status code, for
// Admin.Status.
//
// Thread safety: thread-safe.

#ifndef TPD_DAEMON_CALL_STATS_H_
#define TPD_DAEMON_CALL_STATS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tpd {

class CallStats {
 public:
  // Counts one finished call of `method` that ended with `status`.
  void Record(const char* method, const absl::Status& status);

  std::map<std::string, int64_t> Calls() const;
  // Keyed by absl::StatusCodeToString ("DEADLINE_EXCEEDED", ...).
  std::map<std::string, int64_t> Errors() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> calls_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> errors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpd

#endif  // TPD_DAEMON_CALL_STATS_H_
