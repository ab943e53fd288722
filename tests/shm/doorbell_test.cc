// Tests of the futex doorbell between two processes: a sleeping consumer is woken by the
// producer's Ring, a wait with nothing to read ends at its deadline, and a peer that corrupts
// the shared word causes spurious wake-ups at most, never a wait past its deadline.

#include "shm/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <optional>
#include <random>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "shm/segment.h"
#include "tests/shm/child_process.h"
#include "tests/testing/wait_until.h"

namespace tpd::shm {
namespace {

using testing::FinishChild;
using testing::StartChild;

// A segment whose rx heap holds, for these tests, a DoorbellWord and then a flag word.
struct Shared {
  DoorbellWord word;
  std::atomic<uint32_t> flag;  // the "data" a producer publishes
  std::atomic<uint32_t> stop;  // tells a child to end
};

class DoorbellTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SegmentLimits limits;
    limits.submission_slots = 2;
    limits.completion_slots = 2;
    limits.tx_heap_bytes = kPageBytes;
    limits.rx_heap_bytes = kPageBytes;
    absl::StatusOr<Segment> segment = Segment::Create(limits);
    ASSERT_TRUE(segment.ok()) << segment.status();
    segment_.emplace(*std::move(segment));
    // Two of them: a ping and a pong.
    uint8_t* at = segment_->base() + segment_->layout().rx_heap.offset;
    new (at) Shared;
    new (at + sizeof(Shared)) Shared;
    shared_ = reinterpret_cast<Shared*>(at);
    for (int i = 0; i < 2; ++i) {
      shared_[i].word.seq.store(0);
      shared_[i].word.sleeping.store(0);
      shared_[i].flag.store(0);
      shared_[i].stop.store(0);
    }
  }

  // The same Shared, mapped afresh from the fd as a client would (call in the child).
  Shared* MapInChild() {
    absl::StatusOr<Segment> client = Segment::Map(dup(segment_->fd()));
    if (!client.ok()) return nullptr;
    child_segment_.emplace(*std::move(client));
    return reinterpret_cast<Shared*>(child_segment_->base() +
                                     child_segment_->layout().rx_heap.offset);
  }

  std::optional<Segment> segment_;
  std::optional<Segment> child_segment_;  // in a child only
  Shared* shared_ = nullptr;              // Shared[2] in segment_'s rx heap
};

TEST_F(DoorbellTest, RingWakesAConsumerSleepingInAnotherProcess) {
  const pid_t pid = StartChild([this] {
    Shared* shared = MapInChild();
    if (shared == nullptr) return 10;
    Doorbell doorbell(&shared->word);
    const absl::Time start = absl::Now();
    const bool ready = doorbell.Wait([&] { return shared->flag.load(std::memory_order_acquire); },
                                     absl::Now() + absl::Seconds(20));
    if (!ready) return 11;
    if (absl::Now() - start > absl::Seconds(10)) return 12;
    return doorbell.sleeps() >= 1 ? 0 : 13;
  });
  ASSERT_GT(pid, 0);
  // Only once the child announced its sleep, so the wake-up (not the spin) is what is tested.
  ASSERT_TRUE(tpd::testing::WaitUntil([&] { return shared_->word.sleeping.load() == 1; }))
      << "the child went to sleep";
  absl::SleepFor(absl::Milliseconds(20));  // let it reach FUTEX_WAIT itself
  shared_->flag.store(1, std::memory_order_release);
  Doorbell producer(&shared_->word);
  producer.Ring();
  EXPECT_EQ(producer.wakeups(), 1u) << "the consumer was asleep: one FUTEX_WAKE";
  EXPECT_EQ(FinishChild(pid, absl::Seconds(15)), 0);
  EXPECT_EQ(shared_->word.sleeping.load(), 0u) << "the consumer withdrew its announcement";
}

TEST_F(DoorbellTest, ManyWakeUpsAcrossProcessesAreNeverLost) {
  // Ping-pong through two words with spinning off: every round trip is two futex wake-ups.
  // A lost wake-up would stall a round until the 20 s deadline, which fails the child.
  constexpr uint32_t kRounds = 2000;
  SpinOptions no_spin;
  no_spin.max_spin = absl::ZeroDuration();
  const pid_t pid = StartChild([&] {
    Shared* shared = MapInChild();
    if (shared == nullptr) return 10;
    Doorbell ping(&shared->word, no_spin);
    Doorbell pong(&shared[1].word, no_spin);
    for (uint32_t i = 1; i <= kRounds; ++i) {
      if (!ping.Wait([&] { return shared->flag.load(std::memory_order_acquire) >= i; },
                     absl::Now() + absl::Seconds(20))) {
        return 11;
      }
      shared[1].flag.store(i, std::memory_order_release);
      pong.Ring();
    }
    return 0;
  });
  ASSERT_GT(pid, 0);
  Doorbell ping(&shared_[0].word, no_spin);
  Doorbell pong(&shared_[1].word, no_spin);
  for (uint32_t i = 1; i <= kRounds; ++i) {
    shared_[0].flag.store(i, std::memory_order_release);
    ping.Ring();
    ASSERT_TRUE(pong.Wait([&] { return shared_[1].flag.load(std::memory_order_acquire) >= i; },
                          absl::Now() + absl::Seconds(20)))
        << "round " << i;
  }
  EXPECT_EQ(FinishChild(pid), 0);
  // Most rounds find the answer only after announcing sleep; some actually sleep.
  EXPECT_GT(pong.sleeps(), 0u);
  RecordProperty("sleeps", static_cast<int>(pong.sleeps()));
}

TEST_F(DoorbellTest, WaitWithNothingToReadEndsAtItsDeadlineAsleep) {
  Doorbell doorbell(&shared_->word);
  const absl::Time start = absl::Now();
  EXPECT_FALSE(doorbell.Wait([] { return false; }, start + absl::Milliseconds(50)));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, absl::Milliseconds(50));
  EXPECT_LT(waited, absl::Seconds(2));
  EXPECT_GE(doorbell.sleeps(), 1u) << "it slept instead of spinning out the 50 ms";
  EXPECT_EQ(shared_->word.sleeping.load(), 0u);
}

TEST_F(DoorbellTest, ADeadlineInThePastReturnsAtOnce) {
  Doorbell doorbell(&shared_->word);
  EXPECT_FALSE(doorbell.Wait([] { return false; }, absl::Now() - absl::Seconds(1)));
  EXPECT_TRUE(doorbell.Wait([] { return true; }, absl::Now() - absl::Seconds(1)))
      << "what is ready is reported even late";
  EXPECT_EQ(doorbell.sleeps(), 0u);
}

TEST_F(DoorbellTest, RingWithoutASleeperLeavesTheWordAlone) {
  Doorbell producer(&shared_->word);
  producer.Ring();
  EXPECT_EQ(shared_->word.seq.load(), 0u);
  EXPECT_EQ(producer.wakeups(), 0u) << "nobody slept: no wake-up counted";
  shared_->word.sleeping.store(1);
  producer.Ring();
  EXPECT_EQ(shared_->word.seq.load(), 1u);
  EXPECT_EQ(producer.wakeups(), 1u);
}

// The client corrupts the word the daemon sleeps on: random values into seq and sleeping, and
// FUTEX_WAKEs of its own. The daemon's waits still end at their deadlines, no later.
TEST_F(DoorbellTest, ACorruptedWordCausesSpuriousWakeUpsButNoWaitPastItsDeadline) {
  const pid_t pid = StartChild([this] {
    Shared* shared = MapInChild();
    if (shared == nullptr) return 10;
    std::mt19937 rng(5);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (shared->stop.load() == 0 && absl::Now() < deadline) {
      switch (rng() % 4) {
        case 0:
          shared->word.seq.store(rng());
          break;
        case 1:
          shared->word.sleeping.store(rng() % 3);
          break;
        case 2:
          syscall(SYS_futex, &shared->word.seq, FUTEX_WAKE, 1, nullptr, nullptr, 0);
          break;
        default:
          absl::SleepFor(absl::Microseconds(rng() % 200));
      }
    }
    return 0;
  });
  ASSERT_GT(pid, 0);
  Doorbell doorbell(&shared_->word);
  for (int i = 0; i < 20; ++i) {
    const absl::Time start = absl::Now();
    EXPECT_FALSE(doorbell.Wait([] { return false; }, start + absl::Milliseconds(20)));
    const absl::Duration waited = absl::Now() - start;
    EXPECT_GE(waited, absl::Milliseconds(20));
    EXPECT_LT(waited, absl::Milliseconds(20) + absl::Milliseconds(500)) << "wait " << i;
  }
  // Data that is there is still seen through the noise.
  const absl::Time start = absl::Now();
  shared_->flag.store(1);
  EXPECT_TRUE(doorbell.Wait([&] { return shared_->flag.load() == 1; }, start + absl::Seconds(5)));
  shared_->stop.store(1);
  EXPECT_EQ(FinishChild(pid), 0);
  EXPECT_GT(doorbell.spurious_wakeups(), 0u) << "the corruption was noticed as wake-ups";
  RecordProperty("spurious_wakeups", static_cast<int>(doorbell.spurious_wakeups()));
}

TEST(SpinWindowTest, TheWindowFollowsHowLongWaitsTake) {
  SpinOptions options;
  options.min_spin = absl::Microseconds(2);
  options.max_spin = absl::Microseconds(50);
  SpinWindow spin(options);
  EXPECT_EQ(spin.window_ns(), 50'000) << "starts spinning fully";
  // Waits answered after 10 µs: it settles at four times that.
  for (int i = 0; i < 30; ++i) spin.Learn(10'000);
  EXPECT_NEAR(spin.window_ns(), 40'000, 400);
  // 15 µs waits: four times is past max_spin, so max_spin.
  for (int i = 0; i < 30; ++i) spin.Learn(15'000);
  EXPECT_EQ(spin.window_ns(), 50'000);
  // Waits longer than max_spin (an idle peer): spinning is useless, min_spin.
  for (int i = 0; i < 10; ++i) spin.Learn(5'000'000);
  EXPECT_EQ(spin.window_ns(), 2'000);
  // Busy again: a few quick waits bring the spin back, one long wait does not undo it.
  for (int i = 0; i < 15; ++i) spin.Learn(5'000);
  EXPECT_NEAR(spin.window_ns(), 20'000, 6'000);
  spin.Learn(1'000'000'000);
  EXPECT_GT(spin.window_ns(), 2'000) << "one hiccup";
  for (int i = 0; i < 3; ++i) spin.Learn(1'000'000'000);
  EXPECT_EQ(spin.window_ns(), 2'000) << "idle";
  // Immediate answers: the minimum.
  for (int i = 0; i < 30; ++i) spin.Learn(0);
  EXPECT_EQ(spin.window_ns(), 2'000);
}

TEST(SpinWindowTest, ZeroMaxSpinNeverSpins) {
  SpinOptions options;
  options.max_spin = absl::ZeroDuration();
  SpinWindow spin(options);
  EXPECT_EQ(spin.window_ns(), 0);
  spin.Learn(1'000);
  EXPECT_EQ(spin.window_ns(), 0);
}

TEST_F(DoorbellTest, WaitsFeedTheSpinWindow) {
  Doorbell doorbell(&shared_->word);
  EXPECT_EQ(doorbell.spin_window(), absl::Microseconds(50));
  for (int i = 0; i < 30; ++i) EXPECT_TRUE(doorbell.Wait([] { return true; }, absl::Now()));
  EXPECT_EQ(doorbell.spin_window(), absl::Microseconds(2)) << "answered at once: no need to spin";
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(doorbell.Wait([] { return false; }, absl::Now() + absl::Milliseconds(1)));
  }
  EXPECT_EQ(doorbell.spin_window(), absl::Microseconds(2)) << "an idle peer: sleep at once";
}

TEST_F(DoorbellTest, AWaitOfAnotherKindSpinsForAndFeedsItsOwnWindow) {
  Doorbell doorbell(&shared_->word);
  SpinOptions longer;
  longer.max_spin = absl::Milliseconds(1);
  SpinWindow window(longer);
  // It spins through a wait far longer than the doorbell's own window (50 µs) without sleeping.
  const int64_t until = absl::GetCurrentTimeNanos() + 300'000;
  EXPECT_TRUE(doorbell.Wait([until] { return absl::GetCurrentTimeNanos() >= until; },
                            absl::Now() + absl::Seconds(1), &window));
  EXPECT_EQ(doorbell.sleeps(), 0u);
  for (int i = 0; i < 30; ++i) {
    EXPECT_TRUE(doorbell.Wait([] { return true; }, absl::Now(), &window));
  }
  EXPECT_EQ(window.window_ns(), 2'000) << "it learnt from these waits";
  EXPECT_EQ(doorbell.spin_window(), absl::Microseconds(50)) << "the doorbell's own did not";
}

}  // namespace
}  // namespace tpd::shm
