// tpd: parse flags, load and validate the config, start the daemon, run until SIGTERM or
// SIGINT, shut down.

#include <malloc.h>
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/logging.h"
#include "daemon/systemd_notifier.h"
#include "daemon/version.h"

ABSL_FLAG(std::string, config, "", "TOML config file (see /etc/tpd/tpd.toml); empty: defaults");
ABSL_FLAG(std::string, socket, "", "unix socket to serve; overrides [daemon] socket");
ABSL_FLAG(std::string, log_level, "", "trace|debug|info|warn|error; overrides [daemon] log_level");
ABSL_FLAG(bool, version, false, "print the version and exit");

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "tpd: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles under one process-wide
  // spin lock (twice the cost of an uncontended lock, on every call's path). The thread-safety
  // annotations (clang's analysis, in every build) and the sanitizer builds are where lock order is
  // checked.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // glibc raises its mmap threshold to the size of each large block freed, up to 32 MiB, after
  // which store values of a few MiB come from the heap and stay with the process when their
  // keys are deleted (a socket user's 80 values of 16 MiB kept 833 MB after the deletes). A
  // fixed threshold keeps every block of 1 MiB or more in a mapping of its own, returned to
  // the system when freed.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  absl::SetProgramUsageMessage("tpd: the per-node RPC daemon. Usage: tpd [--config FILE]");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_version)) {
    std::cout << "tpd " << tpd::kVersion << "\n";
    return 0;
  }

  tpd::Config config;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    absl::StatusOr<tpd::Config> loaded = tpd::LoadConfig(path);
    if (!loaded.ok()) return Fail(loaded.status());
    config = *std::move(loaded);
  }
  if (const std::string socket = absl::GetFlag(FLAGS_socket); !socket.empty()) {
    config.socket_path = socket;
  }
  if (const std::string level = absl::GetFlag(FLAGS_log_level); !level.empty()) {
    config.log_level = level;
  }
  if (absl::Status status = tpd::ValidateConfig(config); !status.ok()) return Fail(status);
  if (absl::Status status = tpd::InitLogging(config.log_level); !status.ok()) return Fail(status);

  // Block the stop signals before any thread starts, so every thread inherits the mask and
  // only sigwait() below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<std::unique_ptr<tpd::Daemon>> daemon = tpd::Daemon::Start(config);
  if (!daemon.ok()) {
    tpd::DaemonLog().critical("cannot start: {}", daemon.status().ToString());
    return 1;
  }
  tpd::SystemdNotifier systemd([&daemon] { return (*daemon)->serving(); });
  systemd.Ready();

  int signal = 0;
  sigwait(&stop_signals, &signal);
  tpd::DaemonLog().info("[socket {}] received {}", (*daemon)->socket_path(), strsignal(signal));
  systemd.Stopping();
  (*daemon)->Shutdown();
  return 0;
}
