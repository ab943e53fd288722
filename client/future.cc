// CallFuture and Responder: the handles to one call's result and to one incoming call's
// answer (client/calls.h).

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/call_state.h"
#include "client/calls.h"
#include "client/engine.h"

namespace tpd {

using calls_internal::CallState;
using calls_internal::Link;
using calls_internal::PendingReply;

namespace calls_internal {

bool Spin(absl::FunctionRef<bool()> done, int64_t start_ns, int64_t window_ns, int64_t pause_ns) {
  if (window_ns <= 0) return done();
  int64_t now;
  return shm::SpinUntil(done, start_ns, start_ns + window_ns,
                        start_ns + std::min(window_ns, pause_ns), &now);
}

PendingReply::~PendingReply() {
  if (answered.exchange(true)) return;
  std::shared_ptr<Engine> live = engine.lock();
  if (live == nullptr) return;
  (void)live->Answer(
      call_id, worker, method, /*from_handler=*/false,
      absl::InternalError(absl::StrCat("the handler of worker '", worker, "' method '", method,
                                       "' dropped the call without answering it")));
  ReleaseEngine(std::move(live));
}

}  // namespace calls_internal

namespace {

// The caller's spin window, learnt per thread: a thread making back-to-back calls spins
// through a typical reply; one whose calls take long sleeps almost at once.
thread_local shm::SpinWindow caller_spin(calls_internal::kClientSpin);
// The same for calls that send CUDA tensors, whose reply waits for the copy (shm::kCopySpin).
thread_local shm::SpinWindow cuda_caller_spin(shm::kCopySpin);

shm::SpinWindow& CallerSpin(const CallState& state) {
  return state.copies ? cuda_caller_spin : caller_spin;
}

// Spins for the caller's adaptive window (at most `limit_ns`) on the result of `state`
// before the caller sleeps on its condition variable; learns how long the wait took.
// Returns true when the result is there.
bool SpinOnResult(const CallState& state, int64_t start, int64_t limit_ns) {
  shm::SpinWindow& spin = CallerSpin(state);
  const bool ready =
      calls_internal::Spin([&state] { return state.ready.load(std::memory_order_acquire); }, start,
                           std::min(limit_ns, spin.window_ns()), spin.pause_ns());
  if (ready) spin.Learn(absl::GetCurrentTimeNanos() - start);
  return ready;
}

}  // namespace

CallFuture CallFuture::Ready(absl::StatusOr<Message> result) {
  auto state = std::make_shared<CallState>();
  absl::MutexLock lock(&state->mu);
  state->result = std::move(result);
  state->done = true;
  state->ready.store(true, std::memory_order_release);
  return CallFuture(state);
}

bool CallFuture::ready() const {
  absl::MutexLock lock(&state_->mu);
  return state_->done;
}

const absl::StatusOr<Message>& CallFuture::Wait() const {
  if (!state_->ready.load(std::memory_order_acquire)) {
    const int64_t start = absl::GetCurrentTimeNanos();
    if (!SpinOnResult(*state_, start, INT64_MAX)) {
      absl::MutexLock lock(&state_->mu);
      while (!state_->done) state_->cv.Wait(&state_->mu);
      CallerSpin(*state_).Learn(absl::GetCurrentTimeNanos() - start);
    }
  }
  return state_->Result();  // done (ready's acquire, or the lock): it never changes again
}

bool CallFuture::WaitFor(absl::Duration timeout) const {
  if (state_->ready.load(std::memory_order_acquire)) return true;
  const int64_t start = absl::GetCurrentTimeNanos();
  if (SpinOnResult(*state_, start, absl::ToInt64Nanoseconds(timeout))) return true;
  const absl::Time until = absl::FromUnixNanos(start) + timeout;
  absl::MutexLock lock(&state_->mu);
  while (!state_->done) {
    if (state_->cv.WaitWithDeadline(&state_->mu, until)) return state_->done;
  }
  return true;
}

void CallFuture::Cancel() {
  if (state_ == nullptr) return;
  uint64_t call_id;
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->done || state_->cancel_sent || state_->call_id == 0) return;
    state_->cancel_sent = true;
    call_id = state_->call_id;
  }
  std::shared_ptr<Link> link = state_->link.lock();
  if (link == nullptr) return;  // the engine went: it answered the call CANCELLED
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(shm::Op::kCancel);
  d.call_id = call_id;
  // The daemon answers CANCELLED (or the reply got there first); a ring that broke answers
  // the call UNAVAILABLE.
  (void)link->Push(d);
}

void CallFuture::Then(CallCallback callback) {
  {
    absl::MutexLock lock(&state_->mu);
    if (!state_->done) {
      state_->callbacks.push_back(std::move(callback));
      return;
    }
  }
  callback(state_->Result());
}

absl::Status Responder::Reply(absl::StatusOr<Message> reply) const {
  if (state_ == nullptr) {
    return absl::FailedPreconditionError("Reply on a Responder that holds no call");
  }
  const PendingReply& call = *state_;
  if (state_->answered.exchange(true)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the call to worker '", call.worker, "' method '", call.method, "' was answered already"));
  }
  std::shared_ptr<calls_internal::Engine> engine = call.engine.lock();
  if (engine == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the call to worker '", call.worker, "' method '", call.method,
        "' cannot be answered: the client's shared memory was detached (the daemon answered "
        "its caller)"));
  }
  absl::Status sent = engine->Answer(call.call_id, call.worker, call.method, /*from_handler=*/true,
                                     std::move(reply));
  calls_internal::ReleaseEngine(std::move(engine));
  return sent;
}

DeferredHandler AnswerOnReturn(Handler handler) {
  return [handler = std::move(handler)](Message request, Responder responder) {
    absl::StatusOr<Message> reply = handler(request);
    request = Message{};                      // its rx blocks' releases ride on the reply
    (void)responder.Reply(std::move(reply));  // a failure went to the caller instead
  };
}

}  // namespace tpd
