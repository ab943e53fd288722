// Calls the router delivered to sessions of this daemon, from their delivery until they are
// answered: the id the callee sees, whom the answer goes to, and the deadline, on the one
// timer structure (base/deadline_queue.h).
//
// Exactly once: every way a call ends (its reply, its deadline, its caller's cancel, its
// callee's or caller's session ending) *takes* it, and only the one that took it answers; a
// later taker finds nothing (a late reply is dropped). The clock is injected, so deadlines are
// tested without waiting.
//
// Thread safety: thread-safe, with a mutex of its own that nothing else is held under: it
// knows no session and calls nothing while holding it (ServeDeadlines runs `on_due` unlocked).

#ifndef TPD_DAEMON_ROUTER_PENDING_CALLS_H_
#define TPD_DAEMON_ROUTER_PENDING_CALLS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "base/deadline_queue.h"

namespace tpd::router {

// A call delivered to a local callee session, by the id the callee sees.
struct PendingCall {
  // Who is answered: a local caller session (caller, caller_call_id) or another daemon.
  std::string caller;
  uint64_t caller_call_id = 0;
  std::optional<agent::ReplyTo> remote;
  std::string callee;
  std::string group;
  std::string from;  // the calling worker
  std::string worker;
  std::string method;
  absl::Time deadline = absl::InfiniteFuture();
  // When the call was read off its caller's ring or received from another node, and when it
  // was posted to its callee (MonotonicNanos; 0 until MarkPosted), for CallTimings.
  int64_t read_ns = 0;
  int64_t posted_ns = 0;

  // Where the callee's time starts: its post, or, for a reply read before the post was noted
  // (the callee answered at once), the read, so that call counts its delivery as the callee's
  // time rather than not at all.
  int64_t CalleeSince() const { return posted_ns != 0 ? posted_ns : read_ns; }
};

class PendingCalls {
 public:
  using Clock = std::function<absl::Time()>;

  explicit PendingCalls(Clock clock = [] { return absl::Now(); }) : clock_(std::move(clock)) {}

  // Records `call` under a fresh id (the one its callee sees) and returns the id.
  uint64_t Add(PendingCall call);
  // Notes when call `id` was posted to its callee, if it is still pending.
  void MarkPosted(uint64_t id, int64_t posted_ns);
  // Takes call `id` if it is still pending and `callee` serves it (a reply from any other
  // session is not this call's).
  std::optional<PendingCall> TakeReply(uint64_t id, const std::string& callee);
  // Takes call `id` if it is still pending (its delivery failed).
  std::optional<PendingCall> Take(uint64_t id);
  // Takes the call local session `caller` made as its `caller_call_id` (a cancel).
  std::optional<PendingCall> TakeByCaller(const std::string& caller, uint64_t caller_call_id);
  // Takes every call `session` made or serves (it ended).
  std::vector<PendingCall> TakeOfSession(const std::string& session);
  // Takes every call past its deadline by the clock, earliest first.
  std::vector<PendingCall> TakeDue();

  // Waits until no call is pending or `deadline` passes; returns how many are.
  size_t AwaitNone(absl::Time deadline);
  size_t size();

  // Runs on the calling thread (the router's timer) until Stop: answers each call past its
  // deadline through `on_due`, sleeping until the earliest deadline in between (at most
  // `horizon`: deadlines later than the wake-up cost no signal when they are added).
  void ServeDeadlines(const std::function<void(PendingCall)>& on_due, absl::Duration horizon);
  // Makes ServeDeadlines return. Idempotent.
  void Stop();

 private:
  // Removes `id` (present) and what indexes it.
  PendingCall Remove(std::map<uint64_t, PendingCall>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock clock_;
  absl::Mutex mu_;
  std::map<uint64_t, PendingCall> calls_ ABSL_GUARDED_BY(mu_);  // by id
  // Local callers' calls: (caller session, its call id) -> id.
  std::map<std::pair<std::string, uint64_t>, uint64_t> by_caller_ ABSL_GUARDED_BY(mu_);
  DeadlineQueue deadlines_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar timer_cv_;
  // When ServeDeadlines wakes up next; InfinitePast() while it is awake.
  absl::Time timer_wake_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace tpd::router

#endif  // TPD_DAEMON_ROUTER_PENDING_CALLS_H_
