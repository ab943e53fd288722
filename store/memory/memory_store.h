// The embedded, in-memory store backend: the default store of a daemon.
//
// Thread safety: thread-safe. One mutex guards the data and the waiters; callbacks run
// after it is released. A single timer thread, owned by the store, ends waits at their
// deadlines, so a waiter costs a map entry and no thread of its own.

#ifndef TPD_STORE_MEMORY_MEMORY_STORE_H_
#define TPD_STORE_MEMORY_MEMORY_STORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "store/store.h"
#include "store/waiter_table.h"

namespace tpd::store {

struct MemoryStoreOptions {
  // Most waits pending at once; past it WaitAsync answers RESOURCE_EXHAUSTED. Bounds the
  // memory a flood of waiting clients can pin.
  int64_t max_waiters = 100000;
  // Largest value Append may grow a key to; past it Append answers RESOURCE_EXHAUSTED and
  // changes nothing. (Set-style calls are checked at the service edge, before the copy.)
  int64_t max_value_bytes = int64_t{1} << 30;
  // Most bytes of keys and values held at once; a write that would pass it answers
  // RESOURCE_EXHAUSTED and changes nothing. Bounds the memory all writers together make the
  // daemon hold (gRPC does not tell the daemon who wrote a key, so there is no share per
  // user; docs/security.md).
  int64_t max_total_bytes = int64_t{1} << 30;
};

struct MemoryStoreStats {
  int64_t num_keys = 0;
  int64_t bytes = 0;  // keys and values together
  int64_t waiters = 0;
};

class MemoryStore : public Store {
 public:
  explicit MemoryStore(MemoryStoreOptions options = {});
  // Ends pending waits with UNAVAILABLE and joins the timer thread.
  ~MemoryStore() override;

  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Append(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys(absl::string_view prefix) override;
  absl::StatusOr<WaitId> WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                   WaitCallback done) override;
  void CancelWait(WaitId id) override;

  // Ends every pending wait with UNAVAILABLE and refuses new ones (Get included); writes and
  // Check still work.
  // Called on daemon shutdown so no client call outlives the daemon's grace period.
  void Shutdown();

  MemoryStoreStats Stats();

 private:
  // A finished wait, run after the mutex is released.
  using Completion = WaiterTable::Completion;

  // OK when writing `values` (sizes) at `keys` fits max_total_bytes; else RESOURCE_EXHAUSTED
  // naming the setting.
  absl::Status RoomLocked(const std::vector<std::pair<absl::string_view, size_t>>& writes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `value` at `key` and collects the waits that `key` completes.
  void SetLocked(const std::string& key, std::string value, std::vector<Completion>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The value of `key`, or nullptr when it is not set; the table's lookup.
  const std::string* FindLocked(const std::string& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FindLocked for the WaiterTable::Lookup callbacks: the table calls them only inside its
  // own methods, which run with mu_ held, but the analysis cannot follow a callback, so the
  // lock is asserted (checked at run time too) instead of required.
  const std::string* LookupHeld(const std::string& key);
  void TimerLoop();

  const MemoryStoreOptions options_;

  absl::Mutex mu_;
  // Ordered, so NumKeys(prefix) walks only the keys under the prefix.
  std::map<std::string, std::string, std::less<>> data_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // A Set costs O(waits parked on its key): see WaiterTable.
  WaiterTable waiters_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_timer_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar timer_cv_;

  std::thread timer_;
};

}  // namespace tpd::store

#endif  // TPD_STORE_MEMORY_MEMORY_STORE_H_
