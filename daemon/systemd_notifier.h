// Talks to systemd for a Type=notify unit: READY=1 once serving, STOPPING=1 on shutdown,
// and WATCHDOG=1 pings at half the unit's WatchdogSec. Outside systemd (no NOTIFY_SOCKET)
// every call is a no-op.
//
// Thread safety: Ready/Stopping from the main thread; the watchdog pings from its own thread,
// stopped by Stopping() or the destructor.

#ifndef TPD_DAEMON_SYSTEMD_NOTIFIER_H_
#define TPD_DAEMON_SYSTEMD_NOTIFIER_H_

#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"

namespace tpd {

class SystemdNotifier {
 public:
  // `healthy` is asked before every watchdog ping; a daemon that stopped serving stops
  // pinging and systemd restarts it.
  explicit SystemdNotifier(std::function<bool()> healthy);
  ~SystemdNotifier();

  // Sends READY=1 and starts the watchdog thread if WatchdogSec is set.
  void Ready();
  // Stops the watchdog and sends STOPPING=1.
  void Stopping();

 private:
  void StopWatchdog();

  const std::function<bool()> healthy_;
  absl::Notification stop_;
  std::thread watchdog_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_SYSTEMD_NOTIFIER_H_
