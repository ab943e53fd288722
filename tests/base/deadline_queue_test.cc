// The agent's timer structure: ids come out earliest first, once, and only when due.

#include "base/deadline_queue.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

TEST(DeadlineQueueTest, PopsDueIdsEarliestFirstAndLeavesTheRest) {
  DeadlineQueue queue;
  queue.Add(3, kT0 + absl::Seconds(3));
  queue.Add(1, kT0 + absl::Seconds(1));
  queue.Add(2, kT0 + absl::Seconds(2));
  queue.Add(9, kT0 + absl::Seconds(9));
  EXPECT_EQ(queue.Earliest(), kT0 + absl::Seconds(1));
  EXPECT_THAT(queue.PopDue(kT0), IsEmpty());
  EXPECT_THAT(queue.PopDue(kT0 + absl::Seconds(3)), ElementsAre(1, 2, 3));
  EXPECT_EQ(queue.size(), 1u);
  EXPECT_EQ(queue.Earliest(), kT0 + absl::Seconds(9));
  EXPECT_THAT(queue.PopDue(kT0 + absl::Seconds(3)), IsEmpty());
}

TEST(DeadlineQueueTest, EqualDeadlinesComeOutByIdAndEachOnce) {
  DeadlineQueue queue;
  for (uint64_t id : {5, 4, 6}) queue.Add(id, kT0);
  EXPECT_THAT(queue.PopDue(kT0), ElementsAre(4, 5, 6));
  EXPECT_TRUE(queue.empty());
}

TEST(DeadlineQueueTest, RemoveAndReAddMoveAnId) {
  DeadlineQueue queue;
  queue.Add(1, kT0 + absl::Seconds(1));
  queue.Add(2, kT0 + absl::Seconds(2));
  EXPECT_TRUE(queue.Remove(1));
  EXPECT_FALSE(queue.Remove(1));
  queue.Add(2, kT0 + absl::Seconds(5));  // moved later
  EXPECT_THAT(queue.PopDue(kT0 + absl::Seconds(4)), IsEmpty());
  EXPECT_THAT(queue.PopDue(kT0 + absl::Seconds(5)), ElementsAre(2));
}

TEST(DeadlineQueueTest, NoDeadlineIsNeverDue) {
  DeadlineQueue queue;
  queue.Add(1, absl::InfiniteFuture());
  EXPECT_TRUE(queue.empty());
  EXPECT_FALSE(queue.Earliest().has_value());
  EXPECT_FALSE(queue.Remove(1));
}

}  // namespace
}  // namespace tpd
