// Test helpers that run the real tpd and tpctl binaries as child processes.
//
// Thread safety: a DaemonProcess belongs to one test thread.

#ifndef TPD_TESTS_TESTING_DAEMON_PROCESS_H_
#define TPD_TESTS_TESTING_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tpd::testing {

// Path of a binary of this workspace in the test's runfiles, e.g. "daemon/tpd".
std::string RunfilePath(const std::string& workspace_relative);

// A fresh directory under /tmp (unix socket paths must stay under 108 bytes, which the
// test's own TEST_TMPDIR can exceed); removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  // Writes `contents` to `name` inside the directory and returns its path.
  std::string WriteFile(const std::string& name, const std::string& contents) const;

 private:
  std::string path_;
};

// Output and exit status of a finished child process.
struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string output;  // stdout and stderr together
};

// Runs `argv` to completion (bounded by `timeout`, then SIGKILL) and captures its output.
ProcessResult RunProcess(const std::vector<std::string>& argv,
                         absl::Duration timeout = absl::Seconds(30));

// A tpd daemon child process.
class DaemonProcess {
 public:
  // Starts `<prefix...> tpd --socket <socket_path> <extra_args...>` and waits until it
  // serves (or exits). `prefix` runs the daemon under another command, e.g.
  // {"/usr/sbin/ip", "netns", "exec", "ns1"} to put it in a network namespace.
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(
      const std::string& socket_path, const std::vector<std::string>& extra_args = {},
      const std::vector<std::string>& prefix = {});

  // Sends SIGKILL if still running, and reaps. A daemon that is already gone although the
  // test neither collected its exit (WaitExit) nor caused it (Signal) fails the running test
  // (ADD_FAILURE, with the tail of its output): it crashed or exited after the test's last
  // assertion, and that must not pass unseen. Exits the test caused: death by a signal it
  // sent, or exit code 0 after it sent SIGTERM or SIGINT.
  ~DaemonProcess();

  pid_t pid() const { return pid_; }
  // Sends `signal` to the daemon, and remembers it: the daemon's death by it, or its clean
  // exit after SIGTERM/SIGINT, is then expected (see the destructor).
  void Signal(int signal);
  // Waits for exit up to `timeout`; the exit code, or nullopt (still running, or killed by a
  // signal). Once it has seen the exit, the exit is the test's to judge, never the
  // destructor's. Collects the output written so far.
  std::optional<int> WaitExit(absl::Duration timeout);
  // Everything the daemon wrote to stdout and stderr until now.
  std::string Output() const;

 private:
  DaemonProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}

  // Whether the raw wait status `status` is an end the test caused by its signals.
  bool ExpectedEnd(int status) const;

  pid_t pid_;
  bool reaped_ = false;
  std::string log_path_;
  std::set<int> signals_sent_;
};

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_DAEMON_PROCESS_H_
