#include "tests/testing/group_store_checks.h"

#include <future>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tpd::testing {

void ExpectOneGroupStore(const std::vector<Client*>& members, const std::string& group) {
  ASSERT_GE(members.size(), 3u);
  const StoreView a = members[0]->GroupStore(group);
  const StoreView b = members[1]->GroupStore(group);
  const StoreView c = members[2]->GroupStore(group);
  // The group's own records (its versions) are not among its members' keys.
  absl::StatusOr<int64_t> none = a.NumKeys();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, 0);

  ASSERT_TRUE(a.Set("k", "from a").ok());
  absl::StatusOr<std::string> read = b.Get("k", absl::Seconds(10));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "from a");

  std::future<absl::StatusOr<std::string>> waiting =
      std::async(std::launch::async, [&c] { return c.Get("late", absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(b.Set("late", "from b").ok());
  absl::StatusOr<std::string> late = waiting.get();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, "from b");

  for (size_t i = 0; i < members.size(); ++i) {
    ASSERT_TRUE(members[i]->GroupStore(group).Add("n", static_cast<int64_t>(i + 1)).ok());
  }
  absl::StatusOr<int64_t> sum = c.Add("n", 0);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, static_cast<int64_t>(members.size() * (members.size() + 1) / 2));

  absl::StatusOr<std::string> swapped = c.CompareSet("k", "from a", "from c");
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_EQ(*a.Get("k"), "from c");

  // Namespaces of the group's store stay apart, and the daemon's own store is another.
  absl::StatusOr<bool> elsewhere = members[1]->GroupStore(group, "ns").Check({"k"});
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  EXPECT_FALSE(*elsewhere);
  absl::StatusOr<bool> local = members[0]->Store().Check({"k"});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_FALSE(*local);
  EXPECT_EQ(*b.NumKeys(), 3) << "k, late and n";
  absl::StatusOr<bool> deleted = b.DeleteKey("late");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_TRUE(*deleted);
  EXPECT_FALSE(*a.Check({"late"}));
}

}  // namespace tpd::testing
