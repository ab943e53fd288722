// The one timer structure of calls in flight (the agent's and the router's): ids ordered by
// deadline (a B-tree), so a timer thread sleeps until the earliest one and fails everything
// late in one pass, however many calls are pending: no thread per call.
//
// Thread safety: not thread-safe; its owner guards it with its mutex.

#ifndef TPD_BASE_DEADLINE_QUEUE_H_
#define TPD_BASE_DEADLINE_QUEUE_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace tpd {

class DeadlineQueue {
 public:
  // Adds `id` with `deadline`, or moves it there if present. absl::InfiniteFuture() is
  // never due and is not stored (Remove still returns false for it).
  void Add(uint64_t id, absl::Time deadline);

  // Forgets `id`; false if it was not there.
  bool Remove(uint64_t id);

  // Removes and returns, earliest first (ties by id), every id whose deadline is <= now.
  std::vector<uint64_t> PopDue(absl::Time now);

  // The earliest deadline, if any id is queued.
  std::optional<absl::Time> Earliest() const;

  size_t size() const { return deadline_of_.size(); }
  bool empty() const { return deadline_of_.empty(); }

 private:
  absl::btree_set<std::pair<absl::Time, uint64_t>> by_deadline_;
  absl::flat_hash_map<uint64_t, absl::Time> deadline_of_;
};

}  // namespace tpd

#endif  // TPD_BASE_DEADLINE_QUEUE_H_
