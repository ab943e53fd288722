#include "tests/testing/daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tpd::testing {
namespace {

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log_path) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(log, STDOUT_FILENO);
  dup2(log, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

bool Accepts(const std::string& socket_path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// Waits for `pid` up to `timeout`; the raw wait status, or nullopt if it is still running.
std::optional<int> Reap(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    if (absl::Now() > deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace

std::string RunfilePath(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "tpd", "/",
                      workspace_relative);
}

TempDir::TempDir() {
  char pattern[] = "/tmp/tpd-test-XXXXXX";
  path_ = mkdtemp(pattern);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::WriteFile(const std::string& name, const std::string& contents) const {
  const std::string path = absl::StrCat(path_, "/", name);
  std::ofstream(path) << contents;
  return path;
}

ProcessResult RunProcess(const std::vector<std::string>& argv, absl::Duration timeout) {
  TempDir dir;
  const std::string log = absl::StrCat(dir.path(), "/out");
  const pid_t pid = Spawn(argv, log);
  std::optional<int> status = Reap(pid, timeout);
  if (!status) {
    kill(pid, SIGKILL);
    status = Reap(pid, absl::Seconds(5));
  }
  ProcessResult result;
  if (status && WIFEXITED(*status)) result.exit_code = WEXITSTATUS(*status);
  result.output = ReadFile(log);
  return result;
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(
    const std::string& socket_path, const std::vector<std::string>& extra_args,
    const std::vector<std::string>& prefix) {
  std::vector<std::string> argv = prefix;
  argv.insert(argv.end(), {RunfilePath("daemon/tpd"), "--socket", socket_path});
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  char log_pattern[] = "/tmp/tpd-test-log-XXXXXX";
  const int log_fd = mkstemp(log_pattern);
  close(log_fd);
  std::unique_ptr<DaemonProcess> daemon(new DaemonProcess(Spawn(argv, log_pattern), log_pattern));

  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    // "serving" is logged once the socket has its final mode and health says SERVING;
    // accepting connections alone comes a moment earlier.
    if (Accepts(socket_path) && daemon->Output().find(" serving (pid") != std::string::npos) {
      return daemon;
    }
    std::optional<int> code = daemon->WaitExit(absl::ZeroDuration());
    if (daemon->reaped_) {
      return absl::FailedPreconditionError(
          absl::StrCat("tpd ", code ? absl::StrCat("exited with code ", *code) : "was killed",
                       " before it served: ", daemon->Output()));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("tpd did not serve ", socket_path, " within 20s: ", daemon->Output()));
}

DaemonProcess::~DaemonProcess() {
  if (!reaped_) {
    // Gone already? Then it crashed or exited while the test looked elsewhere.
    if (std::optional<int> status = Reap(pid_, absl::ZeroDuration())) {
      reaped_ = true;
      if (!ExpectedEnd(*status)) {
        const std::string output = Output();
        constexpr size_t kTail = 4000;
        ADD_FAILURE() << "tpd pid " << pid_ << " died unexpectedly ("
                      << (WIFSIGNALED(*status)
                              ? absl::StrCat("killed by signal ", WTERMSIG(*status), " (",
                                             strsignal(WTERMSIG(*status)), ")")
                              : absl::StrCat("exit code ", WEXITSTATUS(*status)))
                      << ") before the test ended; the tail of its output:\n"
                      << (output.size() > kTail ? output.substr(output.size() - kTail) : output);
      }
    }
  }
  // A failed test shows what its daemons said: the first thing anyone debugging it needs.
  if (::testing::Test::HasFailure()) {
    std::fprintf(stderr, "---- tpd pid %d output ----\n%s---- end of pid %d ----\n", pid_,
                 Output().c_str(), pid_);
  }
  if (!reaped_) {
    kill(pid_, SIGKILL);
    Reap(pid_, absl::Seconds(5));
  }
  unlink(log_path_.c_str());
}

void DaemonProcess::Signal(int signal) {
  signals_sent_.insert(signal);
  kill(pid_, signal);
}

bool DaemonProcess::ExpectedEnd(int status) const {
  if (WIFSIGNALED(status)) return signals_sent_.count(WTERMSIG(status)) > 0;
  const bool asked_to_stop = signals_sent_.count(SIGTERM) > 0 || signals_sent_.count(SIGINT) > 0;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 && asked_to_stop;
}

std::optional<int> DaemonProcess::WaitExit(absl::Duration timeout) {
  if (reaped_) return std::nullopt;
  std::optional<int> status = Reap(pid_, timeout);
  if (!status) return std::nullopt;
  reaped_ = true;
  if (!WIFEXITED(*status)) return std::nullopt;
  return WEXITSTATUS(*status);
}

std::string DaemonProcess::Output() const { return ReadFile(log_path_); }

}  // namespace tpd::testing
