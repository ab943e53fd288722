// The c10d Store semantics that store/store.h promises of every backend, as one suite run over
// each backend: a backend's test instantiates it with a factory for its store, e.g.
//
//   INSTANTIATE_TEST_SUITE_P(MemoryStore, StoreConformanceTest,
//                            ::testing::Values(StoreFactory(MakeMemoryStore)));
//
// What only one backend does (its stats, its file, its threads) stays in that backend's test;
// the helpers below are shared with those tests.

#ifndef TPD_TESTS_STORE_STORE_CONFORMANCE_H_
#define TPD_TESTS_STORE_STORE_CONFORMANCE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "store/store.h"

namespace tpd::store {

// Long enough that no test waits out a deadline it does not mean to, short enough that a
// broken wake-up fails the test instead of hanging the suite.
inline constexpr absl::Duration kLongWait = absl::Seconds(30);
// The sanity bound for anything that should finish "promptly"; never a tight timing check.
inline constexpr absl::Duration kSanityBound = absl::Seconds(10);

inline absl::Time LongDeadline() { return absl::Now() + kLongWait; }

// Awaits `backend` (a MemoryStore or FileStore) reporting `n` pending waits, i.e. a waiter
// being parked. Polls Stats(), the one observable sign of a parked waiter; false after
// kSanityBound.
template <typename Backend>
bool AwaitWaiters(Backend& backend, int64_t n) {
  const absl::Time give_up = absl::Now() + kSanityBound;
  while (backend.Stats().waiters != n) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Microseconds(100));
  }
  return true;
}

// Collects what a WaitAsync callback receives, and how often it runs. Must outlive the
// store it is passed to: the store's destructor ends pending waits.
class WaitResult {
 public:
  WaitCallback Callback();

  // True once the callback ran; HasRun() right after a store call that completes the wait
  // is deterministic for a store in this process, since completions run before that call
  // returns (StoreUnderTest::CompletesBeforeReturning).
  bool HasRun() const { return done_.HasBeenNotified(); }
  bool Await() const { return done_.WaitForNotificationWithTimeout(kSanityBound); }
  int calls() const { return calls_.load(); }

  // REQUIRES: HasRun().
  absl::StatusOr<std::vector<std::string>> result() const;

 private:
  std::atomic<int> calls_{0};
  absl::Notification done_;
  mutable absl::Mutex mu_;
  std::optional<absl::StatusOr<std::vector<std::string>>> result_ ABSL_GUARDED_BY(mu_);
};

// One store for one test, with what the suite reads besides the Store interface.
class StoreUnderTest {
 public:
  virtual ~StoreUnderTest() = default;
  virtual Store& store() = 0;
  // Waits pending in the backend that holds the data (its Stats().waiters).
  virtual int64_t waiters() = 0;
  // How the store's messages name `key`: the key itself, or for a namespace over a backend,
  // the key the backend holds.
  virtual std::string NameInMessages(const std::string& key) { return key; }
  // Whether the effects of a store call on waits (a callback run, the backend's waiter count,
  // a wait refused past the limit) are complete when the call returns. True for every store
  // in this process. False for a store in another process (RemoteStore): a wait is a call in
  // flight, registered with the serving daemon and answered over the wire after the call that
  // started, woke or cancelled it has returned. The suite then awaits, within kSanityBound,
  // what it checks at once otherwise; the outcome it checks is the same.
  virtual bool CompletesBeforeReturning() const { return true; }
};

// Makes a fresh, empty store whose backend allows at most `max_waiters` pending waits.
using StoreFactory = std::function<std::unique_ptr<StoreUnderTest>(int64_t max_waiters)>;

class StoreConformanceTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  static constexpr int64_t kDefaultMaxWaiters = 100000;

  void SetUp() override;

  // A WaitResult for a wait on `store_`, kept by the fixture so that it outlives the store.
  WaitResult& NewWaitResult() { return results_.emplace_back(); }

  // Whether `result`'s callback has run: right now when the store completes waits before
  // returning, else within kSanityBound.
  bool Completed(const WaitResult& result) const;
  // Whether the backend of `under_test` holds `n` pending waits: right now, or within
  // kSanityBound (see CompletesBeforeReturning).
  static bool HasWaiters(StoreUnderTest& under_test, int64_t n);
  bool HasWaiters(int64_t n) const { return HasWaiters(*under_test_, n); }

  std::deque<WaitResult> results_;  // declared before the store, so destroyed after it
  std::unique_ptr<StoreUnderTest> under_test_;
  Store* store_ = nullptr;  // under_test_->store()
};

}  // namespace tpd::store

#endif  // TPD_TESTS_STORE_STORE_CONFORMANCE_H_
