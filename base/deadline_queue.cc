#include "base/deadline_queue.h"

namespace tpd {

void DeadlineQueue::Add(uint64_t id, absl::Time deadline) {
  Remove(id);
  if (deadline == absl::InfiniteFuture()) return;
  by_deadline_.emplace(deadline, id);
  deadline_of_.emplace(id, deadline);
}

bool DeadlineQueue::Remove(uint64_t id) {
  auto it = deadline_of_.find(id);
  if (it == deadline_of_.end()) return false;
  by_deadline_.erase({it->second, id});
  deadline_of_.erase(it);
  return true;
}

std::vector<uint64_t> DeadlineQueue::PopDue(absl::Time now) {
  std::vector<uint64_t> due;
  while (!by_deadline_.empty() && by_deadline_.begin()->first <= now) {
    const uint64_t id = by_deadline_.begin()->second;
    by_deadline_.erase(by_deadline_.begin());
    deadline_of_.erase(id);
    due.push_back(id);
  }
  return due;
}

std::optional<absl::Time> DeadlineQueue::Earliest() const {
  if (by_deadline_.empty()) return std::nullopt;
  return by_deadline_.begin()->first;
}

}  // namespace tpd
