// A second, unprivileged user of the node, for tests of what another user can make the daemon
// do (docs/security.md; FAULTS.md B5): processes that run as uid/gid 65534 ("nobody"), either
// a forked child that only holds connections, or the second_user tool
// (tests/testing/second_user_main.cc) that joins, calls, leaves and attaches through the
// client library.
//
// Thread safety: one test thread.

#ifndef TPD_TESTS_TESTING_SECOND_USER_H_
#define TPD_TESTS_TESTING_SECOND_USER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/daemon_process.h"

namespace tpd::testing {

inline constexpr uid_t kSecondUid = 65534;
inline constexpr gid_t kSecondGid = 65534;

// Empty when this process may run others as the second user (it is root); else why not, for
// GTEST_SKIP.
std::string CannotSwitchUser();

// Lets the second user reach sockets in `dir` (which TempDir makes 0700): search permission
// for others, 0711, which the daemon accepts for its socket's directory (no one else may
// write it).
void OpenDirToSecondUser(const std::string& dir);

// `n` connections to the unix socket `path`, opened and held by a child running as the second
// user, which sends nothing on them, until this object goes.
class SecondUserConnections {
 public:
  static absl::StatusOr<std::unique_ptr<SecondUserConnections>> Open(const std::string& path,
                                                                     int n);
  ~SecondUserConnections();  // kills and reaps the child: its connections close
  // How many connects succeeded.
  int connected() const { return connected_; }

 private:
  SecondUserConnections(pid_t pid, int connected) : pid_(pid), connected_(connected) {}
  pid_t pid_;
  int connected_;
};

// Runs the second_user tool with `args` as the second user, from a copy in `dir` (the test's
// runfiles are under root's home, which the second user cannot enter). Its output has one
// line per step, "<step>: <status>" (see second_user_main.cc).
ProcessResult RunAsSecondUser(const std::string& dir, const std::vector<std::string>& args,
                              absl::Duration timeout = absl::Seconds(60));
// The same, as `uid` and `gid` (this process's uid with the second user's gid: another group
// of the same user).
ProcessResult RunToolAs(const std::string& dir, const std::vector<std::string>& args, uid_t uid,
                        gid_t gid, absl::Duration timeout = absl::Seconds(60));

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_SECOND_USER_H_
