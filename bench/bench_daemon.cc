#include "bench/bench_daemon.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace tpd::bench {

std::unique_ptr<BenchDaemon> BenchDaemon::Start(const std::string& tpd, const std::string& dir,
                                                const std::string& name, const std::string& config,
                                                const std::string& log_level,
                                                const std::string& netns) {
  const std::string config_path = absl::StrCat(dir, "/", name, ".toml");
  std::ofstream(config_path) << config;
  std::unique_ptr<BenchDaemon> daemon(
      new BenchDaemon(absl::StrCat(dir, "/", name, ".sock"), absl::StrCat(dir, "/", name, ".log")));
  std::vector<std::string> argv = {tpd,         "--socket",    daemon->socket_, "--config",
                                   config_path, "--log_level", log_level};
  daemon->pid_ = fork();
  if (daemon->pid_ == 0) {
    const int fd = open(daemon->log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    if (!netns.empty() && !EnterNetns(netns)) {
      std::fprintf(stderr, "cannot enter network namespace %s: %s\n", netns.c_str(),
                   std::strerror(errno));
      _exit(126);
    }
    std::vector<char*> args;
    for (std::string& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s\n", tpd.c_str());
    _exit(127);
  }
  if (!daemon->WaitServing()) return nullptr;
  return daemon;
}

BenchDaemon::~BenchDaemon() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 500; ++i) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

std::string BenchDaemon::Log() const {
  std::ifstream in(log_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool BenchDaemon::WaitServing() {
  for (int i = 0; i < 3000; ++i) {
    if (Log().find(" serving (pid") != std::string::npos) return true;
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::fprintf(stderr, "tpd %s did not serve:\n%s\n", socket_.c_str(), Log().c_str());
  return false;
}

std::string PeerConfig(const std::string& node, const std::string& host, int64_t arena_bytes) {
  return absl::StrCat("[peer]\nlisten_address = \"", host,
                      ":0\"\ntoken = \"bench\"\nnode_name = \"", node,
                      "\"\n[data]\narena_bytes = ", arena_bytes, "\n");
}

std::string TomlStrings(const std::string& csv) {
  return absl::StrCat("[\"", absl::StrJoin(absl::StrSplit(csv, ','), "\", \""), "\"]");
}

bool EnterNetns(const std::string& netns) {
  const int fd = open(netns.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool entered = setns(fd, CLONE_NEWNET) == 0;
  const int saved = errno;
  close(fd);
  errno = saved;
  return entered;
}

std::string FindTpd(const std::string& flag, const char* argv0) {
  if (!flag.empty()) return flag;
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(absl::StrCat(dir, "/tpd/daemon/tpd"));
  }
  candidates.push_back(absl::StrCat(argv0, ".runfiles/tpd/daemon/tpd"));
  // argv0 may be a relative path or a bare name run through a wrapper: /proc/self/exe is the
  // binary itself.
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) candidates.push_back((self.parent_path() / "tpd").string());
  candidates.push_back((std::filesystem::path(argv0).parent_path() / "tpd").string());
  for (const std::string& path : candidates) {
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

}  // namespace tpd::bench
