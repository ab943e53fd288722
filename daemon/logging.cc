#include "daemon/logging.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/journal_sink.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace tpd {
namespace {

constexpr const char* kComponents[] = {"daemon", "store", "agent", "cuda"};

}  // namespace

absl::Status InitLogging(const std::string& level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat("unknown log level \"", level, "\""));
  }
  // Under systemd the journal gets entries with priorities and fields (journal_sink.h); a
  // terminal or a file gets lines with their time and level.
  const bool journal = StderrIsJournal();
  spdlog::sink_ptr sink;
  if (journal) {
    sink = std::make_shared<JournalSink>();
  } else {
    sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  }
  for (const char* name : kComponents) {
    spdlog::drop(name);
    auto logger = std::make_shared<spdlog::logger>(name, sink);
    logger->set_level(parsed);
    if (!journal) logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%n] %v");
    spdlog::register_logger(logger);
  }
  return absl::OkStatus();
}

spdlog::logger& CudaLog() {
  std::shared_ptr<spdlog::logger> logger = spdlog::get("cuda");
  return logger != nullptr ? *logger : DaemonLog();
}

spdlog::logger& DaemonLog() {
  std::shared_ptr<spdlog::logger> logger = spdlog::get("daemon");
  if (logger != nullptr) return *logger;
  // Before InitLogging (unit tests that build a daemon in-process): log to stderr. Two
  // threads may get here at once; registering twice throws, so one creates it, under a lock.
  static absl::Mutex create;
  absl::MutexLock lock(&create);
  logger = spdlog::get("daemon");
  if (logger == nullptr) logger = spdlog::stderr_color_mt("daemon");
  return *logger;
}

}  // namespace tpd
