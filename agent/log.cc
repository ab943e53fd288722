#include "agent/log.h"

#include <memory>

#include "spdlog/sinks/stdout_color_sinks.h"

namespace tpd::agent {

spdlog::logger& AgentLog() {
  std::shared_ptr<spdlog::logger> logger = spdlog::get("agent");
  if (logger == nullptr) {
    // Two threads may get here at once; the loser of the registration finds the winner's.
    try {
      logger = spdlog::stderr_color_mt("agent");
    } catch (const spdlog::spdlog_ex&) {
      logger = spdlog::get("agent");
    }
  }
  return *logger;
}

}  // namespace tpd::agent
