#include "tests/testing/one_daemon.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tpd::testing {

void OneDaemonTest::StartDaemon(const OneDaemonConfig& config) {
  socket_ = absl::StrCat(dir_.path(), "/tpd.sock");
  const std::string daemon_section =
      config.daemon_section.empty() ? "" : absl::StrCat("[daemon]\n", config.daemon_section);
  const std::string path = dir_.WriteFile(
      "tpd.toml",
      absl::StrCat(daemon_section, "[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"secret\"\n",
                   config.peer_lines, "node_name = \"", config.node_name,
                   "\"\n[data]\narena_bytes = ", config.arena_bytes, "\n", config.more_sections));
  auto daemon = DaemonProcess::Start(socket_, {"--config", path});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  daemon_ = *std::move(daemon);
}

std::unique_ptr<Client> OneDaemonTest::Connect(ClientOptions options) {
  auto client = Client::Connect(socket_, std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

std::string OneDaemonTest::InitMethod(Client* client) {
  if (init_method_.empty()) {
    init_method_ = absl::StrCat("tcp://", client->Status()->peer_address());
  }
  return init_method_;
}

absl::Status OneDaemonTest::Join(Client* client, const std::string& name,
                                 const v1::BackendOptions& backend, absl::Duration timeout) {
  JoinOptions options;
  options.group = "g";
  options.name = name;
  options.init_method = InitMethod(client);
  options.timeout = timeout;
  options.options = backend;
  return client->Join(options).status();
}

}  // namespace tpd::testing
