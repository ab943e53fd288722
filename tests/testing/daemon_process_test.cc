// The daemon helper itself: a daemon that dies behind the test's back fails the test, and
// one the test stopped on purpose does not.

#include "tests/testing/daemon_process.h"

#include <signal.h>
#include <sys/wait.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "tests/testing/wait_until.h"

namespace tpd::testing {
namespace {

// True once child `pid` has ended, without reaping it (that is the helper's job).
bool Ended(pid_t pid) {
  siginfo_t info{};
  return waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
}

// Starts a daemon, kills it with `signal` the way a crash would (not through Signal), and
// destroys the helper once the daemon is dead.
void DaemonDiesUnseen(int signal) {
  TempDir dir;
  auto daemon = DaemonProcess::Start(absl::StrCat(dir.path(), "/tpd.sock"));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const pid_t pid = (*daemon)->pid();
  kill(pid, signal);
  ASSERT_TRUE(WaitUntil([pid] { return Ended(pid); })) << "the daemon never died";
}

TEST(DaemonProcessTest, ADaemonKilledBehindTheTestsBackFailsTheTest) {
  // "killed by signal 11", or under a sanitizer, which catches the signal, its exit code.
  EXPECT_NONFATAL_FAILURE(DaemonDiesUnseen(SIGSEGV), "died unexpectedly (");
}

TEST(DaemonProcessTest, ADaemonThatExitedBehindTheTestsBackFailsTheTest) {
  // SIGTERM sent by someone else: a clean exit the test never asked for.
  EXPECT_NONFATAL_FAILURE(DaemonDiesUnseen(SIGTERM), "died unexpectedly (exit code");
}

TEST(DaemonProcessTest, ADaemonTheTestStoppedDoesNotFailIt) {
  TempDir dir;
  for (int signal : {SIGTERM, SIGKILL}) {
    auto daemon = DaemonProcess::Start(absl::StrCat(dir.path(), "/tpd.sock"));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    const pid_t pid = (*daemon)->pid();
    (*daemon)->Signal(signal);
    ASSERT_TRUE(WaitUntil([pid] { return Ended(pid); })) << "the daemon never stopped";
    // Destroyed without WaitExit: the end was the test's own doing.
  }
}

}  // namespace
}  // namespace tpd::testing
