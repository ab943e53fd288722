#include "tests/store/store_conformance.h"

#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"

namespace tpd::store {

WaitCallback WaitResult::Callback() {
  return [this](absl::StatusOr<std::vector<std::string>> result) {
    if (calls_.fetch_add(1) > 0) return;  // counted; a second call is a test failure
    {
      absl::MutexLock lock(&mu_);
      result_ = std::move(result);
    }
    done_.Notify();
  };
}

absl::StatusOr<std::vector<std::string>> WaitResult::result() const {
  absl::MutexLock lock(&mu_);
  return *result_;
}

void StoreConformanceTest::SetUp() {
  under_test_ = GetParam()(kDefaultMaxWaiters);
  ASSERT_NE(under_test_, nullptr);
  store_ = &under_test_->store();
}

bool StoreConformanceTest::Completed(const WaitResult& result) const {
  return under_test_->CompletesBeforeReturning() ? result.HasRun() : result.Await();
}

bool StoreConformanceTest::HasWaiters(StoreUnderTest& under_test, int64_t n) {
  if (under_test.CompletesBeforeReturning()) return under_test.waiters() == n;
  const absl::Time give_up = absl::Now() + kSanityBound;
  while (under_test.waiters() != n) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST_P(StoreConformanceTest, SetThenGetReturnsTheValue) {
  ASSERT_TRUE(store_->Set("key", "value").ok());
  absl::StatusOr<std::string> value = store_->Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "value");
}

TEST_P(StoreConformanceTest, SetOverwritesTheValue) {
  ASSERT_TRUE(store_->Set("key", "first").ok());
  ASSERT_TRUE(store_->Set("key", "second").ok());
  absl::StatusOr<std::string> value = store_->Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "second");
}

TEST_P(StoreConformanceTest, WaitAsyncOnPresentKeysCompletesBeforeReturning) {
  WaitResult& result = NewWaitResult();
  ASSERT_TRUE(store_->Set("a", "1").ok());
  ASSERT_TRUE(store_->Set("b", "2").ok());
  ASSERT_TRUE(store_->WaitAsync({"b", "a"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(Completed(result));
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ElementsAre("2", "1"));
  EXPECT_TRUE(HasWaiters(0)) << under_test_->waiters();
}

TEST_P(StoreConformanceTest, AddOnMissingKeyCreatesIt) {
  absl::StatusOr<int64_t> sum = store_->Add("counter", 5);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 5);
  absl::StatusOr<std::string> value = store_->Get("counter", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "5");
}

TEST_P(StoreConformanceTest, AddAccumulates) {
  ASSERT_TRUE(store_->Add("counter", 3).ok());
  ASSERT_TRUE(store_->Add("counter", 4).ok());
  absl::StatusOr<int64_t> sum = store_->Add("counter", -10);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, -3);
  absl::StatusOr<std::string> value = store_->Get("counter", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "-3");
}

TEST_P(StoreConformanceTest, AddOnNonIntegerValueIsFailedPreconditionAndKeepsTheValue) {
  ASSERT_TRUE(store_->Set("key", "not a number").ok());
  absl::StatusOr<int64_t> sum = store_->Add("key", 1);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition) << sum.status();
  EXPECT_THAT(sum.status().message(), HasSubstr("key"));
  absl::StatusOr<std::string> value = store_->Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "not a number");
}

TEST_P(StoreConformanceTest, AddOverflowIsInvalidArgumentAndKeepsTheValue) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  ASSERT_TRUE(store_->Add("counter", max).ok());
  absl::StatusOr<int64_t> sum = store_->Add("counter", 1);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument) << sum.status();
  absl::StatusOr<std::string> value = store_->Get("counter", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, absl::StrCat(max));

  const int64_t min = std::numeric_limits<int64_t>::min();
  ASSERT_TRUE(store_->Set("negative", absl::StrCat(min)).ok());
  EXPECT_EQ(store_->Add("negative", -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(StoreConformanceTest, CompareSetWithMatchingExpectedStoresDesired) {
  ASSERT_TRUE(store_->Set("key", "old").ok());
  absl::StatusOr<std::string> result = store_->CompareSet("key", "old", "new");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "new");
  absl::StatusOr<std::string> value = store_->Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "new");
}

TEST_P(StoreConformanceTest, CompareSetWithMismatchReturnsCurrentValueAndLeavesItUnchanged) {
  ASSERT_TRUE(store_->Set("key", "current").ok());
  absl::StatusOr<std::string> result = store_->CompareSet("key", "other", "new");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "current");
  absl::StatusOr<std::string> value = store_->Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "current");
}

TEST_P(StoreConformanceTest, CompareSetOnMissingKeyWithEmptyExpectedCreatesItWithDesired) {
  absl::StatusOr<std::string> result = store_->CompareSet("key", "", "desired");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "desired");
  absl::StatusOr<std::string> value = store_->Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "desired");
}

TEST_P(StoreConformanceTest,
       CompareSetOnMissingKeyWithNonEmptyExpectedReturnsExpectedAndCreatesNothing) {
  absl::StatusOr<std::string> result = store_->CompareSet("key", "expected", "desired");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "expected");
  absl::StatusOr<bool> present = store_->Check({"key"});
  ASSERT_TRUE(present.ok()) << present.status();
  EXPECT_FALSE(*present);
  EXPECT_EQ(store_->NumKeys("").value_or(-1), 0);
}

TEST_P(StoreConformanceTest, WaitTimesOutWithDeadlineExceededNamingMissingKeys) {
  ASSERT_TRUE(store_->Set("present_key", "v").ok());
  absl::Status status = store_->Wait({"present_key", "missing_one", "missing_two"},
                                     absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("timed out after"));
  EXPECT_THAT(
      status.message(),
      HasSubstr(absl::StrCat("waiting for keys [\"", under_test_->NameInMessages("missing_one"),
                             "\", \"", under_test_->NameInMessages("missing_two"), "\"]")));
  EXPECT_THAT(status.message(), Not(HasSubstr("present_key")));
  EXPECT_TRUE(HasWaiters(0)) << under_test_->waiters();
}

TEST_P(StoreConformanceTest, WaitHonoursTheDeadline) {
  const absl::Duration timeout = absl::Milliseconds(100);
  const absl::Time start = absl::Now();
  absl::Status status = store_->Wait({"never_set"}, start + timeout);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(elapsed, timeout);
  EXPECT_LT(elapsed, kSanityBound);
}

TEST_P(StoreConformanceTest, WaitWithPastDeadlineOnMissingKeyTimesOut) {
  absl::Status status = store_->Wait({"never_set"}, absl::Now() - absl::Seconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
}

TEST_P(StoreConformanceTest, CheckIsTrueOnlyWhenEveryKeyIsSet) {
  ASSERT_TRUE(store_->Set("a", "1").ok());
  absl::StatusOr<bool> all_present = store_->Check({"a"});
  ASSERT_TRUE(all_present.ok()) << all_present.status();
  EXPECT_TRUE(*all_present);
  absl::StatusOr<bool> one_missing = store_->Check({"a", "b"});
  ASSERT_TRUE(one_missing.ok()) << one_missing.status();
  EXPECT_FALSE(*one_missing);
  ASSERT_TRUE(store_->Set("b", "2").ok());
  absl::StatusOr<bool> both_present = store_->Check({"a", "b"});
  ASSERT_TRUE(both_present.ok()) << both_present.status();
  EXPECT_TRUE(*both_present);
}

TEST_P(StoreConformanceTest, DeleteKeyOfAbsentKeyReturnsFalse) {
  ASSERT_TRUE(store_->Set("other", "value").ok());
  absl::StatusOr<bool> deleted = store_->DeleteKey("key");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_FALSE(*deleted);
  EXPECT_EQ(store_->NumKeys("").value_or(-1), 1);
}

TEST_P(StoreConformanceTest, NumKeysCountsEveryKeyWithoutPrefixAndOnlyMatchingKeysWithOne) {
  for (const char* key : {"a/1", "a/2", "ab", "b/1"}) ASSERT_TRUE(store_->Set(key, "v").ok());
  EXPECT_EQ(store_->NumKeys("").value_or(-1), 4);
  EXPECT_EQ(store_->NumKeys("a/").value_or(-1), 2);
  EXPECT_EQ(store_->NumKeys("a").value_or(-1), 3);
  EXPECT_EQ(store_->NumKeys("b/").value_or(-1), 1);
  EXPECT_EQ(store_->NumKeys("c").value_or(-1), 0);
  ASSERT_TRUE(store_->DeleteKey("a/1").ok());
  EXPECT_EQ(store_->NumKeys("a/").value_or(-1), 1);
}

TEST_P(StoreConformanceTest, MultiGetReturnsValuesInRequestOrder) {
  ASSERT_TRUE(store_->Set("a", "1").ok());
  ASSERT_TRUE(store_->Set("b", "2").ok());
  ASSERT_TRUE(store_->Set("c", "3").ok());
  absl::StatusOr<std::vector<std::string>> values =
      store_->MultiGet({"c", "a", "b", "a"}, LongDeadline());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("3", "1", "2", "1"));
}

TEST_P(StoreConformanceTest, MultiSetSetsEveryKey) {
  ASSERT_TRUE(store_->MultiSet({"a", "b", "c"}, {"1", "2", "3"}).ok());
  absl::StatusOr<std::vector<std::string>> values =
      store_->MultiGet({"a", "b", "c"}, LongDeadline());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("1", "2", "3"));
}

TEST_P(StoreConformanceTest, MultiSetWakesAWaiterOnAllItsKeysAtOnce) {
  WaitResult& result = NewWaitResult();
  ASSERT_TRUE(store_->WaitAsync({"b", "a"}, LongDeadline(), result.Callback()).ok());
  // Parked before the keys arrive (a remote wait registers a little after WaitAsync returns).
  ASSERT_TRUE(HasWaiters(1)) << under_test_->waiters();
  ASSERT_TRUE(store_->MultiSet({"a", "b"}, {"1", "2"}).ok());
  ASSERT_TRUE(Completed(result));
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ElementsAre("2", "1"));
}

TEST_P(StoreConformanceTest, MultiSetWithMismatchedSizesIsInvalidArgumentAndSetsNothing) {
  absl::Status status = store_->MultiSet({"a", "b"}, {"1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(store_->NumKeys("").value_or(-1), 0);
}

TEST_P(StoreConformanceTest, AppendToMissingKeyCreatesIt) {
  ASSERT_TRUE(store_->Append("key", "abc").ok());
  absl::StatusOr<std::string> value = store_->Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "abc");
}

TEST_P(StoreConformanceTest, AppendToExistingKeyConcatenates) {
  ASSERT_TRUE(store_->Set("key", "abc").ok());
  ASSERT_TRUE(store_->Append("key", "def").ok());
  absl::StatusOr<std::string> value = store_->Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "abcdef");
}

TEST_P(StoreConformanceTest, CancelWaitEndsTheWaitWithCancelledExactlyOnce) {
  WaitResult& result = NewWaitResult();
  absl::StatusOr<WaitId> id = store_->WaitAsync({"key"}, LongDeadline(), result.Callback());
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(HasWaiters(1)) << under_test_->waiters();
  EXPECT_FALSE(result.HasRun());

  store_->CancelWait(*id);
  ASSERT_TRUE(Completed(result));
  EXPECT_EQ(result.result().status().code(), absl::StatusCode::kCancelled)
      << result.result().status();
  EXPECT_TRUE(HasWaiters(0)) << under_test_->waiters();

  // Neither a second cancel nor the key arriving runs the callback again.
  store_->CancelWait(*id);
  ASSERT_TRUE(store_->Set("key", "value").ok());
  EXPECT_EQ(result.calls(), 1);
  EXPECT_TRUE(HasWaiters(0)) << under_test_->waiters();
}

TEST_P(StoreConformanceTest, CancelWaitOfUnknownIdIsANoOp) {
  WaitResult& result = NewWaitResult();
  absl::StatusOr<WaitId> id = store_->WaitAsync({"key"}, LongDeadline(), result.Callback());
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(HasWaiters(1)) << under_test_->waiters();
  store_->CancelWait(*id + 1000);
  EXPECT_FALSE(result.HasRun());
  EXPECT_TRUE(HasWaiters(1)) << under_test_->waiters();
}

TEST_P(StoreConformanceTest, WaitAsyncPastMaxWaitersIsResourceExhaustedNamingTheLimit) {
  WaitResult first, second, refused, later;
  std::unique_ptr<StoreUnderTest> limited = GetParam()(/*max_waiters=*/2);
  ASSERT_NE(limited, nullptr);
  Store& store = limited->store();
  absl::StatusOr<WaitId> first_id = store.WaitAsync({"a"}, LongDeadline(), first.Callback());
  ASSERT_TRUE(first_id.ok()) << first_id.status();
  ASSERT_TRUE(store.WaitAsync({"b"}, LongDeadline(), second.Callback()).ok());
  ASSERT_TRUE(HasWaiters(*limited, 2)) << limited->waiters();

  absl::StatusOr<WaitId> over = store.WaitAsync({"c"}, LongDeadline(), refused.Callback());
  if (limited->CompletesBeforeReturning()) {
    EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
    EXPECT_THAT(over.status().message(), HasSubstr("store.max_waiters"));
    EXPECT_EQ(refused.calls(), 0);
  } else {
    // The limit is the serving daemon's, and only its answer to the wait's call can tell:
    // a remote store refuses through the callback, once (remote_store.h).
    ASSERT_TRUE(over.ok()) << over.status();
    ASSERT_TRUE(refused.Await());
    EXPECT_EQ(refused.result().status().code(), absl::StatusCode::kResourceExhausted)
        << refused.result().status();
    EXPECT_THAT(refused.result().status().message(), HasSubstr("store.max_waiters"));
    EXPECT_EQ(refused.calls(), 1);
  }
  EXPECT_TRUE(HasWaiters(*limited, 2)) << limited->waiters();

  // A finished wait frees its slot.
  store.CancelWait(*first_id);
  ASSERT_TRUE(HasWaiters(*limited, 1)) << limited->waiters();
  EXPECT_TRUE(store.WaitAsync({"c"}, LongDeadline(), later.Callback()).ok());
  EXPECT_TRUE(HasWaiters(*limited, 2)) << limited->waiters();
  EXPECT_FALSE(later.HasRun());
  EXPECT_EQ(refused.calls(), limited->CompletesBeforeReturning() ? 0 : 1);
}

}  // namespace
}  // namespace tpd::store
