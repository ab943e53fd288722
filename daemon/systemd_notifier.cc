#include "daemon/systemd_notifier.h"

#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cstdint>

#include "absl/time/time.h"
#include "daemon/logging.h"

namespace tpd {

SystemdNotifier::SystemdNotifier(std::function<bool()> healthy) : healthy_(std::move(healthy)) {}

SystemdNotifier::~SystemdNotifier() { StopWatchdog(); }

void SystemdNotifier::Ready() {
  sd_notifyf(0, "READY=1\nSTATUS=serving\nMAINPID=%d", static_cast<int>(getpid()));
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0) return;
  const absl::Duration period = absl::Microseconds(usec) / 2;
  DaemonLog().info("[systemd] watchdog enabled, pinging every {}", absl::FormatDuration(period));
  watchdog_ = std::thread([this, period] {
    while (!stop_.WaitForNotificationWithTimeout(period)) {
      if (healthy_()) sd_notify(0, "WATCHDOG=1");
    }
  });
}

void SystemdNotifier::Stopping() {
  StopWatchdog();
  sd_notify(0, "STOPPING=1\nSTATUS=stopping");
}

void SystemdNotifier::StopWatchdog() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (watchdog_.joinable()) watchdog_.join();
}

}  // namespace tpd
