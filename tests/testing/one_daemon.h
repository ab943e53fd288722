// A test with one real daemon: a config with a peer listener on loopback (so groups form over
// tcp:// at the daemon's own peer address), its data plane, and helpers to connect clients
// and join them as workers of one group. The fixture the integration tests of one node share.

#ifndef TPD_TESTS_TESTING_ONE_DAEMON_H_
#define TPD_TESTS_TESTING_ONE_DAEMON_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "proto/control.pb.h"
#include "tests/testing/daemon_process.h"

namespace tpd::testing {

// What a test's daemon config says beyond the defaults.
struct OneDaemonConfig {
  std::string node_name = "test";
  uint64_t arena_bytes = 1 << 20;  // [data] arena_bytes
  std::string daemon_section;      // lines of [daemon] (socket_mode = "0666", say)
  std::string peer_lines;          // more lines of [peer] (heartbeat_interval_ms = 50, say)
  std::string more_sections;       // whole sections after [data] ("[store]\nmax_key_bytes = 64\n")
};

class OneDaemonTest : public ::testing::Test {
 protected:
  // Writes the config and starts the daemon (fails the test when it does not serve). Call it
  // from SetUp, or from a test that picks its own config.
  void StartDaemon(const OneDaemonConfig& config = {});

  // A client of the daemon (null, the test failed, when it cannot connect).
  std::unique_ptr<Client> Connect(ClientOptions options = {});
  // tcp:// at the daemon's peer address, asked of `client` once.
  std::string InitMethod(Client* client);
  // Joins `client` to group "g" as `name` with `backend` options, waiting at most `timeout`.
  absl::Status Join(Client* client, const std::string& name, const v1::BackendOptions& backend = {},
                    absl::Duration timeout = absl::Seconds(30));

  TempDir dir_;
  std::string socket_;
  std::string init_method_;
  std::unique_ptr<DaemonProcess> daemon_;
};

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_ONE_DAEMON_H_
