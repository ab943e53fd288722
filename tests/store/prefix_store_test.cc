// Unit tests of PrefixStore: namespaces over a MemoryStore base. The c10d semantics every store
// shares run through the conformance suite (tests/store/store_conformance.cc) on a namespace.

#include "store/prefix_store.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/memory/memory_store.h"
#include "store/store.h"
#include "tests/store/store_conformance.h"

namespace tpd::store {
namespace {

using ::testing::ElementsAre;

// A namespace over a MemoryStore that also holds keys outside it, so a wait or a count that
// escaped the namespace would show.
class PrefixStoreUnderTest : public StoreUnderTest {
 public:
  explicit PrefixStoreUnderTest(MemoryStoreOptions options)
      : base_(options), group_("group", &base_) {
    EXPECT_TRUE(base_.Set("outside", "v").ok());
  }
  Store& store() override { return group_; }
  int64_t waiters() override { return base_.Stats().waiters; }
  std::string NameInMessages(const std::string& key) override { return "group/" + key; }

 private:
  MemoryStore base_;
  PrefixStore group_;
};

std::unique_ptr<StoreUnderTest> MakePrefixStore(int64_t max_waiters) {
  MemoryStoreOptions options;
  options.max_waiters = max_waiters;
  return std::make_unique<PrefixStoreUnderTest>(options);
}

INSTANTIATE_TEST_SUITE_P(PrefixStoreOverMemoryStore, StoreConformanceTest,
                         ::testing::Values(StoreFactory(MakePrefixStore)));

TEST(PrefixStoreTest, SameKeyInTwoPrefixesIsIndependent) {
  MemoryStore base;
  PrefixStore group1("group1", &base);
  PrefixStore group2("group2", &base);
  ASSERT_TRUE(group1.Set("key", "one").ok());
  ASSERT_TRUE(group2.Set("key", "two").ok());
  EXPECT_EQ(group1.Get("key", LongDeadline()).value_or(""), "one");
  EXPECT_EQ(group2.Get("key", LongDeadline()).value_or(""), "two");

  ASSERT_TRUE(group1.DeleteKey("key").value_or(false));
  EXPECT_FALSE(group1.Check({"key"}).value_or(true));
  EXPECT_TRUE(group2.Check({"key"}).value_or(false));
}

TEST(PrefixStoreTest, BaseStoreSeesKeysAsPrefixSlashKey) {
  MemoryStore base;
  PrefixStore group("group", &base);
  ASSERT_TRUE(group.Set("key", "value").ok());
  ASSERT_TRUE(group.Add("counter", 7).ok());
  EXPECT_EQ(base.Get("group/key", LongDeadline()).value_or(""), "value");
  EXPECT_EQ(base.Get("group/counter", LongDeadline()).value_or(""), "7");
  EXPECT_FALSE(base.Check({"key"}).value_or(true));
  EXPECT_EQ(base.Stats().num_keys, 2);
}

TEST(PrefixStoreTest, NestedPrefixesNestNamespaces) {
  MemoryStore base;
  PrefixStore outer("outer", &base);
  PrefixStore inner("inner", &outer);
  ASSERT_TRUE(inner.Set("key", "value").ok());
  EXPECT_EQ(base.Get("outer/inner/key", LongDeadline()).value_or(""), "value");
  EXPECT_EQ(outer.Get("inner/key", LongDeadline()).value_or(""), "value");
}

TEST(PrefixStoreTest, OperationsGoThroughThePrefix) {
  MemoryStore base;
  PrefixStore group("group", &base);
  ASSERT_TRUE(group.MultiSet({"a", "b"}, {"1", "2"}).ok());
  EXPECT_EQ(group.Add("a", 4).value_or(-1), 5);
  EXPECT_EQ(group.CompareSet("b", "2", "3").value_or(""), "3");
  ASSERT_TRUE(group.Append("c", "xy").ok());
  absl::StatusOr<std::vector<std::string>> values = group.MultiGet({"c", "b", "a"}, LongDeadline());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("xy", "3", "5"));
  EXPECT_THAT(base.MultiGet({"group/a", "group/b", "group/c"}, LongDeadline())
                  .value_or(std::vector<std::string>{}),
              ElementsAre("5", "3", "xy"));
}

TEST(PrefixStoreTest, NumKeysCountsOnlyItsOwnPrefix) {
  MemoryStore base;
  PrefixStore group("group", &base);
  // "group2" starts with "group": only the '/' keeps the two namespaces apart.
  PrefixStore group2("group2", &base);
  ASSERT_TRUE(group.Set("a/1", "v").ok());
  ASSERT_TRUE(group.Set("a/2", "v").ok());
  ASSERT_TRUE(group.Set("b", "v").ok());
  ASSERT_TRUE(group2.Set("a/1", "v").ok());
  ASSERT_TRUE(base.Set("group", "v").ok());
  ASSERT_TRUE(base.Set("other", "v").ok());

  EXPECT_EQ(group.NumKeys("").value_or(-1), 3);
  EXPECT_EQ(group.NumKeys("a/").value_or(-1), 2);
  EXPECT_EQ(group2.NumKeys("").value_or(-1), 1);
  EXPECT_EQ(base.NumKeys("").value_or(-1), 6);
}

TEST(PrefixStoreTest, WaitAsyncWakesOnSetThroughTheSamePrefix) {
  WaitResult result;
  MemoryStore base;
  PrefixStore group("group", &base);
  ASSERT_TRUE(group.WaitAsync({"key"}, LongDeadline(), result.Callback()).ok());
  EXPECT_FALSE(result.HasRun());
  ASSERT_TRUE(group.Set("key", "value").ok());
  // The completion runs inside Set, before it returns.
  ASSERT_TRUE(result.HasRun());
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ElementsAre("value"));
  EXPECT_EQ(base.Stats().waiters, 0);
}

TEST(PrefixStoreTest, WaitAsyncIsNotWokenBySetThroughAnotherPrefix) {
  WaitResult result;
  MemoryStore base;
  PrefixStore group1("group1", &base);
  PrefixStore group2("group2", &base);
  ASSERT_TRUE(
      group1.WaitAsync({"key"}, absl::Now() + absl::Milliseconds(50), result.Callback()).ok());
  ASSERT_TRUE(group2.Set("key", "value").ok());
  ASSERT_TRUE(base.Set("key", "value").ok());
  EXPECT_FALSE(result.HasRun());

  ASSERT_TRUE(result.Await());
  EXPECT_EQ(result.result().status().code(), absl::StatusCode::kDeadlineExceeded)
      << result.result().status();
  EXPECT_EQ(result.calls(), 1);
}

}  // namespace
}  // namespace tpd::store
