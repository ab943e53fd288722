// The time the group machinery judges by: heartbeat windows, join deadlines, the worker's
// schedule and its back-off after a refused store wait. Tests substitute a clock they move by
// hand, so eviction after a heartbeat window is checked without waiting the window out. Store
// calls keep real deadlines: the stores run their own timers.
//
// Thread safety: implementations are thread-safe.

#ifndef TPD_DAEMON_GROUP_CLOCK_H_
#define TPD_DAEMON_GROUP_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tpd::group {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;

  // The real clock, absl::Now(); lives forever.
  static Clock* Real() {
    class RealClock final : public Clock {
     public:
      absl::Time Now() override { return absl::Now(); }
    };
    static RealClock* const real = new RealClock;
    return real;
  }
};

}  // namespace tpd::group

#endif  // TPD_DAEMON_GROUP_CLOCK_H_
