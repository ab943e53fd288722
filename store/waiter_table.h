// The pending waits of one store backend: which keys each wait needs, its deadline, the key
// it is parked on, and its callback. Backends keep their data (and how it changes) and call
// in here whenever a key is set, a deadline passes, a wait is cancelled or the store shuts
// down; the table decides which waits end and with what result, so every backend ends waits
// with the same results and messages.
//
// Thread safety: not thread-safe, and not locked inside. The owning backend declares its
// table ABSL_GUARDED_BY the mutex that guards its data, and every method REQUIRES that mutex
// held: one lock then covers the values a `Lookup` reads and the waits they complete. Ended
// waits are handed back as Completions, which the backend runs with Run() after it released
// its locks, since a callback may call back into the store.

#ifndef TPD_STORE_WAITER_TABLE_H_
#define TPD_STORE_WAITER_TABLE_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/store.h"

namespace tpd::store {

class WaiterTable {
 public:
  // The backend's current value of a key, or nullptr when the key is not set. Called under
  // the backend's mutex; the pointer is read before the table returns and never kept.
  using Lookup = absl::FunctionRef<const std::string*(const std::string&)>;

  // A wait that ended: its callback and what to pass it.
  struct Completion {
    WaitCallback done;
    absl::StatusOr<std::vector<std::string>> result;
  };

  // `max_waiters` is the store.max_waiters limit that Add enforces.
  explicit WaiterTable(int64_t max_waiters);

  WaiterTable(const WaiterTable&) = delete;
  WaiterTable& operator=(const WaiterTable&) = delete;

  // Registers a wait for every key in `keys` until `deadline`. When all keys are already
  // set it ends at once: its Completion, with the values in request order, is appended to
  // `out`, and the returned id is no longer pending. RESOURCE_EXHAUSTED naming
  // store.max_waiters, without keeping or calling `done`, when `max_waiters` waits are
  // pending. REQUIRES: the owner's mutex.
  absl::StatusOr<WaitId> Add(std::vector<std::string> keys, absl::Time deadline, WaitCallback done,
                             Lookup lookup, std::vector<Completion>* out);

  // Rechecks the waits parked on `key`, which was just set: those whose keys are now all set
  // end with their values; the rest park on a key still missing (one set earlier may have
  // been deleted since). REQUIRES: the owner's mutex.
  void OnKeySet(const std::string& key, Lookup lookup, std::vector<Completion>* out);

  // Ends wait `id` with CANCELLED if it is pending; a no-op otherwise, so a wait ends once.
  // REQUIRES: the owner's mutex.
  void Cancel(WaitId id, std::vector<Completion>* out);

  // Ends every wait whose deadline is at or before `now` with DEADLINE_EXCEEDED, naming
  // the keys still missing. REQUIRES: the owner's mutex.
  void ExpireUntil(absl::Time now, Lookup lookup, std::vector<Completion>* out);

  // Ends every pending wait with `status` (the store is shutting down).
  // REQUIRES: the owner's mutex.
  void EndAll(const absl::Status& status, std::vector<Completion>* out);

  // The earliest deadline of a pending wait; InfiniteFuture() when none is pending.
  // REQUIRES: the owner's mutex.
  absl::Time NextDeadline() const;

  // Whether wait `id` is still pending. REQUIRES: the owner's mutex.
  bool Contains(WaitId id) const { return waiters_.contains(id); }

  // Number of pending waits. REQUIRES: the owner's mutex.
  int64_t size() const { return static_cast<int64_t>(waiters_.size()); }

  // Runs the callbacks of ended waits. Call it with no lock held.
  static void Run(std::vector<Completion> completions);

 private:
  struct Waiter {
    std::vector<std::string> keys;  // as requested, in order
    absl::Time start;
    absl::Time deadline;
    std::string parked_on;  // the missing key whose arrival rechecks this wait
    WaitCallback done;
  };

  // Ends wait `id` when all its keys are set, otherwise parks it on the first missing one.
  void Recheck(WaitId id, Lookup lookup, std::vector<Completion>* out);
  // Removes wait `id` and appends its callback, paired with `result`, to `out`.
  void Finish(WaitId id, absl::StatusOr<std::vector<std::string>> result,
              std::vector<Completion>* out);

  const int64_t max_waiters_;
  absl::flat_hash_map<WaitId, Waiter> waiters_;
  // Each pending wait is parked on exactly one of its missing keys and rechecked when that
  // key is set, so a set costs O(waits parked on that key), not O(all waits).
  absl::flat_hash_map<std::string, absl::flat_hash_set<WaitId>> parked_;
  std::set<std::pair<absl::Time, WaitId>> deadlines_;
  WaitId next_id_ = 1;
};

}  // namespace tpd::store

#endif  // TPD_STORE_WAITER_TABLE_H_
