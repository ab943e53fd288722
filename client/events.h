// Events for threads that are not the client's own: requests to answer, calls' results and
// release notices, queued by the client's handlers and callbacks and taken by threads of
// another runtime that wait for them (the C ABI's tpd_next_event, Python's worker threads).
//
// A thread waiting for requests only may read the call engine's ring itself while nobody
// else does (a lent reader, docs/threading.md, "Lent readers"): a request it reads is
// queued for that very thread by the handler that runs on it, so the request reaches its
// caller with no hand-off between threads. The thread that served the last request takes the
// reading turn back from the one that stood in at the ring meanwhile, so requests that come
// one after another run on one thread.
//
// Thread safety: thread-safe.

#ifndef TPD_CLIENT_EVENTS_H_
#define TPD_CLIENT_EVENTS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/calls.h"

namespace tpd {

// One event. A language binding may derive its own (the C ABI's tpd_event does).
struct ClientEvent {
  enum Kind : int {
    kRequest = 1,   // a call to one of this client's workers: answer it through `responder`
    kReply = 2,     // a call's result (`tag` names the call)
    kReleased = 3,  // the CUDA tensors of a reply sent with `tag` may change now
  };
  virtual ~ClientEvent() = default;

  Kind kind = kRequest;
  uint64_t tag = 0;
  // A reply's status (0: OK), as absl::StatusCode, and its message.
  int code = 0;
  std::string status_message;
  Message message;  // payload, tensors, caller
  std::string method;
  Responder responder;  // requests only
};

// Host tensors a binding handed out (DLPack) over the client's shared memory, by their first
// byte: views of the receive heap, and arena blocks. One given back to be sent (a reply, a
// call) is then sent where it lies instead of being copied into the arena (docs/data_plane.md,
// "Received tensors sent on"; docs/python.md, "Tensors built in the arena").
class HandedOutViews {
 public:
  // `view`: a received host tensor in this client's rx heap, or an arena tensor. Counted: as
  // often added, as often removed.
  void Add(const Tensor& view) ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(const Tensor& view) ABSL_LOCKS_EXCLUDED(mu_);
  // The `size` bytes at `data` as a uint8 tensor sharing the storage of the tensor handed out
  // that holds them all (its block stays while the result lives); nullopt when none does. An
  // arena tensor is found only from its first byte (it is sent from its block's start).
  std::optional<Tensor> Find(const void* data, size_t size) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<const char*, std::pair<Tensor, int>> views_ ABSL_GUARDED_BY(mu_);
};

class EventQueues : public std::enable_shared_from_this<EventQueues> {
 public:
  // The queues, as a mask for Next.
  enum Queue : int { kRequests = 1, kReplies = 2 };

  // Queues `event` (requests on one queue; replies and release notices, which the thread
  // completing calls sends, on the other) and wakes one thread that can take it. False, the
  // event left in `event`, once stopped.
  bool Push(std::unique_ptr<ClientEvent>& event) ABSL_LOCKS_EXCLUDED(mu_);
  // The next event of `queues` (a mask of Queue), waiting at most `timeout` (infinite: no
  // limit). With `engine`, when waiting for requests only, the thread reads the engine's ring
  // as a lent reader when nobody else does. INVALID_ARGUMENT for a mask naming no queue,
  // DEADLINE_EXCEEDED when no event came, CANCELLED once stopped.
  absl::StatusOr<std::unique_ptr<ClientEvent>> Next(int queues, absl::Duration timeout,
                                                    std::shared_ptr<CallEngine> engine)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stops: every waiter returns CANCELLED now and later pushes fail. Returns the events that
  // were queued (the caller answers the requests among them).
  std::deque<std::unique_ptr<ClientEvent>> Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes of the receive heap held by zero-copy views handed out (DLPack), and the heap's
  // size (known once the client attached): a binding's policy for when to copy instead.
  std::atomic<uint64_t> rx_view_bytes{0};
  std::atomic<uint64_t> rx_heap_bytes{0};
  HandedOutViews views;

 private:
  class Waiter;  // one Next call's state

  // Wakes one thread waiting for requests: the newest lent sleeper, else one on requests_cv_.
  void WakeRequestWaiter() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What stops a lent reader: the queues stopped, or a request another thread queued (it
  // takes that instead), or (LentReaderInterrupted) a thread taking the turn back.
  bool RequestOrStop() const;
  bool LentReaderInterrupted() const;

  absl::Mutex mu_;
  // One condition per queue, and one for waiters on both: an event wakes one waiter that can
  // take it, not every thread of the pool (which would all contend for the caller's GIL).
  absl::CondVar requests_cv_;
  absl::CondVar replies_cv_;
  absl::CondVar any_cv_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::unique_ptr<ClientEvent>> requests_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<ClientEvent>> replies_ ABSL_GUARDED_BY(mu_);
  // stopped_ and requests_.size(), read without the lock by lent readers.
  std::atomic<bool> stopped_flag_{false};
  std::atomic<size_t> requests_queued_{0};
  // The engine whose ring lent readers are about to read or read now (one reads at a time),
  // for Push to nudge; set while lent_readers_ > 0 by those threads, which keep it alive.
  int lent_readers_ ABSL_GUARDED_BY(mu_) = 0;
  CallEngine* lent_engine_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Lent readers asleep waiting for the turn or a request, newest last, each on a condition of
  // its own: the one woken is the one that waited least, whose stack and caches are warmest,
  // so calls keep landing on one or two threads rather than going round the pool in the order
  // a shared condition wakes them (longest waiting first).
  std::vector<absl::CondVar*> lent_sleepers_ ABSL_GUARDED_BY(mu_);
  // Set while a lent reader that served the last request takes the reading turn back from the
  // one that stood in at the ring while it ran, which stops the one reading at once.
  std::atomic<bool> reclaiming_{false};
};

}  // namespace tpd

#endif  // TPD_CLIENT_EVENTS_H_
