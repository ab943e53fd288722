#include "tests/testing/second_user.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace tpd::testing {
namespace {

// In a forked child: drop to the second user for good; false when that failed.
bool BecomeSecondUser() {
  return setgroups(0, nullptr) == 0 && setresgid(kSecondGid, kSecondGid, kSecondGid) == 0 &&
         setresuid(kSecondUid, kSecondUid, kSecondUid) == 0;
}

}  // namespace

std::string CannotSwitchUser() {
  if (geteuid() != 0) return "needs root to run a process as a second user (uid 65534)";
  return "";
}

void OpenDirToSecondUser(const std::string& dir) { chmod(dir.c_str(), 0711); }

absl::StatusOr<std::unique_ptr<SecondUserConnections>> SecondUserConnections::Open(
    const std::string& path, int n) {
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork");
  if (pid == 0) {
    // Only system calls from here on: the parent has threads.
    close(report[0]);
    int connected = -1;
    if (BecomeSecondUser()) {
      connected = 0;
      for (int i = 0; i < n; ++i) {
        const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
          ++connected;
        }
      }
    }
    [[maybe_unused]] ssize_t w = write(report[1], &connected, sizeof(connected));
    while (true) pause();
  }
  close(report[1]);
  int connected = -1;
  const ssize_t got = read(report[0], &connected, sizeof(connected));
  close(report[0]);
  std::unique_ptr<SecondUserConnections> held(new SecondUserConnections(pid, connected));
  if (got != sizeof(connected) || connected < 0) {
    return absl::InternalError("the child could not become the second user");
  }
  return held;
}

SecondUserConnections::~SecondUserConnections() {
  kill(pid_, SIGKILL);
  int status;
  waitpid(pid_, &status, 0);
}

ProcessResult RunAsSecondUser(const std::string& dir, const std::vector<std::string>& args,
                              absl::Duration timeout) {
  return RunToolAs(dir, args, kSecondUid, kSecondGid, timeout);
}

ProcessResult RunToolAs(const std::string& dir, const std::vector<std::string>& args, uid_t uid,
                        gid_t gid, absl::Duration timeout) {
  const std::string tool = absl::StrCat(dir, "/second_user");
  std::error_code ignored;
  if (!std::filesystem::exists(tool, ignored)) {
    std::filesystem::copy_file(RunfilePath("tests/testing/second_user_tool"), tool, ignored);
    chmod(tool.c_str(), 0755);
  }
  std::vector<std::string> argv = {"/usr/bin/setpriv", absl::StrCat("--reuid=", uid),
                                   absl::StrCat("--regid=", gid), "--clear-groups", tool};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProcess(argv, timeout);
}

}  // namespace tpd::testing
