// The daemon helper itself: a daemon that dies behind the test's back fails the test, and
// one the test stopped on purpose does not.

#include "tests/testing/daemon_process.h"

#include <signal.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "tests/testing/wait_until.h"

namespace tpd::testing {
namespace {

// True once `pid` has exited (a zombie, not yet reaped).
bool Zombie(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'Z';
}

// Starts a daemon, kills it with `signal` the way a crash would (not through Signal), and
// destroys the helper once the daemon is dead.
void DaemonDiesUnseen(int signal) {
  TempDir dir;
  auto daemon = DaemonProcess::Start(absl::StrCat(dir.path(), "/tpd.sock"));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const pid_t pid = (*daemon)->pid();
  kill(pid, signal);
  ASSERT_TRUE(WaitUntil([pid] { return Zombie(pid); })) << "the daemon never died";
}

TEST(DaemonProcessTest, ADaemonKilledBehindTheTestsBackFailsTheTest) {
  EXPECT_NONFATAL_FAILURE(DaemonDiesUnseen(SIGSEGV), "died unexpectedly (killed by signal 11");
}

TEST(DaemonProcessTest, ADaemonThatExitedBehindTheTestsBackFailsTheTest) {
  // SIGTERM sent by someone else: a clean exit the test never asked for.
  EXPECT_NONFATAL_FAILURE(DaemonDiesUnseen(SIGTERM), "died unexpectedly (exit code 0)");
}

TEST(DaemonProcessTest, ADaemonTheTestStoppedDoesNotFailIt) {
  TempDir dir;
  for (int signal : {SIGTERM, SIGKILL}) {
    auto daemon = DaemonProcess::Start(absl::StrCat(dir.path(), "/tpd.sock"));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    const pid_t pid = (*daemon)->pid();
    (*daemon)->Signal(signal);
    ASSERT_TRUE(WaitUntil([pid] { return Zombie(pid); })) << "the daemon never stopped";
    // Destroyed without WaitExit: the end was the test's own doing.
  }
}

}  // namespace
}  // namespace tpd::testing
