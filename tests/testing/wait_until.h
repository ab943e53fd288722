// Bounded waiting for a condition in tests: every wait has a deadline, and the caller asserts
// on the result, naming what it waited for, e.g.
//
//   ASSERT_TRUE(WaitUntil([&] { return Waiters(client) == 2; }))
//       << "both Waits parked in the daemon";
//
// Thread safety: stateless; `condition` runs on the calling thread.

#ifndef TPD_TESTS_TESTING_WAIT_UNTIL_H_
#define TPD_TESTS_TESTING_WAIT_UNTIL_H_

#include <functional>

#include "absl/time/time.h"

namespace tpd::testing {

// Calls `condition` until it returns true (then true) or `timeout` has passed (then false,
// after one last call), sleeping `interval` between calls.
bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout = absl::Seconds(20),
               absl::Duration interval = absl::Milliseconds(5));

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_WAIT_UNTIL_H_
