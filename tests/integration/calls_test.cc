// Calls between two clients of one daemon through shared memory (docs/data_plane.md, "Calls on
// one node"), against the real daemon: payload and tensors (0..8, 0 B..8 MiB, checksummed)
// there and back, 100 concurrent calls matched to their replies, NOT_FOUND for an unknown
// worker, DEADLINE_EXCEEDED, UNAVAILABLE when the callee's process is killed mid-call, and
// garbage descriptors answered INVALID_ARGUMENT or ending only their own session (FAULTS C3).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/shm/descriptor.h"
#include "proto/shm/message.h"
#include "proto/shm/ring.h"
#include "tests/testing/daemon_process.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;
using testing::DaemonProcess;
using testing::TempDir;

uint64_t Checksum(const std::string& bytes) {
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

class CallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = absl::StrCat(dir_.path(), "/tpd.sock");
    const std::string config = dir_.WriteFile(
        "tpd.toml", absl::StrCat("[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"secret\"\n",
                                 "node_name = \"calls\"\n[data]\narena_bytes = ", arena_bytes_,
                                 "\n"));
    auto daemon = DaemonProcess::Start(socket_, {"--config", config});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
  }

  std::unique_ptr<Client> Connect() {
    auto client = Client::Connect(socket_);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::string InitMethod(Client* client) {
    if (init_method_.empty()) init_method_ = absl::StrCat("tcp://", client->Status()->peer_address());
    return init_method_;
  }

  absl::Status Join(Client* client, const std::string& name) {
    JoinOptions options;
    options.group = "g";
    options.name = name;
    options.init_method = InitMethod(client);
    options.timeout = absl::Seconds(30);
    return client->Join(options).status();
  }

  // Connects a ("a") and b ("b", handling "echo" and "sleep") in group g.
  void StartPair() {
    a_ = Connect();
    b_ = Connect();
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    ASSERT_TRUE(Join(a_.get(), "a").ok());
    ASSERT_TRUE(Join(b_.get(), "b").ok());
    ASSERT_TRUE(b_->Handle("echo", [](const Message& request) -> absl::StatusOr<Message> {
                     Message reply = request;
                     std::string sums;
                     for (const Tensor& t : request.tensors) absl::StrAppend(&sums, Checksum(t.data), ",");
                     reply.payload = absl::StrCat(request.payload, "|", sums);
                     return reply;
                   }).ok());
    ASSERT_TRUE(b_->Handle("whoami", [](const Message& request) -> absl::StatusOr<Message> {
                     return Message{request.caller, {}, ""};
                   }).ok());
    ASSERT_TRUE(b_->Handle("sleep", [](const Message& request) -> absl::StatusOr<Message> {
                     absl::SleepFor(absl::Seconds(2));
                     return request;
                   }).ok());
  }

  int64_t arena_bytes_ = int64_t{64} << 20;
  TempDir dir_;
  std::string socket_;
  std::string init_method_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> a_;
  std::unique_ptr<Client> b_;
};

TEST_F(CallsTest, PayloadOnlyCallAndReply) {
  StartPair();
  absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", "hello", {}, absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, "hello|");
  EXPECT_TRUE(reply->tensors.empty());
  // And the other way, to a method b does not handle.
  ASSERT_TRUE(a_->Handle("ping", [](const Message&) -> absl::StatusOr<Message> {
                   return Message{"pong", {}, ""};
                 }).ok());
  absl::StatusOr<Message> pong = b_->Call("g", "a", "ping", "", {}, absl::Seconds(10));
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_EQ(pong->payload, "pong");
  absl::StatusOr<Message> none = b_->Call("g", "a", "nope", "", {}, absl::Seconds(10));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnimplemented) << none.status();
  EXPECT_THAT(none.status().message(), HasSubstr("nope"));
  EXPECT_THAT(none.status().message(), HasSubstr("remote: worker 'a'"));
  // The handler learns who called.
  absl::StatusOr<Message> who = a_->Call("g", "b", "whoami", "", {}, absl::Seconds(10));
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->payload, "a");
}

TEST_F(CallsTest, OnlyMembersOfTheGroupMayCallIntoIt) {
  StartPair();
  std::unique_ptr<Client> outsider = Connect();
  ASSERT_NE(outsider, nullptr);
  absl::StatusOr<Message> reply = outsider->Call("g", "b", "echo", "x", {}, absl::Seconds(10));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("'g'"));
}

TEST_F(CallsTest, TensorsOfManySizesArriveIntact) {
  StartPair();
  const size_t sizes[] = {0, 1, 4096, 1 << 20, 8 << 20, 24, 100000};
  for (int count = 0; count <= 8; ++count) {
    std::vector<Tensor> tensors;
    std::string sums;
    for (int i = 0; i < count; ++i) {
      size_t n = sizes[(count + i) % 7];
      if (count == 8 && n == (8u << 20)) n = 1 << 20;  // keep one call within the arena
      Tensor t;
      t.dtype = shm::DType::kUInt8;
      t.shape = {static_cast<int64_t>(n)};
      t.data = Pattern(n, count * 16 + i);
      absl::StrAppend(&sums, Checksum(t.data), ",");
      tensors.push_back(std::move(t));
    }
    if (count == 1) {  // a 2-d float tensor too
      tensors[0].dtype = shm::DType::kFloat32;
      tensors[0].data = Pattern(4 * 3 * 5, 99);
      tensors[0].shape = {3, 5};
      sums = absl::StrCat(Checksum(tensors[0].data), ",");
    }
    absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", "t", tensors, absl::Seconds(30));
    ASSERT_TRUE(reply.ok()) << count << ": " << reply.status();
    EXPECT_EQ(reply->payload, absl::StrCat("t|", sums)) << count;
    ASSERT_EQ(reply->tensors.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(reply->tensors[i].dtype, tensors[i].dtype);
      EXPECT_EQ(reply->tensors[i].shape, tensors[i].shape);
      EXPECT_EQ(Checksum(reply->tensors[i].data), Checksum(tensors[i].data)) << count << "/" << i;
    }
  }
}

TEST_F(CallsTest, HundredConcurrentCallsEachGetTheirOwnReply) {
  StartPair();
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::thread> calls;
      for (int i = 0; i < 50; ++i) {
        calls.emplace_back([&, t, i] {
          const std::string payload = absl::StrCat("call-", t, "-", i);
          absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", payload, {}, absl::Seconds(30));
          if (reply.ok() && reply->payload == payload + "|") ++good;
        });
      }
      for (std::thread& call : calls) call.join();
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(good.load(), 100);
}

TEST_F(CallsTest, CallAsyncFuturesEachGetTheirOwnReply) {
  StartPair();
  std::vector<std::future<absl::StatusOr<Message>>> futures;
  for (int i = 0; i < 100; ++i) {
    futures.push_back(a_->CallAsync("g", "b", "echo", absl::StrCat("async-", i), {},
                                    absl::Seconds(30)));
  }
  std::future<absl::StatusOr<Message>> missing =
      a_->CallAsync("g", "nobody", "echo", "", {}, absl::Seconds(10));
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<Message> reply = futures[i].get();
    ASSERT_TRUE(reply.ok()) << i << ": " << reply.status();
    EXPECT_EQ(reply->payload, absl::StrCat("async-", i, "|"));
  }
  EXPECT_EQ(missing.get().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CallsTest, UnknownWorkerIsNotFoundNamingIt) {
  StartPair();
  absl::StatusOr<Message> reply = a_->Call("g", "nobody", "echo", "x", {}, absl::Seconds(10));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kNotFound) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("'nobody'"));
  EXPECT_THAT(reply.status().message(), HasSubstr("other daemons are not available"));
}

TEST_F(CallsTest, DeadlineExceededNamesWorkerMethodAndTime) {
  StartPair();
  const absl::Time start = absl::Now();
  absl::StatusOr<Message> reply = a_->Call("g", "b", "sleep", "x", {}, absl::Milliseconds(300));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("'b'"));
  EXPECT_THAT(reply.status().message(), HasSubstr("'sleep'"));
  EXPECT_THAT(reply.status().message(), HasSubstr("deadline"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // The late reply is dropped; the next call works.
  absl::SleepFor(absl::Seconds(2));
  EXPECT_TRUE(a_->Call("g", "b", "echo", "after", {}, absl::Seconds(10)).ok());
}

// The callee of CalleeKilledMidCall: this binary run again (a fresh process, not a fork of
// one with gRPC threads) with TPD_CALLS_VICTIM=<socket> and TPD_CALLS_READY_FD=<fd>.
TEST(CallsVictim, Run) {
  const char* socket = getenv("TPD_CALLS_VICTIM");
  if (socket == nullptr) GTEST_SKIP() << "only run as the victim of CalleeKilledMidCall";
  const int ready = atoi(getenv("TPD_CALLS_READY_FD"));
  auto client = Client::Connect(socket);
  if (!client.ok()) _exit(2);
  JoinOptions options;
  options.group = "g";
  options.name = "victim";
  options.init_method = absl::StrCat("tcp://", (*client)->Status()->peer_address());
  if (!(*client)->Join(options).ok()) _exit(3);
  if (!(*client)->Handle("hang", [](const Message&) -> absl::StatusOr<Message> {
                   absl::SleepFor(absl::Hours(1));
                   return Message{};
                 }).ok()) {
    _exit(4);
  }
  char byte = 1;
  (void)!write(ready, &byte, 1);
  absl::SleepFor(absl::Hours(1));
  _exit(0);
}

TEST_F(CallsTest, CalleeKilledMidCallIsUnavailableNamingIt) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const std::string socket_env = absl::StrCat("TPD_CALLS_VICTIM=", socket_);
  const std::string fd_env = absl::StrCat("TPD_CALLS_READY_FD=", ready[1]);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    char* argv[] = {const_cast<char*>("calls_test"),
                    const_cast<char*>("--gtest_filter=CallsVictim.Run"), nullptr};
    char* envp[] = {const_cast<char*>(socket_env.c_str()), const_cast<char*>(fd_env.c_str()),
                    nullptr};
    execve("/proc/self/exe", argv, envp);
    _exit(127);
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1) << "the child never got ready";
  close(ready[0]);
  StartPair();
  std::thread killer([child] {
    absl::SleepFor(absl::Milliseconds(300));
    kill(child, SIGKILL);
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<Message> reply = a_->Call("g", "victim", "hang", "x", {}, absl::Seconds(20));
  killer.join();
  waitpid(child, nullptr, 0);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("'victim'"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(CallsTest, GarbageDescriptorsFailTheirCallOrSessionAndOthersGoOn) {
  StartPair();
  std::unique_ptr<Client> bad = Connect();
  ASSERT_NE(bad, nullptr);
  auto segment = bad->AttachSharedMemory();
  ASSERT_TRUE(segment.ok()) << segment.status();
  const shm::Layout& layout = (*segment)->layout();
  shm::RingProducer submit((*segment)->base(), layout.submission, "submission ring");
  shm::RingConsumer complete((*segment)->base(), layout.completion, "completion ring");
  // A call with a reserved field set: INVALID_ARGUMENT for that call.
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(shm::Op::kCall);
  d.call_id = 7;
  d.reserved2 = 5;
  ASSERT_TRUE(submit.TryPush(d).value());
  ASSERT_TRUE(complete.WaitForData(absl::Now() + absl::Seconds(10)).value());
  shm::Descriptor answer{};
  ASSERT_TRUE(complete.TryPop(&answer).value());
  EXPECT_EQ(answer.op, static_cast<uint8_t>(shm::Op::kReply));
  EXPECT_EQ(answer.call_id, 7u);
  EXPECT_NE(answer.flags & shm::kFlagError, 0);
  ASSERT_TRUE(shm::ValidateDescriptor(answer, layout, shm::Direction::kCompletion).ok());
  auto parsed = shm::ParseMessage((*segment)->base(), answer.payload_offset, answer.payload_length);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(parsed->names[2], HasSubstr("reserved2"));
  // A well-formed call claiming to come from worker "a", which this session does not hold.
  {
    const std::string group = "g", worker = "b", method = "echo", from = "a";
    const uint64_t offset = layout.tx_heap.offset;
    shm::WriteMessagePrefix((*segment)->base() + offset, 0, group, worker, method, from);
    shm::Descriptor call{};
    call.op = static_cast<uint8_t>(shm::Op::kCall);
    call.call_id = 8;
    call.payload_offset = offset;
    call.payload_length = shm::MessagePrefixBytes(group.size(), worker.size(), method.size(),
                                                  from.size());
    ASSERT_TRUE(submit.TryPush(call).value());
    bool answered = false;
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (!answered && absl::Now() < until) {
      ASSERT_TRUE(complete.WaitForData(until).ok());
      shm::Descriptor got{};
      if (!complete.TryPop(&got).value() || got.op != static_cast<uint8_t>(shm::Op::kReply)) continue;
      answered = true;
      EXPECT_EQ(got.call_id, 8u);
      auto denied = shm::ParseMessage((*segment)->base(), got.payload_offset, got.payload_length);
      ASSERT_TRUE(denied.ok()) << denied.status();
      EXPECT_EQ(denied->code, static_cast<uint32_t>(absl::StatusCode::kPermissionDenied));
      EXPECT_THAT(denied->names[2], HasSubstr("'a'"));
    }
    EXPECT_TRUE(answered);
  }
  // Random bytes: the session ends; the daemon serves the others.
  std::string junk = Pattern(sizeof(shm::Descriptor) * 8, 42);
  for (int i = 0; i < 8; ++i) {
    std::memcpy(&d, junk.data() + i * sizeof(d), sizeof(d));
    d.call_id = 0;
    (void)submit.TryPush(d);
  }
  absl::SleepFor(absl::Milliseconds(300));
  absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", "still", {}, absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, "still|");
  EXPECT_TRUE(a_->Status().ok());
}

class SmallArenaCallsTest : public CallsTest {
 protected:
  SmallArenaCallsTest() { arena_bytes_ = 1 << 20; }
};

TEST_F(SmallArenaCallsTest, FullReceiverHeapIsResourceExhaustedNamingItsSize) {
  StartPair();
  // "hoarder" joins and attaches but never reads its completion ring nor releases anything.
  std::unique_ptr<Client> hoarder = Connect();
  ASSERT_NE(hoarder, nullptr);
  ASSERT_TRUE(Join(hoarder.get(), "hoarder").ok());
  ASSERT_TRUE(hoarder->AttachSharedMemory().ok());
  const std::string big(600 << 10, 'x');
  std::thread first([&] {
    absl::StatusOr<Message> reply = a_->Call("g", "hoarder", "m", big, {}, absl::Seconds(1));
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  });
  absl::SleepFor(absl::Milliseconds(300));  // the first call's block now sits in hoarder's rx heap
  absl::StatusOr<Message> second = b_->Call("g", "hoarder", "m", big, {}, absl::Seconds(5));
  first.join();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("rx heap"));
  EXPECT_THAT(second.status().message(), HasSubstr("1048576"));
  EXPECT_THAT(second.status().message(), HasSubstr("'hoarder'"));
  // The others go on.
  absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", "ok", {}, absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
}

}  // namespace
}  // namespace tpd
