// The agent's contract beyond moving bytes: options, pipe authentication (wrong tokens,
// impostors, relays, unauthenticated senders), deadlines, peer failures and reopening,
// handler refusals and allocators. Two agents in one process over uv + basic, plus raw
// TensorPipe pipes playing the attacker.

#include "agent/agent.h"

#include <tensorpipe/tensorpipe.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/pipe_auth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/agent.pb.h"
#include "tests/agent/agent_testing.h"
#include "tests/testing/wait_until.h"

namespace tpd::agent {
namespace {

using testing::CallAndWait;
using testing::Checksums;
using testing::EchoHandler;
using ::testing::HasSubstr;
using testing::MakeMessage;
using testing::PeerOf;
using testing::RawContext;
using testing::TestOptions;
using tpd::testing::WaitUntil;

constexpr absl::Duration kWait = absl::Seconds(60);

std::unique_ptr<Agent> MakeAgent(AgentOptions options) {
  absl::StatusOr<std::unique_ptr<Agent>> agent = Agent::Create(options);
  EXPECT_TRUE(agent.ok()) << agent.status();
  return agent.ok() ? *std::move(agent) : nullptr;
}

std::unique_ptr<Agent> UvAgent(const std::string& id) {
  return MakeAgent(TestOptions(id, {"uv"}, {"basic"}));
}

// A handler that keeps every request unanswered until told, and counts them. Its state is
// shared with the handler it installs, so requests the agent delivers after the test dropped
// this object (the agent still reading) land somewhere alive.
class HoldingHandler {
 public:
  explicit HoldingHandler(Agent& agent) : agent_(agent) {
    auto state = state_;
    agent.SetHandler(Handler{nullptr, [state](InboundRequest request) {
                               absl::MutexLock lock(&state->mu);
                               state->held.push_back(std::move(request));
                             }});
  }
  size_t held() {
    absl::MutexLock lock(&state_->mu);
    return state_->held.size();
  }
  // Answers every held request with an empty response; returns their `sent` outcomes.
  std::vector<absl::Status> ReleaseAll() {
    std::vector<InboundRequest> held;
    {
      absl::MutexLock lock(&state_->mu);
      held.swap(state_->held);
    }
    auto outcomes = std::make_shared<std::vector<absl::Status>>();
    auto mu = std::make_shared<absl::Mutex>();
    for (InboundRequest& request : held) {
      Message response;
      agent_.Respond(request.reply_to, std::move(response), [outcomes, mu](absl::Status s) {
        absl::MutexLock lock(mu.get());
        outcomes->push_back(std::move(s));
      });
    }
    EXPECT_TRUE(WaitUntil([&] {
      absl::MutexLock lock(mu.get());
      return outcomes->size() == held.size();
    }));
    absl::MutexLock lock(mu.get());
    return *outcomes;
  }

 private:
  struct State {
    absl::Mutex mu;
    std::vector<InboundRequest> held ABSL_GUARDED_BY(mu);
  };
  Agent& agent_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// Calls in flight, collected (the state outlives this object, as a `done` may).
class Outcomes {
 public:
  Callback Track() {
    auto state = state_;
    {
      absl::MutexLock lock(&state->mu);
      ++state->started;
    }
    return [state](absl::StatusOr<Message> reply) {
      absl::MutexLock lock(&state->mu);
      state->statuses.push_back(reply.status());
    };
  }
  bool AllDone(absl::Duration timeout = kWait) {
    return WaitUntil(
        [&] {
          absl::MutexLock lock(&state_->mu);
          return state_->statuses.size() == state_->started;
        },
        timeout, absl::Milliseconds(1));
  }
  std::vector<absl::Status> statuses() {
    absl::MutexLock lock(&state_->mu);
    return state_->statuses;
  }

 private:
  struct State {
    absl::Mutex mu;
    size_t started ABSL_GUARDED_BY(mu) = 0;
    std::vector<absl::Status> statuses ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// ---------------------------------------------------------------------------------------------
// Raw TensorPipe, for playing a peer without the token.

// Reads one message with no payload or tensors; its metadata, or an error.
absl::StatusOr<std::string> ReadMetadata(tensorpipe::Pipe& pipe) {
  struct State {
    absl::Notification done;
    absl::StatusOr<std::string> result;
  };
  auto state = std::make_shared<State>();
  pipe.readDescriptor(
      [state, &pipe](const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
        if (error) {
          state->result = absl::UnavailableError(error.what());
          state->done.Notify();
          return;
        }
        state->result = descriptor.metadata;
        tensorpipe::Allocation allocation;
        std::vector<std::shared_ptr<std::vector<char>>> buffers;
        for (const auto& payload : descriptor.payloads) {
          buffers.push_back(std::make_shared<std::vector<char>>(payload.length + 1));
          allocation.payloads.push_back({buffers.back()->data()});
        }
        for (const auto& tensor : descriptor.tensors) {
          buffers.push_back(std::make_shared<std::vector<char>>(tensor.length + 1));
          allocation.tensors.push_back({tensorpipe::CpuBuffer{buffers.back()->data()}});
        }
        pipe.read(std::move(allocation),
                  [state, buffers](const tensorpipe::Error&) { state->done.Notify(); });
      });
  if (!state->done.WaitForNotificationWithTimeout(kWait)) {
    return absl::DeadlineExceededError("nothing to read");
  }
  return state->result;
}

void WriteMetadata(tensorpipe::Pipe& pipe, std::string metadata, std::string payload = "") {
  auto held = std::make_shared<std::string>(std::move(payload));
  tensorpipe::Message message;
  message.metadata = std::move(metadata);
  if (!held->empty()) message.payloads.push_back({held->data(), held->size(), ""});
  pipe.write(std::move(message), [held](const tensorpipe::Error&) {});
}

std::shared_ptr<tensorpipe::Pipe> AcceptOne(tensorpipe::Listener& listener) {
  struct State {
    absl::Notification done;
    std::shared_ptr<tensorpipe::Pipe> pipe;
  };
  auto state = std::make_shared<State>();
  listener.accept([state](const tensorpipe::Error& error, std::shared_ptr<tensorpipe::Pipe> pipe) {
    if (!error) state->pipe = std::move(pipe);
    state->done.Notify();
  });
  if (!state->done.WaitForNotificationWithTimeout(kWait)) return nullptr;
  return state->pipe;
}

std::string UvUrl(const Agent& agent) {
  for (const std::string& url : agent.urls()) {
    if (absl::StartsWith(url, "uv://")) return url;
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Options.

TEST(AgentTest, CreateRefusesMissingIdTokenAndBadAddresses) {
  AgentOptions options = TestOptions("node-a");
  options.id = "";
  EXPECT_EQ(Agent::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = TestOptions("node-a");
  options.cluster_token = "";
  EXPECT_THAT(Agent::Create(options).status().message(), HasSubstr("cluster token"));
  options = TestOptions("node-a");
  options.listen_address = "localhost:0";
  EXPECT_THAT(Agent::Create(options).status().message(), HasSubstr("must be an IP address"));
  options.listen_address = "127.0.0.1:70000";
  EXPECT_EQ(Agent::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.listen_address = "127.0.0.1";
  EXPECT_EQ(Agent::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = TestOptions("node-a", {"tcp"});
  EXPECT_THAT(Agent::Create(options).status().message(), HasSubstr("Unknown transport"));
}

TEST(AgentTest, APortInUseIsUnavailableNotACrash) {
  std::unique_ptr<Agent> first = UvAgent("node-a");
  ASSERT_NE(first, nullptr);
  const std::string port = UvUrl(*first).substr(UvUrl(*first).rfind(':') + 1);
  AgentOptions options = TestOptions("node-b", {"uv"}, {"basic"});
  options.listen_address = absl::StrCat("127.0.0.1:", port);
  absl::StatusOr<std::unique_ptr<Agent>> second = Agent::Create(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("in use"));
}

TEST(AgentTest, AddressListsEveryRegisteredTransportUvFirst) {
  std::unique_ptr<Agent> agent = MakeAgent(TestOptions("node-a"));
  ASSERT_NE(agent, nullptr);
  ASSERT_FALSE(agent->urls().empty());
  EXPECT_THAT(agent->urls().front(), ::testing::StartsWith("uv://127.0.0.1:"));
  EXPECT_THAT(agent->urls().front(), ::testing::Not(::testing::EndsWith(":0")));
  EXPECT_EQ(agent->address(), absl::StrJoin(agent->urls(), ","));
}

// ---------------------------------------------------------------------------------------------
// Authentication.

TEST(AgentTest, APeerWithAnotherTokenGetsNothingDeliveredAndItsPipeClosed) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  AgentOptions wrong = TestOptions("node-m", {"uv"}, {"basic"});
  wrong.cluster_token = "not-the-cluster-token";
  std::unique_ptr<Agent> m = MakeAgent(wrong);
  ASSERT_TRUE(a && m);
  EchoHandler echo_a(*a);
  EchoHandler echo_m(*m);

  // m calls a: a refuses m's answer and closes the pipe.
  absl::StatusOr<Message> reply = CallAndWait(*m, PeerOf(*a), MakeMessage("steal", 10, {100}, 1));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("during the handshake"));
  EXPECT_THAT(reply.status().message(), HasSubstr("node-a"));
  // a calls m: a refuses m's... m refuses a's answer (each side checks with its own token).
  reply = CallAndWait(*a, PeerOf(*m), MakeMessage("leak", 10, {100}, 2));
  EXPECT_FALSE(reply.ok());

  EXPECT_EQ(echo_a.requests(), 0);
  EXPECT_EQ(echo_m.requests(), 0);
  // Each refusal is counted on the refusing agent's transport thread, which may still be at it
  // when the caller's side has already seen the pipe close.
  EXPECT_TRUE(WaitUntil([&] {
    return a->Stats().auth_failures >= 1u && m->Stats().auth_failures >= 1u;
  })) << "auth_failures: a "
      << a->Stats().auth_failures << ", m " << m->Stats().auth_failures;
}

TEST(AgentTest, AnImpostorListenerWithoutTheTokenLearnsNoRequest) {
  // Its TensorPipe speaks tpd's transport, but under another token: it cannot prove itself, so
  // the agent sends it nothing, not even the pipe's first packet.
  std::unique_ptr<Agent> a = UvAgent("node-a");
  ASSERT_NE(a, nullptr);
  RawContext raw("not-the-token");
  std::shared_ptr<tensorpipe::Listener> listener = raw.context().listen({"uv://127.0.0.1:0"});
  const PeerId impostor{"node-b", listener->url("uv")};
  std::atomic<bool> accepted{false};
  listener->accept([&accepted](const tensorpipe::Error& error, std::shared_ptr<tensorpipe::Pipe>) {
    if (!error) accepted = true;
  });

  Outcomes outcomes;
  a->Send(impostor, MakeMessage("secret", 100, {1000}, 3), absl::Now() + kWait, outcomes.Track());
  ASSERT_TRUE(outcomes.AllDone());
  ASSERT_EQ(outcomes.statuses().size(), 1u);
  EXPECT_FALSE(outcomes.statuses()[0].ok());
  EXPECT_THAT(outcomes.statuses()[0].message(), HasSubstr("transport handshake"));
  EXPECT_FALSE(accepted.load()) << "the impostor's TensorPipe got a pipe";
}

TEST(AgentTest, AStrangerWithoutTheTokenIsRefusedBeforeTensorPipeSeesIt) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  ASSERT_NE(a, nullptr);
  EchoHandler echo(*a);
  RawContext stranger("not-the-token");
  std::shared_ptr<tensorpipe::Pipe> pipe = stranger.context().connect(UvUrl(*a));
  EXPECT_FALSE(ReadMetadata(*pipe).ok()) << "the agent's challenge reached a stranger";
  EXPECT_TRUE(WaitUntil([&] { return a->Stats().auth_failures >= 1; }));
  EXPECT_EQ(echo.requests(), 0);
  // The agent serves a peer with the token as before.
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(CallAndWait(*b, PeerOf(*a), MakeMessage("echo", 8, {}, 9)).ok());
}

TEST(AgentTest, AnUnauthenticatedSenderReachesNoHandler) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  ASSERT_NE(a, nullptr);
  EchoHandler echo(*a);
  RawContext raw;
  // 1. Ignores the challenge and sends a request straight away.
  {
    std::shared_ptr<tensorpipe::Pipe> pipe = raw.context().connect(UvUrl(*a));
    ASSERT_TRUE(ReadMetadata(*pipe).ok()) << "the challenge";
    v1::AgentMessage request;
    request.set_kind(v1::AgentMessage::REQUEST);
    request.set_call_id(1);
    request.set_method("echo");
    request.set_payload_bytes(5);
    WriteMetadata(*pipe, request.SerializeAsString(), "hello");
    EXPECT_FALSE(ReadMetadata(*pipe).ok()) << "no answer but the pipe closing";
  }
  // 2. Answers with a MAC made up.
  {
    std::shared_ptr<tensorpipe::Pipe> pipe = raw.context().connect(UvUrl(*a));
    absl::StatusOr<std::string> challenge = ReadMetadata(*pipe);
    ASSERT_TRUE(challenge.ok());
    v1::PipeHello answer;
    answer.set_version(std::string(kPipeAuthVersion));
    answer.set_step(v1::PipeHello::ANSWER);
    answer.set_nonce(NewPipeNonce());
    answer.set_agent_id("node-m");
    answer.set_dialed_url(UvUrl(*a));
    answer.set_mac(std::string(32, 'y'));
    WriteMetadata(*pipe, answer.SerializeAsString());
    EXPECT_FALSE(ReadMetadata(*pipe).ok()) << "no proof but the pipe closing";
  }
  EXPECT_EQ(echo.requests(), 0);
  EXPECT_TRUE(WaitUntil([&] { return a->Stats().auth_failures == 2; })) << a->Stats().auth_failures;
}

TEST(AgentTest, ARelayedHandshakeIsRefusedByTheRealDaemon) {
  // m (no token) listens where a client said node-a is, and relays between c, which dials
  // it, and the real node-a: c's answer is valid but names m's address, which a does not own.
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> c = UvAgent("node-c");
  ASSERT_TRUE(a && c);
  EchoHandler echo(*a);
  RawContext raw;
  std::shared_ptr<tensorpipe::Listener> listener = raw.context().listen({"uv://127.0.0.1:0"});

  Outcomes outcomes;
  c->Send(PeerId{"node-a", listener->url("uv")}, MakeMessage("echo", 10, {}, 4),
          absl::Now() + kWait, outcomes.Track());
  std::shared_ptr<tensorpipe::Pipe> from_c = AcceptOne(*listener);
  ASSERT_NE(from_c, nullptr);
  std::shared_ptr<tensorpipe::Pipe> to_a = raw.context().connect(UvUrl(*a));
  absl::StatusOr<std::string> challenge = ReadMetadata(*to_a);
  ASSERT_TRUE(challenge.ok());
  WriteMetadata(*from_c, *challenge);
  absl::StatusOr<std::string> answer = ReadMetadata(*from_c);
  ASSERT_TRUE(answer.ok());
  WriteMetadata(*to_a, *answer);
  EXPECT_FALSE(ReadMetadata(*to_a).ok()) << "node-a must not send its proof";
  from_c->close();

  ASSERT_TRUE(outcomes.AllDone());
  EXPECT_FALSE(outcomes.statuses()[0].ok());
  EXPECT_EQ(echo.requests(), 0);
  EXPECT_EQ(a->Stats().auth_failures, 1u);
}

TEST(AgentTest, TheWrongNodeAtAnAddressIsRefused) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  EchoHandler echo(*b);
  absl::StatusOr<Message> reply =
      CallAndWait(*a, PeerId{"node-x", b->address()}, MakeMessage("echo", 1, {}, 5));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(reply.status().message(), HasSubstr("is \"node-b\", not \"node-x\""));
  EXPECT_EQ(echo.requests(), 0);
}

// ---------------------------------------------------------------------------------------------
// Pings (tpctl doctor): answered by the agent itself, never its handler.

TEST(AgentTest, APingIsAnsweredByThePeersAgentWithItsClock) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  EchoHandler echo(*b);
  absl::Notification done;
  absl::StatusOr<PingResult> result;
  a->Ping(PeerId{"node-b", b->address()}, absl::Now() + absl::Seconds(10),
          [&](absl::StatusOr<PingResult> r) {
            result = std::move(r);
            done.Notify();
          });
  done.WaitForNotification();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->round_trip, absl::ZeroDuration());
  EXPECT_LT(result->round_trip, absl::Seconds(10));
  // One machine, one clock: the estimate is off by at most half the round trip.
  EXPECT_LE(absl::AbsDuration(result->clock_offset),
            result->round_trip / 2 + absl::Milliseconds(1));
  EXPECT_EQ(echo.requests(), 0) << "the handler never sees a ping";
}

TEST(AgentTest, APingCarryingBytesIsRefusedAndReachesNoHandler) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  EchoHandler echo(*b);
  Message ping = MakeMessage(kPingMethod, 16, {}, 7);
  ping.header.clear_group();
  absl::StatusOr<Message> reply = CallAndWait(*a, PeerId{"node-b", b->address()}, std::move(ping));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header.kind(), v1::AgentMessage::ERROR);
  EXPECT_THAT(reply->header.status_message(), HasSubstr("a ping carries no payload"));
  EXPECT_EQ(echo.requests(), 0);
}

// ---------------------------------------------------------------------------------------------
// Deadlines.

TEST(AgentTest, ALateCallFailsWithDeadlineExceededNamingPeerMethodAndTime) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  HoldingHandler holding(*b);
  const absl::Time start = absl::Now();
  absl::StatusOr<Message> reply =
      CallAndWait(*a, PeerOf(*b), MakeMessage("train.step", 8, {}, 6), absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("method \"train.step\""));
  EXPECT_THAT(reply.status().message(), HasSubstr("node-b"));
  EXPECT_THAT(reply.status().message(), HasSubstr("timeout 200ms"));
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(holding.held(), 1u) << "the request did arrive";
  // The late answer is dropped; the pipe keeps serving.
  holding.ReleaseAll();
  EchoHandler echo(*b);
  absl::StatusOr<Message> next = CallAndWait(*a, PeerOf(*b), MakeMessage("echo", 8, {}, 7));
  EXPECT_TRUE(next.ok()) << next.status();
  const AgentStats stats = a->Stats();
  ASSERT_EQ(stats.peers.size(), 1u);
  EXPECT_EQ(stats.peers[0].errors, 1u);
  EXPECT_EQ(stats.calls_pending, 0u);
}

TEST(AgentTest, ManyDeadlinesShareOneTimerThread) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  HoldingHandler holding(*b);
  Outcomes warmup;
  a->Send(PeerOf(*b), MakeMessage("warm", 1, {}, 8), absl::Now() + absl::Milliseconds(50),
          warmup.Track());
  ASSERT_TRUE(warmup.AllDone());
  const int threads_before = testing::ThreadCount();
  constexpr int kCalls = 500;
  Outcomes outcomes;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kCalls; ++i) {
    a->Send(PeerOf(*b), MakeMessage("slow", 1, {}, 100 + i),
            start + absl::Milliseconds(100 + (i * 7) % 300), outcomes.Track());
  }
  const int threads_during = testing::ThreadCount();
  ASSERT_TRUE(outcomes.AllDone());
  EXPECT_LE(threads_during, threads_before) << "no thread per call";
  int late = 0;
  for (const absl::Status& status : outcomes.statuses()) {
    if (status.code() == absl::StatusCode::kDeadlineExceeded) ++late;
  }
  EXPECT_EQ(late, kCalls);
  EXPECT_EQ(a->Stats().calls_pending, 0u);
}

TEST(AgentTest, ACallWhoseDeadlinePassedIsNotSent) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  EchoHandler echo(*b);
  Outcomes outcomes;
  a->Send(PeerOf(*b), MakeMessage("echo", 1, {}, 9), absl::Now() - absl::Seconds(1),
          outcomes.Track());
  ASSERT_TRUE(outcomes.AllDone());
  EXPECT_EQ(outcomes.statuses()[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(echo.requests(), 0);
}

// ---------------------------------------------------------------------------------------------
// Failures.

TEST(AgentTest, DestroyingThePeerFailsPendingCallsAtOnceNamingIt) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  auto holding = std::make_unique<HoldingHandler>(*b);
  Outcomes outcomes;
  for (int i = 0; i < 10; ++i) {
    a->Send(PeerOf(*b), MakeMessage("hold", 100, {4096}, 10 + i), absl::Now() + absl::Seconds(120),
            outcomes.Track());
  }
  ASSERT_TRUE(WaitUntil([&] { return holding->held() == 10; }));
  const absl::Time killed = absl::Now();
  b.reset();
  ASSERT_TRUE(outcomes.AllDone(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5)) << "not after the deadline";
  for (const absl::Status& status : outcomes.statuses()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr("node-b"));
    EXPECT_THAT(status.message(), HasSubstr("method \"hold\""));
  }
  const AgentStats stats = a->Stats();
  ASSERT_EQ(stats.peers.size(), 1u);
  EXPECT_EQ(stats.peers[0].state, PipeState::kFailed);
  EXPECT_EQ(stats.calls_pending, 0u);
  holding.reset();
}

TEST(AgentTest, APipeReopensWhenThePeerComesBack) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  const PeerId peer = PeerOf(*b);
  const std::string port = UvUrl(*b).substr(UvUrl(*b).rfind(':') + 1);
  {
    EchoHandler echo(*b);
    ASSERT_TRUE(CallAndWait(*a, peer, MakeMessage("echo", 10, {10}, 20)).ok());
  }
  b.reset();
  absl::StatusOr<Message> down = CallAndWait(*a, peer, MakeMessage("echo", 10, {10}, 21));
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable) << down.status();
  EXPECT_THAT(down.status().message(), HasSubstr("node-b"));

  AgentOptions options = TestOptions("node-b", {"uv"}, {"basic"});
  options.listen_address = absl::StrCat("127.0.0.1:", port);
  b = MakeAgent(options);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(PeerOf(*b), peer) << "same node, same address";
  EchoHandler echo(*b);
  Message request = MakeMessage("echo", 10, {10}, 22);
  const auto sums = Checksums(request);
  absl::StatusOr<Message> up = CallAndWait(*a, peer, std::move(request));
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(Checksums(*up), sums);
  EXPECT_EQ(a->Stats().peers[0].state, PipeState::kReady);
}

TEST(AgentTest, FailPeerFailsEverythingTowardTheNodeWithTheOwnersStatus) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  auto holding = std::make_unique<HoldingHandler>(*b);
  Outcomes outcomes;
  for (int i = 0; i < 5; ++i) {
    a->Send(PeerOf(*b), MakeMessage("hold", 1, {}, 30 + i), absl::Now() + absl::Seconds(120),
            outcomes.Track());
  }
  ASSERT_TRUE(WaitUntil([&] { return holding->held() == 5; }));
  a->FailPeer(PeerId{"node-b", ""},
              absl::UnavailableError("node node-b evicted: no heartbeat for 10s"));
  ASSERT_TRUE(outcomes.AllDone(absl::Seconds(5)));
  for (const absl::Status& status : outcomes.statuses()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(status.message(), HasSubstr("node node-b evicted"));
  }
  // Answers to the failed calls go nowhere (each `done` ran once); the next call opens a new
  // pipe.
  holding->ReleaseAll();
  holding.reset();
  EXPECT_EQ(outcomes.statuses().size(), 5u);
  EchoHandler echo(*b);
  EXPECT_TRUE(CallAndWait(*a, PeerOf(*b), MakeMessage("echo", 1, {}, 40)).ok());
}

TEST(AgentTest, UnreachableAndUnusableAddressesFailTheCallNotTheProcess) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  ASSERT_NE(a, nullptr);
  absl::StatusOr<Message> reply =
      CallAndWait(*a, PeerId{"node-z", "uv://127.0.0.1:1"}, MakeMessage("echo", 1, {}, 50));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(reply.status().message(), HasSubstr("node-z"));
  reply = CallAndWait(*a, PeerId{"node-z", "uv://localhost:5"}, MakeMessage("echo", 1, {}, 51));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  reply = CallAndWait(*a, PeerId{"node-z", "ibv://10.0.0.1"}, MakeMessage("echo", 1, {}, 52));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(reply.status().message(), HasSubstr("no transport in common"));
}

// ---------------------------------------------------------------------------------------------
// Handlers, allocators, responses.

TEST(AgentTest, AnAllocatorRefusalAnswersTheCallerWithItsError) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  std::atomic<int> delivered{0};
  b->SetHandler(Handler{
      [](const v1::AgentMessage&, size_t, absl::Span<const size_t>) -> absl::StatusOr<Destination> {
        return absl::ResourceExhaustedError("arena of worker callee is full (64 MiB)");
      },
      [&delivered](InboundRequest) { ++delivered; }});
  absl::StatusOr<Message> reply =
      CallAndWait(*a, PeerOf(*b), MakeMessage("big", 1000, {1 << 20}, 60));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header.kind(), v1::AgentMessage::ERROR);
  EXPECT_EQ(reply->header.status_code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(reply->header.status_message(), HasSubstr("arena of worker callee is full"));
  EXPECT_EQ(delivered, 0);
}

TEST(AgentTest, WithoutAHandlerRequestsAreAnsweredUnavailable) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  absl::StatusOr<Message> reply = CallAndWait(*a, PeerOf(*b), MakeMessage("echo", 1, {}, 61));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header.kind(), v1::AgentMessage::ERROR);
  EXPECT_EQ(reply->header.status_code(), static_cast<int>(absl::StatusCode::kUnavailable));
}

TEST(AgentTest, AllocatorsPlaceRequestAndReplyBytesWhereTheOwnerSays) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  // A bump allocator over one block, standing in for a client's shared-memory arena.
  struct Arena {
    std::vector<char> memory = std::vector<char>(4 << 20);
    std::atomic<size_t> used{0};
    bool Contains(const void* p) const {
      const char* c = static_cast<const char*>(p);
      return c >= memory.data() && c < memory.data() + memory.size();
    }
    Allocator allocator() {
      return [this](const v1::AgentMessage&, size_t payload_size,
                    absl::Span<const size_t> sizes) -> absl::StatusOr<Destination> {
        Destination d;
        auto take = [this](size_t n) -> void* {
          return memory.data() + used.fetch_add((n + 63) / 64 * 64);
        };
        d.payload = take(payload_size);
        for (size_t size : sizes) d.tensors.push_back(take(size));
        return d;
      };
    }
  };
  Arena server_arena;
  Arena client_arena;
  std::atomic<bool> request_in_arena{false};
  Agent* server = b.get();
  b->SetHandler(Handler{server_arena.allocator(), [&, server](InboundRequest request) {
                          request_in_arena = server_arena.Contains(request.message.payload.data) &&
                                             server_arena.Contains(request.message.tensors[0].data);
                          Message response;
                          response.payload = request.message.payload;
                          response.tensors = request.message.tensors;
                          *response.header.mutable_tensors() = request.message.header.tensors();
                          server->Respond(request.reply_to, std::move(response));
                        }});
  Message request = MakeMessage("echo", 3000, {1 << 20, 5}, 70);
  const auto sums = Checksums(request);
  absl::StatusOr<Message> reply =
      CallAndWait(*a, PeerOf(*b), std::move(request), kWait, client_arena.allocator());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(request_in_arena);
  EXPECT_TRUE(client_arena.Contains(reply->payload.data));
  EXPECT_TRUE(client_arena.Contains(reply->tensors[0].data));
  EXPECT_EQ(Checksums(*reply), sums);
}

TEST(AgentTest, RemoteErrorsTravelAsErrorMessages) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  Agent* server = b.get();
  b->SetHandler(Handler{nullptr, [server](InboundRequest request) {
                          Message error;
                          error.header.set_kind(v1::AgentMessage::ERROR);
                          error.header.set_status_code(
                              static_cast<int>(absl::StatusCode::kFailedPrecondition));
                          error.header.set_status_message("handler says no");
                          server->Respond(request.reply_to, std::move(error));
                        }});
  absl::StatusOr<Message> reply = CallAndWait(*a, PeerOf(*b), MakeMessage("m", 1, {}, 80));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header.kind(), v1::AgentMessage::ERROR);
  EXPECT_EQ(reply->header.status_message(), "handler says no");
  EXPECT_EQ(reply->header.method(), "m");
}

TEST(AgentTest, MessagesOverTheLimitAreRefusedBeforeSending) {
  AgentOptions options = TestOptions("node-a", {"uv"}, {"basic"});
  options.max_message_bytes = 1000;
  std::unique_ptr<Agent> a = MakeAgent(options);
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  EchoHandler echo(*b);
  absl::StatusOr<Message> reply = CallAndWait(*a, PeerOf(*b), MakeMessage("m", 600, {600}, 90));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reply.status().message(), HasSubstr("max_message_bytes"));
  Message mismatched = MakeMessage("m", 1, {8}, 91);
  mismatched.header.add_tensors();
  reply = CallAndWait(*a, PeerOf(*b), std::move(mismatched));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(echo.requests(), 0);
}

TEST(AgentTest, AnswersAfterTheRequestsDeadlineAreNotSent) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  HoldingHandler holding(*b);
  // The callee's deadline is its arrival plus the time left when it was sent, so it may end after
  // the caller's; a busy machine can also take longer than a short timeout to connect the pipe
  // (a call whose deadline passes before it is written is never sent). Connect first, then wait
  // for the request to arrive and for a whole timeout after that before answering.
  absl::StatusOr<Message> warm = absl::UnknownError("not answered");
  std::thread warm_call(
      [&] { warm = CallAndWait(*a, PeerOf(*b), MakeMessage("warm", 1, {}, 94)); });
  ASSERT_TRUE(WaitUntil([&] { return holding.held() == 1; }));
  ASSERT_EQ(holding.ReleaseAll().size(), 1u);
  warm_call.join();
  ASSERT_TRUE(warm.ok()) << warm.status();

  constexpr absl::Duration kTimeout = absl::Milliseconds(300);
  absl::StatusOr<Message> reply =
      CallAndWait(*a, PeerOf(*b), MakeMessage("slow", 1, {}, 95), kTimeout);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(WaitUntil([&] { return holding.held() == 1; }));
  absl::SleepFor(kTimeout);
  std::vector<absl::Status> sent = holding.ReleaseAll();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(AgentTest, DestroyingAnAgentCompletesItsPendingCalls) {
  std::unique_ptr<Agent> a = UvAgent("node-a");
  std::unique_ptr<Agent> b = UvAgent("node-b");
  ASSERT_TRUE(a && b);
  HoldingHandler holding(*b);
  Outcomes outcomes;
  for (int i = 0; i < 3; ++i) {
    a->Send(PeerOf(*b), MakeMessage("hold", 1, {}, 99 + i), absl::Now() + absl::Seconds(120),
            outcomes.Track());
  }
  ASSERT_TRUE(WaitUntil([&] { return holding.held() == 3; }));
  a.reset();
  ASSERT_TRUE(outcomes.AllDone(absl::Milliseconds(1)));
  for (const absl::Status& status : outcomes.statuses()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(status.message(), HasSubstr("closing"));
  }
}

}  // namespace
}  // namespace tpd::agent
