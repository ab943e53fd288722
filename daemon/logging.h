// Named spdlog loggers, one per component ("daemon", "store", "agent", "cuda"), all writing
// to stderr (the journal under systemd). Every line names its object: "[socket /run/...] ...".
//
// Thread safety: InitLogging() runs once in main() before other threads start; the loggers
// themselves are thread-safe.

#ifndef TPD_DAEMON_LOGGING_H_
#define TPD_DAEMON_LOGGING_H_

#include <string>

#include "absl/status/status.h"
#include "spdlog/spdlog.h"

namespace tpd {

// Creates the component loggers at `level` (validated by ValidateConfig).
absl::Status InitLogging(const std::string& level);

// The daemon component's logger; valid after InitLogging (before it, a default stderr one).
spdlog::logger& DaemonLog();
// The "cuda" component's logger (InitLogging registers it); the daemon's before that.
spdlog::logger& CudaLog();

}  // namespace tpd

#endif  // TPD_DAEMON_LOGGING_H_
