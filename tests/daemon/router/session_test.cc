#include "daemon/router/session.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/layout.h"

namespace tpd::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint32_t kSlots = 4;

// A session over an in-process segment whose completion ring holds kSlots, and the client's
// end of that ring.
class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shm::SegmentLimits limits;
    limits.submission_slots = kSlots;
    limits.completion_slots = kSlots;
    limits.tx_heap_bytes = shm::kMinHeapBytes;
    limits.rx_heap_bytes = shm::kMinHeapBytes;
    absl::StatusOr<shm::Segment> segment = shm::Segment::Create(limits);
    ASSERT_TRUE(segment.ok()) << segment.status();
    segment_ = std::make_shared<shm::Segment>(*std::move(segment));
    session_.id = "s-test";
    session_.handle = "s-test";
    session_.limits = {/*max_unposted=*/3, /*max_waiting_calls=*/2};
    session_.segment = segment_;
    absl::MutexLock lock(&session_.mu);
    session_.completions = std::make_unique<shm::RingProducer>(
        segment_->base(), segment_->layout().completion, "completion ring");
    client_ = std::make_unique<shm::RingConsumer>(segment_->base(), segment_->layout().completion,
                                                  "client");
  }

  absl::Status Post(shm::Op op, uint64_t call_id) {
    shm::Descriptor d{};
    d.op = static_cast<uint8_t>(op);
    d.call_id = call_id;
    absl::MutexLock lock(&session_.mu);
    return session_.Post(d);
  }

  void Flush() {
    absl::MutexLock lock(&session_.mu);
    session_.FlushUnposted();
  }

  // Reads up to `n` completions as the client would: their call ids.
  std::vector<uint64_t> Read(size_t n) {
    std::vector<uint64_t> ids;
    shm::Descriptor d{};
    while (ids.size() < n && client_->TryPop(&d).value_or(false)) ids.push_back(d.call_id);
    return ids;
  }

  std::shared_ptr<shm::Segment> segment_;
  Session session_;
  std::unique_ptr<shm::RingConsumer> client_;
};

TEST_F(SessionTest, AnswersPastTheRingWaitAndGoInOrderAsTheClientMakesRoom) {
  session_.calls_in_flight = 6;
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(Post(shm::Op::kReply, id).ok()) << id;
  EXPECT_EQ(session_.unposted_count.load(), 2);
  // A reply counts its call down only once it is on the ring.
  EXPECT_EQ(session_.calls_in_flight.load(), 2);
  EXPECT_THAT(Read(3), ElementsAre(1, 2, 3));
  Flush();  // the session's thread, after the client made room
  EXPECT_EQ(session_.unposted_count.load(), 0);
  EXPECT_EQ(session_.calls_in_flight.load(), 0);
  EXPECT_THAT(Read(10), ElementsAre(4, 5, 6));
}

TEST_F(SessionTest, CallsPastTheRingWaitUpToTheirBoundThenAreRefusedAndTheSessionLives) {
  for (uint64_t id = 1; id <= kSlots + 2; ++id) ASSERT_TRUE(Post(shm::Op::kCall, id).ok()) << id;
  absl::Status refused = Post(shm::Op::kCall, 99);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("is full and 2 calls wait for room on it"));
  {
    absl::MutexLock lock(&session_.mu);
    EXPECT_FALSE(session_.broken);
  }
  // An answer waits behind the calls queued before it, and every one of them arrives.
  ASSERT_TRUE(Post(shm::Op::kReply, 50).ok());
  EXPECT_THAT(Read(10), ElementsAre(1, 2, 3, 4));
  Flush();
  EXPECT_THAT(Read(10), ElementsAre(5, 6, 50));
}

TEST_F(SessionTest, AClientThatLeavesTooManyAnswersUnreadBreaksItsSession) {
  for (uint64_t id = 1; id <= kSlots + 3; ++id) ASSERT_TRUE(Post(shm::Op::kRelease, id).ok());
  absl::Status ended = Post(shm::Op::kRelease, 100);
  EXPECT_EQ(ended.code(), absl::StatusCode::kUnavailable) << ended;
  EXPECT_THAT(ended.message(), HasSubstr("its client left 3 answers and releases unread"));
  // Nothing more goes to it, with the same reason, whatever it is.
  absl::Status after = Post(shm::Op::kCall, 101);
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(after.message(), ended.message());
  Flush();
  EXPECT_THAT(Read(10), ElementsAre(1, 2, 3, 4));
}

TEST_F(SessionTest, ReleasesOfBlocksACopyStillWritesWaitUntilItCompleted) {
  const Session::BlockRef rx{0, 4096};
  const Session::BlockRef pool{2, 8192};  // cuda:1's receive pool
  const Session::BlockRef other{0, 12288};
  session_.HoldWhileCopying({rx, pool});
  // The client releases one while the copy runs (early, or hostile): held back.
  EXPECT_TRUE(session_.DeferRelease(rx));
  EXPECT_FALSE(session_.DeferRelease(other));  // not held: released at once
  // Only what was released meanwhile comes back to be freed; the hold is gone after.
  EXPECT_THAT(session_.EndCopying({rx, pool}), ElementsAre(rx));
  EXPECT_FALSE(session_.DeferRelease(pool));
  EXPECT_THAT(session_.EndCopying({rx, pool}), ::testing::IsEmpty());
}

}  // namespace
}  // namespace tpd::router
