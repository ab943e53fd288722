#include "tests/agent/peer_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

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

std::unique_ptr<PeerProcess> SpawnPeer(std::vector<std::string> argv,
                                       const std::vector<std::string>* env) {
  // Built before fork: the child may only exec.
  std::vector<char*> args;
  for (std::string& arg : argv) args.push_back(arg.data());
  args.push_back(nullptr);
  std::vector<std::string> env_strings = env == nullptr ? std::vector<std::string>() : *env;
  std::vector<char*> envp;
  for (std::string& entry : env_strings) envp.push_back(entry.data());
  envp.push_back(nullptr);
  int to_child[2];
  int from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return nullptr;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    close(to_child[1]);
    close(from_child[0]);
    if (env == nullptr) {
      execv(args[0], args.data());
    } else {
      execve(args[0], args.data(), envp.data());
    }
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  auto peer = std::make_unique<PeerProcess>();
  peer->pid = pid;
  peer->stdin_fd = to_child[1];
  FILE* out = fdopen(from_child[0], "r");
  char line[4096];
  while (out != nullptr && std::fgets(line, sizeof(line), out) != nullptr) {
    if (!absl::StartsWith(line, "ADDRESS ")) continue;
    peer->address = std::string(line + 8);
    while (!peer->address.empty() && peer->address.back() == '\n') peer->address.pop_back();
    break;
  }
  if (out != nullptr) std::fclose(out);
  return peer;
}

std::unique_ptr<PeerProcess> StartPeer(const std::string& id,
                                       const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {tpd::testing::RunfilePath("tests/agent/agent_peer"),
                                   absl::StrCat("--id=", id), absl::StrCat("--token=", kTestToken)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return SpawnPeer(std::move(argv));
}

}  // namespace tpd::agent::testing
