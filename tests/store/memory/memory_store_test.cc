// Unit tests of MemoryStore against the c10d Store semantics that store/store.h promises.

#include "store/memory/memory_store.h"

#include <atomic>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/store.h"

namespace tpd::store {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// Long enough that no test waits out a deadline it does not mean to, short enough that a
// broken wake-up fails the test instead of hanging the suite.
constexpr absl::Duration kLongWait = absl::Seconds(30);
// The sanity bound for anything that should finish "promptly"; never a tight timing check.
constexpr absl::Duration kSanityBound = absl::Seconds(5);

absl::Time LongDeadline() { return absl::Now() + kLongWait; }

// Awaits the store reporting `n` pending waits, i.e. a waiter being parked. Polls Stats(),
// the one observable sign of a parked waiter; false after kSanityBound.
bool AwaitWaiters(MemoryStore& store, int64_t n) {
  const absl::Time give_up = absl::Now() + kSanityBound;
  while (store.Stats().waiters != n) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Microseconds(100));
  }
  return true;
}

// Collects what a WaitAsync callback receives, and how often it runs. Must outlive the
// store it is passed to: the store's destructor ends pending waits.
class WaitResult {
 public:
  WaitCallback Callback() {
    return [this](absl::StatusOr<std::vector<std::string>> result) {
      if (calls_.fetch_add(1) > 0) return;  // counted; a second call is a test failure
      {
        absl::MutexLock lock(&mu_);
        result_ = std::move(result);
      }
      done_.Notify();
    };
  }

  // True once the callback ran; HasRun() right after a store call that completes the wait
  // is deterministic, since completions run before that call returns.
  bool HasRun() const { return done_.HasBeenNotified(); }
  bool Await() const { return done_.WaitForNotificationWithTimeout(kSanityBound); }
  int calls() const { return calls_.load(); }

  // REQUIRES: HasRun().
  absl::StatusOr<std::vector<std::string>> result() const {
    absl::MutexLock lock(&mu_);
    return *result_;
  }

 private:
  std::atomic<int> calls_{0};
  absl::Notification done_;
  mutable absl::Mutex mu_;
  std::optional<absl::StatusOr<std::vector<std::string>>> result_ ABSL_GUARDED_BY(mu_);
};

TEST(MemoryStoreTest, SetThenGetReturnsTheValue) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("key", "value").ok());
  absl::StatusOr<std::string> value = store.Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "value");
}

TEST(MemoryStoreTest, SetOverwritesTheValue) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("key", "first").ok());
  ASSERT_TRUE(store.Set("key", "second").ok());
  absl::StatusOr<std::string> value = store.Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "second");
}

TEST(MemoryStoreTest, GetWaitsUntilAnotherThreadSetsTheKey) {
  MemoryStore store;
  std::thread setter([&store] {
    // Set only once the getter is parked, so the get really waits.
    ASSERT_TRUE(AwaitWaiters(store, 1));
    ASSERT_TRUE(store.Set("key", "late value").ok());
  });
  absl::StatusOr<std::string> value = store.Get("key", LongDeadline());
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "late value");
  EXPECT_EQ(store.Stats().waiters, 0);
}

TEST(MemoryStoreTest, WaitAsyncOnPresentKeysCompletesBeforeReturning) {
  WaitResult result;
  MemoryStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Set("b", "2").ok());
  ASSERT_TRUE(store.WaitAsync({"b", "a"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(result.HasRun());
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ElementsAre("2", "1"));
  EXPECT_EQ(store.Stats().waiters, 0);
}

TEST(MemoryStoreTest, AddOnMissingKeyCreatesIt) {
  MemoryStore store;
  absl::StatusOr<int64_t> sum = store.Add("counter", 5);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 5);
  absl::StatusOr<std::string> value = store.Get("counter", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "5");
}

TEST(MemoryStoreTest, AddAccumulates) {
  MemoryStore store;
  ASSERT_TRUE(store.Add("counter", 3).ok());
  ASSERT_TRUE(store.Add("counter", 4).ok());
  absl::StatusOr<int64_t> sum = store.Add("counter", -10);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, -3);
  absl::StatusOr<std::string> value = store.Get("counter", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "-3");
}

TEST(MemoryStoreTest, AddOnNonIntegerValueIsFailedPreconditionAndKeepsTheValue) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("key", "not a number").ok());
  absl::StatusOr<int64_t> sum = store.Add("key", 1);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition) << sum.status();
  EXPECT_THAT(sum.status().message(), HasSubstr("key"));
  absl::StatusOr<std::string> value = store.Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "not a number");
}

TEST(MemoryStoreTest, AddOverflowIsInvalidArgumentAndKeepsTheValue) {
  MemoryStore store;
  const int64_t max = std::numeric_limits<int64_t>::max();
  ASSERT_TRUE(store.Add("counter", max).ok());
  absl::StatusOr<int64_t> sum = store.Add("counter", 1);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument) << sum.status();
  absl::StatusOr<std::string> value = store.Get("counter", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, absl::StrCat(max));

  const int64_t min = std::numeric_limits<int64_t>::min();
  ASSERT_TRUE(store.Set("negative", absl::StrCat(min)).ok());
  EXPECT_EQ(store.Add("negative", -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MemoryStoreTest, CompareSetWithMatchingExpectedStoresDesired) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("key", "old").ok());
  absl::StatusOr<std::string> result = store.CompareSet("key", "old", "new");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "new");
  absl::StatusOr<std::string> value = store.Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "new");
}

TEST(MemoryStoreTest, CompareSetWithMismatchReturnsCurrentValueAndLeavesItUnchanged) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("key", "current").ok());
  absl::StatusOr<std::string> result = store.CompareSet("key", "other", "new");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "current");
  absl::StatusOr<std::string> value = store.Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "current");
}

TEST(MemoryStoreTest, CompareSetOnMissingKeyWithEmptyExpectedCreatesItWithDesired) {
  MemoryStore store;
  absl::StatusOr<std::string> result = store.CompareSet("key", "", "desired");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "desired");
  absl::StatusOr<std::string> value = store.Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "desired");
}

TEST(MemoryStoreTest, CompareSetOnMissingKeyWithNonEmptyExpectedReturnsExpectedAndCreatesNothing) {
  MemoryStore store;
  absl::StatusOr<std::string> result = store.CompareSet("key", "expected", "desired");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "expected");
  absl::StatusOr<bool> present = store.Check({"key"});
  ASSERT_TRUE(present.ok()) << present.status();
  EXPECT_FALSE(*present);
  EXPECT_EQ(store.Stats().num_keys, 0);
}

TEST(MemoryStoreTest, WaitTimesOutWithDeadlineExceededNamingMissingKeys) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("present_key", "v").ok());
  absl::Status status = store.Wait({"present_key", "missing_one", "missing_two"},
                                   absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("\"missing_one\""));
  EXPECT_THAT(status.message(), HasSubstr("\"missing_two\""));
  EXPECT_THAT(status.message(), Not(HasSubstr("present_key")));
  EXPECT_EQ(store.Stats().waiters, 0);
}

TEST(MemoryStoreTest, WaitHonoursTheDeadline) {
  MemoryStore store;
  const absl::Duration timeout = absl::Milliseconds(100);
  const absl::Time start = absl::Now();
  absl::Status status = store.Wait({"never_set"}, start + timeout);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(elapsed, timeout);
  EXPECT_LT(elapsed, kSanityBound);
}

TEST(MemoryStoreTest, WaitWithPastDeadlineOnMissingKeyTimesOut) {
  MemoryStore store;
  absl::Status status = store.Wait({"never_set"}, absl::Now() - absl::Seconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
}

TEST(MemoryStoreTest, CheckIsTrueOnlyWhenEveryKeyIsSet) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  absl::StatusOr<bool> all_present = store.Check({"a"});
  ASSERT_TRUE(all_present.ok()) << all_present.status();
  EXPECT_TRUE(*all_present);
  absl::StatusOr<bool> one_missing = store.Check({"a", "b"});
  ASSERT_TRUE(one_missing.ok()) << one_missing.status();
  EXPECT_FALSE(*one_missing);
  ASSERT_TRUE(store.Set("b", "2").ok());
  absl::StatusOr<bool> both_present = store.Check({"a", "b"});
  ASSERT_TRUE(both_present.ok()) << both_present.status();
  EXPECT_TRUE(*both_present);
}

TEST(MemoryStoreTest, DeleteKeyOfPresentKeyRemovesItAndReturnsTrue) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("key", "value").ok());
  absl::StatusOr<bool> deleted = store.DeleteKey("key");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_TRUE(*deleted);
  absl::StatusOr<bool> present = store.Check({"key"});
  ASSERT_TRUE(present.ok()) << present.status();
  EXPECT_FALSE(*present);
  EXPECT_EQ(store.Stats().num_keys, 0);
  EXPECT_EQ(store.Stats().bytes, 0);
}

TEST(MemoryStoreTest, DeleteKeyOfAbsentKeyReturnsFalse) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("other", "value").ok());
  absl::StatusOr<bool> deleted = store.DeleteKey("key");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_FALSE(*deleted);
  EXPECT_EQ(store.Stats().num_keys, 1);
}

TEST(MemoryStoreTest, NumKeysCountsEveryKeyWithoutPrefixAndOnlyMatchingKeysWithOne) {
  MemoryStore store;
  for (const char* key : {"a/1", "a/2", "ab", "b/1"}) ASSERT_TRUE(store.Set(key, "v").ok());
  EXPECT_EQ(store.NumKeys("").value_or(-1), 4);
  EXPECT_EQ(store.NumKeys("a/").value_or(-1), 2);
  EXPECT_EQ(store.NumKeys("a").value_or(-1), 3);
  EXPECT_EQ(store.NumKeys("b/").value_or(-1), 1);
  EXPECT_EQ(store.NumKeys("c").value_or(-1), 0);
}

TEST(MemoryStoreTest, StatsTrackKeysAndBytes) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("ab", "cde").ok());
  EXPECT_EQ(store.Stats().num_keys, 1);
  EXPECT_EQ(store.Stats().bytes, 5);
  ASSERT_TRUE(store.Set("ab", "x").ok());
  EXPECT_EQ(store.Stats().bytes, 3);
  ASSERT_TRUE(store.Append("ab", "yz").ok());
  EXPECT_EQ(store.Stats().bytes, 5);
}

TEST(MemoryStoreTest, MultiGetReturnsValuesInRequestOrder) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Set("b", "2").ok());
  ASSERT_TRUE(store.Set("c", "3").ok());
  absl::StatusOr<std::vector<std::string>> values =
      store.MultiGet({"c", "a", "b", "a"}, LongDeadline());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("3", "1", "2", "1"));
}

TEST(MemoryStoreTest, MultiSetSetsEveryKey) {
  MemoryStore store;
  ASSERT_TRUE(store.MultiSet({"a", "b", "c"}, {"1", "2", "3"}).ok());
  absl::StatusOr<std::vector<std::string>> values = store.MultiGet({"a", "b", "c"}, LongDeadline());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("1", "2", "3"));
}

TEST(MemoryStoreTest, MultiSetWakesAWaiterOnAllItsKeysAtOnce) {
  WaitResult result;
  MemoryStore store;
  ASSERT_TRUE(store.WaitAsync({"b", "a"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(store.MultiSet({"a", "b"}, {"1", "2"}).ok());
  ASSERT_TRUE(result.HasRun());
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ElementsAre("2", "1"));
}

TEST(MemoryStoreTest, MultiSetWithMismatchedSizesIsInvalidArgumentAndSetsNothing) {
  MemoryStore store;
  absl::Status status = store.MultiSet({"a", "b"}, {"1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(store.Stats().num_keys, 0);
}

TEST(MemoryStoreTest, AppendToMissingKeyCreatesIt) {
  MemoryStore store;
  ASSERT_TRUE(store.Append("key", "abc").ok());
  absl::StatusOr<std::string> value = store.Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "abc");
}

TEST(MemoryStoreTest, AppendToExistingKeyConcatenates) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("key", "abc").ok());
  ASSERT_TRUE(store.Append("key", "def").ok());
  absl::StatusOr<std::string> value = store.Get("key", LongDeadline());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "abcdef");
}

TEST(MemoryStoreTest, AppendWakesAWaiterOnTheKey) {
  WaitResult result;
  MemoryStore store;
  ASSERT_TRUE(store.WaitAsync({"key"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(store.Append("key", "abc").ok());
  ASSERT_TRUE(result.HasRun());
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ElementsAre("abc"));
}

TEST(MemoryStoreTest, TimedOutWaitLeavesTheStoreUsableForTheSameCaller) {
  MemoryStore store;
  absl::Status timed_out = store.Wait({"key"}, absl::Now() + absl::Milliseconds(20));
  ASSERT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded) << timed_out;
  EXPECT_EQ(store.Stats().waiters, 0);

  // The same caller goes on: a new wait on the same key, woken by a set from elsewhere.
  std::thread setter([&store] {
    ASSERT_TRUE(AwaitWaiters(store, 1));
    ASSERT_TRUE(store.Set("key", "value").ok());
  });
  absl::StatusOr<std::string> value = store.Get("key", LongDeadline());
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "value");
  EXPECT_EQ(store.Add("counter", 2).value_or(-1), 2);
  EXPECT_EQ(store.Stats().waiters, 0);
}

TEST(MemoryStoreTest, CancelWaitEndsTheWaitWithCancelledExactlyOnce) {
  WaitResult result;
  MemoryStore store;
  absl::StatusOr<WaitId> id = store.WaitAsync({"key"}, LongDeadline(), result.Callback());
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(store.Stats().waiters, 1);
  EXPECT_FALSE(result.HasRun());

  store.CancelWait(*id);
  ASSERT_TRUE(result.HasRun());
  EXPECT_EQ(result.result().status().code(), absl::StatusCode::kCancelled)
      << result.result().status();
  EXPECT_EQ(store.Stats().waiters, 0);

  // Neither a second cancel nor the key arriving runs the callback again.
  store.CancelWait(*id);
  ASSERT_TRUE(store.Set("key", "value").ok());
  EXPECT_EQ(result.calls(), 1);
  EXPECT_EQ(store.Stats().waiters, 0);
}

TEST(MemoryStoreTest, CancelWaitOfUnknownIdIsANoOp) {
  WaitResult result;
  MemoryStore store;
  absl::StatusOr<WaitId> id = store.WaitAsync({"key"}, LongDeadline(), result.Callback());
  ASSERT_TRUE(id.ok()) << id.status();
  store.CancelWait(*id + 1000);
  EXPECT_FALSE(result.HasRun());
  EXPECT_EQ(store.Stats().waiters, 1);
}

TEST(MemoryStoreTest, CallbackRunsExactlyOnceWhenSetCancelAndDeadlineRace) {
  constexpr int kRounds = 300;
  std::deque<WaitResult> results(kRounds);  // outlive the store
  int ok = 0, cancelled = 0, deadline_exceeded = 0;
  {
    MemoryStore store;
    for (int i = 0; i < kRounds; ++i) {
      const std::string key = absl::StrCat("race/", i);
      // Deadlines from already past to a little in the future, so each of the three
      // endings wins some rounds.
      const absl::Time deadline = absl::Now() + absl::Microseconds(100 * (i % 5) - 100);
      absl::StatusOr<WaitId> id = store.WaitAsync({key}, deadline, results[i].Callback());
      ASSERT_TRUE(id.ok()) << id.status();
      std::thread setter([&store, &key] { ASSERT_TRUE(store.Set(key, "v").ok()); });
      std::thread canceller([&store, &id] { store.CancelWait(*id); });
      setter.join();
      canceller.join();
      ASSERT_TRUE(results[i].Await()) << "round " << i;
      switch (results[i].result().status().code()) {
        case absl::StatusCode::kOk:
          ++ok;
          break;
        case absl::StatusCode::kCancelled:
          ++cancelled;
          break;
        case absl::StatusCode::kDeadlineExceeded:
          ++deadline_exceeded;
          break;
        default:
          ADD_FAILURE() << "round " << i << ": " << results[i].result().status();
      }
    }
    EXPECT_TRUE(AwaitWaiters(store, 0));
  }  // The destructor joins the timer thread, so no late callback can follow.
  for (int i = 0; i < kRounds; ++i) EXPECT_EQ(results[i].calls(), 1) << "round " << i;
  EXPECT_EQ(ok + cancelled + deadline_exceeded, kRounds);
  // Which ending won is up to the scheduler; recorded in test.xml for the curious.
  ::testing::Test::RecordProperty("won_by_set", ok);
  ::testing::Test::RecordProperty("won_by_cancel", cancelled);
  ::testing::Test::RecordProperty("won_by_deadline", deadline_exceeded);
}

TEST(MemoryStoreTest, WaitAsyncPastMaxWaitersIsResourceExhaustedNamingTheLimit) {
  WaitResult first, second, refused, later;
  MemoryStoreOptions options;
  options.max_waiters = 2;
  MemoryStore store(options);
  absl::StatusOr<WaitId> first_id = store.WaitAsync({"a"}, LongDeadline(), first.Callback());
  ASSERT_TRUE(first_id.ok()) << first_id.status();
  ASSERT_TRUE(store.WaitAsync({"b"}, LongDeadline(), second.Callback()).ok());

  absl::StatusOr<WaitId> over = store.WaitAsync({"c"}, LongDeadline(), refused.Callback());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(over.status().message(), HasSubstr("store.max_waiters"));
  EXPECT_EQ(refused.calls(), 0);
  EXPECT_EQ(store.Stats().waiters, 2);

  // A finished wait frees its slot.
  store.CancelWait(*first_id);
  EXPECT_TRUE(store.WaitAsync({"c"}, LongDeadline(), later.Callback()).ok());
  EXPECT_EQ(refused.calls(), 0);
}

TEST(MemoryStoreTest, ShutdownEndsPendingWaitsWithUnavailableAndRefusesNewOnes) {
  WaitResult async_wait, after_shutdown;
  MemoryStore store;
  ASSERT_TRUE(store.Set("present", "v").ok());
  ASSERT_TRUE(store.WaitAsync({"a"}, LongDeadline(), async_wait.Callback()).ok());
  absl::Status blocking_status;
  std::thread blocking(
      [&store, &blocking_status] { blocking_status = store.Wait({"b"}, LongDeadline()); });
  ASSERT_TRUE(AwaitWaiters(store, 2));

  store.Shutdown();
  blocking.join();
  EXPECT_EQ(blocking_status.code(), absl::StatusCode::kUnavailable) << blocking_status;
  ASSERT_TRUE(async_wait.HasRun());
  EXPECT_EQ(async_wait.result().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store.Stats().waiters, 0);

  absl::StatusOr<WaitId> refused =
      store.WaitAsync({"a"}, LongDeadline(), after_shutdown.Callback());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_EQ(after_shutdown.calls(), 0);
  // The data stays readable through the non-waiting calls.
  EXPECT_TRUE(store.Check({"present"}).value_or(false));
  EXPECT_EQ(async_wait.calls(), 1);
}

TEST(MemoryStoreTest, DestructorEndsPendingWaitsWithUnavailable) {
  WaitResult result;
  {
    MemoryStore store;
    ASSERT_TRUE(store.WaitAsync({"key"}, LongDeadline(), result.Callback()).ok());
  }
  ASSERT_TRUE(result.HasRun());
  EXPECT_EQ(result.result().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(result.calls(), 1);
}

TEST(MemoryStoreTest, ConcurrentAddsFromSixteenThreadsSumExactly) {
  constexpr int kThreads = 16;
  constexpr int kAddsPerThread = 1000;
  MemoryStore store;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&store, t] {
      for (int i = 0; i < kAddsPerThread; ++i) {
        ASSERT_TRUE(store.Add("counter", t + 1).ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const int64_t expected = int64_t{kAddsPerThread} * kThreads * (kThreads + 1) / 2;
  EXPECT_EQ(store.Add("counter", 0).value_or(-1), expected);
}

TEST(MemoryStoreTest, WaitKeepsWaitingWhenASetKeyIsDeletedBeforeTheLastKeyArrives) {
  WaitResult result;
  MemoryStore store;
  ASSERT_TRUE(store.WaitAsync({"a", "b", "c"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Set("b", "2").ok());
  ASSERT_TRUE(store.DeleteKey("a").value_or(false));
  // Every key has now been set once, but "a" is gone again: the wait must not complete.
  ASSERT_TRUE(store.Set("c", "3").ok());
  EXPECT_FALSE(result.HasRun());
  EXPECT_EQ(store.Stats().waiters, 1);

  ASSERT_TRUE(store.Set("a", "again").ok());
  ASSERT_TRUE(result.HasRun());
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ElementsAre("again", "2", "3"));
  EXPECT_EQ(store.Stats().waiters, 0);
}

TEST(MemoryStoreTest, WaitsOnTheSameKeyAreAllWokenBySet) {
  WaitResult first, second;
  MemoryStore store;
  ASSERT_TRUE(store.WaitAsync({"key"}, LongDeadline(), first.Callback()).ok());
  ASSERT_TRUE(store.WaitAsync({"other", "key"}, LongDeadline(), second.Callback()).ok());
  ASSERT_TRUE(store.Set("key", "v").ok());
  ASSERT_TRUE(first.HasRun());
  EXPECT_THAT(first.result().value_or(std::vector<std::string>{}), ElementsAre("v"));
  EXPECT_FALSE(second.HasRun());
  ASSERT_TRUE(store.Set("other", "w").ok());
  ASSERT_TRUE(second.HasRun());
  EXPECT_THAT(second.result().value_or(std::vector<std::string>{}), ElementsAre("w", "v"));
}

}  // namespace
}  // namespace tpd::store
