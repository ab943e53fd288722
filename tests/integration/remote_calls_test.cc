// Calls between client processes of two daemons (docs/data_plane.md, "Calls between nodes"):
// each daemon is a real process with its peer port and agent on loopback, the clients use the
// public client API, and every byte crosses a real TensorPipe pipe between the daemons.
// Payload and tensors (0..64, 0 B..64 MiB, checksummed) both ways, concurrent calls in both
// directions matched to their replies, NOT_FOUND, a remote handler's error with its code,
// DEADLINE_EXCEEDED, and the faults of FAULTS.md: a peer daemon SIGKILLed mid-call (D1:
// UNAVAILABLE naming the node well before the call's deadline, calls again once it is back),
// SIGTERMed mid-call (D3: the call in flight is answered, new ones are refused naming the
// node, exit 0), a client process SIGKILLed as callee and as caller of a large transfer (C1:
// its peer's call fails fast naming it, the daemons free its shared memory and serve on), and
// 1 ms deadlines under load (C4).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_nodes.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/proc_counts.h"
#include "tests/testing/test_bytes.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using ::testing::AnyOf;
using testing::Checksum;
using ::testing::HasSubstr;
using testing::Pattern;

// Replies with the request's payload, "|", each tensor's checksum, and the tensors themselves.
absl::StatusOr<Message> Echo(const Message& request) {
  Message reply = request;
  std::string sums;
  for (const Tensor& t : request.tensors) absl::StrAppend(&sums, Checksum(t.data()), ",");
  reply.payload = absl::StrCat(request.payload, "|", sums);
  return reply;
}

// Session segments ("/memfd:tpd-session", one inode each, maybe several mappings) mapped in
// process `pid`.
int SessionMappings(pid_t pid) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::set<std::string> inodes;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:tpd-session") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode;
    fields >> range >> perms >> offset >> dev >> inode;
    inodes.insert(inode);
  }
  return static_cast<int>(inodes.size());
}

class RemoteCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(nodes_.StartAll());
    init_method_ = nodes_.init_method();
  }

  std::unique_ptr<Client> Connect(int i) { return nodes_.Connect(i); }

  // Joins `name` with `rank` into static group `group` of `world`; call from as many threads.
  absl::Status Join(Client* client, const std::string& group, const std::string& name, int64_t rank,
                    int64_t world) {
    JoinOptions options;
    options.group = group;
    options.name = name;
    options.rank = rank;
    options.world_size = world;
    options.init_method = init_method_;
    options.timeout = absl::Seconds(30);
    return client->Join(options).status();
  }

  // a (on node0) and b (on node1) in static group "g", both handling "echo".
  void StartPair() {
    a_ = Connect(0);
    b_ = Connect(1);
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    for (Client* c : {a_.get(), b_.get()}) {
      ASSERT_TRUE(c->Handle("echo", Echo).ok());
      ASSERT_TRUE(c->Handle("fail", [](const Message&) -> absl::StatusOr<Message> {
                     return absl::FailedPreconditionError("the handler refuses");
                   }).ok());
      ASSERT_TRUE(c->Handle("sleep", [](const Message& request) -> absl::StatusOr<Message> {
                     absl::SleepFor(absl::Seconds(3));
                     return request;
                   }).ok());
    }
    auto joined = std::async(std::launch::async, [&] { return Join(b_.get(), "g", "b", 1, 2); });
    ASSERT_TRUE(Join(a_.get(), "g", "a", 0, 2).ok());
    ASSERT_TRUE(joined.get().ok());
  }

  // Runs this binary again (a fresh process, not a fork of one with gRPC threads) as
  // RemoteVictim.Run in `mode` on daemon `i`; returns its pid once it has joined group "v" as
  // "victim" (rank 1 of 2; the caller joins rank 0 with JoinVictimGroup).
  pid_t StartVictim(int i, const std::string& mode) {
    int ready[2];
    EXPECT_EQ(pipe(ready), 0);
    const std::string socket_env = absl::StrCat("TPD_REMOTE_VICTIM=", nodes_.socket(i));
    const std::string mode_env = absl::StrCat("TPD_REMOTE_VICTIM_MODE=", mode);
    const std::string init_env = absl::StrCat("TPD_REMOTE_VICTIM_INIT=", init_method_);
    const std::string fd_env = absl::StrCat("TPD_REMOTE_VICTIM_FD=", ready[1]);
    const pid_t child = fork();
    if (child == 0) {
      close(ready[0]);
      char* argv[] = {const_cast<char*>("remote_calls_test"),
                      const_cast<char*>("--gtest_filter=RemoteVictim.Run"), nullptr};
      char* envp[] = {const_cast<char*>(socket_env.c_str()), const_cast<char*>(mode_env.c_str()),
                      const_cast<char*>(init_env.c_str()), const_cast<char*>(fd_env.c_str()),
                      nullptr};
      execve("/proc/self/exe", argv, envp);
      _exit(127);
    }
    close(ready[1]);
    victim_ready_fd_ = ready[0];
    return child;
  }

  // Joins a_ as rank 0 of group "v" beside the victim, then waits for the victim's signal.
  void JoinVictimGroup() {
    ASSERT_TRUE(Join(a_.get(), "v", "a", 0, 2).ok());
    char byte = 0;
    ASSERT_EQ(read(victim_ready_fd_, &byte, 1), 1) << "the victim never got ready";
    close(victim_ready_fd_);
  }

  int victim_ready_fd_ = -1;
  // Appended to both daemons' config (an [agent] table), set before SetUp.
  std::string agent_config_;
  testing::DaemonNodes nodes_{
      {"node0", "node1"}, [this](int) {
        return absl::StrCat("heartbeat_interval_ms = 200\nheartbeat_timeout_ms = 2000\n",
                            "[data]\narena_bytes = ", int64_t{256} << 20, "\n", agent_config_);
      }};
  std::string init_method_;
  std::unique_ptr<Client> a_;
  std::unique_ptr<Client> b_;
};

TEST_F(RemoteCallsTest, PayloadOnlyCallsCrossBothWays) {
  StartPair();
  absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", "hello from a");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, "hello from a|");
  reply = b_->Call("g", "a", "echo", "hello from b");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, "hello from b|");
}

TEST_F(RemoteCallsTest, GroupIsOfferedOnlyWhatTheAgentsRegistered) {
  StartPair();
  absl::StatusOr<v1::GroupView> view = a_->GetGroup("g", init_method_);
  ASSERT_TRUE(view.ok()) << view.status();
  // No InfiniBand and no GPU here, and shm is left out unless named: uv and the CPU channels.
  EXPECT_THAT(view->transports(), ::testing::ElementsAre("uv"));
  EXPECT_THAT(view->channels(), ::testing::ElementsAre("cma", "mpt_uv", "basic"));
  for (const v1::Member& member : view->members()) {
    EXPECT_THAT(member.agent_address(), ::testing::StartsWith("uv://127.0.0.1:")) << member.name();
  }
}

TEST_F(RemoteCallsTest, TensorsOfManySizesArriveIntact) {
  StartPair();
  struct Case {
    int count;
    size_t bytes;
  };
  for (const Case& c : {Case{0, 0}, Case{1, 0}, Case{1, 1}, Case{3, 4096}, Case{64, 1000},
                        Case{2, size_t{8} << 20}, Case{1, size_t{64} << 20}}) {
    std::vector<Tensor> tensors;
    std::string expected_sums;
    for (int i = 0; i < c.count; ++i) {
      Tensor t(shm::DType::kUInt8, {static_cast<int64_t>(c.bytes)},
               Pattern(c.bytes, static_cast<uint32_t>(i + c.bytes)));
      absl::StrAppend(&expected_sums, Checksum(t.data()), ",");
      tensors.push_back(std::move(t));
    }
    absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", "p", tensors, absl::Seconds(60));
    ASSERT_TRUE(reply.ok()) << c.count << " x " << c.bytes << ": " << reply.status();
    EXPECT_EQ(reply->payload, absl::StrCat("p|", expected_sums));
    ASSERT_EQ(reply->tensors.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(reply->tensors[i].shape(), tensors[i].shape());
      EXPECT_EQ(Checksum(reply->tensors[i].data()), Checksum(tensors[i].data())) << i;
    }
  }
}

TEST_F(RemoteCallsTest, ConcurrentCallsBothWaysEachGetTheirOwnReply) {
  StartPair();
  std::vector<CallFuture> from_a;
  std::vector<CallFuture> from_b;
  for (int i = 0; i < 100; ++i) {
    Tensor t(shm::DType::kInt32, {i}, Pattern(4 * i, i));
    from_a.push_back(a_->CallAsync("g", "b", "echo", absl::StrCat("a", i), {t}));
    from_b.push_back(b_->CallAsync("g", "a", "echo", absl::StrCat("b", i), {t}));
  }
  for (int i = 0; i < 100; ++i) {
    const std::string sum = absl::StrCat(Checksum(Pattern(4 * i, i)), ",");
    const absl::StatusOr<Message>& ra = from_a[i].Wait();
    const absl::StatusOr<Message>& rb = from_b[i].Wait();
    ASSERT_TRUE(ra.ok()) << ra.status();
    ASSERT_TRUE(rb.ok()) << rb.status();
    EXPECT_EQ(ra->payload, absl::StrCat("a", i, "|", sum));
    EXPECT_EQ(rb->payload, absl::StrCat("b", i, "|", sum));
  }
}

TEST_F(RemoteCallsTest, ErrorsNameTheWorker) {
  StartPair();
  absl::StatusOr<Message> reply = a_->Call("g", "nobody", "echo", "");
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kNotFound) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("nobody"));

  reply = a_->Call("g", "b", "fail", "");
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("the handler refuses"));

  reply = a_->Call("g", "b", "no-such-method", "");
  EXPECT_FALSE(reply.ok());
  EXPECT_THAT(reply.status().message(), HasSubstr("no-such-method"));

  const absl::Time start = absl::Now();
  reply = a_->Call("g", "b", "sleep", "", {}, absl::Milliseconds(300));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("sleep"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));  // answered by the deadline, not the reply
  // The late reply is dropped; the next call gets its own.
  reply = a_->Call("g", "b", "echo", "after");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, "after|");
}

TEST_F(RemoteCallsTest, PeerDaemonKilledMidCallIsUnavailableNamingTheNode) {
  StartPair();
  auto pending = std::async(std::launch::async,
                            [&] { return a_->Call("g", "b", "sleep", "", {}, absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(300));  // the request is at b's handler
  const absl::Time killed = absl::Now();
  nodes_.daemon(1)->Signal(SIGKILL);
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  absl::StatusOr<Message> reply = pending.get();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("node1"));
  // Within the heartbeat window (2 s) plus slack, far from the call's 60 s.
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10));
  b_.reset();
  nodes_.Stop(1);

  // node1 restarts on the same ports; a new b joins a new group and answers again.
  ASSERT_NO_FATAL_FAILURE(nodes_.Start(1));
  b_ = Connect(1);
  ASSERT_NE(b_, nullptr);
  ASSERT_TRUE(b_->Handle("echo", Echo).ok());
  auto joined = std::async(std::launch::async, [&] { return Join(b_.get(), "g2", "b", 1, 2); });
  ASSERT_TRUE(Join(a_.get(), "g2", "a", 0, 2).ok());
  ASSERT_TRUE(joined.get().ok());
  reply = a_->Call("g2", "b", "echo", "again");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, "again|");
}

// The same calls over each transport and channel the agent registers here: uv (the default
// between daemons), shm (two daemons of one host, when named) and the CPU channels.
struct Wire {
  const char* transports;
  const char* channels;
};

class RemoteCallsWireTest : public RemoteCallsTest, public ::testing::WithParamInterface<Wire> {
 protected:
  void SetUp() override {
    agent_config_ = absl::StrCat("[agent]\ntransports = [", GetParam().transports,
                                 "]\nchannels = [", GetParam().channels, "]\n");
    RemoteCallsTest::SetUp();
  }
};

TEST_P(RemoteCallsWireTest, TensorsAndConcurrentCallsArriveIntact) {
  StartPair();
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{65536}, size_t{3} << 20}) {
    std::vector<Tensor> tensors;
    for (int i = 0; i < 3; ++i) {
      tensors.emplace_back(shm::DType::kUInt8, std::vector<int64_t>{static_cast<int64_t>(bytes)},
                           Pattern(bytes, i + 1));
    }
    absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", "w", tensors, absl::Seconds(30));
    ASSERT_TRUE(reply.ok()) << bytes << ": " << reply.status();
    ASSERT_EQ(reply->tensors.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(Checksum(reply->tensors[i].data()), Checksum(tensors[i].data())) << bytes;
    }
  }
  std::vector<CallFuture> calls;
  for (int i = 0; i < 40; ++i) {
    calls.push_back(
        (i % 2 == 0 ? a_ : b_)->CallAsync("g", i % 2 == 0 ? "b" : "a", "echo", absl::StrCat(i)));
  }
  for (int i = 0; i < 40; ++i) {
    const absl::StatusOr<Message>& reply = calls[i].Wait();
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->payload, absl::StrCat(i, "|"));
  }
}

INSTANTIATE_TEST_SUITE_P(Wires, RemoteCallsWireTest,
                         ::testing::Values(Wire{"\"uv\"", "\"basic\""},
                                           Wire{"\"uv\"", "\"mpt_uv\", \"basic\""},
                                           Wire{"\"uv\"", "\"cma\", \"basic\""},
                                           Wire{"\"shm\", \"uv\"", "\"basic\""},
                                           Wire{"\"shm\", \"uv\"", "\"cma\", \"basic\""}));

TEST_F(RemoteCallsTest, FrozenPeerDaemonIsEvictedAndItsCallsFailAtOnceNamingIt) {
  StartPair();
  auto pending = std::async(std::launch::async,
                            [&] { return a_->Call("g", "b", "sleep", "", {}, absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(300));  // the request is at b's handler
  // SIGSTOP keeps node1's sockets open (no pipe error): only the heartbeat can tell.
  const absl::Time frozen = absl::Now();
  nodes_.daemon(1)->Signal(SIGSTOP);
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  absl::StatusOr<Message> reply = pending.get();
  nodes_.daemon(1)->Signal(SIGCONT);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("node node1 was evicted"));
  // heartbeat_timeout is 2 s: answered within the window plus slack, not at the 60 s deadline.
  EXPECT_LT(absl::Now() - frozen, absl::Seconds(10));
}

TEST_F(RemoteCallsTest, DaemonsReturnToTheirBaselineAfterClientsComeAndGo) {
  StartPair();  // the pipe between the daemons exists from here on: part of the baseline
  ASSERT_TRUE(a_->Call("g", "b", "echo", "warm").ok());
  ASSERT_TRUE(b_->Call("g", "a", "echo", "warm").ok());
  testing::ProcCounts baseline[2];
  for (int i = 0; i < 2; ++i) {
    std::optional<testing::ProcCounts> settled = testing::SettledCounts(nodes_.daemon(i)->pid());
    ASSERT_TRUE(settled.has_value()) << "node" << i << "'s counts never held still";
    baseline[i] = *settled;
  }
  for (int round = 0; round < 3; ++round) {
    auto c = Connect(0);
    auto d = Connect(1);
    ASSERT_TRUE(c && d);
    ASSERT_TRUE(d->Handle("echo", Echo).ok());
    const std::string group = absl::StrCat("h", round);
    auto joined = std::async(std::launch::async, [&] { return Join(d.get(), group, "d", 1, 2); });
    ASSERT_TRUE(Join(c.get(), group, "c", 0, 2).ok());
    ASSERT_TRUE(joined.get().ok());
    const Tensor t(shm::DType::kUInt8, {1 << 20}, Pattern(1 << 20, round));
    std::vector<CallFuture> calls;
    for (int i = 0; i < 20; ++i) calls.push_back(c->CallAsync(group, "d", "echo", "x", {t}));
    for (CallFuture& call : calls) ASSERT_TRUE(call.Wait().ok()) << call.Wait().status();
  }
  // Sessions, their threads, segments and fds are gone again on both daemons.
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(
        testing::BackToBaseline(nodes_.daemon(i)->pid(), baseline[i], "", absl::Seconds(10)))
        << "node" << i;
  }
}

TEST_F(RemoteCallsTest, PeerDaemonStoppedMidCallAnswersItRefusesNewOnesAndExitsZero) {
  StartPair();
  auto pending = std::async(std::launch::async, [&] {
    return a_->Call("g", "b", "sleep", "drained", {}, absl::Seconds(30));
  });
  absl::SleepFor(absl::Milliseconds(300));  // the request is at b's handler
  nodes_.daemon(1)->Signal(SIGTERM);
  absl::SleepFor(absl::Milliseconds(300));  // node1 is draining
  absl::StatusOr<Message> refused = a_->Call("g", "b", "echo", "late", {}, absl::Seconds(10));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("node1"));
  absl::StatusOr<Message> reply = pending.get();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, "drained");
  EXPECT_EQ(nodes_.daemon(1)->WaitExit(absl::Seconds(20)), 0);
}

// The victim of the C1 tests: this binary run again by StartVictim. Mode "callee" handles
// "hang" forever; mode "caller" calls a's "echo" with a 256 MiB tensor until it is killed.
TEST(RemoteVictim, Run) {
  const char* socket = getenv("TPD_REMOTE_VICTIM");
  if (socket == nullptr) GTEST_SKIP() << "only run as the victim of the C1 tests";
  const std::string mode = getenv("TPD_REMOTE_VICTIM_MODE");
  const int ready = atoi(getenv("TPD_REMOTE_VICTIM_FD"));
  auto client = Client::Connect(socket);
  if (!client.ok()) _exit(2);
  if (!(*client)
           ->Handle("hang",
                    [](const Message&) -> absl::StatusOr<Message> {
                      absl::SleepFor(absl::Hours(1));
                      return Message{};
                    })
           .ok()) {
    _exit(3);
  }
  JoinOptions options;
  options.group = "v";
  options.name = "victim";
  options.rank = 1;
  options.world_size = 2;
  options.init_method = getenv("TPD_REMOTE_VICTIM_INIT");
  options.timeout = absl::Seconds(30);
  if (!(*client)->Join(options).ok()) _exit(4);
  char byte = 1;
  (void)!write(ready, &byte, 1);
  if (mode == "caller") {
    Tensor big(shm::DType::kUInt8, {int64_t{256} << 20}, std::string(size_t{256} << 20, 'Z'));
    for (;;) (void)(*client)->Call("v", "a", "echo", "", {big}, absl::Seconds(60));
  }
  absl::SleepFor(absl::Hours(1));
  _exit(0);
}

TEST_F(RemoteCallsTest, CalleeProcessKilledMidCallFailsTheCallerFastNamingIt) {
  const int baseline = SessionMappings(nodes_.daemon(1)->pid());
  a_ = Connect(0);
  ASSERT_NE(a_, nullptr);
  ASSERT_TRUE(a_->Handle("echo", Echo).ok());
  const pid_t victim = StartVictim(1, "callee");
  JoinVictimGroup();
  EXPECT_EQ(SessionMappings(nodes_.daemon(1)->pid()), baseline + 1);
  std::thread killer([victim] {
    absl::SleepFor(absl::Milliseconds(300));
    kill(victim, SIGKILL);
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<Message> reply = a_->Call("v", "victim", "hang", "x", {}, absl::Seconds(30));
  killer.join();
  waitpid(victim, nullptr, 0);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("'victim'"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // node1 unmapped the victim's shared memory and serves on.
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return SessionMappings(nodes_.daemon(1)->pid()) == baseline; }, absl::Seconds(10)));
  auto b = Connect(1);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(b->Serving().value_or(false));
}

TEST_F(RemoteCallsTest, CallerProcessKilledMidLargeTransferLeavesNothingBehind) {
  const int baseline = SessionMappings(nodes_.daemon(1)->pid());
  std::atomic<int> received{0};
  a_ = Connect(0);
  ASSERT_NE(a_, nullptr);
  ASSERT_TRUE(a_->Handle("echo", [&](const Message& request) -> absl::StatusOr<Message> {
                  ++received;
                  return Message{request.payload, {}, ""};
                }).ok());
  const pid_t victim = StartVictim(1, "caller");
  JoinVictimGroup();
  // Kill it while its 256 MiB tensors are on their way (the first takes a while here).
  absl::SleepFor(absl::Milliseconds(400));
  kill(victim, SIGKILL);
  waitpid(victim, nullptr, 0);
  // Both daemons serve on; node1 lets go of the victim's memory once TensorPipe is done
  // reading it; a fresh client of node1 calls a as usual.
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return SessionMappings(nodes_.daemon(1)->pid()) == baseline; }, absl::Seconds(20)));
  b_ = Connect(1);
  ASSERT_NE(b_, nullptr);
  ASSERT_TRUE(b_->Handle("echo", Echo).ok());
  auto joined = std::async(std::launch::async, [&] { return Join(b_.get(), "g", "b", 1, 2); });
  ASSERT_TRUE(Join(a_.get(), "g", "a", 0, 2).ok());
  ASSERT_TRUE(joined.get().ok());
  absl::StatusOr<Message> reply = b_->Call("g", "a", "echo", "after the kill");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, "after the kill");
}

TEST_F(RemoteCallsTest, OneMillisecondDeadlinesUnderLoadEndEveryCallOnce) {
  StartPair();
  const Tensor t(shm::DType::kUInt8, {1 << 20}, Pattern(1 << 20, 7));
  std::atomic<int> ok{0};
  std::atomic<int> late{0};
  std::atomic<int> other{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < 50; ++i) {
        const absl::Duration timeout = i % 2 == 0 ? absl::Milliseconds(1) : absl::Seconds(30);
        absl::StatusOr<Message> reply = (th % 2 == 0 ? a_ : b_)
                                            ->Call("g", th % 2 == 0 ? "b" : "a", "echo",
                                                   absl::StrCat(th, "/", i), {t}, timeout);
        if (reply.ok() &&
            reply->payload == absl::StrCat(th, "/", i, "|", Checksum(t.data()), ",")) {
          ++ok;
        } else if (reply.status().code() == absl::StatusCode::kDeadlineExceeded) {
          ++late;
        } else {
          ++other;
          ADD_FAILURE() << reply.status();
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(other, 0);
  EXPECT_EQ(ok + late, 200);
  EXPECT_GE(ok, 100);  // every call with a 30 s timeout
  // Nothing is stuck: both sides still call each other.
  absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", "still");
  ASSERT_TRUE(reply.ok()) << reply.status();
  reply = b_->Call("g", "a", "echo", "still");
  ASSERT_TRUE(reply.ok()) << reply.status();
}

}  // namespace
}  // namespace tpd
