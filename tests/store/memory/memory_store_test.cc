// Unit tests of MemoryStore. The c10d semantics every backend shares run here through the
// conformance suite (tests/store/store_conformance.cc); the tests below are MemoryStore's own:
// its stats, its timer thread, shutdown, and waits woken from other threads.

#include "store/memory/memory_store.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/store.h"
#include "tests/store/store_conformance.h"

namespace tpd::store {
namespace {

using ::testing::ElementsAre;

class MemoryStoreUnderTest : public StoreUnderTest {
 public:
  explicit MemoryStoreUnderTest(MemoryStoreOptions options) : store_(options) {}
  Store& store() override { return store_; }
  int64_t waiters() override { return store_.Stats().waiters; }

 private:
  MemoryStore store_;
};

std::unique_ptr<StoreUnderTest> MakeMemoryStore(int64_t max_waiters) {
  MemoryStoreOptions options;
  options.max_waiters = max_waiters;
  return std::make_unique<MemoryStoreUnderTest>(options);
}

INSTANTIATE_TEST_SUITE_P(MemoryStore, StoreConformanceTest,
                         ::testing::Values(StoreFactory(MakeMemoryStore)));

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

TEST(MemoryStoreTest, WritesPastMaxTotalBytesAreRefusedAndChangeNothing) {
  MemoryStoreOptions options;
  options.max_total_bytes = 10;
  MemoryStore store(options);
  ASSERT_TRUE(store.Set("a", "12345678").ok());  // 9 bytes
  for (absl::Status refused :
       {store.Set("b", "1"), store.MultiSet({"b", "c"}, {"", ""}), store.Append("a", "90"),
        store.CompareSet("c", "", "x").status(), store.Add("counter", 1).status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
    EXPECT_THAT(refused.message(), ::testing::HasSubstr("store.max_total_bytes is 10"));
  }
  EXPECT_EQ(store.Stats().bytes, 9);
  EXPECT_EQ(store.Stats().num_keys, 1);
  // Replacing a value with one no larger fits; deleting gives the room back.
  EXPECT_TRUE(store.Set("a", "87654321").ok());
  EXPECT_TRUE(store.CompareSet("a", "87654321", "1").ok());
  ASSERT_TRUE(*store.DeleteKey("a"));
  EXPECT_TRUE(store.Set("b", "123456789").ok());
}

StoreShare ShareOf(std::string writer, int64_t max_bytes, int64_t max_keys, int64_t max_waiters) {
  return {std::move(writer), max_bytes, max_keys, max_waiters, "per_uid"};
}

TEST(MemoryStoreTest, AWritersShareBoundsItsBytesAndKeysAndLeavesOthersTheirs) {
  MemoryStore store;
  std::unique_ptr<Store> alice = store.ChargedTo(ShareOf("uid 1000", 20, 3, 0));
  std::unique_ptr<Store> bob = store.ChargedTo(ShareOf("uid 1001", 20, 3, 0));
  ASSERT_TRUE(alice->Set("a1", std::string(8, 'x')).ok());  // 10 bytes
  ASSERT_TRUE(alice->Add("a2", 12345678).ok());             // 10 bytes: the share is full
  absl::Status refused = alice->Set("a3", "");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              ::testing::HasSubstr("uid 1000 holds 20 bytes of the store and this write adds 2; "
                                   "its share, store.max_bytes_per_uid, is 20"));
  for (absl::Status also : {alice->Append("a1", "y"), alice->MultiSet({"a3"}, {""}),
                            alice->CompareSet("a3", "", "z").status()}) {
    EXPECT_EQ(also.code(), absl::StatusCode::kResourceExhausted) << also;
  }
  // The other writer's share is its own, and the daemon's writes count only in the totals.
  EXPECT_TRUE(bob->Set("b1", std::string(18, 'y')).ok());
  EXPECT_TRUE(store.Set("daemon", std::string(100, 'd')).ok());
  // A value no larger fits; a deleted key gives its bytes back to the writer it was charged to.
  EXPECT_TRUE(alice->Set("a1", "12345678").ok());
  ASSERT_TRUE(*bob->DeleteKey("a2"));
  EXPECT_TRUE(alice->Set("a3", "").ok());
  EXPECT_TRUE(alice->Set("a4", "").ok());
  refused = alice->Set("a5", "");
  EXPECT_THAT(refused.message(),
              ::testing::HasSubstr("uid 1000 holds 3 keys of the store and this write adds 1; "
                                   "its share, store.max_keys_per_uid, is 3"));
  MemoryStoreStats stats = store.Stats();
  ASSERT_EQ(stats.writers.size(), 3u);
  EXPECT_EQ(stats.writers[0].writer, "the daemon");
  EXPECT_EQ(stats.writers[1].writer, "uid 1000");
  EXPECT_EQ(stats.writers[1].keys, 3);
  EXPECT_EQ(stats.writers[1].bytes, 14);
  EXPECT_EQ(stats.writers[2].bytes, 20);
}

TEST(MemoryStoreTest, AKeyOverwrittenByAnotherWriterIsChargedToIt) {
  MemoryStore store;
  std::unique_ptr<Store> alice = store.ChargedTo(ShareOf("uid 1000", 100, 0, 0));
  std::unique_ptr<Store> bob = store.ChargedTo(ShareOf("uid 1001", 100, 0, 0));
  ASSERT_TRUE(alice->Set("k", std::string(50, 'a')).ok());
  ASSERT_TRUE(bob->Set("k", std::string(10, 'b')).ok());
  MemoryStoreStats stats = store.Stats();
  ASSERT_EQ(stats.writers.size(), 1u);  // alice holds nothing now
  EXPECT_EQ(stats.writers[0].writer, "uid 1001");
  EXPECT_EQ(stats.writers[0].bytes, 11);
  // A second view of one writer shares its account.
  std::unique_ptr<Store> bob_again = store.ChargedTo(ShareOf("uid 1001", 100, 0, 0));
  EXPECT_EQ(bob_again->Set("k2", std::string(89, 'b')).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(alice->Set("k2", std::string(89, 'a')).ok());
}

TEST(MemoryStoreTest, AWritersWaitingCallsAreBoundedAndGiveTheirPlaceBackWhenTheyEnd) {
  MemoryStore store;
  std::unique_ptr<Store> alice = store.ChargedTo(ShareOf("uid 1000", 0, 0, 2));
  std::unique_ptr<Store> bob = store.ChargedTo(ShareOf("uid 1001", 0, 0, 2));
  std::vector<absl::Status> ends;
  absl::Mutex mu;
  auto wait = [&](Store& as, std::string key, absl::Duration timeout) {
    return as.WaitAsync({std::move(key)}, absl::Now() + timeout,
                        [&](absl::StatusOr<std::vector<std::string>> result) {
                          absl::MutexLock lock(&mu);
                          ends.push_back(result.status());
                        });
  };
  absl::StatusOr<WaitId> first = wait(*alice, "x", absl::Hours(1));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(wait(*alice, "y", absl::Milliseconds(1)).ok());
  // Wait until the short wait's callback has run: the writer's place is given back before it
  // (the table drops the wait before its completion runs, so the table's count is too early).
  auto ended = [&] {
    absl::MutexLock lock(&mu);
    return ends.size();
  };
  for (int i = 0; i < 5000 && ended() < 1; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(ended(), 1u);
  ASSERT_TRUE(wait(*alice, "z", absl::Hours(1)).ok());
  absl::StatusOr<WaitId> refused = wait(*alice, "w", absl::Hours(1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              ::testing::HasSubstr("uid 1000 has 2 store calls waiting; its share, "
                                   "store.max_waiters_per_uid, is 2"));
  EXPECT_TRUE(wait(*bob, "w", absl::Hours(1)).ok());
  // A wait a key ends, one cancelled and those shutdown ends give their places back too.
  ASSERT_TRUE(store.Set("x", "1").ok());
  absl::StatusOr<WaitId> cancelled = wait(*alice, "w", absl::Hours(1));
  ASSERT_TRUE(cancelled.ok());
  store.CancelWait(*cancelled);
  EXPECT_TRUE(wait(*alice, "w", absl::Hours(1)).ok());
  store.Shutdown();
  EXPECT_EQ(store.Stats().waiters, 0);
  ASSERT_EQ(store.Stats().writers.size(), 1u);  // the daemon's key "x" only
  EXPECT_EQ(store.Stats().writers[0].writer, "the daemon");
  absl::MutexLock lock(&mu);
  EXPECT_EQ(ends.size(), 6u);
}

TEST(MemoryStoreTest, KeysPastMaxKeysAreRefusedNamingTheSetting) {
  MemoryStoreOptions options;
  options.max_keys = 2;
  MemoryStore store(options);
  ASSERT_TRUE(store.MultiSet({"a", "b"}, {"1", "2"}).ok());
  absl::Status refused = store.Set("c", "3");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("the store holds 2 keys and this write adds "
                                                      "1; the limit store.max_keys is 2"));
  EXPECT_TRUE(store.Set("a", "overwritten").ok());
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
