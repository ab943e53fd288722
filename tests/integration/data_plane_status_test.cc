// The data plane as operators see it (Admin.Status `agent` and per-session call fields, and
// `tpctl status`), against two real daemons with peer ports and agents on loopback: the agent
// section names the agent's URLs and every known transport and channel with whether it was
// registered or why not; after a call between the daemons, the caller's daemon counts it
// sent with its bytes and the callee's daemon counts it received; a call awaiting its reply
// shows as pending on the agent and in flight on its session; each daemon's `call_latency`
// histograms count every call through each stage it passed and put a slow handler's time in
// the stage that holds it.

#include <future>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_nodes.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;
using testing::RunfilePath;
using testing::RunProcess;
using testing::WaitUntil;

constexpr int64_t kArenaBytes = int64_t{16} << 20;
constexpr absl::Duration kNap = absl::Milliseconds(50);

// The backend named `name` in `backends`, or null.
const v1::AgentBackend* FindBackend(
    const google::protobuf::RepeatedPtrField<v1::AgentBackend>& backends, const std::string& name) {
  for (const v1::AgentBackend& backend : backends) {
    if (backend.name() == name) return &backend;
  }
  return nullptr;
}

// The peer entry of node `node` in `status`, or an empty one.
v1::AgentPeer PeerOf(const absl::StatusOr<v1::StatusResponse>& status, const std::string& node) {
  if (!status.ok()) return {};
  for (const v1::AgentPeer& peer : status->agent().peers()) {
    if (peer.node() == node) return peer;
  }
  return {};
}

// Stage `name` of `status`'s call_latency, or an empty one.
v1::CallLatency StageOf(const absl::StatusOr<v1::StatusResponse>& status, const std::string& name) {
  if (!status.ok()) return {};
  for (const v1::CallLatency& stage : status->call_latency()) {
    if (stage.stage() == name) return stage;
  }
  return {};
}

// Daemons node0 and node1 (tests/testing/daemon_nodes.h).
class DataPlaneStatusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(nodes_.StartAll());
    init_method_ = nodes_.init_method();
  }

  std::unique_ptr<Client> Connect(int i) { return nodes_.Connect(i); }

  // Joins `client` as `name` to the two-member group `group`.
  absl::Status Join(Client* client, const std::string& name, int64_t rank,
                    const std::string& group = "g") {
    JoinOptions options;
    options.group = group;
    options.name = name;
    options.rank = rank;
    options.world_size = 2;
    options.init_method = init_method_;
    options.timeout = absl::Seconds(30);
    return client->Join(options).status();
  }

  // a (on node0) and b (on node1) in static group "g"; b handles "echo", "nap" (50 ms) and
  // "sleep" (3 s).
  void StartPair() {
    a_ = Connect(0);
    b_ = Connect(1);
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    ASSERT_TRUE(b_->Handle("echo", [](const Message& request) -> absl::StatusOr<Message> {
                    return request;
                  }).ok());
    ASSERT_TRUE(b_->Handle("nap", [](const Message& request) -> absl::StatusOr<Message> {
                    absl::SleepFor(kNap);
                    return request;
                  }).ok());
    ASSERT_TRUE(b_->Handle("sleep", [](const Message& request) -> absl::StatusOr<Message> {
                    absl::SleepFor(absl::Seconds(3));
                    return request;
                  }).ok());
    auto joined = std::async(std::launch::async, [&] { return Join(b_.get(), "b", 1); });
    ASSERT_TRUE(Join(a_.get(), "a", 0).ok());
    ASSERT_TRUE(joined.get().ok());
  }

  // c and d, both on node0, in group "l" (local calls); d handles "echo" and "nap" (50 ms).
  void StartLocalPair() {
    c_ = Connect(0);
    d_ = Connect(0);
    ASSERT_NE(c_, nullptr);
    ASSERT_NE(d_, nullptr);
    ASSERT_TRUE(d_->Handle("nap", [](const Message& request) -> absl::StatusOr<Message> {
                    absl::SleepFor(kNap);
                    return request;
                  }).ok());
    ASSERT_TRUE(d_->Handle("echo", [](const Message& request) -> absl::StatusOr<Message> {
                    return request;
                  }).ok());
    auto joined = std::async(std::launch::async, [&] { return Join(d_.get(), "d", 1, "l"); });
    ASSERT_TRUE(Join(c_.get(), "c", 0, "l").ok());
    ASSERT_TRUE(joined.get().ok());
  }

  testing::ProcessResult Tpctl(int i) {
    return RunProcess({RunfilePath("client/tpctl"), "--socket", nodes_.socket(i), "status"});
  }

  testing::DaemonNodes nodes_{{"node0", "node1"}, [](int) {
                                return absl::StrCat(
                                    "heartbeat_interval_ms = 200\nheartbeat_timeout_ms = 2000\n",
                                    "[data]\narena_bytes = ", kArenaBytes, "\n");
                              }};
  std::string init_method_;
  std::unique_ptr<Client> a_;
  std::unique_ptr<Client> b_;
  std::unique_ptr<Client> c_;
  std::unique_ptr<Client> d_;
};

TEST_F(DataPlaneStatusTest, AgentSectionNamesItsUrlsAndWhyEachBackendWasOrWasNotRegistered) {
  std::unique_ptr<Client> client = Connect(0);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::StatusResponse> status = client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_TRUE(status->has_agent()) << "a daemon with a peer port hosts an agent";
  const v1::AgentStatus& agent = status->agent();
  EXPECT_EQ(agent.id(), "node0");
  EXPECT_TRUE(absl::StartsWith(agent.address(), "uv://127.0.0.1:"))
      << agent.address() << ": uv, the lowest priority, comes first";
  EXPECT_EQ(agent.peers_size(), 0) << "no call has been made yet";
  EXPECT_EQ(agent.auth_failures(), 0u);
  EXPECT_EQ(agent.calls_pending(), 0u);

  const v1::AgentBackend* uv = FindBackend(agent.transports(), "uv");
  ASSERT_NE(uv, nullptr);
  EXPECT_TRUE(uv->registered());
  EXPECT_EQ(uv->priority(), 0);
  const v1::AgentBackend* ibv = FindBackend(agent.transports(), "ibv");
  ASSERT_NE(ibv, nullptr) << "every known transport is listed, registered or not";
  EXPECT_FALSE(ibv->registered()) << "this machine has no InfiniBand device";
  EXPECT_FALSE(ibv->reason().empty()) << "an unregistered transport says why";
  EXPECT_EQ(ibv->priority(), 100);
  const v1::AgentBackend* basic = FindBackend(agent.channels(), "basic");
  ASSERT_NE(basic, nullptr);
  EXPECT_TRUE(basic->registered());
  for (const v1::AgentBackend& channel : agent.channels()) {
    if (!channel.registered()) {
      EXPECT_FALSE(channel.reason().empty()) << channel.name() << " says why it is unregistered";
    }
  }

  const testing::ProcessResult tpctl = Tpctl(0);
  EXPECT_EQ(tpctl.exit_code, 0) << tpctl.output;
  EXPECT_THAT(tpctl.output, HasSubstr(absl::StrCat("agent:   node0 at ", agent.address())));
  EXPECT_THAT(tpctl.output, HasSubstr("transport ibv"));
  EXPECT_THAT(tpctl.output, HasSubstr(absl::StrCat("100  not registered: ", ibv->reason())));
  EXPECT_THAT(tpctl.output, HasSubstr("transport uv"));
  EXPECT_THAT(tpctl.output, HasSubstr("channel   basic"));
}

TEST_F(DataPlaneStatusTest, CallerCountsTheCallSentAndCalleeCountsItReceived) {
  StartPair();
  const std::string payload(4096, 'x');
  absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", payload);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, payload);

  // Counters settle when TensorPipe reports the writes done, which may come after the reply.
  absl::StatusOr<v1::StatusResponse> caller;
  ASSERT_TRUE(WaitUntil([&] {
    caller = a_->Status();
    const v1::AgentPeer peer = PeerOf(caller, "node1");
    return peer.calls_sent() >= 1 && peer.bytes_sent() >= payload.size() &&
           peer.bytes_received() >= payload.size();
  })) << caller->DebugString();
  const v1::AgentPeer to_b = PeerOf(caller, "node1");
  EXPECT_EQ(to_b.pipe_state(), "ready");
  EXPECT_FALSE(to_b.address().empty());
  EXPECT_FALSE(to_b.transport().empty()) << "the transport TensorPipe chose is shown";
  EXPECT_FALSE(to_b.channel().empty());
  EXPECT_EQ(to_b.calls_pending(), 0u);
  EXPECT_EQ(to_b.errors(), 0u);
  EXPECT_TRUE(to_b.last_error().empty()) << to_b.last_error();

  absl::StatusOr<v1::StatusResponse> callee;
  ASSERT_TRUE(WaitUntil([&] {
    callee = b_->Status();
    const v1::AgentPeer peer = PeerOf(callee, "node0");
    return peer.calls_received() >= 1 && peer.bytes_received() >= payload.size();
  })) << callee->DebugString();
  const v1::AgentPeer from_a = PeerOf(callee, "node0");
  EXPECT_GE(from_a.inbound_pipes(), 1) << "node0 opened the pipe the call came on";
  EXPECT_EQ(from_a.transport(), to_b.transport()) << "both ends name the same choice";
  EXPECT_EQ(from_a.channel(), to_b.channel());
  // Each side shows what the other offered, which says why the others were not chosen.
  EXPECT_THAT(to_b.peer_transports(), ::testing::Contains(to_b.transport()));
  EXPECT_THAT(to_b.peer_channels(), ::testing::Contains(to_b.channel()));
  EXPECT_THAT(from_a.peer_transports(), ::testing::Contains(to_b.transport()));
  EXPECT_THAT(to_b.peer_transports(), ::testing::Not(::testing::Contains("ibv")));

  // Each session is listed with its call fields (the rx heap is data.arena_bytes).
  ASSERT_EQ(caller->attached_sessions_size(), 1);
  EXPECT_EQ(caller->attached_sessions(0).calls_in_flight(), 0);
  EXPECT_EQ(caller->attached_sessions(0).rx_heap_bytes(), static_cast<uint64_t>(kArenaBytes));

  const testing::ProcessResult tpctl = Tpctl(0);
  EXPECT_EQ(tpctl.exit_code, 0) << tpctl.output;
  EXPECT_THAT(tpctl.output,
              HasSubstr(absl::StrCat("peer node1: pipe ready, ", to_b.inbound_pipes(), " inbound; ",
                                     to_b.transport(), "/", to_b.channel(), "; calls sent ",
                                     to_b.calls_sent())));
  EXPECT_THAT(tpctl.output, HasSubstr("0 calls in flight, rx heap "));
  EXPECT_THAT(tpctl.output, HasSubstr("it offers transports "));
}

TEST_F(DataPlaneStatusTest, CallAwaitingItsReplyIsPendingOnTheAgentAndInFlightOnItsSession) {
  StartPair();
  auto call = std::async(std::launch::async, [&] { return a_->Call("g", "b", "sleep", "zz"); });
  absl::StatusOr<v1::StatusResponse> status;
  ASSERT_TRUE(WaitUntil([&] {
    status = a_->Status();
    return status.ok() && status->agent().calls_pending() == 1 &&
           status->attached_sessions_size() == 1 &&
           status->attached_sessions(0).calls_in_flight() == 1;
  })) << status->DebugString();
  EXPECT_EQ(PeerOf(status, "node1").calls_pending(), 1u);
  const testing::ProcessResult tpctl = Tpctl(0);
  EXPECT_THAT(tpctl.output, HasSubstr("1 calls in flight"));
  EXPECT_THAT(tpctl.output, HasSubstr("pending 1;"));

  ASSERT_TRUE(call.get().ok());
  // The reply sits in a's rx heap until a's engine releases it; then nothing is pending.
  EXPECT_TRUE(WaitUntil([&] {
    status = a_->Status();
    return status.ok() && status->agent().calls_pending() == 0 &&
           status->attached_sessions_size() == 1 &&
           status->attached_sessions(0).calls_in_flight() == 0;
  })) << status->DebugString();
}

TEST_F(DataPlaneStatusTest, CallLatencyCountsEachStageAndShowsWhereAHandlersTimeWent) {
  StartPair();
  ASSERT_NO_FATAL_FAILURE(StartLocalPair());  // local calls too
  Client* c = c_.get();

  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a_->Call("g", "b", "echo", "x").ok());
    ASSERT_TRUE(c->Call("l", "d", "echo", "x").ok());
  }
  ASSERT_TRUE(a_->Call("g", "b", "nap", "x").ok());
  ASSERT_TRUE(c->Call("l", "d", "nap", "x").ok());

  // The last stage of a call is counted just after its reply is posted: wait for it.
  absl::StatusOr<v1::StatusResponse> node0;
  ASSERT_TRUE(WaitUntil([&] {
    node0 = a_->Status();
    return StageOf(node0, "remote.total").count() == 4 &&
           StageOf(node0, "local.total").count() == 4;
  })) << node0->DebugString();
  const int64_t nap_us = absl::ToInt64Microseconds(kNap);
  for (const char* name : {"local.deliver", "local.callee", "local.reply", "local.total",
                           "remote.send", "remote.wait", "remote.post", "remote.total"}) {
    const v1::CallLatency stage = StageOf(node0, name);
    EXPECT_EQ(stage.count(), 4u) << name;
    uint64_t in_buckets = 0;
    for (const v1::LatencyBucket& bucket : stage.buckets()) in_buckets += bucket.count();
    EXPECT_EQ(in_buckets, stage.count()) << name;
    EXPECT_LE(stage.p50_us(), stage.p99_us()) << name;
    EXPECT_LE(stage.p99_us(), stage.max_us()) << name;
    EXPECT_GT(stage.max_us(), 0) << name;
  }
  // The handler's nap is in the stages that hold the callee's turn, and in the totals.
  EXPECT_GE(StageOf(node0, "local.callee").max_us(), nap_us);
  EXPECT_GE(StageOf(node0, "local.total").max_us(), nap_us);
  EXPECT_GE(StageOf(node0, "remote.wait").max_us(), nap_us);
  EXPECT_GE(StageOf(node0, "remote.total").max_us(), nap_us);
  EXPECT_EQ(StageOf(node0, "inbound.deliver").count(), 0u) << "node0 served no remote call";

  absl::StatusOr<v1::StatusResponse> node1;
  ASSERT_TRUE(WaitUntil([&] {
    node1 = b_->Status();
    return StageOf(node1, "inbound.respond").count() == 4;
  })) << node1->DebugString();
  EXPECT_EQ(StageOf(node1, "inbound.deliver").count(), 4u);
  EXPECT_EQ(StageOf(node1, "inbound.callee").count(), 4u);
  EXPECT_GE(StageOf(node1, "inbound.callee").max_us(), nap_us);
  EXPECT_EQ(StageOf(node1, "local.total").count(), 0u) << "node1 served no local call";

  const testing::ProcessResult tpctl = Tpctl(0);
  EXPECT_EQ(tpctl.exit_code, 0) << tpctl.output;
  EXPECT_THAT(tpctl.output, HasSubstr("call latency (us, since start):"));
  EXPECT_THAT(tpctl.output, ::testing::ContainsRegex("remote.wait +4 "));
  EXPECT_THAT(tpctl.output, ::testing::ContainsRegex("local.callee +4 "));
}

// A hop that finds the other side asleep is counted on both ends: the client's reader slept and
// the daemon woke it; the daemon's thread slept and the client's submission woke it.
TEST_F(DataPlaneStatusTest, WakeUpsCountTheHopsThatFoundTheOtherSideAsleep) {
  ASSERT_NO_FATAL_FAILURE(StartLocalPair());
  Client* c = c_.get();
  Client* d = d_.get();

  // Idle far past every spin window (at most 100 µs), so d's reader and both session threads
  // sleep; during the handler's nap, c's reader sleeps too.
  absl::SleepFor(kNap);
  ASSERT_TRUE(c->Call("l", "d", "nap", "x").ok());

  const CallEngineStats caller = *c->GetCallStats();
  const CallEngineStats callee = *d->GetCallStats();
  EXPECT_GE(callee.reader_sleeps, 1u) << "d's reader waited 50 ms for the call";
  EXPECT_GE(caller.reader_sleeps, 1u) << "c's reader waited 50 ms for the reply";
  EXPECT_GE(caller.daemon_wakeups + callee.daemon_wakeups, 1u)
      << "the daemon's session threads were asleep when the call and its reply came";

  absl::StatusOr<v1::StatusResponse> status = c->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  uint64_t reader_wakeups = 0;
  uint64_t daemon_sleeps = 0;
  for (const v1::AttachedSession& session : status->attached_sessions()) {
    reader_wakeups += session.reader_wakeups();
    daemon_sleeps += session.daemon_sleeps();
  }
  EXPECT_GE(reader_wakeups, 1u) << status->DebugString();
  EXPECT_GE(daemon_sleeps, 2u) << "each session's thread slept while idle: "
                               << status->DebugString();

  const testing::ProcessResult tpctl = Tpctl(0);
  EXPECT_EQ(tpctl.exit_code, 0) << tpctl.output;
  EXPECT_THAT(tpctl.output, ::testing::ContainsRegex("[0-9]+ wake-ups of its reader, [0-9]+ "
                                                     "sleeps of its daemon thread"));
}

}  // namespace
}  // namespace tpd
