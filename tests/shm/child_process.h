// Forked children for the shared-memory tests: the other process of a segment (a client, a
// producer, a corrupter), run from a test body and bounded in time.
//
//   const pid_t pid = StartChild([&] { ...; return 0; });   // runs in the child
//   EXPECT_EQ(FinishChild(pid), 0);
//
// The child runs `body` and _exits with its result, without gtest's or anyone's atexit
// handlers; it must not use gtest assertions (they would fail in the child, unseen).
//
// Thread safety: call from the test's main thread (fork copies only the calling thread).

#ifndef TPD_TESTS_SHM_CHILD_PROCESS_H_
#define TPD_TESTS_SHM_CHILD_PROCESS_H_

#include <sys/types.h>

#include <functional>

#include "absl/time/time.h"

namespace tpd::shm::testing {

// Forks; the child returns `body()` as its exit status (0..255). -1 when fork fails.
pid_t StartChild(const std::function<int()>& body);

// The child's exit status, or -1 when it did not exit by itself within `timeout` (it is then
// killed with SIGKILL and reaped) or was killed by a signal.
int FinishChild(pid_t pid, absl::Duration timeout = absl::Seconds(30));

}  // namespace tpd::shm::testing

#endif  // TPD_TESTS_SHM_CHILD_PROCESS_H_
