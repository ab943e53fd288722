// A client that abuses its own shared memory, against the real daemon (FAULTS.md C3): ring
// indices, the header, the heaps and the doorbell words scribbled over, holes punched in the
// segment, completions never read, and submissions flooded. The pass criteria: the daemon never
// crashes or hangs, the other clients are served on time, the bad session's calls fail with a
// specific error or the session ends, and the daemon's fds, threads and memfds return to their
// baseline.
//
// The bad client here attaches through the library (Client::AttachSharedMemory) but never
// starts its call engine (no Handle or Call), so nothing of this process reads its rings but
// the test: it drives them by hand (RingProducer/RingConsumer) and scribbles through a
// writable mapping of the segment's memfd of its own.

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/descriptor.h"
#include "shm/layout.h"
#include "shm/message.h"
#include "shm/ring.h"
#include "shm/segment.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/one_daemon.h"
#include "tests/testing/proc_counts.h"
#include "tests/testing/raw_session.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using ::testing::AnyOf;
using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::ProcCounts;
using testing::TempDir;
using testing::WaitUntil;

constexpr int64_t kArenaBytes = 1 << 20;

void Scribble(uint8_t* at, size_t n, std::mt19937_64& gen) {
  for (size_t i = 0; i < n; ++i) at[i] = static_cast<uint8_t>(gen());
}

// A session attached by the library whose rings the test drives by hand.
using BadSession = testing::RawSession;

class ShmHostileTest : public testing::OneDaemonTest {
 protected:
  void SetUp() override {
    testing::OneDaemonConfig config;
    config.node_name = "shm-hostile";
    config.arena_bytes = kArenaBytes;
    ASSERT_NO_FATAL_FAILURE(StartDaemon(config));
    a_ = Connect();
    b_ = Connect();
    ASSERT_TRUE(a_ && b_);
    ASSERT_TRUE(Join(a_.get(), "a").ok());
    ASSERT_TRUE(Join(b_.get(), "b").ok());
    ASSERT_TRUE(b_->Handle("echo", [](const Message& request) -> absl::StatusOr<Message> {
                    return request;
                  }).ok());
    ASSERT_TRUE(a_->Call("g", "b", "echo", "warm", {}, absl::Seconds(10)).ok());
    ExpectServing();
    // The fresh client of ExpectServing is still going away.
    std::optional<ProcCounts> settled = testing::SettledCounts(daemon_->pid());
    ASSERT_TRUE(settled.has_value()) << "the daemon's counts never held still";
    baseline_ = *settled;
    baseline_threads_ = testing::DescribeThreadsAndMemfds(daemon_->pid());
  }

  void TearDown() override {
    if (daemon_ == nullptr) return;
    ExpectServing();
    EXPECT_TRUE(testing::BackToBaseline(daemon_->pid(), baseline_, baseline_threads_));
  }

  // A client joined as `name`, attached, with its rings in the test's hands.
  std::unique_ptr<BadSession> Bad(const std::string& name) {
    std::unique_ptr<Client> client = Connect();
    if (client == nullptr) return nullptr;
    EXPECT_TRUE(Join(client.get(), name).ok());
    absl::StatusOr<std::unique_ptr<BadSession>> bad = BadSession::Open(std::move(client));
    EXPECT_TRUE(bad.ok()) << bad.status();
    return bad.ok() ? *std::move(bad) : nullptr;
  }

  int AttachedSessions() {
    auto status = a_->Status();
    return status.ok() ? status->attached_session_count() : -1;
  }

  // The daemon answers health; a fresh client joins, attaches and calls b within 3 s; a calls b.
  void ExpectServing() {
    std::unique_ptr<Client> c = Connect();
    ASSERT_NE(c, nullptr);
    absl::StatusOr<bool> serving = c->Serving();
    ASSERT_TRUE(serving.ok()) << serving.status();
    EXPECT_TRUE(*serving);
    ASSERT_TRUE(Join(c.get(), absl::StrCat("c", ++fresh_)).ok());
    const absl::Time start = absl::Now();
    absl::StatusOr<Message> reply = c->Call("g", "b", "echo", "fresh", {}, absl::Seconds(10));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->payload, "fresh");
    EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "attach and call took too long";
    absl::StatusOr<Message> old = a_->Call("g", "b", "echo", "old", {}, absl::Seconds(10));
    ASSERT_TRUE(old.ok()) << old.status();
  }

  std::unique_ptr<Client> a_;
  std::unique_ptr<Client> b_;
  int fresh_ = 0;
  ProcCounts baseline_;
  std::string baseline_threads_;
};

TEST_F(ShmHostileTest, AGoodCallByHandWorks) {
  // The harness itself: a well-formed call from the bad session is answered.
  std::unique_ptr<BadSession> bad = Bad("bad");
  ASSERT_NE(bad, nullptr);
  ASSERT_TRUE(bad->SubmitCall(bad->layout.tx_heap.offset, "g", "b", "echo", "bad", "hi", 1));
  auto replies = bad->Replies(1, absl::Now() + absl::Seconds(10));
  ASSERT_EQ(replies.count(1), 1u);
  EXPECT_EQ(replies[1].first, absl::StatusCode::kOk) << replies[1].second;
}

// CUDA requests a client can forge: a device pool whose IPC handle is garbage, a CUDA tensor
// pointing at a garbage export record, a release naming a device pool nothing was lent in.
// Each is refused with its reason (on this node: no GPUs, or no device map) and the daemon
// serves on. (On a GPU node the pool is refused because its handle does not open:
// tests/cuda/cuda_calls_test covers that side.)
TEST_F(ShmHostileTest, CallsIntoMadeUpGroupsAreRefusedAndNeverCountedUnderTheirNames) {
  auto bad = Bad("bad");
  ASSERT_NE(bad, nullptr);
  constexpr int kCalls = 50;
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(bad->SubmitCall(bad->layout.tx_heap.offset + i * 256, absl::StrCat("made-up-", i),
                                "b", "echo", "bad", "x", i + 1));
  }
  auto replies = bad->Replies(kCalls, absl::Now() + absl::Seconds(10));
  ASSERT_EQ(replies.size(), kCalls);
  for (const auto& [id, reply] : replies) {
    EXPECT_EQ(reply.first, absl::StatusCode::kPermissionDenied) << reply.second;
  }
  // Counted for the uid, but no name a client made up becomes a key of the group usage.
  absl::StatusOr<v1::StatusResponse> status = a_->Status();
  ASSERT_TRUE(status.ok());
  for (const v1::GroupUsage& group : status->group_usage()) {
    EXPECT_THAT(group.group(), ::testing::Not(::testing::StartsWith("made-up-")));
  }
}

TEST_F(ShmHostileTest, ForgedCudaRequestsAreRefusedNamingWhy) {
  std::unique_ptr<BadSession> bad = Bad("bad");
  ASSERT_NE(bad, nullptr);
  const uint64_t tx = bad->layout.tx_heap.offset;
  shm::DevicePoolRecord pool{};
  std::memset(pool.memory, 0xab, sizeof(pool.memory));
  pool.bytes = uint64_t{1} << 20;
  std::memcpy(bad->writable + tx, &pool, sizeof(pool));
  shm::Descriptor lend{};
  lend.op = static_cast<uint8_t>(shm::Op::kDevicePool);
  lend.call_id = 1;
  lend.payload_offset = tx;
  lend.payload_length = sizeof(pool);
  ASSERT_TRUE(bad->submit->TryPush(lend).value_or(false));
  auto replies = bad->Replies(1, absl::Now() + absl::Seconds(10));
  ASSERT_EQ(replies.count(1), 1u);
  EXPECT_THAT(replies[1].first,
              AnyOf(absl::StatusCode::kFailedPrecondition, absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(replies[1].second, HasSubstr("receive pool on cuda:0"));

  // A call carrying a CUDA tensor whose export record is garbage, to a worker no map covers.
  shm::TensorEntry entry{};
  entry.dtype = static_cast<uint8_t>(shm::DType::kFloat32);
  entry.ndim = 1;
  entry.shape[0] = 1024;
  entry.length = 4096;
  entry.device_type = static_cast<uint8_t>(shm::DeviceType::kCuda);
  entry.offset = 1 << 20;
  shm::CudaExport garbage;
  std::memset(&garbage, 0x5a, sizeof(garbage));
  ASSERT_TRUE(bad->SubmitCall(tx + 4096, "g", "b", "echo", "bad", "x", 2, absl::Seconds(5), {entry},
                              {garbage}));
  replies = bad->Replies(1, absl::Now() + absl::Seconds(10));
  ASSERT_EQ(replies.count(2), 1u);
  EXPECT_EQ(replies[2].first, absl::StatusCode::kInvalidArgument) << replies[2].second;
  EXPECT_THAT(replies[2].second,
              HasSubstr("Request device mapping is not available for destination b for device "
                        "cuda:0"));

  shm::Descriptor release{};
  release.op = static_cast<uint8_t>(shm::Op::kRelease);
  release.call_id = 1;
  release.device_pool = 1;
  release.payload_offset = 64;
  ASSERT_TRUE(bad->submit->TryPush(release).value_or(false));
  ASSERT_TRUE(bad->SubmitCall(tx + 8192, "g", "b", "echo", "bad", "hi", 3));
  replies = bad->Replies(1, absl::Now() + absl::Seconds(10));
  ASSERT_EQ(replies.count(3), 1u);
  EXPECT_EQ(replies[3].first, absl::StatusCode::kOk)
      << "the session goes on: " << replies[3].second;
  ExpectServing();
}

TEST_F(ShmHostileTest, ScribbledSubmissionIndicesEndOnlyThatSession) {
  const int attached = AttachedSessions();
  std::unique_ptr<BadSession> ahead = Bad("bad1");
  std::unique_ptr<BadSession> back = Bad("bad2");
  ASSERT_TRUE(ahead && back);
  ASSERT_EQ(AttachedSessions(), attached + 2);
  auto* ahead_control =
      reinterpret_cast<shm::RingControl*>(ahead->writable + ahead->layout.submission.region.offset);
  auto* back_control =
      reinterpret_cast<shm::RingControl*>(back->writable + back->layout.submission.region.offset);
  // A tail far ahead of the head; a tail that moved backwards.
  ahead_control->tail.store(ahead->layout.submission.slots * 7 + 3);
  back_control->tail.store(0xffffffffu);
  ASSERT_TRUE(WaitUntil([&] { return AttachedSessions() == attached; }, absl::Seconds(10)))
      << "the daemon did not end the sessions whose ring broke: " << AttachedSessions();
  ExpectServing();
}

TEST_F(ShmHostileTest, AScribbledCompletionHeadFailsCallsToThatSessionAtOnce) {
  std::unique_ptr<BadSession> bad = Bad("bad");
  ASSERT_NE(bad, nullptr);
  auto* control =
      reinterpret_cast<shm::RingControl*>(bad->writable + bad->layout.completion.region.offset);
  control->head.store(0xdeadbeefu);  // the head of the ring the daemon produces into
  const absl::Time start = absl::Now();
  absl::StatusOr<Message> reply = a_->Call("g", "bad", "m", "x", {}, absl::Seconds(5));
  EXPECT_FALSE(reply.ok());
  EXPECT_THAT(reply.status().code(),
              AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDataLoss))
      << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("completion ring"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << reply.status();
  // And again: the session is broken, not the daemon.
  reply = a_->Call("g", "bad", "m", "x", {}, absl::Seconds(5));
  EXPECT_FALSE(reply.ok());
  EXPECT_NE(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("'bad'")) << "names the worker";
  ExpectServing();
}

// A completion ring whose head the client broke ends that session, as a broken submission
// ring does (docs/data_plane.md, "Checks"): it is detached and its member leaves the group.
TEST_F(ShmHostileTest, ABrokenCompletionRingEndsThatSession) {
  const int attached = AttachedSessions();
  std::unique_ptr<BadSession> bad = Bad("bad");
  ASSERT_NE(bad, nullptr);
  ASSERT_EQ(AttachedSessions(), attached + 1);
  auto* control =
      reinterpret_cast<shm::RingControl*>(bad->writable + bad->layout.completion.region.offset);
  control->head.store(0xdeadbeefu);
  EXPECT_FALSE(a_->Call("g", "bad", "m", "x", {}, absl::Seconds(5)).ok());
  EXPECT_TRUE(WaitUntil([&] { return AttachedSessions() == attached; }, absl::Seconds(5)))
      << AttachedSessions() << " sessions attached";
  // The session's end records its member's departure in a new version, right after.
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto view = a_->GetGroup("g", init_method_);
        if (!view.ok()) return false;
        for (const auto& member : view->members()) {
          if (member.name() == "bad") return false;
        }
        return true;
      },
      absl::Seconds(5)))
      << "'bad' is still a member";
}

TEST_F(ShmHostileTest, AScribbledHeaderChangesNothingForTheDaemon) {
  std::unique_ptr<BadSession> bad = Bad("bad");
  ASSERT_NE(bad, nullptr);
  std::mt19937_64 gen(1);
  Scribble(bad->writable, shm::kPageBytes, gen);  // the header page
  ASSERT_TRUE(bad->SubmitCall(bad->layout.tx_heap.offset, "g", "b", "echo", "bad", "hi", 1));
  auto replies = bad->Replies(1, absl::Now() + absl::Seconds(10));
  ASSERT_EQ(replies.count(1), 1u);
  EXPECT_EQ(replies[1].first, absl::StatusCode::kOk) << replies[1].second;
  absl::StatusOr<Message> to_bad = a_->Call("g", "bad", "m", "x", {}, absl::Milliseconds(300));
  EXPECT_EQ(to_bad.status().code(), absl::StatusCode::kDeadlineExceeded) << to_bad.status();
  ExpectServing();
}

TEST_F(ShmHostileTest, GarbageInTheTxHeapIsInvalidArgumentPerCall) {
  std::unique_ptr<BadSession> bad = Bad("bad");
  ASSERT_NE(bad, nullptr);
  std::mt19937_64 gen(2);
  const shm::Region tx = bad->layout.tx_heap;
  Scribble(bad->writable + tx.offset, tx.bytes, gen);
  // Calls whose payload is random bytes at random places (64-aligned, inside the heap).
  constexpr int kCalls = 200;
  int submitted = 0;
  for (int i = 1; i <= kCalls; ++i) {
    shm::Descriptor d{};
    d.op = static_cast<uint8_t>(shm::Op::kCall);
    d.call_id = i;
    d.payload_offset = tx.offset + (gen() % (tx.bytes / 64 - 64)) * 64;
    d.payload_length = 1 + gen() % 4000;
    if (!bad->submit->TryPush(d).value_or(false)) break;
    ++submitted;
  }
  auto replies = bad->Replies(submitted, absl::Now() + absl::Seconds(20));
  EXPECT_EQ(replies.size(), static_cast<size_t>(submitted));
  for (const auto& [id, reply] : replies) {
    EXPECT_EQ(reply.first, absl::StatusCode::kInvalidArgument) << id << ": " << reply.second;
  }
  ExpectServing();
}

TEST_F(ShmHostileTest, HeapsScribbledWhileCallsAreInFlight) {
  // The client rewrites its tx heap (what the daemon copies from) and its rx heap (what the
  // daemon copies into) while its calls to b run, and sends releases of blocks it was never
  // given: each call is answered (OK or a specific error), nothing hangs, b and the others
  // are served.
  std::unique_ptr<BadSession> bad = Bad("bad");
  ASSERT_NE(bad, nullptr);
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    std::mt19937_64 gen(3);
    const shm::Region tx = bad->layout.tx_heap;
    const shm::Region rx = bad->layout.rx_heap;
    while (!stop.load()) {
      Scribble(bad->writable + tx.offset + (gen() % (tx.bytes / 4096)) * 4096, 4096, gen);
      Scribble(bad->writable + rx.offset + (gen() % (rx.bytes / 4096)) * 4096, 4096, gen);
    }
  });
  std::mt19937_64 gen(4);
  std::map<uint64_t, bool> pending;
  uint64_t id = 0;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 20; ++i) {
      ++id;
      const uint64_t offset = bad->layout.tx_heap.offset + (id % 64) * 4096;
      if (bad->SubmitCall(offset, "g", "b", "echo", "bad", std::string(100, 'p'), id)) {
        pending[id] = true;
      }
    }
    for (int i = 0; i < 10; ++i) {  // releases of made-up blocks
      shm::Descriptor release{};
      release.op = static_cast<uint8_t>(shm::Op::kRelease);
      release.call_id = 1;
      release.payload_offset = bad->layout.rx_heap.offset + (gen() % 1000) * 64;
      (void)bad->submit->TryPush(release);
    }
    auto replies = bad->Replies(pending.size(), absl::Now() + absl::Seconds(10));
    for (const auto& [reply_id, reply] : replies) {
      EXPECT_THAT(reply.first,
                  AnyOf(absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument,
                        absl::StatusCode::kPermissionDenied, absl::StatusCode::kNotFound,
                        absl::StatusCode::kDataLoss))  // DATA_LOSS: we scribbled the reply
          << reply_id << ": " << reply.second;
      pending.erase(reply_id);
    }
    EXPECT_TRUE(pending.empty()) << pending.size() << " calls unanswered in round " << round;
    pending.clear();
  }
  stop = true;
  scribbler.join();
  ExpectServing();
}

TEST_F(ShmHostileTest, RattledDoorbellWordsCostOnlySpuriousWakeUps) {
  std::unique_ptr<BadSession> bad = Bad("bad");
  ASSERT_NE(bad, nullptr);
  std::atomic<bool> stop{false};
  std::thread rattler([&] {
    std::mt19937_64 gen(5);
    while (!stop.load()) {
      // The two doorbell cache lines of each ring (after head and tail).
      for (const shm::RingLayout* ring : {&bad->layout.submission, &bad->layout.completion}) {
        uint8_t* control = bad->writable + ring->region.offset;
        Scribble(control + 2 * shm::kCacheLineBytes, 2 * shm::kCacheLineBytes, gen);
      }
    }
  });
  const absl::Time start = absl::Now();
  ExpectServing();
  // Calls to and from the rattling session still end.
  absl::StatusOr<Message> to_bad = a_->Call("g", "bad", "m", "x", {}, absl::Milliseconds(300));
  EXPECT_EQ(to_bad.status().code(), absl::StatusCode::kDeadlineExceeded) << to_bad.status();
  ASSERT_TRUE(bad->SubmitCall(bad->layout.tx_heap.offset, "g", "b", "echo", "bad", "hi", 1));
  auto replies = bad->Replies(1, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(replies.count(1), 1u);
  stop = true;
  rattler.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ExpectServing();
}

TEST_F(ShmHostileTest, PunchedHolesAndTruncationDoNotHurtTheDaemon) {
  std::unique_ptr<BadSession> bad = Bad("bad");
  ASSERT_NE(bad, nullptr);
  const int fd = bad->segment->fd();
  // The seals refuse shrinking and growing.
  EXPECT_NE(ftruncate(fd, 4096), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(fd, bad->size * 2), 0);
  // Holes (pages read as zero afterwards; the size stays) over both heaps: the daemon copies
  // from zeroes and writes into fresh pages.
  const shm::Region tx = bad->layout.tx_heap;
  const shm::Region rx = bad->layout.rx_heap;
  ASSERT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, tx.offset, tx.bytes), 0);
  ASSERT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, rx.offset, rx.bytes), 0);
  absl::StatusOr<Message> to_bad = a_->Call("g", "bad", "m", "x", {}, absl::Milliseconds(300));
  EXPECT_EQ(to_bad.status().code(), absl::StatusCode::kDeadlineExceeded) << to_bad.status();
  ASSERT_TRUE(bad->SubmitCall(tx.offset, "g", "b", "echo", "bad", "hi", 1));
  ASSERT_EQ(bad->Replies(1, absl::Now() + absl::Seconds(10)).count(1), 1u);
  // Then over the whole segment, rings included: their indices read zero, which moves them
  // backwards; the session may end, the daemon serves on.
  ASSERT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, bad->size), 0);
  (void)a_->Call("g", "bad", "m", "x", {}, absl::Milliseconds(300));
  ExpectServing();
}

// Fills the completion ring of `hoarder` (which reads nothing) with calls from `callers`; the
// futures of those calls.
std::vector<CallFuture> Hoard(const std::vector<Client*>& callers, uint32_t slots,
                              absl::Duration timeout) {
  std::vector<CallFuture> calls;
  for (uint32_t i = 0; i < slots / callers.size() + 40; ++i) {
    for (Client* caller : callers) {
      calls.push_back(caller->CallAsync("g", "hoarder", "m", "x", {}, timeout));
    }
  }
  return calls;
}

TEST_F(ShmHostileTest, AClientThatNeverReadsItsCompletions) {
  // "hoarder" is a member of g and attached, and reads nothing: its completion ring (1024
  // slots) fills with calls from h1 and h2. Each of those ends by its deadline (plus the
  // client's 2 s of grace) as DEADLINE_EXCEEDED, or RESOURCE_EXHAUSTED naming the ring; a, b
  // and fresh clients are served on time meanwhile.
  std::unique_ptr<BadSession> hoarder = Bad("hoarder");
  ASSERT_NE(hoarder, nullptr);
  std::unique_ptr<Client> h1 = Connect();
  std::unique_ptr<Client> h2 = Connect();
  ASSERT_TRUE(h1 && h2);
  ASSERT_TRUE(Join(h1.get(), "h1").ok());
  ASSERT_TRUE(Join(h2.get(), "h2").ok());
  const absl::Duration timeout = absl::Seconds(4);
  const absl::Time start = absl::Now();
  std::vector<CallFuture> calls =
      Hoard({h1.get(), h2.get()}, hoarder->layout.completion.slots, timeout);
  ExpectServing();
  const absl::Duration serving_took = absl::Now() - start;
  std::map<absl::StatusCode, int> codes;
  int not_the_daemons = 0;
  for (CallFuture& call : calls) {
    ASSERT_TRUE(
        call.WaitFor(start + timeout + absl::Seconds(2) + absl::Milliseconds(500) - absl::Now()))
        << "a call to the hoarder did not end by its deadline + 2.5 s";
    const absl::StatusOr<Message>& reply = call.Wait();
    ++codes[reply.status().code()];
    if (absl::StrContains(reply.status().message(), "not even the daemon's")) ++not_the_daemons;
    EXPECT_THAT(reply.status().code(),
                AnyOf(absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kResourceExhausted))
        << reply.status();
    if (reply.status().code() == absl::StatusCode::kResourceExhausted) {
      EXPECT_THAT(reply.status().message(), HasSubstr("completion ring"));
    }
  }
  std::string summary;
  for (const auto& [code, count] : codes) {
    absl::StrAppend(&summary, absl::StatusCodeToString(code), " x", count, "; ");
  }
  std::cerr << "hoarder: " << summary << not_the_daemons
            << " given up by the client library (the daemon never answered); all ended after "
            << absl::Now() - start << "; a fresh client and a were served after " << serving_took
            << "\n";
  ExpectServing();
}

// A client whose completion ring is full costs its callers nothing but their calls to it:
// those wait in its session's queue (no daemon thread waits for a client to read), so a
// caller's call to a healthy worker made behind ten of them is served at once, and every call
// is answered by the daemon by its deadline + 0.5 s.
TEST_F(ShmHostileTest, ACallerOfAClientThatNeverReadsKeepsItsOtherCalls) {
  std::unique_ptr<BadSession> hoarder = Bad("hoarder");
  ASSERT_NE(hoarder, nullptr);
  std::unique_ptr<Client> h1 = Connect();
  std::unique_ptr<Client> h2 = Connect();
  ASSERT_TRUE(h1 && h2);
  ASSERT_TRUE(Join(h1.get(), "h1").ok());
  ASSERT_TRUE(Join(h2.get(), "h2").ok());
  const uint32_t slots = hoarder->layout.completion.slots;
  std::vector<CallFuture> fill = Hoard({h1.get(), h2.get()}, slots, absl::Seconds(10));
  auto* control = reinterpret_cast<shm::RingControl*>(hoarder->writable +
                                                      hoarder->layout.completion.region.offset);
  ASSERT_TRUE(WaitUntil([&] { return control->tail.load() - control->head.load() == slots; }))
      << "the hoarder's completion ring did not fill";
  // Now a calls the hoarder ten times, then b.
  const absl::Duration timeout = absl::Seconds(3);
  std::vector<CallFuture> stuck;
  for (int i = 0; i < 10; ++i)
    stuck.push_back(a_->CallAsync("g", "hoarder", "m", "x", {}, timeout));
  const absl::Time start = absl::Now();
  absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", "meanwhile", {}, absl::Seconds(5));
  EXPECT_TRUE(reply.ok()) << reply.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << reply.status();
  std::cerr << "a's call to b behind ten calls to a full ring took " << absl::Now() - start << ": "
            << reply.status() << "\n";
  for (CallFuture& call : stuck) {
    EXPECT_TRUE(call.WaitFor(start + timeout + absl::Milliseconds(500) - absl::Now()))
        << "a call to the hoarder was not answered by its deadline + 0.5 s";
    EXPECT_THAT(std::string(call.Wait().status().message()),
                ::testing::Not(HasSubstr("not even the daemon's")));
  }
  for (CallFuture& call : fill) call.Wait();
}

TEST_F(ShmHostileTest, AFloodOfSubmissions) {
  // The bad session submits as fast as the ring takes them for 3 s: garbage calls
  // (INVALID_ARGUMENT), calls to a worker that does not exist (NOT_FOUND) and releases of
  // nothing, reading its completions as fast as it can. Others stay served on time.
  std::unique_ptr<BadSession> bad = Bad("bad");
  ASSERT_NE(bad, nullptr);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> submitted{0};
  std::atomic<uint64_t> answered{0};
  std::atomic<uint64_t> wrong{0};
  absl::Mutex wrong_mu;
  std::vector<std::string> wrong_examples;
  std::thread flooder([&] {
    uint64_t id = 0;
    const uint64_t message = bad->layout.tx_heap.offset;
    while (!stop.load()) {
      ++id;
      bool pushed = false;
      switch (id % 3) {
        case 0: {
          shm::Descriptor d{};
          d.op = static_cast<uint8_t>(shm::Op::kCall);
          d.call_id = id;
          d.device_pool = 1;  // only a release may name a device pool
          pushed = bad->submit->TryPush(d).value_or(false);
          break;
        }
        case 1:
          pushed = bad->SubmitCall(message, "g", "nobody", "m", "bad", "", id);
          break;
        case 2: {
          shm::Descriptor release{};
          release.op = static_cast<uint8_t>(shm::Op::kRelease);
          release.call_id = 1;
          release.payload_offset = bad->layout.rx_heap.offset + 64;
          pushed = bad->submit->TryPush(release).value_or(false);
          if (pushed) continue;  // answers nothing
          break;
        }
      }
      if (pushed) ++submitted;
      shm::Descriptor d{};
      while (bad->complete->TryPop(&d).value_or(false)) {
        if (d.op != static_cast<uint8_t>(shm::Op::kReply)) continue;
        ++answered;
        auto parsed = shm::ParseMessage(bad->segment->base(), d.payload_offset, d.payload_length);
        // An error reply without a payload: the answer found this session's rx heap full.
        const bool unplaced = (d.flags & shm::kFlagError) != 0 && d.payload_length == 0;
        const auto code = unplaced      ? absl::StatusCode::kResourceExhausted
                          : parsed.ok() ? static_cast<absl::StatusCode>(parsed->code)
                                        : absl::StatusCode::kInternal;
        // RESOURCE_EXHAUSTED: data.max_calls_in_flight, or this session's own rx heap.
        if (code != absl::StatusCode::kInvalidArgument && code != absl::StatusCode::kNotFound &&
            code != absl::StatusCode::kResourceExhausted) {
          ++wrong;
          absl::MutexLock lock(&wrong_mu);
          if (wrong_examples.size() < 5) {
            wrong_examples.push_back(
                parsed.ok() ? absl::StrCat(absl::StatusCodeToString(code), ": ", parsed->names[2])
                            : std::string(parsed.status().message()));
          }
        }
        // Give the rx block back, as a client must.
        if (unplaced) continue;
        shm::Descriptor release{};
        release.op = static_cast<uint8_t>(shm::Op::kRelease);
        release.call_id = 1;
        release.payload_offset = d.payload_offset;
        (void)bad->submit->TryPush(release);
      }
    }
  });
  std::vector<absl::Duration> latencies;
  const absl::Time until = absl::Now() + absl::Seconds(3);
  while (absl::Now() < until) {
    const absl::Time start = absl::Now();
    absl::StatusOr<Message> reply = a_->Call("g", "b", "echo", "during", {}, absl::Seconds(5));
    ASSERT_TRUE(reply.ok()) << reply.status();
    latencies.push_back(absl::Now() - start);
  }
  stop = true;
  flooder.join();
  std::sort(latencies.begin(), latencies.end());
  std::cerr << "flood: " << submitted << " submitted, " << answered << " answered, "
            << latencies.size() << " calls of a meanwhile, p50 " << latencies[latencies.size() / 2]
            << ", max " << latencies.back() << "\n";
  EXPECT_GT(submitted.load(), 1000u);
  EXPECT_EQ(wrong.load(), 0u) << absl::StrJoin(wrong_examples, "; ");
  EXPECT_LT(latencies.back(), absl::Seconds(1));
  ExpectServing();
}

}  // namespace
}  // namespace tpd
