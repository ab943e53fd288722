// Unit tests of the bounded list and string renderings used in messages.

#include "base/summarize.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

TEST(SummarizeTest, ShortListIsJoinedWhole) {
  EXPECT_EQ(JoinSummarized(std::vector<int>{1, 2, 3}, ", "), "1, 2, 3");
  EXPECT_EQ(JoinSummarized(std::vector<std::string>{}, ", "), "");
  EXPECT_EQ(JoinSummarized(std::vector<std::string>{"a"}, "; "), "a");
}

TEST(SummarizeTest, ListOfExactlyTheLimitHasNoTail) {
  std::vector<int> items(kMaxListedItems, 7);
  EXPECT_EQ(JoinSummarized(items, ",").find("more"), std::string::npos);
}

TEST(SummarizeTest, LongListShowsTheFirstTenAndCountsTheRest) {
  std::vector<int> items;
  for (int i = 0; i < 1000000; ++i) items.push_back(i);
  EXPECT_EQ(JoinSummarized(items, ", "), "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... and 999990 more");
}

TEST(SummarizeTest, MaxItemsZeroGivesOnlyTheCount) {
  EXPECT_EQ(JoinSummarized(std::vector<int>{1, 2}, ", ", absl::AlphaNumFormatter(), 0),
            "... and 2 more");
}

TEST(SummarizeTest, FormatterAppliesToMapsAndOtherRanges) {
  std::map<std::string, int> map = {{"a", 1}, {"b", 2}};
  EXPECT_EQ(JoinSummarized(map, ", ",
                           [](std::string* out, const auto& entry) {
                             absl::StrAppend(out, entry.first, "=", entry.second);
                           }),
            "a=1, b=2");
}

TEST(SummarizeTest, EchoEscapesControlCharactersAndCutsLongText) {
  EXPECT_EQ(Echo("plain"), "plain");
  EXPECT_EQ(Echo("a\nb"), "a\\nb");
  EXPECT_EQ(Echo(std::string("\0x", 2)), "\\x00x");
  const std::string long_text(10000, 'k');
  EXPECT_EQ(Echo(long_text), absl::StrCat(std::string(kMaxEchoedBytes, 'k'), "..."));
  EXPECT_EQ(Echo("abcdef", 3), "abc...");
}

TEST(SummarizeTest, JoinEchoedBoundsBothCountAndLength) {
  std::vector<std::string> names(2000, std::string(1 << 20, 'x'));
  const std::string joined = JoinEchoed(names, ", ");
  EXPECT_LT(joined.size(), 2 * kMaxListedItems * (kMaxEchoedBytes + 8));
  EXPECT_NE(joined.find("... and 1990 more"), std::string::npos);
}

}  // namespace
}  // namespace tpd
