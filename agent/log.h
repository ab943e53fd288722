// The agent's named spdlog logger ("agent"). Every line names its object: "[peer node-b] ...".
//
// Thread safety: thread-safe (spdlog loggers are).

#ifndef TPD_AGENT_LOG_H_
#define TPD_AGENT_LOG_H_

#include "spdlog/spdlog.h"

namespace tpd::agent {

// The "agent" logger the daemon's InitLogging registers; before that (tests, benchmarks), a
// stderr logger of the same name.
spdlog::logger& AgentLog();

}  // namespace tpd::agent

#endif  // TPD_AGENT_LOG_H_
