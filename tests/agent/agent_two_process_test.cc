// Two agents in two processes, as two daemons on one host: calls with tensors both ways
// through whatever the registry picks (shm + cma where viable), and a peer process killed
// with SIGKILL failing the calls pending on it at once, naming it.

#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_testing.h"
#include "tests/agent/peer_process.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait_until.h"

namespace tpd::agent {
namespace {

using testing::CallAndWait;
using testing::Checksums;
using ::testing::HasSubstr;
using testing::MakeMessage;
using testing::PeerProcess;
using testing::StartPeer;

TEST(AgentTwoProcessTest, CallsWithTensorsThenAPeerKilledFailsItsCallsAtOnce) {
  std::unique_ptr<PeerProcess> peer_process = StartPeer("node-b");
  ASSERT_NE(peer_process, nullptr);
  ASSERT_FALSE(peer_process->address.empty()) << "the peer never printed its address";
  absl::StatusOr<std::unique_ptr<Agent>> created = Agent::Create(testing::TestOptions("node-a"));
  ASSERT_TRUE(created.ok()) << created.status();
  Agent& a = **created;
  const PeerId peer{"node-b", peer_process->address};

  for (size_t size : {size_t{0}, size_t{4096}, size_t{1} << 20, size_t{16} << 20}) {
    Message request = MakeMessage("echo", 100, {size, 3}, size + 1);
    const auto sums = Checksums(request);
    absl::StatusOr<Message> reply = CallAndWait(a, peer, std::move(request));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(Checksums(*reply), sums) << size;
  }
  AgentStats stats = a.Stats();
  ASSERT_EQ(stats.peers.size(), 1u);
  // Two processes of one host and user: the best of what both registered.
  EXPECT_EQ(stats.peers[0].transport, a.registry().PickTransport(a.registry().TransportDomains()));
  EXPECT_NE(stats.peers[0].channel, "xth") << "xth never crosses processes";
  std::printf("two processes: %s + %s\n", stats.peers[0].transport.c_str(),
              stats.peers[0].channel.c_str());

  struct Pending {
    absl::Mutex mu;
    std::vector<absl::Status> statuses;
  };
  auto pending = std::make_shared<Pending>();
  for (int i = 0; i < 8; ++i) {
    a.Send(peer, MakeMessage("hold", 10, {1 << 16}, 100 + i), absl::Now() + absl::Seconds(120),
           [pending](absl::StatusOr<Message> reply) {
             absl::MutexLock lock(&pending->mu);
             pending->statuses.push_back(reply.status());
           });
  }
  ASSERT_TRUE(tpd::testing::WaitUntil([&] { return a.Stats().peers[0].bytes_sent >= 8 * 65546u; }))
      << "the held calls were written";
  const absl::Time killed = absl::Now();
  kill(peer_process->pid, SIGKILL);
  ASSERT_TRUE(tpd::testing::WaitUntil(
      [&] {
        absl::MutexLock lock(&pending->mu);
        return pending->statuses.size() == 8;
      },
      absl::Seconds(10), absl::Milliseconds(1)));
  const absl::Duration took = absl::Now() - killed;
  EXPECT_LT(took, absl::Seconds(2)) << "failed by the pipe, not by the deadline";
  absl::MutexLock lock(&pending->mu);
  for (const absl::Status& status : pending->statuses) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr("node-b"));
  }
  std::printf("8 pending calls failed %s after SIGKILL\n", absl::FormatDuration(took).c_str());
}

TEST(AgentTwoProcessTest, EveryTransportPairWorksAcrossProcesses) {
  for (const auto& [transports, channels] : std::vector<std::pair<std::string, std::string>>{
           {"uv", "basic"}, {"uv", "mpt_uv"}, {"uv,shm", "basic"}, {"uv,shm", "cma"}}) {
    SCOPED_TRACE(absl::StrCat(transports, " + ", channels));
    std::unique_ptr<PeerProcess> peer_process = StartPeer(
        "node-b",
        {absl::StrCat("--transports=", transports), absl::StrCat("--channels=", channels)});
    ASSERT_NE(peer_process, nullptr);
    if (peer_process->address.empty()) {
      ADD_FAILURE() << "the peer did not start (not viable here?)";
      continue;
    }
    auto created =
        Agent::Create(testing::TestOptions("node-a", absl::StrSplit(transports, ','), {channels}));
    ASSERT_TRUE(created.ok()) << created.status();
    Message request = MakeMessage("echo", 1000, {size_t{4} << 20, 0, 17}, 7);
    const auto sums = Checksums(request);
    absl::StatusOr<Message> reply =
        CallAndWait(**created, PeerId{"node-b", peer_process->address}, std::move(request));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(Checksums(*reply), sums);
    EXPECT_EQ((*created)->Stats().peers[0].channel, channels);
  }
}

}  // namespace
}  // namespace tpd::agent
