#include "tests/agent/peer_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/agent/agent_testing.h"
#include "tests/testing/daemon_process.h"

namespace tpd::agent::testing {

bool PeerProcess::Died() {
  if (reaped) return true;
  if (waitpid(pid, &status, WNOHANG) == pid) reaped = true;
  return reaped;
}

PeerProcess::~PeerProcess() {
  if (stdin_fd >= 0) close(stdin_fd);
  if (pid > 0 && !reaped) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
}

std::unique_ptr<PeerProcess> StartPeer(const std::string& id,
                                       const std::vector<std::string>& flags) {
  int to_child[2];
  int from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return nullptr;
  std::vector<std::string> args = {tpd::testing::RunfilePath("tests/agent/agent_peer"),
                                   absl::StrCat("--id=", id), absl::StrCat("--token=", kTestToken)};
  args.insert(args.end(), flags.begin(), flags.end());
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    close(to_child[1]);
    close(from_child[0]);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  auto peer = std::make_unique<PeerProcess>();
  peer->pid = pid;
  peer->stdin_fd = to_child[1];
  FILE* out = fdopen(from_child[0], "r");
  char line[4096];
  if (out != nullptr && std::fgets(line, sizeof(line), out) != nullptr &&
      absl::StartsWith(line, "ADDRESS ")) {
    peer->address = std::string(line + 8);
    while (!peer->address.empty() && peer->address.back() == '\n') peer->address.pop_back();
  }
  if (out != nullptr) std::fclose(out);
  return peer;
}

}  // namespace tpd::agent::testing
