// A peer agent in a process of its own (tests/agent/agent_peer, which prints "ADDRESS <urls>"
// once it listens and exits when its stdin closes), for the tests that need the other end of a
// pipe to be a real process: killed mid-call, or fed bytes that should crash it.
//
// Thread safety: belongs to the test thread.

#ifndef TPD_TESTS_AGENT_PEER_PROCESS_H_
#define TPD_TESTS_AGENT_PEER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace tpd::agent::testing {

struct PeerProcess {
  pid_t pid = -1;
  int stdin_fd = -1;    // closing it ends the peer
  std::string address;  // what it printed; empty if it never did
  int status = 0;       // its wait status, once Died()
  bool reaped = false;

  // Whether it has died (then `status` is its wait status).
  bool Died();
  // SIGKILLs and reaps it unless it died already.
  ~PeerProcess();
};

// Runs `argv` (argv[0] the binary) with its stdin and stdout piped to this process, in `env`
// ("NAME=value" entries) or, when `env` is null, in this process's environment, and reads
// what it prints up to its "ADDRESS <urls>" line. Null when the pipes cannot be made.
std::unique_ptr<PeerProcess> SpawnPeer(std::vector<std::string> argv,
                                       const std::vector<std::string>* env = nullptr);

// SpawnPeer of agent_peer (from the test's runfiles) as node `id`, with the test token and
// `flags`.
std::unique_ptr<PeerProcess> StartPeer(const std::string& id,
                                       const std::vector<std::string>& flags = {});

}  // namespace tpd::agent::testing

#endif  // TPD_TESTS_AGENT_PEER_PROCESS_H_
