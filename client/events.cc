#include "client/events.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tpd {
namespace {

// The queues whose requests the calling thread reads as a lent reader: a request it reads it
// queues for itself, waking nobody.
thread_local const EventQueues* lent_reader_of = nullptr;
// The queues whose last request Next gave this thread as a lent reader: back in Next, it
// takes the reading turn back (reclaiming_).
thread_local const EventQueues* served_request_of = nullptr;

// How long a lent reader taking the turn back spins for it: the one reading gives it up as
// soon as it looks (it spins on the ring, or a nudge wakes it).
constexpr absl::Duration kReclaimSpin = absl::Microseconds(100);

}  // namespace

// One Next call: what it takes, and its part in the lent readers' turns.
class EventQueues::Waiter {
 public:
  Waiter(EventQueues& queues, int mask, absl::Duration timeout, std::shared_ptr<CallEngine> engine)
      : q_(queues),
        mask_(mask),
        timeout_(timeout),
        deadline_(absl::Now() + timeout),
        engine_(std::move(engine)) {}

  absl::StatusOr<std::unique_ptr<ClientEvent>> Run() ABSL_LOCKS_EXCLUDED(q_.mu_) {
    absl::MutexLock lock(&q_.mu_);
    // This thread served the last request: it takes the turn back (reclaiming_ set by it).
    served_last_ = served_request_of == &q_;
    served_request_of = nullptr;
    while (true) {
      if (q_.stopped_) {
        StopWaitingForTurn();
        return absl::CancelledError("the client stopped its events");
      }
      if (std::unique_ptr<ClientEvent> event = TakeQueued()) return event;
      // Checked after the queues: a wait that timed out as it was signalled has consumed the
      // signal, so it must take the event itself.
      if (timed_out_) {
        StopWaitingForTurn();
        return absl::DeadlineExceededError(
            absl::StrCat("no event within ", absl::ToInt64Microseconds(timeout_), " microseconds"));
      }
      if (engine_ == nullptr) {
        WaitOnQueues();
      } else if (!waiting_for_turn_ || !ReadAsLent()) {
        WaitForTurn();
      }
    }
  }

 private:
  // The first event of the queues asked for (replies first), or null.
  std::unique_ptr<ClientEvent> TakeQueued() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_.mu_) {
    for (auto* queue : {&q_.replies_, &q_.requests_}) {
      const int mask = queue == &q_.replies_ ? kReplies : kRequests;
      if ((mask_ & mask) == 0 || queue->empty()) continue;
      std::unique_ptr<ClientEvent> event = std::move(queue->front());
      queue->pop_front();
      if (mask == kRequests) {
        q_.requests_queued_ = q_.requests_.size();
        if (engine_ != nullptr) served_request_of = &q_;
      }
      StopWaitingForTurn();
      // A lent reader's own request woke nobody: pass on what it leaves behind.
      if (!queue->empty()) {
        if (mask == kReplies) {
          q_.replies_cv_.Signal();
        } else {
          q_.WakeRequestWaiter();
        }
      }
      return event;
    }
    return nullptr;
  }

  void WaitOnQueues() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_.mu_) {
    const int both = kRequests | kReplies;
    absl::CondVar& cv = (mask_ & both) == both     ? q_.any_cv_
                        : (mask_ & kRequests) != 0 ? q_.requests_cv_
                                                   : q_.replies_cv_;
    timed_out_ = cv.WaitWithDeadline(&q_.mu_, deadline_);
  }

  // Reads the ring as a lent reader, the turn being free; true when it read (what it read is
  // queued for it, unless the stop took it) or its time is up.
  bool ReadAsLent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_.mu_) {
    EndReclaim();  // before its own reading, which the flag would stop
    ++q_.lent_readers_;
    q_.lent_engine_ = engine_.get();
    q_.mu_.Unlock();
    lent_reader_of = &q_;
    EventQueues& q = q_;
    const bool read = engine_->ReadAsLent(deadline_, [&q] { return q.LentReaderInterrupted(); });
    lent_reader_of = nullptr;
    q_.mu_.Lock();
    if (--q_.lent_readers_ == 0) q_.lent_engine_ = nullptr;
    waiting_for_turn_ = false;
    timed_out_ = absl::Now() >= deadline_;
    return read || timed_out_;
  }

  // Waits, as a lent reader, for the reading turn or an event.
  void WaitForTurn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_.mu_) {
    // The thread that served the last request reads the next one: it takes the turn back
    // from the lent reader that stood in at the ring while it ran. Requests that come one
    // after another then run on one thread, whose core's caches hold what they touch
    // (Python's objects, their reference counts written by every request); moved to another
    // core each time, a request paid for every object it touched.
    if (served_last_ && q_.lent_readers_ > 0 && !q_.reclaiming_) {
      reclaimer_ = true;
      q_.reclaiming_ = true;
      q_.lent_engine_->NudgeReader();
    }
    served_last_ = false;
    waiting_for_turn_ = true;
    // The turn is free: take it (back at the top), unless another thread takes it back.
    if (engine_->LentReaderWaits(+1) && (reclaimer_ || !q_.reclaiming_)) return;
    if (reclaimer_) {  // once: back at the top, the loop ends the reclaim before it reads
      q_.mu_.Unlock();
      EventQueues& q = q_;
      engine_->SpinForTurn(std::min(deadline_, absl::Now() + kReclaimSpin),
                           [&q] { return q.RequestOrStop(); });
      q_.mu_.Lock();
      return;  // takes the turn at the top when it came free
    }
    absl::CondVar mine;
    q_.lent_sleepers_.push_back(&mine);
    timed_out_ = mine.WaitWithDeadline(&q_.mu_, deadline_);
    // Gone from the stack when woken; still there when the wait timed out.
    auto it = std::find(q_.lent_sleepers_.begin(), q_.lent_sleepers_.end(), &mine);
    if (it != q_.lent_sleepers_.end()) q_.lent_sleepers_.erase(it);
  }

  void EndReclaim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_.mu_) {
    if (!reclaimer_) return;
    reclaimer_ = false;
    q_.reclaiming_ = false;
  }

  void StopWaitingForTurn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_.mu_) {
    EndReclaim();
    if (!waiting_for_turn_) return;
    waiting_for_turn_ = false;
    // The turn is free and another lent reader waits for it: wake one.
    if (engine_->LentReaderWaits(-1)) q_.WakeRequestWaiter();
  }

  EventQueues& q_;
  const int mask_;
  const absl::Duration timeout_;
  const absl::Time deadline_;
  const std::shared_ptr<CallEngine> engine_;  // lent reading, when not null
  bool timed_out_ = false;
  bool waiting_for_turn_ = false;  // counted among the engine's lent readers
  bool served_last_ = false;
  bool reclaimer_ = false;  // this thread set reclaiming_
};

bool EventQueues::Push(std::unique_ptr<ClientEvent>& event) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return false;
  const bool request = event->kind == ClientEvent::kRequest;
  (request ? requests_ : replies_).push_back(std::move(event));
  if (request && lent_reader_of == this) return true;  // this thread takes it next
  if (request) {
    ++requests_queued_;
    // A lent reader at the ring would not see it there: it stops reading to take it.
    if (lent_readers_ > 0) lent_engine_->NudgeReader();
    WakeRequestWaiter();
  } else {
    replies_cv_.Signal();
  }
  any_cv_.Signal();
  return true;
}

absl::StatusOr<std::unique_ptr<ClientEvent>> EventQueues::Next(int queues, absl::Duration timeout,
                                                               std::shared_ptr<CallEngine> engine) {
  if ((queues & (kRequests | kReplies)) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("queues ", queues, " names no queue"));
  }
  // Only a thread waiting for requests alone reads the ring: a request it reads goes to its
  // handler on this very thread, which queues it for this thread.
  if (queues != kRequests) engine = nullptr;
  if (engine != nullptr) {
    engine->EnableLentReaders([weak = weak_from_this()] {
      if (std::shared_ptr<EventQueues> events = weak.lock()) {
        absl::MutexLock lock(&events->mu_);
        events->WakeRequestWaiter();
      }
    });
  }
  return Waiter(*this, queues, timeout, std::move(engine)).Run();
}

std::deque<std::unique_ptr<ClientEvent>> EventQueues::Stop() {
  std::deque<std::unique_ptr<ClientEvent>> dropped;
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  stopped_flag_ = true;
  if (lent_readers_ > 0) lent_engine_->NudgeReader();
  dropped.swap(requests_);
  requests_queued_ = 0;
  for (auto& reply : replies_) dropped.push_back(std::move(reply));
  replies_.clear();
  requests_cv_.SignalAll();
  for (absl::CondVar* sleeper : lent_sleepers_) sleeper->Signal();
  lent_sleepers_.clear();
  replies_cv_.SignalAll();
  any_cv_.SignalAll();
  return dropped;
}

void EventQueues::WakeRequestWaiter() {
  if (lent_sleepers_.empty()) {
    requests_cv_.Signal();
    return;
  }
  lent_sleepers_.back()->Signal();
  lent_sleepers_.pop_back();
}

bool EventQueues::RequestOrStop() const {
  return stopped_flag_.load(std::memory_order_relaxed) ||
         requests_queued_.load(std::memory_order_relaxed) > 0;
}

bool EventQueues::LentReaderInterrupted() const {
  return RequestOrStop() || reclaiming_.load(std::memory_order_relaxed);
}

void HandedOutViews::Add(const Tensor& view) {
  if (view.size() == 0 || view.is_cuda()) return;
  absl::MutexLock lock(&mu_);
  auto [it, added] = views_.try_emplace(view.data().data(), view, 0);
  ++it->second.second;
}

void HandedOutViews::Remove(const Tensor& view) {
  if (view.size() == 0 || view.is_cuda()) return;
  Tensor last;  // dropped after the lock: the last hold of an rx block releases it
  absl::MutexLock lock(&mu_);
  auto it = views_.find(view.data().data());
  if (it == views_.end() || --it->second.second > 0) return;
  last = std::move(it->second.first);
  views_.erase(it);
}

std::optional<Tensor> HandedOutViews::Find(const void* data, size_t size) const {
  const char* const at = static_cast<const char*>(data);
  absl::MutexLock lock(&mu_);
  auto it = views_.upper_bound(at);
  if (it == views_.begin()) return std::nullopt;
  --it;
  const Tensor& view = it->second.first;
  if (static_cast<size_t>(at - it->first) > view.size() ||
      size > view.size() - static_cast<size_t>(at - it->first)) {
    return std::nullopt;
  }
  using calls_internal::TensorParts;
  const std::vector<int64_t> shape = {static_cast<int64_t>(size)};
  if (view.storage() == TensorStorage::kArena) {
    if (at != it->first) return std::nullopt;
    return TensorParts::Arena(shm::DType::kUInt8, shape, TensorParts::ArenaOf(view),
                              const_cast<char*>(at), size);
  }
  return TensorParts::Received(shm::DType::kUInt8, shape, Device{}, TensorParts::KeepOf(view), at,
                               size);
}

}  // namespace tpd
