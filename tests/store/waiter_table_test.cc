// Unit tests of WaiterTable: which waits end, when, and with what result, over a plain map
// standing in for a backend's data. No threads and no store: the table is driven directly.

#include "store/waiter_table.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/store.h"

namespace tpd::store {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::Time LongDeadline() { return absl::Now() + absl::Hours(1); }

// Counts a callback's runs and keeps the last result.
struct Outcome {
  WaitCallback Callback() {
    return [this](absl::StatusOr<std::vector<std::string>> r) {
      ++calls;
      result = std::move(r);
    };
  }
  std::vector<std::string> values() const {
    return result.value_or(std::vector<std::string>{"(no values)"});
  }

  int calls = 0;
  absl::StatusOr<std::vector<std::string>> result = absl::UnknownError("not run");
};

// The table with a map as the backend's data, driven as a backend drives it.
class WaiterTableTest : public ::testing::Test {
 protected:
  static constexpr int64_t kMaxWaiters = 2;

  // The table's lookup into `data_`.
  const std::string* Find(const std::string& key) const {
    auto it = data_.find(key);
    return it == data_.end() ? nullptr : &it->second;
  }

  // Adds a wait that `outcome` records; 0, never an id, when Add fails.
  WaitId AddWait(std::vector<std::string> keys, Outcome& outcome,
                 absl::Time deadline = LongDeadline()) {
    absl::StatusOr<WaitId> id = table_.Add(
        std::move(keys), deadline, outcome.Callback(),
        [this](const std::string& key) { return Find(key); }, &out_);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }

  void Set(const std::string& key, std::string value) {
    data_[key] = std::move(value);
    table_.OnKeySet(
        key, [this](const std::string& k) { return Find(k); }, &out_);
  }

  void ExpireUntil(absl::Time now) {
    table_.ExpireUntil(
        now, [this](const std::string& key) { return Find(key); }, &out_);
  }

  // Runs the waits ended so far, as a backend does once it released its lock.
  void RunEnded() {
    WaiterTable::Run(std::move(out_));
    out_.clear();
  }

  std::map<std::string, std::string> data_;
  WaiterTable table_{kMaxWaiters};
  std::vector<WaiterTable::Completion> out_;  // ended, not yet run
};

TEST_F(WaiterTableTest, AddWithEveryKeySetEndsAtOnceWithValuesInRequestOrder) {
  Set("a", "1");
  Set("b", "2");
  Outcome outcome;
  const WaitId id = AddWait({"b", "a"}, outcome);
  EXPECT_FALSE(table_.Contains(id));
  EXPECT_EQ(table_.size(), 0);
  EXPECT_EQ(outcome.calls, 0);  // callbacks run only when the owner runs them
  RunEnded();
  EXPECT_EQ(outcome.calls, 1);
  EXPECT_THAT(outcome.values(), ElementsAre("2", "1"));
}

TEST_F(WaiterTableTest, ParkedWaitEndsWhenItsLastMissingKeyIsSet) {
  Outcome outcome;
  const WaitId id = AddWait({"a", "b"}, outcome);
  EXPECT_TRUE(out_.empty());
  EXPECT_TRUE(table_.Contains(id));

  Set("unrelated", "x");
  Set("a", "1");
  EXPECT_TRUE(out_.empty());  // now parked on "b"
  EXPECT_TRUE(table_.Contains(id));

  Set("b", "2");
  EXPECT_FALSE(table_.Contains(id));
  RunEnded();
  EXPECT_EQ(outcome.calls, 1);
  EXPECT_THAT(outcome.values(), ElementsAre("1", "2"));
}

TEST_F(WaiterTableTest, WaitParksAgainOnAKeyDeletedAfterItWasSet) {
  Outcome outcome;
  const WaitId id = AddWait({"a", "b"}, outcome);
  Set("a", "1");
  data_.erase("a");
  // "b" arrives, but "a" is gone again: the wait parks on "a" instead of ending.
  Set("b", "2");
  EXPECT_TRUE(out_.empty());
  EXPECT_TRUE(table_.Contains(id));

  Set("a", "again");
  RunEnded();
  EXPECT_EQ(outcome.calls, 1);
  EXPECT_THAT(outcome.values(), ElementsAre("again", "2"));
}

TEST_F(WaiterTableTest, ExpireUntilEndsOnlyDueWaitsNamingTheirMissingKeys) {
  Set("present", "v");
  const absl::Time soon = absl::Now() + absl::Milliseconds(50);
  const absl::Time later = soon + absl::Seconds(1);
  Outcome due, not_due;
  AddWait({"present", "missing_one", "missing_two"}, due, soon);
  AddWait({"missing_one"}, not_due, later);
  EXPECT_EQ(table_.NextDeadline(), soon);

  ExpireUntil(soon);
  EXPECT_EQ(table_.size(), 1);
  EXPECT_EQ(table_.NextDeadline(), later);
  RunEnded();
  EXPECT_EQ(due.calls, 1);
  EXPECT_EQ(due.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  // The duration is the deadline less the (slightly later) start of the wait: about 50ms.
  EXPECT_THAT(std::string(due.result.status().message()),
              AllOf(StartsWith("timed out after "),
                    EndsWith("ms waiting for keys [\"missing_one\", \"missing_two\"]")));
  EXPECT_EQ(not_due.calls, 0);
}

// A wait on many long keys must not produce a message past gRPC's metadata limit.
TEST_F(WaiterTableTest, TimeoutMessageListsAtMostTenKeysEachCut) {
  std::vector<std::string> keys;
  for (int i = 0; i < 1000; ++i) keys.push_back(absl::StrCat(i, std::string(4000, 'k')));
  const absl::Time soon = absl::Now() + absl::Milliseconds(1);
  Outcome outcome;
  AddWait(keys, outcome, soon);
  ExpireUntil(soon);
  RunEnded();
  ASSERT_EQ(outcome.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  const std::string message(outcome.result.status().message());
  EXPECT_LT(message.size(), 2000u);
  EXPECT_THAT(message, AllOf(HasSubstr("[\"0kkk"), EndsWith("... and 990 more]")));
}

TEST_F(WaiterTableTest, NextDeadlineIsInfiniteFutureWithNoWaitPending) {
  EXPECT_EQ(table_.NextDeadline(), absl::InfiniteFuture());
}

TEST_F(WaiterTableTest, CancelEndsThePendingWaitWithCancelledExactlyOnce) {
  Outcome outcome;
  const WaitId id = AddWait({"key"}, outcome);
  table_.Cancel(id, &out_);
  EXPECT_EQ(table_.size(), 0);

  // Neither a second cancel, an unknown id nor the key arriving ends it again.
  table_.Cancel(id, &out_);
  table_.Cancel(id + 1000, &out_);
  Set("key", "v");
  EXPECT_EQ(out_.size(), 1u);
  RunEnded();
  EXPECT_EQ(outcome.calls, 1);
  EXPECT_EQ(outcome.result.status(), absl::CancelledError("wait cancelled by the caller"));
}

TEST_F(WaiterTableTest, EndAllEndsEveryPendingWaitWithTheGivenStatus) {
  Outcome first, second;
  AddWait({"a"}, first);
  AddWait({"b"}, second);

  const absl::Status stopping = absl::UnavailableError("the store is stopping");
  table_.EndAll(stopping, &out_);
  EXPECT_EQ(table_.size(), 0);
  EXPECT_EQ(table_.NextDeadline(), absl::InfiniteFuture());
  RunEnded();
  EXPECT_EQ(first.calls, 1);
  EXPECT_EQ(first.result.status(), stopping);
  EXPECT_EQ(second.calls, 1);
  EXPECT_EQ(second.result.status(), stopping);
}

TEST_F(WaiterTableTest, AddAtTheLimitIsResourceExhaustedAndDropsTheCallbackUncalled) {
  Outcome first, second, refused, later;
  const WaitId first_id = AddWait({"a"}, first);
  AddWait({"b"}, second);

  absl::StatusOr<WaitId> over = table_.Add(
      {"c"}, LongDeadline(), refused.Callback(),
      [this](const std::string& key) { return Find(key); }, &out_);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(over.status().message(), HasSubstr("store.max_waiters = 2"));
  EXPECT_TRUE(out_.empty());
  EXPECT_EQ(table_.size(), 2);

  // An ended wait frees its slot.
  table_.Cancel(first_id, &out_);
  AddWait({"c"}, later);
  RunEnded();
  EXPECT_EQ(refused.calls, 0);
}

TEST_F(WaiterTableTest, IdsAreNeverReused) {
  Outcome first, second;
  const WaitId first_id = AddWait({"a"}, first);
  table_.Cancel(first_id, &out_);
  EXPECT_NE(AddWait({"a"}, second), first_id);
}

}  // namespace
}  // namespace tpd::store
