#include "tests/testing/wait_until.h"

#include "absl/time/clock.h"

namespace tpd::testing {

bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout,
               absl::Duration interval) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(interval);
  }
  return condition();
}

}  // namespace tpd::testing
