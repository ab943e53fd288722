// Calls between workers through the daemon's shared memory (docs/data_plane.md, "Calls on one
// node", "Client API"): the client side. Used through Client::Handle, Client::Call,
// Client::CallAsync and Client::AllocateTensor.
//
// Copies. A tensor allocated in the library's shared arena (the tx heap, AllocateTensor) is
// sent where it lies: the message's tensor table points at its block, no byte is copied. Any
// other bytes (the payload, tensors in user memory or received ones passed on) are copied
// once, into the message's block of the arena. What arrives is read in place: a received
// tensor is a view into the rx heap that holds its block until the last copy of the view
// goes, and only then is the block released to the daemon. The payload is copied into a
// std::string (it is the small part of a message).
//
// Lifetimes. An arena block is freed when nobody holds it: the user's Tensors and every sent
// message whose tensor table points at it (the daemon releases a message's block once it no
// longer reads any of that message, tensors included; until then the message pins the arena
// blocks it references). Tensors, views and futures may outlive the engine: the segment
// stays mapped while anything holds a part of it.
//
// Thread safety: thread-safe. The engine's threads ("tpd-calls") take turns reading the
// completion ring: the thread whose turn it is copies payloads out, answers futures and sends
// releases, and runs no user code while it reads. Handlers and future callbacks run on the
// others; see CallEngine.

#ifndef TPD_CLIENT_CALLS_H_
#define TPD_CLIENT_CALLS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/segment/tensor.h"
#include "shm/descriptor.h"
#include "shm/segment.h"

namespace tpd {

namespace calls_internal {
class Engine;         // what CallEngine fronts (client/engine.h)
struct CallState;     // one call's result, shared by the engine and its CallFutures
struct PendingReply;  // an incoming call not yet answered, shared by its Responders
}  // namespace calls_internal

// Answers one request; an error status goes back to the caller with its code and message,
// marked as the remote handler's. The request's tensors are views into the rx heap: a copy
// of a Tensor kept past the handler keeps its block from the daemon (Clone() owns the bytes
// instead). Runs on a handler pool thread.
using Handler = std::function<absl::StatusOr<Message>(const Message& request)>;

// The answer to one incoming call, given once, from any thread, after the handler that
// received it returned if it likes (PyTorch's @rpc.functions.async_execution, a C ABI
// handing requests to another language's threads). Copies share one answer.
//
// A call stays in flight until it is answered: Leave's drain waits for it, and
// CallEngineStats::handlers_running counts it. When the last copy of an unanswered Responder
// goes, the call is answered INTERNAL naming the worker and method, so a lost Responder
// never leaves its caller waiting for a deadline.
//
// Thread safety: thread-safe.
class Responder {
 public:
  // Answers nothing (valid() false).
  Responder() = default;

  bool valid() const { return state_ != nullptr; }
  // Sends `reply` to the caller, as a Handler's return value goes: a message, or an error
  // marked as the remote handler's. Only the first answer goes: a later one, one on an invalid
  // Responder and one after the engine went away (the daemon has answered the caller then)
  // return FAILED_PRECONDITION naming the call. An error sending the reply (too big for the
  // arena, say) is returned and goes to the caller instead.
  absl::Status Reply(absl::StatusOr<Message> reply) const;

 private:
  friend class calls_internal::Engine;
  explicit Responder(std::shared_ptr<calls_internal::PendingReply> state)
      : state_(std::move(state)) {}
  std::shared_ptr<calls_internal::PendingReply> state_;
};

// Receives one request and answers it through `responder`, now or later. Runs on a handler
// pool thread, which is free again when it returns.
using DeferredHandler = std::function<void(Message request, Responder responder)>;
// `handler` as a DeferredHandler that answers with its return value.
DeferredHandler AnswerOnReturn(Handler handler);
// Runs once with a call's result (CallFuture::Then).
using CallCallback = std::function<void(const absl::StatusOr<Message>& result)>;

// The result of CallAsync. Copies share one result.
//
// Thread safety: thread-safe.
class CallFuture {
 public:
  // A future with no call (valid() false); Wait on it is a programming error.
  CallFuture() = default;
  // A future that is ready with `result` (a call refused before it was sent).
  static CallFuture Ready(absl::StatusOr<Message> result);

  bool valid() const { return state_ != nullptr; }
  bool ready() const;
  // Blocks until the call's result is there and returns it; it lives as long as the future.
  // Spins for a short adaptive window (as the rings' doorbells do) before it sleeps.
  // Every call ends (by its reply, its deadline, or the engine going away), so a call with
  // a timeout never makes this wait longer than its timeout plus 2 s.
  const absl::StatusOr<Message>& Wait() const;
  // Waits at most `timeout`: true when the result is there.
  bool WaitFor(absl::Duration timeout) const;
  // Cancels the call: the daemon answers it CANCELLED naming the worker and method at once
  // (a call to another node too) and drops the callee's late reply; the callee's handler
  // still runs to its end. The result is set once: CANCELLED, or the reply (or error) when
  // that got here first. A no-op once the result is there, on a future never sent (Ready,
  // or refused), and after the first Cancel; it never blocks on the daemon.
  void Cancel();
  // Runs `callback` once with the result: on a handler pool thread of the client when the
  // result arrives later, or on this thread, before Then returns, when it is there already.
  // Never on a thread while it reads the ring, so a callback may block (it then holds one
  // handler thread, as a handler would). Callbacks of one future run in the order given.
  void Then(CallCallback callback);

 private:
  friend class calls_internal::Engine;
  explicit CallFuture(std::shared_ptr<calls_internal::CallState> state)
      : state_(std::move(state)) {}
  std::shared_ptr<calls_internal::CallState> state_;
};

// Counters of one engine, for tests and benchmarks.
struct CallEngineStats {
  uint64_t arena_bytes = 0;       // the tx heap's size
  uint64_t arena_used_bytes = 0;  // in live blocks: arena tensors and unreleased messages
  uint64_t arena_live_blocks = 0;
  uint64_t bytes_copied_in = 0;    // user bytes copied into the arena (payloads, tensors)
  uint64_t tensors_copied_in = 0;  // tensors copied into a message block
  uint64_t tensors_in_place = 0;   // arena tensors sent where they lie
  uint64_t bytes_copied_out = 0;   // bytes copied out of the rx heap (payloads)
  uint64_t rx_blocks_held = 0;     // received blocks not yet released (views alive)
  int handler_threads = 0;
  int handlers_running = 0;  // incoming calls taken off the queue and not yet answered
  int workers_leaving = 0;   // BeginLeave'd and not rejoined
  // Work (an incoming call, a future's callbacks) handed to the pool: taken by a pool thread
  // that was spinning for it, or by one woken through the condition variable.
  uint64_t handoffs_to_spinner = 0;
  uint64_t handoffs_woken = 0;
  // Incoming calls the thread that read them ran itself (another took over the ring): no
  // hand-off at all.
  uint64_t calls_run_by_reader = 0;
  // Hops that cost a wake-up: the reader slept on the completion ring (nothing came within its
  // spin window), and submissions that found the daemon's thread asleep and woke it.
  uint64_t reader_sleeps = 0;
  uint64_t daemon_wakeups = 0;
  // Releases of rx blocks that waited to ride on the next descriptor pushed, and pushes of
  // such releases on their own (none rode along within the release delay).
  uint64_t releases_deferred = 0;
  uint64_t release_flushes = 0;
  uint64_t cuda_tensors_sent = 0;      // exported to the daemon (never copied here)
  uint64_t cuda_tensors_received = 0;  // views into a receive pool
  uint64_t cuda_pool_blocks_held = 0;  // receive pool blocks not yet released (views alive)
  // Host tensors received in the sender's memory (mapped read-only, not copied by anyone),
  // and the peers' segments mapped now for them.
  uint64_t tensors_received_shared = 0;
  uint64_t peer_segments_mapped = 0;
  // Store calls made through the rings (StoreCall) rather than over gRPC.
  uint64_t store_calls = 0;
};

// The client's call machinery on one attached segment.
//
// Threads ("tpd-calls"): one more than the pool of `handler_threads`, which only grows
// (EnsureHandlerThreads; Client sizes it by the largest num_worker_threads of the groups it
// joined). They take turns (leader/followers): one reads the completion ring; the others run
// handlers for incoming calls and CallFuture callbacks, one FIFO each (callbacks first), or
// wait. The reading thread that finds an incoming call runs it itself when another thread is
// idle to read on, so the call passes to its handler with no hand-off (the idle thread takes
// the ring meanwhile); otherwise it queues the call and reads on. A thread always reads, so at
// most `handler_threads` handlers and callbacks run at once, and a reply to a handler's own
// call is never stuck behind busy handlers.
//
// Hand-offs: one idle thread at a time spins on the queue (and on a free turn at the ring) for
// a short adaptive window before it sleeps, and a caller in Wait spins on its result, so
// back-to-back calls pass between threads without a system call; an idle engine's threads
// sleep. Releases of rx blocks made while reading, or by a handler before its reply, ride on
// the next descriptor pushed (within 200 µs) instead of waking the daemon.
class CallEngine {
 public:
  // `notice_fd` (owned; -1: none): the session's data connection, where the daemon sends the
  // segments of peers whose tensors this client reads in place (PeerSegments).
  CallEngine(std::shared_ptr<const shm::Segment> segment, int handler_threads, int notice_fd = -1);
  // Answers calls still waiting CANCELLED (naming each), drops incoming calls not yet
  // started (the daemon answers their callers when the session ends), waits for running
  // handlers and runs every callback still due. On one of the engine's own threads (a handler
  // that detached its client), all that happens on a thread of its own, since it joins them.
  ~CallEngine();
  CallEngine(const CallEngine&) = delete;
  CallEngine& operator=(const CallEngine&) = delete;

  // Registers `handler` for `method`, replacing an earlier one (of either kind). A Handler
  // answers with its return value; a DeferredHandler through its Responder.
  void Handle(const std::string& method, Handler handler);
  void HandleDeferred(const std::string& method, DeferredHandler handler);
  // Grows the handler pool to at least `threads` (never shrinks).
  void EnsureHandlerThreads(int threads);
  // The session ended on the daemon's side (it exited, restarted or ended the session): no
  // reply will come through the rings, so the calls waiting fail now, UNAVAILABLE with `why`,
  // rather than at their deadlines, and later calls are refused with it.
  void Break(const absl::Status& why);
  // Lends the daemon a receive pool of `bytes` on cuda:`device` (once per device; later calls
  // for that device return OK): CUDA tensors sent to this client's workers land there.
  // Errors: the driver's (no GPU, cuMemAlloc failed), the daemon's refusal.
  absl::Status LendDevicePool(int device, uint64_t bytes);

  // A tensor whose bytes are a fresh block of the tx heap (contents unspecified).
  // INVALID_ARGUMENT for a bad dtype or shape; RESOURCE_EXHAUSTED naming the arena's size,
  // the request and the largest free block when it does not fit.
  absl::StatusOr<Tensor> AllocateTensor(shm::DType dtype, std::vector<int64_t> shape);

  // Calls `method` of `worker` in `group` as worker `from` (the daemon checks this session
  // holds it). `timeout` zero or infinite: no deadline. The future's result is the reply, or:
  // the daemon's or callee's error, DEADLINE_EXCEEDED naming worker, method, deadline and
  // timeout, FAILED_PRECONDITION while `from` is leaving, RESOURCE_EXHAUSTED when the arena
  // cannot hold the message, UNAVAILABLE when the session's ring broke, CANCELLED when the
  // engine goes away first. Payload and non-arena tensors are copied before this returns.
  // `flags`: shm::kFlagReverseMap or 0 (Client::CallOptions).
  CallFuture CallAsync(const std::string& group, const std::string& from, const std::string& worker,
                       const std::string& method, std::string_view payload,
                       absl::Span<const Tensor> tensors, absl::Duration timeout,
                       uint16_t flags = 0);
  // CallAsync and Wait.
  absl::StatusOr<Message> Call(const std::string& group, const std::string& from,
                               const std::string& worker, const std::string& method,
                               std::string_view payload, absl::Span<const Tensor> tensors,
                               absl::Duration timeout);
  // A call of the daemon's Store service through the rings (Op::kStore): `method` ("Set",
  // "Get", ...) with the serialized `request`, on the daemon's store ("" `group`) or a
  // group's. Returns the serialized response, or the daemon's error; the library gives up
  // `timeout` (zero: never) plus 2 s after the call, as for Call.
  absl::StatusOr<std::string> StoreCall(const std::string& group, const std::string& method,
                                        std::string_view request, absl::Duration timeout);

  // Graceful leave of worker `worker` of `group`, before the Leave RPC. BeginLeave: new
  // calls to it are answered UNAVAILABLE ("worker 'w' is leaving group 'g'"), new calls
  // from it FAILED_PRECONDITION. DrainLeave: waits until its calls in flight (made by it,
  // and handlers running or queued for calls to it) are done, at most until the latest of
  // their deadlines; one with no deadline counts as `no_deadline_wait` from now. Returns how
  // many were still in flight when it gave up (0: drained). Rejoined ends the refusals.
  void BeginLeave(const std::string& group, const std::string& worker);
  int DrainLeave(const std::string& group, const std::string& worker,
                 absl::Duration no_deadline_wait);
  void Rejoined(const std::string& group, const std::string& worker);

  // Lent readers: threads that are not the engine's may read its ring in place of its own
  // (the C ABI's threads waiting in tpd_next_event for requests), so that an incoming call
  // whose handler queues it for such a thread reaches that thread with no hand-off between
  // threads (docs/threading.md, "Lent readers"). While a lent reader waits for the turn, the
  // engine's own threads leave the ring to lent readers, and whoever gives the turn up calls
  // the waker, without the engine's lock, to wake one.
  //
  // EnableLentReaders sets the waker (the first call only; before any LentReaderWaits).
  void EnableLentReaders(std::function<void()> waker);
  // A lent reader begins (+1) or ends (-1) waiting for the turn. Returns whether the turn is
  // free now with nobody to take it: +1, so the caller takes it (ReadAsLent) rather than waits;
  // -1, so the caller wakes another lent reader (the waker's work, which it cannot call here
  // when it holds what the waker locks).
  bool LentReaderWaits(int delta);
  // Ends this thread's wait for the reading turn (counted by LentReaderWaits), takes the turn
  // if it is free and reads until it keeps an incoming call, which it serves on this thread
  // (the handler runs here), or until the engine stops, `deadline` passes or `interrupted()`
  // is true (seen at once after a NudgeReader, else within kPollInterval). False when the turn
  // was not free.
  bool ReadAsLent(absl::Time deadline, absl::FunctionRef<bool()> interrupted);
  // A lent reader waiting for the turn (counted by LentReaderWaits) spins until it is free,
  // `until` passes or `interrupted()` is true; meanwhile the thread giving the turn up wakes
  // nobody, since the spinner takes it. For a turn due at once (taken back from a lent reader
  // told to give it up). Returns whether the turn is free.
  bool SpinForTurn(absl::Time until, absl::FunctionRef<bool()> interrupted);
  // Wakes the thread that reads the ring if it sleeps there, so a lent reader looks at what
  // interrupts it at once. Thread-safe.
  void NudgeReader() const;

  CallEngineStats Stats();

 private:
  std::shared_ptr<calls_internal::Engine> engine_;
};

}  // namespace tpd

#endif  // TPD_CLIENT_CALLS_H_
