// Tests of the SPSC rings: order and capacity in one process, correctness between two
// processes (a forked client producing, the parent consuming, both rings, checksummed), and
// what the daemon's side does when the client corrupts a ring (the C3 fault row): an error
// naming the ring, never a hang, never a read outside the ring.

#include "shm/ring.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/descriptor.h"
#include "shm/segment.h"
#include "tests/shm/child_process.h"

namespace tpd::shm {
namespace {

using testing::FinishChild;
using ::testing::HasSubstr;
using testing::StartChild;

Segment CreateSegment(uint32_t slots) {
  SegmentLimits limits;
  limits.submission_slots = slots;
  limits.completion_slots = slots;
  limits.tx_heap_bytes = kPageBytes;
  limits.rx_heap_bytes = kPageBytes;
  absl::StatusOr<Segment> segment = Segment::Create(limits);
  EXPECT_TRUE(segment.ok()) << segment.status();
  return *std::move(segment);
}

Descriptor Numbered(uint64_t i) {
  Descriptor d{};
  d.op = static_cast<uint8_t>(Op::kCall);
  d.call_id = i + 1;
  d.deadline_unix_ns = static_cast<int64_t>(i * 2654435761u);  // a value to checksum
  return d;
}

RingControl* Control(const Segment& segment, const RingLayout& ring) {
  return reinterpret_cast<RingControl*>(segment.base() + ring.region.offset);
}

TEST(RingTest, DescriptorsComeOutInOrderAndAFullRingRefusesMore) {
  Segment segment = CreateSegment(4);
  RingProducer producer(segment.base(), segment.layout().submission, "submission ring");
  RingConsumer consumer(segment.base(), segment.layout().submission, "submission ring");
  Descriptor out;
  EXPECT_EQ(*consumer.TryPop(&out), false) << "empty";
  EXPECT_EQ(*producer.FreeSlots(), 4u);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(*producer.TryPush(Numbered(i)), true);
  EXPECT_EQ(*producer.TryPush(Numbered(4)), false) << "full";
  EXPECT_EQ(*producer.FreeSlots(), 0u);
  EXPECT_EQ(*consumer.Available(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(*consumer.TryPop(&out), true);
    EXPECT_EQ(out.call_id, i + 1);
  }
  EXPECT_EQ(*consumer.TryPop(&out), false);
  EXPECT_EQ(*producer.FreeSlots(), 4u);
}

TEST(RingTest, AQuietPushIsPublishedAndReadWithTheNextRungOne) {
  Segment segment = CreateSegment(4);
  RingProducer producer(segment.base(), segment.layout().completion, "completion ring");
  RingConsumer consumer(segment.base(), segment.layout().completion, "completion ring");
  // A consumer asleep in the futex is not woken by a quiet push; the rung push after it
  // wakes it, and it finds both, in order.
  Descriptor out;
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_EQ(*producer.TryPush(Numbered(0), /*wake=*/false), true);
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_EQ(*producer.TryPush(Numbered(1)), true);
  });
  ASSERT_TRUE(*consumer.WaitForData(absl::Now() + absl::Seconds(10)));
  late.join();
  ASSERT_EQ(*consumer.TryPop(&out), true);
  EXPECT_EQ(out.call_id, 1u);
  ASSERT_EQ(*consumer.TryPop(&out), true);
  EXPECT_EQ(out.call_id, 2u);
  EXPECT_EQ(*consumer.TryPop(&out), false);
}

TEST(RingTest, ANudgeWakesASleepingConsumerToLookAtWhatInterruptsIt) {
  Segment segment = CreateSegment(4);
  RingConsumer consumer(segment.base(), segment.layout().submission, "submission ring");
  std::atomic<bool> interrupt{false};
  std::thread nudger([&] {
    absl::SleepFor(absl::Milliseconds(300));  // the consumer is asleep in the futex by now
    interrupt = true;
    consumer.Nudge();
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<bool> ready =
      consumer.WaitForData(start + absl::Seconds(30), nullptr, [&] { return interrupt.load(); });
  nudger.join();
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_FALSE(*ready) << "nothing was published";
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "woken by the nudge, not the deadline";
  EXPECT_EQ(consumer.sleeps(), 1u);
}

TEST(RingTest, BatchesWrapAroundManyTimes) {
  Segment segment = CreateSegment(8);
  RingProducer producer(segment.base(), segment.layout().completion, "completion ring");
  RingConsumer consumer(segment.base(), segment.layout().completion, "completion ring");
  std::mt19937 rng(3);
  uint64_t pushed = 0;
  uint64_t popped = 0;
  std::vector<Descriptor> batch(11);
  while (popped < 10'000) {
    std::vector<Descriptor> in;
    for (size_t n = rng() % 11; n > 0; --n) in.push_back(Numbered(pushed + in.size()));
    absl::StatusOr<size_t> accepted = producer.TryPushBatch(in);
    ASSERT_TRUE(accepted.ok()) << accepted.status();
    pushed += *accepted;
    absl::StatusOr<size_t> taken = consumer.TryPopBatch(absl::MakeSpan(batch).first(rng() % 11));
    ASSERT_TRUE(taken.ok()) << taken.status();
    for (size_t i = 0; i < *taken; ++i) {
      ASSERT_EQ(batch[i].call_id, popped + 1);
      ++popped;
    }
    ASSERT_LE(pushed - popped, 8u);
  }
}

TEST(RingTest, IndicesWrapPastTwoToThe32) {
  Segment segment = CreateSegment(4);
  const RingLayout& ring = segment.layout().submission;
  constexpr uint32_t kStart = 0xFFFFFFF0u;
  InitRing(segment.base(), ring, kStart);
  RingProducer producer(segment.base(), ring, "submission ring", {}, kStart);
  RingConsumer consumer(segment.base(), ring, "submission ring", {}, kStart);
  Descriptor out;
  uint64_t pushed = 0;
  while (pushed < 100) {
    // One or two at a time, so the slot index and the free-running index both wrap.
    for (int k = pushed % 3 == 0 ? 2 : 1; k > 0; --k) {
      ASSERT_EQ(*producer.TryPush(Numbered(pushed++)), true);
    }
    EXPECT_LE(*consumer.Available(), 2u);
    while (*consumer.Available() > 0) ASSERT_EQ(*consumer.TryPop(&out), true);
    ASSERT_EQ(out.call_id, pushed);
  }
  EXPECT_EQ(Control(segment, ring)->tail.load(), static_cast<uint32_t>(kStart + pushed));
  EXPECT_EQ(Control(segment, ring)->head.load(), static_cast<uint32_t>(kStart + pushed));
  EXPECT_EQ(*producer.FreeSlots(), 4u);
}

// A client process produces N descriptors on the submission ring; the daemon (this process)
// echoes each back on the completion ring; the client checks the echoes. Small rings, so both
// producers meet a full ring and both consumers an empty one, often.
TEST(RingTest, TwoProcessesExchangeEveryDescriptorInOrder) {
  constexpr uint64_t kCount = 100'000;
  Segment daemon = CreateSegment(16);
  const int fd = daemon.fd();
  const pid_t client_pid = StartChild([fd] {
    absl::StatusOr<Segment> client = Segment::Map(dup(fd));
    if (!client.ok()) return 10;
    RingProducer submissions(client->base(), client->layout().submission, "submission ring");
    RingConsumer completions(client->base(), client->layout().completion, "completion ring");
    const absl::Time deadline = absl::Now() + absl::Seconds(45);
    uint64_t sent = 0;
    uint64_t received = 0;
    uint64_t checksum = 0;
    while (received < kCount) {
      if (absl::Now() > deadline) return 11;
      // Submit what fits, then take every answer there is; sleep only when there is none.
      while (sent < kCount) {
        absl::StatusOr<bool> pushed = submissions.TryPush(Numbered(sent));
        if (!pushed.ok()) return 12;
        if (!*pushed) break;
        ++sent;
      }
      Descriptor out;
      absl::StatusOr<bool> popped = completions.TryPop(&out);
      if (!popped.ok()) return 13;
      if (!*popped) {
        // Something is in flight (the ring was full or all is sent): an answer will come.
        if (!completions.WaitForData(absl::Now() + absl::Seconds(5)).ok()) return 14;
        continue;
      }
      if (out.call_id != received + 1 || out.op != static_cast<uint8_t>(Op::kReply)) return 15;
      checksum += out.deadline_unix_ns;
      ++received;
    }
    uint64_t expected = 0;
    for (uint64_t i = 0; i < kCount; ++i) expected += Numbered(i).deadline_unix_ns;
    return checksum == expected ? 0 : 16;
  });
  ASSERT_GT(client_pid, 0);

  RingConsumer submissions(daemon.base(), daemon.layout().submission, "submission ring");
  RingProducer completions(daemon.base(), daemon.layout().completion, "completion ring");
  uint64_t checksum = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(45);
  for (uint64_t i = 0; i < kCount; ++i) {
    Descriptor in;
    while (true) {
      absl::StatusOr<bool> popped = submissions.TryPop(&in);
      ASSERT_TRUE(popped.ok()) << popped.status();
      if (*popped) break;
      ASSERT_LT(absl::Now(), deadline) << "at descriptor " << i;
      ASSERT_TRUE(submissions.WaitForData(absl::Now() + absl::Seconds(1)).ok());
    }
    ASSERT_TRUE(ValidateDescriptor(in, daemon.layout(), Direction::kSubmission).ok());
    ASSERT_EQ(in.call_id, i + 1);
    checksum += in.deadline_unix_ns;
    in.op = static_cast<uint8_t>(Op::kReply);
    while (true) {
      absl::StatusOr<bool> pushed = completions.TryPush(in);
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      if (*pushed) break;
      ASSERT_LT(absl::Now(), deadline) << "at reply " << i;
      ASSERT_TRUE(completions.WaitForSpace(absl::Now() + absl::Seconds(1)).ok());
    }
  }
  uint64_t expected = 0;
  for (uint64_t i = 0; i < kCount; ++i) expected += Numbered(i).deadline_unix_ns;
  EXPECT_EQ(checksum, expected);
  EXPECT_EQ(FinishChild(client_pid), 0) << "the client's view (10+: which step failed)";
}

TEST(RingCorruptionTest, ATailTooFarAheadIsDataLossNamingTheRing) {
  Segment segment = CreateSegment(8);
  RingConsumer consumer(segment.base(), segment.layout().submission, "submission ring");
  Control(segment, segment.layout().submission)->tail.store(9);
  Descriptor out;
  absl::StatusOr<bool> popped = consumer.TryPop(&out);
  EXPECT_EQ(popped.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(popped.status().message(),
              HasSubstr("submission ring: the producer's tail 9 is 9 ahead of the head 0, "
                        "more than the ring's 8 slots"));
  // Sticky: a repaired tail does not un-break the ring, and waiting returns the error at once.
  Control(segment, segment.layout().submission)->tail.store(1);
  EXPECT_EQ(consumer.TryPop(&out).status(), popped.status());
  const absl::Time start = absl::Now();
  EXPECT_EQ(consumer.WaitForData(absl::Now() + absl::Seconds(10)).status(), popped.status());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(RingCorruptionTest, ATailBehindTheHeadIsDataLoss) {
  Segment segment = CreateSegment(8);
  RingConsumer consumer(segment.base(), segment.layout().submission, "submission ring");
  // 0xFFFFFFFF is "one behind head 0" modulo 2^32: more than 8 ahead.
  Control(segment, segment.layout().submission)->tail.store(0xFFFFFFFFu);
  EXPECT_EQ(consumer.Available().status().code(), absl::StatusCode::kDataLoss);
}

TEST(RingCorruptionTest, ATailMovedBackwardsIsDataLoss) {
  Segment segment = CreateSegment(8);
  RingProducer producer(segment.base(), segment.layout().submission, "submission ring");
  RingConsumer consumer(segment.base(), segment.layout().submission, "submission ring");
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(*producer.TryPush(Numbered(i)));
  EXPECT_EQ(*consumer.Available(), 5u);
  Control(segment, segment.layout().submission)->tail.store(3);
  absl::StatusOr<uint32_t> available = consumer.Available();
  EXPECT_EQ(available.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(available.status().message(), HasSubstr("tail moved backwards from 5 to 3"));
}

TEST(RingCorruptionTest, AHeadPastTheTailOrMovedBackwardsIsDataLoss) {
  Segment segment = CreateSegment(8);
  RingControl* control = Control(segment, segment.layout().completion);
  {
    RingProducer producer(segment.base(), segment.layout().completion, "completion ring");
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(*producer.TryPush(Numbered(i)));
    control->head.store(4);  // the client claims to have read 4 of 3
    absl::StatusOr<bool> pushed = producer.TryPush(Numbered(3));
    EXPECT_EQ(pushed.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(pushed.status().message(),
                HasSubstr("completion ring: the consumer's head 4 is outside [0, 3]"));
    EXPECT_EQ(producer.WaitForSpace(absl::Now() + absl::Seconds(10)).status(), pushed.status());
  }
  InitRing(segment.base(), segment.layout().completion);
  {
    RingProducer producer(segment.base(), segment.layout().completion, "completion ring");
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(*producer.TryPush(Numbered(i)));
    control->head.store(2);
    EXPECT_EQ(*producer.FreeSlots(), 7u);
    control->head.store(1);  // backwards
    absl::StatusOr<uint32_t> free = producer.FreeSlots();
    EXPECT_EQ(free.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(free.status().message(), HasSubstr("head 1 is outside [2, 3]"));
  }
}

// A client process writes random values into the submission ring's indices, doorbell and
// slots as fast as it can, while the daemon consumes it and produces on the completion ring
// whose head it also scribbles. Every daemon call returns by its deadline with descriptors or
// an error; nothing crashes. Fresh ring objects start over after each error.
TEST(RingCorruptionTest, AClientScribblingOverTheRingsNeverHangsOrCrashesTheDaemon) {
  Segment daemon = CreateSegment(16);
  const int fd = daemon.fd();
  auto* stop = static_cast<std::atomic<uint32_t>*>(
      static_cast<void*>(daemon.base() + daemon.layout().rx_heap.offset));
  stop->store(0);
  const pid_t client_pid = StartChild([fd] {
    absl::StatusOr<Segment> client = Segment::Map(dup(fd));
    if (!client.ok()) return 10;
    auto* stop = static_cast<std::atomic<uint32_t>*>(
        static_cast<void*>(client->base() + client->layout().rx_heap.offset));
    std::mt19937 rng(99);
    const Region rings{client->layout().submission.region.offset,
                       client->layout().tx_heap.offset - client->layout().submission.region.offset};
    auto* words = reinterpret_cast<std::atomic<uint32_t>*>(client->base() + rings.offset);
    const size_t count = rings.bytes / 4;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (stop->load() == 0 && absl::Now() < deadline) {
      // Mostly small values near real indices, sometimes anything.
      const uint32_t value = rng() % 4 == 0 ? rng() : rng() % 40;
      words[rng() % count].store(value, std::memory_order_relaxed);
    }
    return 0;
  });
  ASSERT_GT(client_pid, 0);

  int errors = 0;
  int popped = 0;
  int refused = 0;
  const absl::Time end = absl::Now() + absl::Milliseconds(500);
  while (absl::Now() < end) {
    RingConsumer submissions(daemon.base(), daemon.layout().submission, "submission ring");
    RingProducer completions(daemon.base(), daemon.layout().completion, "completion ring");
    for (int i = 0; i < 1000; ++i) {
      const absl::Time call_deadline = absl::Now() + absl::Milliseconds(2);
      absl::StatusOr<bool> ready = submissions.WaitForData(call_deadline);
      ASSERT_LT(absl::Now(), call_deadline + absl::Milliseconds(500)) << "WaitForData overran";
      if (!ready.ok()) {
        EXPECT_EQ(ready.status().code(), absl::StatusCode::kDataLoss);
        ++errors;
        break;
      }
      Descriptor batch[32];
      absl::StatusOr<size_t> n = submissions.TryPopBatch(absl::MakeSpan(batch));
      if (!n.ok()) {
        ++errors;
        break;
      }
      for (size_t k = 0; k < *n; ++k) {
        ++popped;
        // Garbage descriptors are refused by validation, never trusted.
        if (!ValidateDescriptor(batch[k], daemon.layout(), Direction::kSubmission).ok()) {
          ++refused;
        }
      }
      absl::StatusOr<bool> pushed = completions.TryPush(Numbered(i));
      if (!pushed.ok()) {
        ++errors;
        break;
      }
    }
  }
  stop->store(1);
  EXPECT_EQ(FinishChild(client_pid), 0);
  EXPECT_GT(errors, 0) << "the scribbling should have been caught";
  RecordProperty("errors", errors);
  RecordProperty("popped", popped);
  RecordProperty("refused", refused);
}

}  // namespace
}  // namespace tpd::shm
