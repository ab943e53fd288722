// examples/tensor_calls, the program users copy, does what tools/run.sh shows: four workers on
// two real daemons (two per node, loopback) join one group, call each other with tensors of
// every size, and each prints one "exact" line per peer and size and exits 0.

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ProcessResult;
using testing::RunfilePath;
using testing::RunProcess;
using testing::TempDir;

constexpr int kWorldSize = 4;
constexpr int kChecksPerWorker = 3 * 4;  // three peers, four tensor sizes

TEST(ExampleTest, FourWorkersOnTwoDaemonsCallEachOtherAndPassEveryCheck) {
  // Two daemons as tools/run.sh configures them: node0 and node1, one token, peer ports on
  // loopback, arenas for the 16 MiB calls.
  TempDir dirs[2];
  std::string sockets[2];
  std::unique_ptr<DaemonProcess> daemons[2];
  for (int i = 0; i < 2; ++i) {
    sockets[i] = absl::StrCat(dirs[i].path(), "/tpd.sock");
    const std::string config = dirs[i].WriteFile(
        "tpd.toml", absl::StrCat("[peer]\nlisten_address = \"127.0.0.1:0\"\n",
                                 "token = \"example\"\nnode_name = \"node", i, "\"\n",
                                 "[data]\narena_bytes = ", int64_t{256} << 20, "\n"));
    auto daemon = DaemonProcess::Start(sockets[i], {"--config", config});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemons[i] = *std::move(daemon);
  }
  auto client = Client::Connect(sockets[0]);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<v1::StatusResponse> status = (*client)->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  const std::string init_method = absl::StrCat("tcp://", status->peer_address());

  std::vector<std::future<ProcessResult>> workers;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    const std::vector<std::string> argv = {
        RunfilePath("examples/tensor_calls"),
        absl::StrCat("--socket=", sockets[rank / 2]),
        absl::StrCat("--init_method=", init_method),
        absl::StrCat("--rank=", rank),
        absl::StrCat("--world_size=", kWorldSize),
        "--calls=3",  // enough to check; run.sh's 20 are for the timings
    };
    workers.push_back(
        std::async(std::launch::async, [argv] { return RunProcess(argv, absl::Seconds(60)); }));
  }
  for (int rank = 0; rank < kWorldSize; ++rank) {
    const ProcessResult result = workers[rank].get();
    SCOPED_TRACE(absl::StrCat("worker", rank, " printed:\n", result.output));
    EXPECT_EQ(result.exit_code, 0);
    const std::string me = absl::StrCat("worker", rank, " (node", rank / 2, ")");
    int exact = 0;
    for (absl::string_view line : absl::StrSplit(result.output, '\n')) {
      if (absl::StartsWith(line, absl::StrCat(me, " -> ")) && absl::EndsWith(line, " exact")) {
        ++exact;
      }
    }
    EXPECT_EQ(exact, kChecksPerWorker);
    EXPECT_THAT(result.output, HasSubstr(absl::StrCat(me, ": ", kChecksPerWorker, " of ",
                                                      kChecksPerWorker, " checks passed")));
    EXPECT_THAT(result.output, Not(HasSubstr("FAILED")));
  }
  // Two of each worker's three peers are on the other node: node0's two workers made
  // 2 x 2 x 4 sizes x 3 calls to node1 through the agents, and got as many.
  status = (*client)->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->agent().peers_size(), 1) << status->agent().DebugString();
  const v1::AgentPeer& node1 = status->agent().peers(0);
  EXPECT_EQ(node1.node(), "node1");
  EXPECT_EQ(node1.calls_sent(), 48u);
  EXPECT_EQ(node1.calls_received(), 48u);
  EXPECT_EQ(node1.errors(), 0u) << node1.last_error();
  const uint64_t tensor_bytes = (1 << 10) + (64 << 10) + (1 << 20) + (16 << 20);
  EXPECT_GE(node1.bytes_sent(), 2 * 12 * tensor_bytes);  // requests and replies
}

}  // namespace
}  // namespace tpd
