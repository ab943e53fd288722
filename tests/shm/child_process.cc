#include "tests/shm/child_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/testing/wait_until.h"

namespace tpd::shm::testing {

pid_t StartChild(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  return pid;
}

int FinishChild(pid_t pid, absl::Duration timeout) {
  if (pid <= 0) return -1;
  int status = 0;
  const bool exited = tpd::testing::WaitUntil([&] { return waitpid(pid, &status, WNOHANG) == pid; },
                                              timeout, absl::Milliseconds(1));
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace tpd::shm::testing
