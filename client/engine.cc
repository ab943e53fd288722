#include "client/engine.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "client/call_state.h"
#include "client/segment/codec.h"
#include "client/segment/cuda_export.h"
#include "shm/doorbell.h"
#include "shm/message.h"
#include "shm/ring.h"

namespace tpd::calls_internal {

namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(50);
// How long past its deadline a call waits for the daemon's own DEADLINE_EXCEEDED.
constexpr absl::Duration kDeadlineGrace = absl::Seconds(2);
// How a handler's error is marked on its way back: the caller sees whose handler failed.
constexpr absl::string_view kRemotePrefix = "remote handler of worker '";

std::string CallName(const std::string& group, const std::string& worker,
                     const std::string& method) {
  return absl::StrCat("call to worker '", worker, "' method '", method, "' of group '", group, "'");
}

// The engine whose reader or handler thread this is.
thread_local const Engine* own_engine = nullptr;

}  // namespace

// --- Engine ---

Engine::Engine(std::shared_ptr<const shm::Segment> segment, int handler_threads, int notice_fd)
    : link_(std::make_shared<Link>(segment)),
      peers_(notice_fd),
      completions_(segment->base(), segment->layout().completion, "completion ring", kClientSpin),
      copy_reply_spin_(shm::kCopySpin),
      pool_spin_(kClientSpin) {
  extra_thread_ = std::thread([this] { ThreadLoop(); });
  absl::MutexLock lock(&mu_);
  EnsureThreadsLocked(handler_threads);
}

Engine::~Engine() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    // The ring's reader stops at its next look (within kPollInterval); nobody takes over.
    while (reading_) role_cv_.Wait(&mu_);
  }
  std::vector<std::thread> pool;
  std::deque<Incoming> dropped;  // their rx blocks are released outside mu_
  {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> ids;
    for (const auto& [id, call] : waiting_) ids.push_back(id);
    for (uint64_t id : ids) {
      const Outgoing& call = waiting_.at(id);
      Finish(id, absl::CancelledError(
                     absl::StrCat(CallName(call.from.first, call.worker, call.method),
                                  ": the client's shared memory was detached during the call")));
    }
    dropped.swap(incoming_);
    for (const Incoming& incoming : dropped) serving_.erase(incoming.call_id);
    PublishQueued();
    pool_exit_ = true;
    work_cv_.SignalAll();
    idle_cv_.SignalAll();
    pool.swap(pool_);
  }
  dropped.clear();
  extra_thread_.join();
  for (std::thread& thread : pool) thread.join();  // they run the callbacks due first
  std::deque<std::function<void()>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(callbacks_);
  }
  for (std::function<void()>& callback : left) callback();  // a pool that never had a thread
  link_->Close();
}

void Engine::Handle(const std::string& method, Handler handler) {
  HandleDeferred(method, AnswerOnReturn(std::move(handler)));
}

void Engine::HandleDeferred(const std::string& method, DeferredHandler handler) {
  absl::MutexLock lock(&mu_);
  handlers_[method] = std::move(handler);
}

void Engine::EnsureHandlerThreads(int threads) {
  absl::MutexLock lock(&mu_);
  EnsureThreadsLocked(threads);
}

void Engine::EnsureThreadsLocked(int threads) {
  while (!pool_exit_ && static_cast<int>(pool_.size()) < threads) {
    pool_.emplace_back([this] { ThreadLoop(); });
  }
}

absl::StatusOr<Tensor> Engine::AllocateTensor(shm::DType dtype, std::vector<int64_t> shape) {
  absl::StatusOr<uint64_t> bytes = TensorBytes(dtype, shape, "arena tensor");
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<uint64_t> block = link_->Allocate(std::max<uint64_t>(*bytes, 1), "a tensor");
  if (!block.ok()) return block.status();
  return TensorParts::Arena(dtype, std::move(shape), std::make_shared<ArenaBlock>(link_, *block),
                            reinterpret_cast<char*>(link_->base() + *block), *bytes);
}

void Engine::Complete(const std::shared_ptr<CallState>& state, absl::StatusOr<Message> result) {
  std::vector<CallCallback> callbacks;
  {
    absl::MutexLock lock(&state->mu);
    if (state->done) return;
    state->result = std::move(result);
    state->done = true;
    callbacks.swap(state->callbacks);
    state->cv.SignalAll();  // no system call when the caller is still spinning
  }
  // After the lock: a spinning caller that sees it returns without taking the lock, so it
  // never queues behind this thread (absl's Mutex may put a waiter to sleep).
  state->ready.store(true, std::memory_order_release);
  if (callbacks.empty()) return;
  // User code never runs while its thread reads the ring (nor under mu_): the pool runs it.
  callbacks_.push_back([state, callbacks = std::move(callbacks)] {
    for (const CallCallback& callback : callbacks) callback(state->Result());
  });
  WorkQueued();
}

void Engine::WorkQueued() {
  // The pool's wait: from a thread running out of work to the next work queued, whichever
  // thread takes it. (What one thread waited would be wrong: a thread that slept may be
  // woken only after others served many calls, and that long wait would shut the spin off.)
  if (pool_idle_since_ns_ != 0) {
    pool_spin_.Learn(absl::GetCurrentTimeNanos() - pool_idle_since_ns_);
    pool_idle_since_ns_ = 0;
  }
  EnsureThreadsLocked(1);
  // A pool thread spinning for work takes it without being woken (no system call here).
  if (pool_spinners_ == 0) {
    ++handoffs_woken_;
    work_cv_.Signal();
  } else {
    ++handoffs_to_spinner_;
  }
  // Last, so a spinning pool thread that sees it rarely finds mu_ still held.
  PublishQueued();
}

bool Engine::ReadingFree() const { return !reading_ && !stop_ && broken_.ok(); }

bool Engine::OwnTurnFree() const { return ReadingFree() && lent_waiting_ == 0; }

void Engine::PublishQueued() {
  queued_.store(callbacks_.size() + incoming_.size() + (OwnTurnFree() ? 1 : 0),
                std::memory_order_release);
  reading_free_.store(ReadingFree(), std::memory_order_release);
}

void Engine::EnableLentReaders(std::function<void()> waker) {
  absl::MutexLock lock(&mu_);
  if (!lent_waker_) lent_waker_ = std::move(waker);
}

bool Engine::LentReaderWaits(int delta) {
  absl::MutexLock lock(&mu_);
  lent_waiting_ += delta;
  if (delta > 0) return ReadingFree();
  if (!ReadingFree()) return false;
  // Another lent reader is to take the turn: a spinning one sees it, a sleeping one is woken.
  if (lent_waiting_ > 0) return lent_spinners_ == 0;
  // The last lent reader stopped waiting: the engine's own threads read again.
  PublishQueued();
  if (pool_spinners_ == 0) work_cv_.Signal();
  return false;
}

bool Engine::SpinForTurn(absl::Time until, absl::FunctionRef<bool()> interrupted) {
  {
    absl::MutexLock lock(&mu_);
    if (ReadingFree()) return true;
    ++lent_spinners_;
  }
  const int64_t start = absl::GetCurrentTimeNanos();
  Spin([&] { return reading_free_.load(std::memory_order_acquire) || interrupted(); }, start,
       absl::ToUnixNanos(until) - start, absl::ToInt64Nanoseconds(kClientSpin.pause_spin));
  absl::MutexLock lock(&mu_);
  --lent_spinners_;
  return ReadingFree();
}

bool Engine::ReadAsLent(absl::Time deadline, absl::FunctionRef<bool()> interrupted) {
  {
    absl::MutexLock lock(&mu_);
    --lent_waiting_;
    if (!ReadingFree()) return false;
    reading_ = true;
    PublishQueued();
  }
  const LentTurn turn{deadline, interrupted};
  std::optional<Incoming> incoming = Read(&turn);
  if (incoming) Serve(*std::move(incoming));
  return true;
}

void Engine::Finish(uint64_t id, absl::StatusOr<Message> result) {
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return;
  Outgoing call = std::move(it->second);
  waiting_.erase(it);
  if (call.state->copies) --copy_calls_waiting_;
  idle_cv_.SignalAll();
  if (!result.ok() && result.status().code() == absl::StatusCode::kDeadlineExceeded &&
      !absl::StartsWith(result.status().message(), kRemotePrefix)) {
    // The daemon's message names worker, method and deadline; add what the caller asked.
    result = absl::DeadlineExceededError(absl::StrCat(result.status().message(), " (group '",
                                                      call.from.first, "', timeout ",
                                                      absl::FormatDuration(call.timeout), ")"));
  }
  Complete(call.state, std::move(result));
}

void Engine::Expire() {
  const absl::Time now = absl::Now();
  std::vector<uint64_t> expired;
  for (const auto& [id, call] : waiting_) {
    if (call.give_up <= now) expired.push_back(id);
  }
  for (uint64_t id : expired) {
    const Outgoing& call = waiting_.at(id);
    Finish(id, absl::DeadlineExceededError(
                   absl::StrCat(CallName(call.from.first, call.worker, call.method),
                                " got no answer by its deadline ",
                                absl::FormatTime(call.deadline, absl::UTCTimeZone()), " plus ",
                                absl::FormatDuration(kDeadlineGrace), " (not even the daemon's)")));
  }
}

CallFuture Engine::CallAsync(const std::string& group, const std::string& from,
                             const std::string& worker, const std::string& method,
                             std::string_view payload, absl::Span<const Tensor> tensors,
                             absl::Duration timeout, uint16_t flags) {
  return Start(shm::Op::kCall, {group, worker, method, from}, payload, tensors, timeout, flags);
}

absl::StatusOr<std::string> Engine::StoreCall(const std::string& group, const std::string& method,
                                              std::string_view request, absl::Duration timeout) {
  ++link_->counters.store_calls;
  CallFuture future = Start(shm::Op::kStore, {group, "", method, ""}, request, {}, timeout, 0);
  future.Wait();
  absl::MutexLock lock(&future.state_->mu);
  if (!future.state_->result.ok()) return future.state_->result.status();
  return std::move(future.state_->result->payload);
}

CallFuture Engine::Start(shm::Op op, shm::MessageNames names, std::string_view payload,
                         absl::Span<const Tensor> tensors, absl::Duration timeout, uint16_t flags) {
  OutgoingHeader header{op, 0, 0, flags, 0, std::move(names)};
  const auto& [group, worker, method, from] = header.names;
  auto state = std::make_shared<CallState>();
  state->copies = std::any_of(tensors.begin(), tensors.end(),
                              [](const Tensor& t) { return t.is_cuda() && t.size() > 0; });
  const bool none = timeout == absl::ZeroDuration() || timeout == absl::InfiniteDuration();
  const absl::Time deadline = none ? absl::InfiniteFuture() : absl::Now() + timeout;
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    absl::Status refused;
    if (!broken_.ok()) {
      refused = Prefixed(broken_, CallName(group, worker, method), ": ");
    } else if (stop_) {
      refused = absl::CancelledError(
          absl::StrCat(CallName(group, worker, method), ": the call engine is stopping"));
    } else if (leaving_.count({group, from}) > 0) {
      refused = absl::FailedPreconditionError(absl::StrCat("worker '", from, "' is leaving group '",
                                                           group, "' and makes no new calls (",
                                                           CallName(group, worker, method), ")"));
    }
    if (!refused.ok()) {
      Complete(state, refused);
      return CallFuture(state);
    }
    id = next_call_id_++;
    state->call_id = id;
    state->link = link_;
    Outgoing& call = waiting_[id];
    call.state = state;
    if (state->copies) ++copy_calls_waiting_;
    call.from = {group, from};
    call.worker = worker;
    call.method = method;
    call.timeout = none ? absl::ZeroDuration() : timeout;
    call.deadline = deadline;
    call.give_up = none ? absl::InfiniteFuture() : deadline + kDeadlineGrace;
  }
  // A store call has no deadline of its own on the ring (a waiting one carries its timeout in
  // its request); the library still gives up on it past `timeout`.
  const int64_t deadline_ns = none || op != shm::Op::kCall ? 0 : absl::ToUnixNanos(deadline);
  header.call_id = id;
  header.deadline_unix_ns = deadline_ns;
  absl::Status submitted = Submit(header, payload, tensors);
  if (!submitted.ok()) {
    absl::MutexLock lock(&mu_);
    Finish(id, Prefixed(submitted, CallName(group, worker, method), " was not sent: "));
  }
  return CallFuture(state);
}

absl::StatusOr<Message> Engine::Call(const std::string& group, const std::string& from,
                                     const std::string& worker, const std::string& method,
                                     std::string_view payload, absl::Span<const Tensor> tensors,
                                     absl::Duration timeout) {
  CallFuture future = CallAsync(group, from, worker, method, payload, tensors, timeout);
  future.Wait();
  // Nobody else reads this result: the engine is done with it once it is set.
  absl::MutexLock lock(&future.state_->mu);
  return std::move(future.state_->result);
}

absl::Status Engine::Submit(const OutgoingHeader& header, std::string_view payload,
                            absl::Span<const Tensor> tensors) {
  absl::StatusOr<EncodedMessage> message = EncodeMessage(*link_, header, payload, tensors);
  if (!message.ok()) return message.status();
  absl::Status pushed = link_->PushMessage(message->descriptor, message->block,
                                           std::move(message->pins), std::move(message->leases));
  if (!pushed.ok()) return pushed;
  LinkCounters& counters = link_->counters;
  counters.cuda_tensors_sent += message->cuda_tensors;
  counters.bytes_copied_in += message->bytes_copied;
  counters.tensors_copied_in += message->tensors_copied;
  counters.tensors_in_place += message->tensors_in_place;
  return absl::OkStatus();
}

void Engine::ReplyError(uint64_t call_id, const absl::Status& status) {
  std::string message(status.message());
  if (message.size() > shm::kMaxMessageName) message.resize(shm::kMaxMessageName);
  const auto code =
      status.code() == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : status.code();
  // Nothing more to do when even this cannot go: the caller's deadline answers the call.
  (void)Submit({shm::Op::kReply,
                call_id,
                0,
                shm::kFlagError,
                static_cast<uint32_t>(code),
                {"", "", message, ""}},
               "", {});
}

std::optional<Engine::Incoming> Engine::Read(const LentTurn* lent) {
  // Releases made while reading ride on the next push (the reply of the call kept, say).
  Link::DeferReleasesOnThisThread(link_.get());
  shm::Descriptor batch[64];
  std::optional<Incoming> kept;
  bool ended = false;               // stopping, or the ring broke: nobody reads after this thread
  std::function<void()> wake_lent;  // called once the lock is dropped
  while (!ended) {
    ended = !ReadUntilKept(batch, &kept, lent);
    absl::MutexLock lock(&mu_);
    if (kept && idle_threads_ == 0 && lent_waiting_ == 0) {
      // Calls queued after it in the same batch took the idle threads: this one waits its turn
      // at the head of the queue, and this thread reads on.
      incoming_.push_front(*std::move(kept));
      kept.reset();
      --handlers_running_;
      --calls_kept_;
      WorkQueued();
      continue;
    }
    reading_ = false;
    role_cv_.SignalAll();
    // The idle thread just counted takes over: a lent reader, woken; else the spinner sees the
    // turn free, or one is woken.
    PublishQueued();
    if (ReadingFree() && lent_waiting_ > 0) {
      // A lent reader spinning for the turn takes it as it is; else one is woken.
      if (lent_spinners_ == 0) wake_lent = lent_waker_;
    } else if (ReadingFree() && pool_spinners_ == 0) {
      work_cv_.Signal();
    }
    break;
  }
  if (wake_lent) wake_lent();
  Link::DeferReleasesOnThisThread(nullptr);
  if (ended) link_->FlushReleases(absl::ZeroDuration());
  return kept;
}

void Engine::Break(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  BreakLocked(why);
}

void Engine::BreakLocked(const absl::Status& why) {
  if (broken_.ok()) broken_ = absl::UnavailableError(why.message());
  std::vector<uint64_t> ids;
  for (const auto& [id, call] : waiting_) ids.push_back(id);
  for (uint64_t id : ids) {
    const Outgoing& call = waiting_.at(id);
    Finish(id, absl::UnavailableError(absl::StrCat(
                   CallName(call.from.first, call.worker, call.method), ": ", broken_.message())));
  }
}

bool Engine::ReadUntilKept(absl::Span<shm::Descriptor> batch, std::optional<Incoming>* kept,
                           const LentTurn* lent) {
  while (!*kept) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return false;
    }
    if (lent != nullptr && (lent->interrupted() || absl::Now() >= lent->deadline)) return true;
    // Releases waiting for a push go by themselves once they have waited kReleaseDelay.
    const int64_t deferred = link_->DeferredSince();
    absl::Time wake = deferred == 0 ? absl::Now() + kPollInterval
                                    : std::min(absl::Now() + kPollInterval,
                                               absl::FromUnixNanos(deferred) + kReleaseDelay);
    if (lent != nullptr) wake = std::min(wake, lent->deadline);
    absl::StatusOr<bool> ready = completions_.WaitForData(
        wake, copy_calls_waiting_.load(std::memory_order_relaxed) > 0 ? &copy_reply_spin_ : nullptr,
        [lent] { return lent != nullptr && lent->interrupted(); });
    link_->FlushReleases(kReleaseDelay);
    absl::StatusOr<size_t> n = ready.ok() ? completions_.TryPopBatch(batch) : ready.status();
    if (!n.ok()) {
      absl::MutexLock lock(&mu_);
      BreakLocked(absl::UnavailableError(
          absl::StrCat("the session's completion ring broke: ", n.status().message())));
      return false;
    }
    for (size_t i = 0; i < *n; ++i) OnCompletion(batch[i], kept);
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now >= next_expire_) {
      Expire();
      next_expire_ = now + kPollInterval;
    }
  }
  return true;
}

void Engine::OnCompletion(const shm::Descriptor& d, std::optional<Incoming>* keep) {
  if (!shm::ValidateDescriptor(d, link_->layout(), shm::Direction::kCompletion).ok()) return;
  switch (static_cast<shm::Op>(d.op)) {
    case shm::Op::kRelease:
      link_->OnReleased(d.payload_offset);
      return;
    case shm::Op::kPeerGone:
      peers_.Forget(d.call_id);
      return;
    case shm::Op::kReply:
      // The rx block (when no tensor holds it) is released after the caller has its message:
      // on this thread the release waits for the next push.
      OnReply(d.call_id, DecodeMessage(d, link_, peers_));
      return;
    case shm::Op::kCall:
      OnCall(d, DecodeMessage(d, link_, peers_), keep);
      return;
    default:
      return;
  }
}

void Engine::OnReply(uint64_t call_id, DecodedMessage reply) {
  if (reply.message.ok() && !reply.copies.empty()) {
    // The daemon posts replies once their copies completed: this returns at once.
    if (absl::Status copied = AwaitCopies(reply.copies, absl::InfiniteFuture()); !copied.ok()) {
      reply.message = copied;
    }
  }
  absl::MutexLock lock(&mu_);
  Finish(call_id, std::move(reply.message));  // a call given up on already: ignored
}

void Engine::OnCall(const shm::Descriptor& d, DecodedMessage call, std::optional<Incoming>* keep) {
  if (!call.message.ok()) return;  // a malformed call: the caller's deadline answers it
  call.message->caller = std::move(call.names[3]);
  Incoming incoming;
  incoming.call_id = d.call_id;
  incoming.to = {std::move(call.names[0]), std::move(call.names[1])};
  incoming.method = std::move(call.names[2]);
  if (d.deadline_unix_ns != 0) incoming.deadline = absl::FromUnixNanos(d.deadline_unix_ns);
  incoming.request = *std::move(call.message);
  if (!call.copies.empty()) {
    incoming.copies = std::move(call.copies);
    incoming.copies_block = std::move(call.block);
  }
  {
    absl::MutexLock lock(&mu_);
    if (!stop_ && leaving_.count(incoming.to) == 0) {
      serving_[incoming.call_id] = {incoming.to, incoming.deadline};
      // This thread runs the call itself, with no hand-off, when another thread is idle to
      // take over the ring (and none queued before it). Otherwise it keeps reading: a thread
      // always reads, so replies to handlers' own calls are never stuck behind them.
      if (!*keep && idle_threads_ > 0 && incoming_.empty()) {
        ++handlers_running_;
        ++calls_kept_;
        *keep = std::move(incoming);
        return;
      }
      incoming_.push_back(std::move(incoming));
      WorkQueued();
      return;
    }
  }
  ReplyError(d.call_id,
             absl::UnavailableError(absl::StrCat("worker '", incoming.to.second,
                                                 "' is leaving group '", incoming.to.first, "'")));
}

void Engine::ThreadLoop() {
  pthread_setname_np(pthread_self(), "tpd-calls");
  own_engine = this;
  while (true) {
    std::function<void()> callback;
    std::optional<Incoming> incoming;
    {
      absl::MutexLock lock(&mu_);
      ++idle_threads_;
      int64_t wait_start = 0;  // when this thread began to spin for work (0: it did not)
      while (callbacks_.empty() && (stop_ || incoming_.empty()) && !OwnTurnFree() && !pool_exit_) {
        if (stop_ || pool_spinners_ > 0 || wait_start != 0) {
          work_cv_.Wait(&mu_);
          continue;
        }
        // One idle thread at a time spins on the queue for the adaptive window before it
        // sleeps; the reader sees it spinning and hands it work (or the ring) without waking
        // anyone.
        ++pool_spinners_;
        wait_start = absl::GetCurrentTimeNanos();
        if (pool_idle_since_ns_ == 0) pool_idle_since_ns_ = wait_start;
        const int64_t window = pool_spin_.window_ns();
        const int64_t pause = pool_spin_.pause_ns();
        mu_.Unlock();
        Spin([this] { return queued_.load(std::memory_order_acquire) > 0; }, wait_start, window,
             pause);
        mu_.Lock();
        --pool_spinners_;
      }
      --idle_threads_;
      // The ring first: a thread must be reading before any takes more work.
      if (OwnTurnFree()) {
        reading_ = true;
      } else if (!callbacks_.empty()) {
        callback = std::move(callbacks_.front());
        callbacks_.pop_front();
      } else if (!stop_ && !incoming_.empty()) {
        incoming = std::move(incoming_.front());
        incoming_.pop_front();
        ++handlers_running_;
      } else {
        return;  // pool_exit_, and no callback left
      }
      PublishQueued();
      // More work than this thread: wake another (the spinner, if any, takes one itself).
      if (queued_.load(std::memory_order_relaxed) > 0 && pool_spinners_ == 0) {
        work_cv_.Signal();
      }
    }
    if (callback) {
      callback();
      continue;
    }
    // Reads until it keeps a call to run here (another thread reads on) or the engine stops.
    if (!incoming) incoming = Read();
    if (incoming) Serve(*std::move(incoming));
  }
}

void Engine::Serve(Incoming incoming) {
  DeferredHandler handler;
  {
    absl::MutexLock lock(&mu_);
    auto it = handlers_.find(incoming.method);
    if (it != handlers_.end()) handler = it->second;
  }
  const std::string& worker = incoming.to.second;
  if (!incoming.copies.empty()) {
    // Its tensors' bytes are there once the daemon's copies completed, while this thread was
    // readied. (When a copy fails the daemon answers the caller itself; this answer is dropped.)
    if (absl::Status copied = AwaitCopies(incoming.copies, incoming.deadline); !copied.ok()) {
      (void)Answer(incoming.call_id, worker, incoming.method, /*from_handler=*/false, copied);
      return;
    }
    incoming.copies_block.reset();
  }
  if (!handler) {
    (void)Answer(
        incoming.call_id, worker, incoming.method, /*from_handler=*/false,
        absl::UnimplementedError(absl::StrCat("worker '", worker, "' has no handler for method '",
                                              incoming.method, "' (Client::Handle)")));
    return;
  }
  auto pending =
      std::make_shared<PendingReply>(weak_from_this(), incoming.call_id, worker, incoming.method);
  // Releases of the request's rx blocks the handler drops ride on its reply (one doorbell ring
  // for both) when it answers before it returns.
  Link::DeferReleasesOnThisThread(link_.get());
  handler(std::move(incoming.request), Responder(std::move(pending)));
  Link::DeferReleasesOnThisThread(nullptr);
  link_->FlushReleases(absl::ZeroDuration());  // when nothing above was pushed
}

absl::Status Engine::AwaitCopies(absl::Span<shm::CopySignal* const> signals, absl::Time deadline) {
  for (shm::CopySignal* signal : signals) {
    auto copied = [signal] {
      return signal->state.load(std::memory_order_acquire) != shm::kCopying;
    };
    // A fresh doorbell spins for its whole window first: a copy for this very call is running.
    shm::Doorbell bell(&signal->bell, shm::kCopySpin);
    while (!bell.Wait(copied, std::min(deadline, absl::Now() + kPollInterval))) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            "the call's deadline passed while the daemon copied its CUDA tensors");
      }
      absl::MutexLock lock(&mu_);
      if (!broken_.ok()) return broken_;
    }
    if (signal->state.load(std::memory_order_acquire) != shm::kCopied) {
      return absl::InternalError("the daemon's copy of the call's CUDA tensors failed");
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::Answer(uint64_t id, const std::string& worker, const std::string& method,
                            bool from_handler, absl::StatusOr<Message> reply) {
  absl::Status sent;
  if (reply.ok()) {
    sent = Submit({shm::Op::kReply, id}, reply->payload, reply->tensors);
  } else if (!from_handler) {
    ReplyError(id, reply.status());
  } else {
    ReplyError(id,
               Prefixed(reply.status(), kRemotePrefix, worker, "' method '", method, "' failed: "));
  }
  if (!sent.ok()) {
    // Too big for the arena, say: tell the caller that instead.
    sent = Prefixed(sent, "the reply of worker '", worker, "' method '", method,
                    "' could not be sent: ");
    ReplyError(id, sent);
  }
  if (!link_->DefersOnThisThread()) link_->FlushReleases(absl::ZeroDuration());
  reply = Message{};
  absl::MutexLock lock(&mu_);
  --handlers_running_;
  serving_.erase(id);
  idle_cv_.SignalAll();
  return sent;
}

void Engine::BeginLeave(const std::string& group, const std::string& worker) {
  absl::MutexLock lock(&mu_);
  leaving_.insert({group, worker});
}

void Engine::Rejoined(const std::string& group, const std::string& worker) {
  absl::MutexLock lock(&mu_);
  leaving_.erase({group, worker});
}

int Engine::DrainLeave(const std::string& group, const std::string& worker,
                       absl::Duration no_deadline_wait) {
  const WorkerKey key{group, worker};
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  absl::Time bound = now;
  auto later = [&](absl::Time deadline) {
    bound = std::max(bound, deadline == absl::InfiniteFuture() ? now + no_deadline_wait : deadline);
  };
  for (const auto& [id, call] : waiting_) {
    if (call.from == key) later(call.give_up);
  }
  for (const auto& [id, serving] : serving_) {
    if (serving.first == key) later(serving.second);
  }
  while (true) {
    int left = 0;
    for (const auto& [id, call] : waiting_) left += call.from == key;
    for (const auto& [id, serving] : serving_) left += serving.first == key;
    if (left == 0 || absl::Now() >= bound) return left;
    idle_cv_.WaitWithDeadline(&mu_, bound);
  }
}

bool Engine::OnOwnThread() const { return own_engine == this; }

void ReleaseEngine(std::shared_ptr<Engine> engine) {
  if (engine == nullptr || engine.use_count() > 1 || !engine->OnOwnThread()) return;
  // Its destructor joins this very thread, which goes back to its loop and exits once the
  // destructor has told the pool to.
  std::thread([engine = std::move(engine)]() mutable { engine.reset(); }).detach();
}

absl::Status Engine::LendDevicePool(int device, uint64_t bytes) {
  const std::string what = absl::StrCat("receive pool of ", bytes, " bytes on cuda:", device);
  absl::MutexLock lend(&lend_mu_);
  if (link_->Pool(device)) return absl::OkStatus();
  absl::StatusOr<CudaExporter*> exporter = CudaExporter::Get();
  absl::StatusOr<DevicePool> pool =
      exporter.ok() ? (*exporter)->AllocatePool(device, bytes) : exporter.status();
  if (!pool.ok()) return Prefixed(pool.status(), what, ": ");
  link_->SetPool(device, *pool);  // known before the daemon can place anything in it
  absl::Status lent = OfferPool(*pool);
  if (lent.ok()) return absl::OkStatus();
  // Freed only when the daemon refused it; unanswered (the ring, a timeout), the daemon may
  // still take it, so it stays lent for the engine's life.
  const bool refused = lent.code() == absl::StatusCode::kInvalidArgument ||
                       lent.code() == absl::StatusCode::kFailedPrecondition ||
                       lent.code() == absl::StatusCode::kAlreadyExists ||
                       lent.code() == absl::StatusCode::kUnimplemented;
  if (refused) {
    link_->ErasePool(device);
    (*exporter)->FreePool(*pool);
  }
  return Prefixed(lent, what, ": ");
}

absl::Status Engine::OfferPool(const DevicePool& pool) {
  auto state = std::make_shared<CallState>();
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_call_id_++;
    state->call_id = id;
    Outgoing& call = waiting_[id];
    call.state = state;
    call.worker = "(the daemon)";
    call.method = "lend a device pool";
    call.give_up = absl::Now() + kRingWait;
  }
  absl::StatusOr<uint64_t> block = link_->Allocate(sizeof(pool.record), "a device pool's record");
  absl::Status sent = block.status();
  if (block.ok()) {
    std::memcpy(link_->base() + *block, &pool.record, sizeof(pool.record));
    shm::Descriptor d{};
    d.op = static_cast<uint8_t>(shm::Op::kDevicePool);
    d.call_id = id;
    d.payload_offset = *block;
    d.payload_length = sizeof(pool.record);
    sent = link_->PushMessage(d, *block, {}, {});
  }
  if (!sent.ok()) {
    absl::MutexLock lock(&mu_);
    Finish(id, sent);
  }
  return CallFuture(state).Wait().status();
}

CallEngineStats Engine::Stats() {
  CallEngineStats stats;
  const shm::HeapAllocator::Stats tx = link_->ArenaStats();
  stats.arena_bytes = tx.heap_bytes;
  stats.arena_used_bytes = tx.used_bytes;
  stats.arena_live_blocks = tx.live_blocks;
  stats.daemon_wakeups = link_->DaemonWakeups();
  stats.reader_sleeps = completions_.sleeps();
  const LinkCounters& counters = link_->counters;
  stats.bytes_copied_in = counters.bytes_copied_in;
  stats.tensors_copied_in = counters.tensors_copied_in;
  stats.tensors_in_place = counters.tensors_in_place;
  stats.bytes_copied_out = counters.bytes_copied_out;
  stats.rx_blocks_held = counters.rx_blocks_held;
  stats.releases_deferred = counters.releases_deferred;
  stats.release_flushes = counters.release_flushes;
  stats.cuda_tensors_sent = counters.cuda_tensors_sent;
  stats.cuda_tensors_received = counters.cuda_tensors_received;
  stats.cuda_pool_blocks_held = counters.cuda_pool_blocks_held;
  stats.tensors_received_shared = counters.tensors_received_shared;
  stats.peer_segments_mapped = peers_.size();
  stats.store_calls = counters.store_calls;
  absl::MutexLock lock(&mu_);
  stats.handler_threads = static_cast<int>(pool_.size());
  stats.handlers_running = handlers_running_;
  stats.workers_leaving = static_cast<int>(leaving_.size());
  stats.handoffs_to_spinner = handoffs_to_spinner_;
  stats.handoffs_woken = handoffs_woken_;
  stats.calls_run_by_reader = calls_kept_;
  return stats;
}

}  // namespace tpd::calls_internal
