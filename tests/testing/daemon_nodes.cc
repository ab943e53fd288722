#include "tests/testing/daemon_nodes.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tpd::testing {

DaemonNodes::DaemonNodes(std::vector<std::string> names, std::function<std::string(int)> config)
    : names_(std::move(names)),
      config_(std::move(config)),
      sockets_(names_.size()),
      peers_(names_.size()),
      daemons_(names_.size()) {
  for (size_t i = 0; i < names_.size(); ++i) {
    dirs_.push_back(std::make_unique<TempDir>());
    sockets_[i] = absl::StrCat(dirs_[i]->path(), "/tpd.sock");
  }
}

void DaemonNodes::Start(int i, bool keep_port) {
  // A restart listens where the node did: its peers (and node 0's store users) find it there.
  const std::string listen = peers_[i].empty() || !keep_port ? "127.0.0.1:0" : peers_[i];
  const std::string config = dirs_[i]->WriteFile(
      "tpd.toml", absl::StrCat("[peer]\nlisten_address = \"", listen, "\"\ntoken = \"secret\"\n",
                               "node_name = \"", names_[i], "\"\n", config_ ? config_(i) : ""));
  absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
      DaemonProcess::Start(sockets_[i], {"--config", config});
  ASSERT_TRUE(daemon.ok()) << names_[i] << ": " << daemon.status();
  daemons_[i] = *std::move(daemon);
  std::unique_ptr<Client> client = Connect(i);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::StatusResponse> status = client->Status();
  ASSERT_TRUE(status.ok()) << names_[i] << ": " << status.status();
  peers_[i] = status->peer_address();
}

void DaemonNodes::StartAll() {
  for (int i = 0; i < size(); ++i) ASSERT_NO_FATAL_FAILURE(Start(i));
}

std::unique_ptr<Client> DaemonNodes::Connect(int i, ClientOptions options) const {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(sockets_[i], options);
  EXPECT_TRUE(client.ok()) << names_[i] << ": " << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

std::vector<absl::StatusOr<v1::JoinResponse>> JoinStatic(
    const std::vector<Client*>& clients, const JoinOptions& base,
    const std::function<void(int, JoinOptions*)>& customize) {
  const int world = static_cast<int>(clients.size());
  std::vector<absl::StatusOr<v1::JoinResponse>> results(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    JoinOptions options = base;
    options.name = absl::StrCat("w", r);
    options.rank = r;
    options.world_size = world;
    if (customize) customize(r, &options);
    threads.emplace_back(
        [&results, r, client = clients[r], options] { results[r] = client->Join(options); });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

}  // namespace tpd::testing
