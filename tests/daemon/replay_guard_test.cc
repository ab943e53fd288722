// The anti-replay window of peer calls: each (sender, sequence) once, calls overtaking each
// other within the window, a bounded sender table that never reopens a forgotten sender's
// old calls.

#include "daemon/replay_guard.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;

const absl::Time kStart = absl::FromUnixMillis(1'000'000);
constexpr int64_t kLater = 1'000'500;  // a timestamp after kStart

TEST(ReplayGuardTest, AcceptsEachSequenceOnce) {
  ReplayGuard guard(16, kStart);
  EXPECT_TRUE(guard.Accept(1, 1, kLater).ok());
  EXPECT_TRUE(guard.Accept(1, 2, kLater).ok());
  absl::Status again = guard.Accept(1, 2, kLater);
  EXPECT_EQ(again.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(again.message(), HasSubstr("replay"));
  EXPECT_TRUE(guard.Accept(2, 2, kLater).ok()) << "another sender's numbers are its own";
}

TEST(ReplayGuardTest, OutOfOrderWithinTheWindowPassesOnce) {
  ReplayGuard guard(16, kStart);
  ASSERT_TRUE(guard.Accept(1, 2000, kLater).ok());
  EXPECT_TRUE(guard.Accept(1, 1999, kLater).ok());
  EXPECT_TRUE(guard.Accept(1, 2000 - ReplayGuard::kWindow + 1, kLater).ok());
  EXPECT_FALSE(guard.Accept(1, 1999, kLater).ok());
  EXPECT_FALSE(guard.Accept(1, 2000 - ReplayGuard::kWindow + 1, kLater).ok());
  ASSERT_TRUE(guard.Accept(1, 5000, kLater).ok());
  absl::Status old = guard.Accept(1, 5000 - ReplayGuard::kWindow, kLater);
  EXPECT_THAT(old.message(), HasSubstr("older than the last"));
  // A jump keeps the bits that are still inside the window.
  ASSERT_TRUE(guard.Accept(1, 5100, kLater).ok());
  EXPECT_FALSE(guard.Accept(1, 5000, kLater).ok());
  EXPECT_TRUE(guard.Accept(1, 5001, kLater).ok());
  for (uint64_t jump : {63, 64, 65, 127, 1023}) {
    ReplayGuard fresh(1, kStart);
    ASSERT_TRUE(fresh.Accept(9, 10, kLater).ok());
    ASSERT_TRUE(fresh.Accept(9, 11, kLater).ok());
    ASSERT_TRUE(fresh.Accept(9, 11 + jump, kLater).ok());
    EXPECT_FALSE(fresh.Accept(9, 11, kLater).ok()) << jump;
    EXPECT_FALSE(fresh.Accept(9, 10, kLater).ok()) << jump;
    EXPECT_TRUE(fresh.Accept(9, 12, kLater).ok()) << jump;
  }
}

TEST(ReplayGuardTest, CallsStampedBeforeTheStartAreRefused) {
  ReplayGuard guard(16, kStart);
  absl::Status before = guard.Accept(1, 1, absl::ToUnixMillis(kStart) - 1);
  EXPECT_EQ(before.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(before.message(), HasSubstr("this daemon's start"));
  EXPECT_TRUE(guard.Accept(1, 2, kLater).ok());
}

TEST(ReplayGuardTest, TheTableIsBoundedAndForgottenSendersStayClosed) {
  ReplayGuard guard(2, kStart);
  ASSERT_TRUE(guard.Accept(1, 1, kLater).ok());
  ASSERT_TRUE(guard.Accept(2, 1, kLater + 10).ok());
  ASSERT_TRUE(guard.Accept(1, 2, kLater + 20).ok());  // 1 is now the most recently seen
  ASSERT_TRUE(guard.Accept(3, 1, kLater + 30).ok());  // forgets 2, the least recently seen
  EXPECT_EQ(guard.senders(), 2);
  // Sender 2's recorded call would look new now; its timestamp is not above the floor.
  EXPECT_FALSE(guard.Accept(2, 1, kLater + 10).ok());
  // Its next real call, stamped later, passes.
  EXPECT_TRUE(guard.Accept(2, 2, kLater + 40).ok());
  EXPECT_EQ(guard.senders(), 2);
  EXPECT_FALSE(guard.Accept(3, 1, kLater + 30).ok()) << "a tracked sender keeps its window";
}

TEST(ReplayGuardTest, SequenceZeroIsNeverValid) {
  ReplayGuard guard(16, kStart);
  EXPECT_FALSE(guard.Accept(1, 0, kLater).ok());
}

}  // namespace
}  // namespace tpd
