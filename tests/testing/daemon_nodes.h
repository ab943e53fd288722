// Daemons standing in for the nodes of a cluster on this host, the fixture of every test that
// runs groups across daemons: node i on a socket and a config of its own in a temporary
// directory, its peer port on loopback (kept across restarts: node 0's hosts the groups'
// tcp:// store), all sharing one token.
//
//   DaemonNodes nodes({"node0", "node1"}, [](int) { return "[data]\narena_bytes = 67108864\n"; });
//   ASSERT_NO_FATAL_FAILURE(nodes.StartAll());
//   std::unique_ptr<Client> a = nodes.Connect(0);
//
// Thread safety: belongs to one test thread (Connect may be called from any).

#ifndef TPD_TESTS_TESTING_DAEMON_NODES_H_
#define TPD_TESTS_TESTING_DAEMON_NODES_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "tests/testing/daemon_process.h"

namespace tpd::testing {

class DaemonNodes {
 public:
  // Node i is named names[i]. `config(i)` (when given) is TOML appended to node i's config
  // right after its [peer] keys: more [peer] keys first, then sections of its own
  // ("heartbeat_interval_ms = 200\n[data]\narena_bytes = 1048576\n").
  explicit DaemonNodes(std::vector<std::string> names,
                       std::function<std::string(int)> config = nullptr);

  // Starts node i, or starts it again after it stopped: on its peer port, or (`keep_port`
  // false) on a fresh one. Fails the test on an error: call it under ASSERT_NO_FATAL_FAILURE.
  void Start(int i, bool keep_port = true);
  void StartAll();
  // Kills node i (if running) and forgets its process.
  void Stop(int i) { daemons_[i].reset(); }

  int size() const { return static_cast<int>(names_.size()); }
  const std::string& name(int i) const { return names_[i]; }
  const std::string& socket(int i) const { return sockets_[i]; }
  const TempDir& dir(int i) const { return *dirs_[i]; }
  // Node i's process; null before Start or after Stop.
  DaemonProcess* daemon(int i) const { return daemons_[i].get(); }
  // "127.0.0.1:port" of node i's peer port (known once it started).
  const std::string& peer_address(int i) const { return peers_[i]; }
  // A group's init_method naming node 0's store.
  std::string init_method() const { return "tcp://" + peers_[0]; }

  // A client of node i; null (and a test failure) when it does not connect.
  std::unique_ptr<Client> Connect(int i, ClientOptions options = {}) const;

 private:
  const std::vector<std::string> names_;
  const std::function<std::string(int)> config_;
  std::vector<std::unique_ptr<TempDir>> dirs_;
  std::vector<std::string> sockets_;
  std::vector<std::string> peers_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

// Joins one static group of clients.size() ranks, rank r ("w<r>" unless `customize` renames
// it) through clients[r], each from a thread of its own (a static Join returns once every
// rank joined). `base` gives the group, init_method and timeout. Each rank's result, by rank.
std::vector<absl::StatusOr<v1::JoinResponse>> JoinStatic(
    const std::vector<Client*>& clients, const JoinOptions& base,
    const std::function<void(int, JoinOptions*)>& customize = nullptr);

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_DAEMON_NODES_H_
