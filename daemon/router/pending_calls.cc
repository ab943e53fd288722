#include "daemon/router/pending_calls.h"

#include <algorithm>

namespace tpd::router {

uint64_t PendingCalls::Add(PendingCall call) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  if (call.deadline != absl::InfiniteFuture()) {
    deadlines_.Add(id, call.deadline);
    // Wake the timer only for a deadline before the time it sleeps until: waking it for every
    // call cost a context switch per call.
    if (call.deadline < timer_wake_at_) timer_cv_.Signal();
  }
  if (!call.remote) by_caller_[{call.caller, call.caller_call_id}] = id;
  calls_.emplace(id, std::move(call));
  return id;
}

void PendingCalls::MarkPosted(uint64_t id, int64_t posted_ns) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(id);
  if (it != calls_.end()) it->second.posted_ns = posted_ns;
}

PendingCall PendingCalls::Remove(std::map<uint64_t, PendingCall>::iterator it) {
  PendingCall call = std::move(it->second);
  deadlines_.Remove(it->first);
  if (!call.remote) by_caller_.erase({call.caller, call.caller_call_id});
  calls_.erase(it);
  return call;
}

std::optional<PendingCall> PendingCalls::TakeReply(uint64_t id, const std::string& callee) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(id);
  if (it == calls_.end() || it->second.callee != callee) return std::nullopt;
  return Remove(it);
}

std::optional<PendingCall> PendingCalls::Take(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return std::nullopt;
  return Remove(it);
}

std::optional<PendingCall> PendingCalls::TakeByCaller(const std::string& caller,
                                                      uint64_t caller_call_id) {
  absl::MutexLock lock(&mu_);
  auto by = by_caller_.find({caller, caller_call_id});
  if (by == by_caller_.end()) return std::nullopt;
  return Remove(calls_.find(by->second));
}

std::vector<PendingCall> PendingCalls::TakeOfSession(const std::string& session) {
  absl::MutexLock lock(&mu_);
  std::vector<PendingCall> taken;
  for (auto it = calls_.begin(); it != calls_.end();) {
    auto next = std::next(it);
    if (it->second.callee == session || (!it->second.remote && it->second.caller == session)) {
      taken.push_back(Remove(it));
    }
    it = next;
  }
  return taken;
}

std::vector<PendingCall> PendingCalls::TakeDue() {
  absl::MutexLock lock(&mu_);
  std::vector<PendingCall> due;
  for (uint64_t id : deadlines_.PopDue(clock_())) {
    auto it = calls_.find(id);
    if (it != calls_.end()) due.push_back(Remove(it));
  }
  return due;
}

size_t PendingCalls::AwaitNone(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.empty(); };
  mu_.AwaitWithDeadline(absl::Condition(&none), deadline);
  return calls_.size();
}

size_t PendingCalls::size() {
  absl::MutexLock lock(&mu_);
  return calls_.size();
}

void PendingCalls::ServeDeadlines(const std::function<void(PendingCall)>& on_due,
                                  absl::Duration horizon) {
  while (true) {
    for (PendingCall& call : TakeDue()) on_due(std::move(call));
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    const absl::Time now = clock_();
    const std::optional<absl::Time> next = deadlines_.Earliest();
    if (next && *next <= now) continue;  // came due meanwhile
    // Sleep until the earliest deadline, or `horizon` at most: most deadlines (seconds away)
    // are then later than the wake-up and cost no signal; the timer finds them when it wakes.
    timer_wake_at_ = std::min(next.value_or(absl::InfiniteFuture()), now + horizon);
    timer_cv_.WaitWithDeadline(&mu_, timer_wake_at_);
    timer_wake_at_ = absl::InfinitePast();  // awake: it looks at the queue before sleeping
  }
}

void PendingCalls::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  timer_cv_.SignalAll();
}

}  // namespace tpd::router
