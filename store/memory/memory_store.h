// The embedded, in-memory store backend: the default store of a daemon.
//
// Every key is charged to whoever wrote it last: the daemon itself through the Store methods
// of this class, or a writer with a share (a uid, callers without a session) through the view
// ChargedTo returns, which refuses a write past that writer's share. Deleting or overwriting a
// key gives its bytes back to the writer it was charged to (docs/security.md, "Per-user
// bounds").
//
// Thread safety: thread-safe. One mutex guards the data and the waiters; callbacks run
// after it is released. A single timer thread, owned by the store, ends waits at their
// deadlines, so a waiter costs a map entry and no thread of its own.

#ifndef TPD_STORE_MEMORY_MEMORY_STORE_H_
#define TPD_STORE_MEMORY_MEMORY_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
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
  // Most bytes of keys and values held at once, and most keys, all writers together; a write
  // that would pass either answers RESOURCE_EXHAUSTED and changes nothing.
  int64_t max_total_bytes = int64_t{1} << 30;
  int64_t max_keys = int64_t{1} << 20;
};

// A writer's share of the store: what the keys charged to it, and its waiting calls, may add
// up to. 0 leaves that one bounded by the store's totals only.
struct StoreShare {
  // Names the writer in refusals and stats ("uid 1000", "callers without a session").
  std::string writer;
  int64_t max_bytes = 0;
  int64_t max_keys = 0;
  int64_t max_waiters = 0;
  // The settings' common suffix, named in refusals: "per_uid" for store.max_bytes_per_uid.
  std::string setting_suffix;
};

struct StoreWriterUse {
  std::string writer;
  int64_t keys = 0;
  int64_t bytes = 0;
  int64_t waiters = 0;
};

struct MemoryStoreStats {
  int64_t num_keys = 0;
  int64_t bytes = 0;  // keys and values together
  int64_t waiters = 0;
  // Writers holding keys or waits now, the daemon's own writes first.
  std::vector<StoreWriterUse> writers;
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

  // A view of this store whose writes and waits are charged to `share.writer` and refused past
  // its share (RESOURCE_EXHAUSTED naming the setting). Views of one writer name share one
  // account. This store must outlive the view.
  std::unique_ptr<Store> ChargedTo(StoreShare share);

  // Ends every pending wait with UNAVAILABLE and refuses new ones (Get included); writes and
  // Check still work.
  // Called on daemon shutdown so no client call outlives the daemon's grace period.
  void Shutdown();

  MemoryStoreStats Stats();

 private:
  class Charged;
  // Who a call is charged to: an account (kDaemon for this class's own methods) and its share
  // (nullptr: the totals only).
  struct Writer {
    uint32_t account;
    const StoreShare* share;
  };
  static constexpr Writer kDaemon = {0, nullptr};
  struct Entry {
    std::string value;
    uint32_t account = 0;  // charged with the key's and the value's bytes
  };
  struct Account {
    std::string writer;
    int64_t keys = 0;
    int64_t bytes = 0;
    int64_t waiters = 0;
  };

  // A finished wait, run after the mutex is released.
  using Completion = WaiterTable::Completion;

  absl::Status SetAs(Writer writer, absl::string_view key, absl::string_view value);
  absl::Status MultiSetAs(Writer writer, const std::vector<std::string>& keys,
                          const std::vector<std::string>& values);
  absl::StatusOr<int64_t> AddAs(Writer writer, absl::string_view key, int64_t delta);
  absl::StatusOr<std::string> CompareSetAs(Writer writer, absl::string_view key,
                                           absl::string_view expected, absl::string_view desired);
  absl::Status AppendAs(Writer writer, absl::string_view key, absl::string_view value);
  absl::StatusOr<WaitId> WaitAsyncAs(Writer writer, std::vector<std::string> keys,
                                     absl::Time deadline, WaitCallback done);

  // The account of `writer`, made on first use.
  uint32_t AccountOf(const std::string& writer) ABSL_LOCKS_EXCLUDED(mu_);
  // OK when writing `values` (sizes) at `keys` fits the totals and the writer's share; else
  // RESOURCE_EXHAUSTED naming the setting.
  absl::Status RoomLocked(Writer writer,
                          const std::vector<std::pair<absl::string_view, size_t>>& writes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `value` at `key`, charged to `account`, and collects the waits `key` completes.
  void SetLocked(uint32_t account, const std::string& key, std::string value,
                 std::vector<Completion>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  std::map<std::string, Entry, std::less<>> data_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Indexed by Entry::account; account 0 is the daemon's. One per writer name ever seen (a
  // uid, or a kind of caller): never removed, a few dozen bytes each.
  std::vector<Account> accounts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> account_of_ ABSL_GUARDED_BY(mu_);
  // A Set costs O(waits parked on its key): see WaiterTable.
  WaiterTable waiters_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_timer_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar timer_cv_;

  std::thread timer_;
};

}  // namespace tpd::store

#endif  // TPD_STORE_MEMORY_MEMORY_STORE_H_
