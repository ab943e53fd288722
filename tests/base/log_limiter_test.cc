#include "base/log_limiter.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(LogLimiterTest, AdmitsOneLinePerSourcePerIntervalAndCountsTheRest) {
  LogLimiter limiter(absl::Seconds(10));
  int64_t held = -1;
  ASSERT_TRUE(limiter.Admit("s-1", &held, kStart));
  EXPECT_EQ(held, 0);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limiter.Admit("s-1", &held, kStart + absl::Seconds(i)));
  ASSERT_TRUE(limiter.Admit("s-1", &held, kStart + absl::Seconds(10)));
  EXPECT_EQ(held, 5);
  // The count starts over after each admitted line.
  ASSERT_TRUE(limiter.Admit("s-1", &held, kStart + absl::Seconds(20)));
  EXPECT_EQ(held, 0);
}

TEST(LogLimiterTest, SourcesAreLimitedApart) {
  LogLimiter limiter(absl::Seconds(10));
  int64_t held = 0;
  ASSERT_TRUE(limiter.Admit("uid 1000", &held, kStart));
  EXPECT_FALSE(limiter.Admit("uid 1000", &held, kStart));
  EXPECT_TRUE(limiter.Admit("uid 0", &held, kStart));
}

TEST(LogLimiterTest, ManySourcesStayBoundedAndStillLimitTheNewest) {
  LogLimiter limiter(absl::Seconds(10), /*max_sources=*/8);
  int64_t held = 0;
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(limiter.Admit(absl::StrCat("host ", i), &held, kStart));
  }
  // The table was cleared to make room, yet the newest source is remembered.
  EXPECT_FALSE(limiter.Admit("host 99", &held, kStart));
}

TEST(LogLimiterTest, HeldBackSaysHowManyOnlyWhenSome) {
  EXPECT_EQ(HeldBack(0, absl::Seconds(10)), "");
  EXPECT_EQ(HeldBack(3, absl::Seconds(10)), " (3 more in the last 10s)");
}

}  // namespace
}  // namespace tpd
