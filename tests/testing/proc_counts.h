// What a process holds, read from /proc/<pid>: for hygiene checks after fault tests
// (FAULTS.md, "Hygiene": file descriptors, threads and shared-memory segments return to their
// baseline). Each count is -1 when the process (or its /proc entry) is gone.
//
// Thread safety: stateless; each call reads /proc afresh.

#ifndef TPD_TESTS_TESTING_PROC_COUNTS_H_
#define TPD_TESTS_TESTING_PROC_COUNTS_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tpd::testing {

// Entries of /proc/<pid>/fd.
int CountFds(pid_t pid);
// Entries of /proc/<pid>/task.
int CountThreads(pid_t pid);
// Threads that are not one of gRPC's own on-demand pools (kGrpcPoolThreads): those grow with
// load up to a bound gRPC sets and shrink when gRPC decides, so they are no leak of ours and
// would make a baseline comparison flaky.
int CountThreadsOutsideGrpcPools(pid_t pid);
// Name prefixes (as /proc/<pid>/task/<tid>/comm shows them, 15 bytes at most) of gRPC 1.51's
// pools: its executor ("default-executor") and its timer threads ("grpc_global_timer").
inline constexpr const char* kGrpcPoolThreads[] = {"default-executo", "grpc_global_tim"};
// File descriptors whose link starts with "/memfd:" (memfds the process still holds open).
int CountMemfdFds(pid_t pid);
// Lines of /proc/<pid>/maps that map a memfd whose name contains `name` ("tpd-session": the
// daemon's session segments; a segment is several lines, one per protection).
int CountMemfdMaps(pid_t pid, const std::string& name);

// Thread names of the process with their counts ("grpcpp_sync_ser x4, tpd-data, ..."), the
// targets of its memfd fds and its fds by kind ("socket x12, pipe x2, ..."), for failure
// messages.
std::string DescribeThreadsAndMemfds(pid_t pid);

// All four at once, for comparing against a baseline.
struct ProcCounts {
  int fds = -1;
  int threads = -1;  // CountThreadsOutsideGrpcPools
  int memfd_fds = -1;
  int segment_maps = -1;

  // Whether every count is at most `baseline`'s (and the process exists).
  bool AtMost(const ProcCounts& baseline) const;
  std::string ToString() const;
};
ProcCounts CountAll(pid_t pid);

// `pid`'s counts once they hold still for 200 ms (a client that just went away is gone from
// them), waited for up to 10 s; nullopt when they never held still.
std::optional<ProcCounts> SettledCounts(pid_t pid);

// Success once `pid`'s counts are back to at most `baseline` within `timeout`; else a failure
// naming its counts and threads now, and `at_baseline` (DescribeThreadsAndMemfds then, or "").
::testing::AssertionResult BackToBaseline(pid_t pid, const ProcCounts& baseline,
                                          const std::string& at_baseline = "",
                                          absl::Duration timeout = absl::Seconds(20));

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_PROC_COUNTS_H_
