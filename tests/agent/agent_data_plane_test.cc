// The agent's data-plane suite, run over every transport and channel the registry finds
// viable on this machine (STYLE: every transport the agent registers runs the same suite):
// two agents in one process exchange requests and responses, payload-only and with 0..64
// tensors, 0 B..64 MiB (1 GiB with TPD_AGENT_TEST_1GIB=1), contents checksummed; many
// concurrent calls both ways, every reply matched to its call.

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/agent.h"
#include "agent/registry.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_testing.h"

namespace tpd::agent {
namespace {

using testing::CallAndWait;
using testing::Checksums;
using testing::EchoHandler;
using testing::MakeMessage;
using testing::PeerOf;
using testing::TestOptions;

struct Combo {
  std::string transport;
  std::string channel;
};

// Every (transport, channel) pair the registry registers here by default (xth, opt-in and
// never used between daemons, is left out: see agent/registry.h).
std::vector<Combo> ViableCombos() {
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Create(RegistryOptions{});
  std::vector<Combo> combos;
  if (!registry.ok()) return combos;
  for (const Candidate& transport : (*registry)->transports()) {
    if (!transport.registered) continue;
    for (const Candidate& channel : (*registry)->channels()) {
      if (channel.registered) combos.push_back({transport.name, channel.name});
    }
  }
  return combos;
}

class AgentDataPlaneTest : public ::testing::TestWithParam<Combo> {
 protected:
  void SetUp() override {
    // shm is reached the way daemons reach it: bootstrap on uv, upgrade to shm.
    std::vector<std::string> transports = {GetParam().transport};
    if (GetParam().transport != "uv") transports.push_back("uv");
    auto a = Agent::Create(TestOptions("node-a", transports, {GetParam().channel}));
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = Agent::Create(TestOptions("node-b", transports, {GetParam().channel}));
    ASSERT_TRUE(b.ok()) << b.status();
    a_ = *std::move(a);
    b_ = *std::move(b);
    echo_a_ = std::make_unique<EchoHandler>(*a_);
    echo_b_ = std::make_unique<EchoHandler>(*b_);
  }

  // One echo call from a to b; checks that the reply carries exactly what was sent.
  void EchoAndCheck(size_t payload_size, const std::vector<size_t>& tensor_sizes, uint64_t seed) {
    Message request = MakeMessage("echo", payload_size, tensor_sizes, seed);
    const std::vector<uint64_t> sent = Checksums(request);
    absl::StatusOr<Message> reply = CallAndWait(*a_, PeerOf(*b_), std::move(request));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->header.kind(), v1::AgentMessage::RESPONSE);
    EXPECT_EQ(reply->header.method(), "echo");
    ASSERT_EQ(reply->tensors.size(), tensor_sizes.size());
    ASSERT_EQ(reply->payload.size, payload_size);
    for (size_t i = 0; i < tensor_sizes.size(); ++i) {
      ASSERT_EQ(reply->tensors[i].size, tensor_sizes[i]) << "tensor " << i;
      EXPECT_EQ(reply->header.tensors(static_cast<int>(i)).nbytes(), tensor_sizes[i]);
    }
    EXPECT_EQ(Checksums(*reply), sent)
        << "payload " << payload_size << " B, " << tensor_sizes.size() << " tensors";
  }

  std::unique_ptr<Agent> a_;
  std::unique_ptr<Agent> b_;
  std::unique_ptr<EchoHandler> echo_a_;
  std::unique_ptr<EchoHandler> echo_b_;
};

TEST_P(AgentDataPlaneTest, PayloadOnlyCallsRoundTrip) {
  uint64_t seed = 1;
  for (size_t size : {size_t{0}, size_t{1}, size_t{64}, size_t{4096}, size_t{65536},
                      size_t{1} << 20, size_t{8} << 20}) {
    SCOPED_TRACE(absl::StrCat("payload ", size));
    EchoAndCheck(size, {}, seed++);
  }
}

TEST_P(AgentDataPlaneTest, ZeroToSixtyFourTensorsRoundTrip) {
  uint64_t seed = 100;
  for (size_t count : {0, 1, 2, 7, 16, 64}) {
    std::vector<size_t> sizes;
    for (size_t i = 0; i < count; ++i) sizes.push_back(i % 5 == 0 ? 0 : 1000 * i + 3);
    SCOPED_TRACE(absl::StrCat(count, " tensors"));
    EchoAndCheck(/*payload_size=*/100, sizes, seed++);
  }
}

TEST_P(AgentDataPlaneTest, TensorsFromZeroBytesToSixtyFourMiBRoundTrip) {
  std::vector<size_t> sizes = {
      0, 1, 4096, 65536, size_t{1} << 20, size_t{8} << 20, size_t{64} << 20};
  const char* big = std::getenv("TPD_AGENT_TEST_1GIB");
  if (big != nullptr && std::string(big) == "1") sizes.push_back(size_t{1} << 30);
  uint64_t seed = 1000;
  for (size_t size : sizes) {
    SCOPED_TRACE(absl::StrCat("tensor ", size));
    EchoAndCheck(/*payload_size=*/16, {size}, seed++);
  }
}

TEST_P(AgentDataPlaneTest, ConcurrentCallsBothWaysEachGetTheirOwnReply) {
  constexpr int kThreads = 4;
  constexpr int kCallsPerThread = 50;
  absl::Mutex mu;
  std::vector<std::string> failures;
  auto caller = [&](Agent* from, Agent* to, int thread) {
    struct Outstanding {
      absl::Notification done;
      std::vector<uint64_t> sent;
      std::optional<absl::StatusOr<Message>> reply;
    };
    std::vector<std::unique_ptr<Outstanding>> calls;
    for (int i = 0; i < kCallsPerThread; ++i) {
      const uint64_t seed = static_cast<uint64_t>(thread) * 100000 + i;
      Message request =
          MakeMessage(absl::StrCat("echo-", seed), 64 + i, {size_t(i) * 100, 7}, seed);
      auto call = std::make_unique<Outstanding>();
      call->sent = Checksums(request);
      Outstanding* raw = call.get();
      calls.push_back(std::move(call));
      from->Send(PeerOf(*to), std::move(request), absl::Now() + absl::Seconds(60),
                 [raw](absl::StatusOr<Message> reply) {
                   raw->reply = std::move(reply);
                   raw->done.Notify();
                 });
    }
    for (int i = 0; i < kCallsPerThread; ++i) {
      Outstanding& call = *calls[i];
      const uint64_t seed = static_cast<uint64_t>(thread) * 100000 + i;
      if (!call.done.WaitForNotificationWithTimeout(absl::Seconds(90))) {
        absl::MutexLock lock(&mu);
        failures.push_back(absl::StrCat("call ", seed, " never completed"));
        continue;
      }
      std::string problem;
      if (!call.reply->ok()) {
        problem = call.reply->status().ToString();
      } else if ((*call.reply)->header.method() != absl::StrCat("echo-", seed)) {
        problem = absl::StrCat("got the reply of ", (*call.reply)->header.method());
      } else if (Checksums(**call.reply) != call.sent) {
        problem = "contents differ";
      }
      if (!problem.empty()) {
        absl::MutexLock lock(&mu);
        failures.push_back(absl::StrCat("call ", seed, ": ", problem));
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    Agent* from = t % 2 == 0 ? a_.get() : b_.get();
    Agent* to = t % 2 == 0 ? b_.get() : a_.get();
    threads.emplace_back(caller, from, to, t);
  }
  for (auto& thread : threads) thread.join();
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures, first: " << failures.front();
  EXPECT_EQ(echo_a_->requests() + echo_b_->requests(), kThreads * kCallsPerThread);
}

TEST_P(AgentDataPlaneTest, StatsNameTheTransportAndChannelAndCountBothWays) {
  EchoAndCheck(1000, {5000}, 7);
  const AgentStats a = a_->Stats();
  const AgentStats b = b_->Stats();
  ASSERT_EQ(a.peers.size(), 1u);
  ASSERT_EQ(b.peers.size(), 1u);
  const PeerStats& to_b = a.peers[0];
  const PeerStats& from_a = b.peers[0];
  EXPECT_EQ(to_b.node, "node-b");
  EXPECT_EQ(to_b.state, PipeState::kReady);
  EXPECT_EQ(to_b.transport, GetParam().transport);
  EXPECT_EQ(to_b.channel, GetParam().channel);
  EXPECT_EQ(to_b.calls_sent, 1u);
  EXPECT_EQ(to_b.calls_pending, 0u);
  EXPECT_EQ(to_b.bytes_sent, 6000u);
  EXPECT_EQ(to_b.bytes_received, 6000u);
  EXPECT_EQ(to_b.errors, 0u);
  EXPECT_EQ(from_a.node, "node-a");
  EXPECT_EQ(from_a.inbound_pipes, 1);
  EXPECT_EQ(from_a.calls_received, 1u);
  EXPECT_EQ(from_a.transport, GetParam().transport);
  EXPECT_EQ(from_a.channel, GetParam().channel);
  EXPECT_EQ(from_a.bytes_received, 6000u);
  EXPECT_EQ(a.auth_failures + b.auth_failures, 0u);
}

INSTANTIATE_TEST_SUITE_P(EveryViableTransportAndChannel, AgentDataPlaneTest,
                         ::testing::ValuesIn(ViableCombos()),
                         [](const ::testing::TestParamInfo<Combo>& info) {
                           return absl::StrCat(info.param.transport, "_", info.param.channel);
                         });

}  // namespace
}  // namespace tpd::agent
