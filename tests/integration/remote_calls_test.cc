// Calls between client processes of two daemons (docs/data_plane.md, "Calls between nodes"):
// each daemon is a real process with its peer port and agent on loopback, the clients use the
// public client API, and every byte crosses a real TensorPipe pipe between the daemons.
// Payload and tensors (0..64, 0 B..64 MiB, checksummed) both ways, concurrent calls in both
// directions matched to their replies, NOT_FOUND, a remote handler's error with its code,
// DEADLINE_EXCEEDED, and a peer daemon SIGKILLed mid-call (FAULTS D1): UNAVAILABLE naming
// the node well before the call's deadline, and calls again once it is back.

#include <signal.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"

namespace tpd {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using testing::DaemonProcess;
using testing::TempDir;

uint64_t Checksum(absl::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    s[i] = static_cast<char>(x >> 24);
  }
  return s;
}

// Replies with the request's payload, "|", each tensor's checksum, and the tensors themselves.
absl::StatusOr<Message> Echo(const Message& request) {
  Message reply = request;
  std::string sums;
  for (const Tensor& t : request.tensors) absl::StrAppend(&sums, Checksum(t.data), ",");
  reply.payload = absl::StrCat(request.payload, "|", sums);
  return reply;
}

class RemoteCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StartDaemon(0);
    StartDaemon(1);
    init_method_ = absl::StrCat("tcp://", PeerAddress(0));
  }

  void StartDaemon(int i) {
    sockets_[i] = absl::StrCat(dirs_[i].path(), "/tpd.sock");
    const std::string config = dirs_[i].WriteFile(
        "tpd.toml",
        absl::StrCat("[peer]\nlisten_address = \"127.0.0.1:", ports_[i], "\"\n",
                     "token = \"secret\"\nnode_name = \"node", i, "\"\n",
                     "heartbeat_interval_ms = 200\nheartbeat_timeout_ms = 2000\n",
                     "[data]\narena_bytes = ", int64_t{256} << 20, "\n"));
    auto daemon = DaemonProcess::Start(sockets_[i], {"--config", config});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemons_[i] = *std::move(daemon);
    if (ports_[i] == 0) {
      const std::string peer = PeerAddress(i);
      ports_[i] = std::stoi(peer.substr(peer.rfind(':') + 1));
    }
  }

  std::string PeerAddress(int i) {
    auto client = Client::Connect(sockets_[i]);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? (*client)->Status()->peer_address() : "";
  }

  std::unique_ptr<Client> Connect(int i) {
    auto client = Client::Connect(sockets_[i]);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Joins `name` with `rank` into static group `group` of `world`; call from as many threads.
  absl::Status Join(Client* client, const std::string& group, const std::string& name,
                    int64_t rank, int64_t world) {
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

  TempDir dirs_[2];
  std::string sockets_[2];
  int ports_[2] = {0, 0};
  std::string init_method_;
  std::unique_ptr<DaemonProcess> daemons_[2];
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
      Tensor t;
      t.dtype = shm::DType::kUInt8;
      t.shape = {static_cast<int64_t>(c.bytes)};
      t.data = Pattern(c.bytes, static_cast<uint32_t>(i + c.bytes));
      absl::StrAppend(&expected_sums, Checksum(t.data), ",");
      tensors.push_back(std::move(t));
    }
    absl::StatusOr<Message> reply =
        a_->Call("g", "b", "echo", "p", tensors, absl::Seconds(60));
    ASSERT_TRUE(reply.ok()) << c.count << " x " << c.bytes << ": " << reply.status();
    EXPECT_EQ(reply->payload, absl::StrCat("p|", expected_sums));
    ASSERT_EQ(reply->tensors.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(reply->tensors[i].shape, tensors[i].shape);
      EXPECT_EQ(Checksum(reply->tensors[i].data), Checksum(tensors[i].data)) << i;
    }
  }
}

TEST_F(RemoteCallsTest, ConcurrentCallsBothWaysEachGetTheirOwnReply) {
  StartPair();
  std::vector<std::future<absl::StatusOr<Message>>> from_a;
  std::vector<std::future<absl::StatusOr<Message>>> from_b;
  for (int i = 0; i < 100; ++i) {
    Tensor t;
    t.dtype = shm::DType::kInt32;
    t.shape = {i};
    t.data = Pattern(4 * i, i);
    from_a.push_back(a_->CallAsync("g", "b", "echo", absl::StrCat("a", i), {t}));
    from_b.push_back(b_->CallAsync("g", "a", "echo", absl::StrCat("b", i), {t}));
  }
  for (int i = 0; i < 100; ++i) {
    const std::string sum = absl::StrCat(Checksum(Pattern(4 * i, i)), ",");
    absl::StatusOr<Message> ra = from_a[i].get();
    absl::StatusOr<Message> rb = from_b[i].get();
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
  auto pending = std::async(std::launch::async, [&] {
    return a_->Call("g", "b", "sleep", "", {}, absl::Seconds(60));
  });
  absl::SleepFor(absl::Milliseconds(300));  // the request is at b's handler
  const absl::Time killed = absl::Now();
  daemons_[1]->Signal(SIGKILL);
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  absl::StatusOr<Message> reply = pending.get();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("node1"));
  // Within the heartbeat window (2 s) plus slack, far from the call's 60 s.
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10));
  b_.reset();
  daemons_[1].reset();

  // node1 restarts on the same ports; a new b joins a new group and answers again.
  StartDaemon(1);
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

}  // namespace
}  // namespace tpd
