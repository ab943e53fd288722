// The engine behind CallEngine (client/calls.h): its threads, its turns at the rings and its
// state. CallEngine is the facade users hold; this is what Responders and pending replies reach
// (weakly) to answer a call, and what the engine's threads run on.
//
// Internal to the client library.
//
// Thread safety: thread-safe (CallEngine says how its threads share the work).

#ifndef TPD_CLIENT_ENGINE_H_
#define TPD_CLIENT_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/calls.h"
#include "client/segment/peer_segments.h"
#include "client/segment/tensor.h"
#include "shm/copy_signal.h"
#include "shm/descriptor.h"
#include "shm/doorbell.h"
#include "shm/message.h"
#include "shm/ring.h"
#include "shm/segment.h"

namespace tpd::calls_internal {

class Link;             // the engine's half of a segment (client/segment/link.h)
struct CallState;       // one call's result, shared by the engine and its CallFutures
struct DevicePool;      // a receive pool on a CUDA device (client/segment/cuda_export.h)
struct OutgoingHeader;  // what a message sent says (client/segment/codec.h)
struct DecodedMessage;  // what a message received says (client/segment/codec.h)

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // CallEngine's operations, as client/calls.h documents them.
  Engine(std::shared_ptr<const shm::Segment> segment, int handler_threads, int notice_fd = -1);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  void Handle(const std::string& method, Handler handler);
  void HandleDeferred(const std::string& method, DeferredHandler handler);
  void EnsureHandlerThreads(int threads);
  void Break(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LendDevicePool(int device, uint64_t bytes);
  absl::StatusOr<Tensor> AllocateTensor(shm::DType dtype, std::vector<int64_t> shape);
  CallFuture CallAsync(const std::string& group, const std::string& from, const std::string& worker,
                       const std::string& method, std::string_view payload,
                       absl::Span<const Tensor> tensors, absl::Duration timeout,
                       uint16_t flags = 0);
  absl::StatusOr<Message> Call(const std::string& group, const std::string& from,
                               const std::string& worker, const std::string& method,
                               std::string_view payload, absl::Span<const Tensor> tensors,
                               absl::Duration timeout);
  absl::StatusOr<std::string> StoreCall(const std::string& group, const std::string& method,
                                        std::string_view request, absl::Duration timeout);
  void BeginLeave(const std::string& group, const std::string& worker);
  int DrainLeave(const std::string& group, const std::string& worker,
                 absl::Duration no_deadline_wait);
  void Rejoined(const std::string& group, const std::string& worker);
  void EnableLentReaders(std::function<void()> waker);
  bool LentReaderWaits(int delta);
  bool ReadAsLent(absl::Time deadline, absl::FunctionRef<bool()> interrupted);
  bool SpinForTurn(absl::Time until, absl::FunctionRef<bool()> interrupted);
  void NudgeReader() const { completions_.Nudge(); }
  CallEngineStats Stats();
  bool OnOwnThread() const;

  // Sends the answer of the incoming call `id` to `worker`'s method `method` and ends it
  // (Responder::Reply, and PendingReply when the last Responder went unanswered). `from_handler`:
  // an error is the handler's (prefixed as such), not the engine's own refusal.
  absl::Status Answer(uint64_t id, const std::string& worker, const std::string& method,
                      bool from_handler, absl::StatusOr<Message> reply);

 private:
  // Sends a message of `op` (kCall, or kStore with the names {group, "", method, ""}) to
  // `names` ({group, worker, method, from}) and registers its future: CallAsync and StoreCall.
  CallFuture Start(shm::Op op, shm::MessageNames names, std::string_view payload,
                   absl::Span<const Tensor> tensors, absl::Duration timeout, uint16_t flags);
  using WorkerKey = std::pair<std::string, std::string>;  // (group, worker)
  struct Outgoing {
    std::shared_ptr<CallState> state;
    WorkerKey from;
    std::string worker;
    std::string method;
    absl::Duration timeout;
    absl::Time deadline = absl::InfiniteFuture();
    absl::Time give_up = absl::InfiniteFuture();
  };
  struct Incoming {
    uint64_t call_id = 0;
    WorkerKey to;  // this client's worker, the one called
    std::string method;
    absl::Time deadline = absl::InfiniteFuture();
    Message request;
    // Posted before the daemon's copies of its CUDA tensors completed: the signals to wait on
    // before the handler sees it (shm/copy_signal.h), and the rx block they lie in.
    std::vector<shm::CopySignal*> copies;
    std::shared_ptr<const void> copies_block;
  };

  // Waits until the daemon's copies behind `signals` completed: OK, INTERNAL when one
  // failed, DEADLINE_EXCEEDED past `deadline`, UNAVAILABLE once the completion ring broke.
  absl::Status AwaitCopies(absl::Span<shm::CopySignal* const> signals, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Answers the call `id` (no-op when it was answered already).
  void Finish(uint64_t id, absl::StatusOr<Message> result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Breaks the engine for `why` (the first reason stays): every call waiting fails UNAVAILABLE
  // naming it and the reason, and later calls are refused with it.
  void BreakLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the state's result and queues its callbacks on the pool.
  void Complete(const std::shared_ptr<CallState>& state, absl::StatusOr<Message> result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives up on calls past their give_up time (the daemon never answered).
  void Expire() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnsureThreadsLocked(int threads) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After queueing on incoming_ or callbacks_: publishes queued_ and wakes a pool thread
  // unless one is spinning for work.
  void WorkQueued() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Writes a message into a tx block (client/segment/codec.h), pins the arena tensors it
  // points at, and pushes its descriptor.
  absl::Status Submit(const OutgoingHeader& header, std::string_view payload,
                      absl::Span<const Tensor> tensors);
  // Offers the daemon the receive pool `pool` (Op::kDevicePool) and waits for its answer.
  absl::Status OfferPool(const DevicePool& pool);
  // Sends an error reply for the incoming call `call_id`.
  void ReplyError(uint64_t call_id, const absl::Status& status);
  // Every engine thread's loop: reads the ring when nobody does, else runs what is queued
  // (callbacks first) or waits for it.
  void ThreadLoop();
  // A lent reader's limits on its turn (ReadAsLent).
  struct LentTurn {
    absl::Time deadline;
    absl::FunctionRef<bool()> interrupted;
  };
  // Reads the completion ring (the caller holds the reading turn, reading_) until it keeps an
  // incoming call for this thread to run, or the engine stops or its ring breaks, or a lent
  // reader's turn ends (nullopt); then gives the turn up.
  std::optional<Incoming> Read(const LentTurn* lent = nullptr);
  // Read's loop: until OnCompletion keeps a call (true), or the engine stops or its ring
  // broke (false), or `lent`'s turn ended (true, nothing kept).
  bool ReadUntilKept(absl::Span<shm::Descriptor> batch, std::optional<Incoming>* kept,
                     const LentTurn* lent);
  // The reading turn is free and the engine's own threads may take it (no lent reader waits).
  bool OwnTurnFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One descriptor read off the ring. An incoming call goes into `*keep` (empty before) when
  // another thread is idle to read on; else it is queued. Read checks again as it gives up
  // the ring, since calls queued after it may have taken that thread.
  void OnCompletion(const shm::Descriptor& d, std::optional<Incoming>* keep);
  // A reply read off the ring: answers its call.
  void OnReply(uint64_t call_id, DecodedMessage reply);
  // A call read off the ring: kept in `*keep`, queued, or refused (its worker is leaving).
  void OnCall(const shm::Descriptor& d, DecodedMessage call, std::optional<Incoming>* keep);
  // Nobody reads the ring, and somebody may (not stopping, not broken).
  bool ReadingFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes queued_: what an idle thread may take (callbacks, calls, the reading turn).
  void PublishQueued() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Serve(Incoming incoming);

  const std::shared_ptr<Link> link_;
  PeerSegments peers_;
  shm::RingConsumer completions_;  // the thread whose turn it is to read (reading_)
  // The reader's window while calls that sent CUDA tensors wait for replies (the thread whose
  // turn it is to read): such a reply comes after the copy, later than the plain window.
  shm::SpinWindow copy_reply_spin_;
  std::atomic<int> copy_calls_waiting_{0};  // in waiting_ with CallState::copies

  absl::Mutex mu_;
  absl::CondVar work_cv_;  // the pool: work queued, or exit
  absl::CondVar idle_cv_;  // DrainLeave: a call of some worker ended
  absl::CondVar role_cv_;  // the destructor: the reading thread gave up its turn
  // A thread is reading the completion ring (its turn passes between the engine's threads).
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  // Engine threads waiting in ThreadLoop for something to do (spinning or asleep).
  int idle_threads_ ABSL_GUARDED_BY(mu_) = 0;
  // Lent readers waiting for the reading turn, and how to wake one (set once).
  int lent_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  // Lent readers in SpinForTurn, and ReadingFree() published for them to read without the lock.
  int lent_spinners_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> reading_free_{false};
  std::function<void()> lent_waker_ ABSL_GUARDED_BY(mu_);
  uint64_t calls_kept_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;       // no new calls; nobody reads the ring
  bool pool_exit_ ABSL_GUARDED_BY(mu_) = false;  // pool threads exit once callbacks ran
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Outgoing> waiting_ ABSL_GUARDED_BY(mu_);
  absl::Time next_expire_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<std::string, DeferredHandler> handlers_ ABSL_GUARDED_BY(mu_);
  std::deque<Incoming> incoming_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
  // Incoming calls queued or running, by the id the daemon gave them: (worker, deadline).
  std::map<uint64_t, std::pair<WorkerKey, absl::Time>> serving_ ABSL_GUARDED_BY(mu_);
  std::set<WorkerKey> leaving_ ABSL_GUARDED_BY(mu_);
  int handlers_running_ ABSL_GUARDED_BY(mu_) = 0;
  // Pool threads spinning for work (at most one), the adaptive window they spin for, and
  // what is queued (callbacks_, incoming_ and a free reading turn), which they read without
  // the lock.
  int pool_spinners_ ABSL_GUARDED_BY(mu_) = 0;
  shm::SpinWindow pool_spin_ ABSL_GUARDED_BY(mu_);
  // When a pool thread last ran out of work with nothing queued (GetCurrentTimeNanos), until
  // work is queued again; 0 otherwise.
  int64_t pool_idle_since_ns_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<size_t> queued_{0};
  absl::Mutex lend_mu_;  // one LendDevicePool at a time
  uint64_t handoffs_to_spinner_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t handoffs_woken_ ABSL_GUARDED_BY(mu_) = 0;
  // The thread beyond the pool: the engine has handler_threads + 1, so one reads the ring while
  // that many run handlers. Not otherwise special (the threads take turns at the ring).
  std::thread extra_thread_;
  std::vector<std::thread> pool_ ABSL_GUARDED_BY(mu_);
};

// Drops `engine`. When this may be the last reference and this thread is one of the
// engine's own (a handler or callback that detached its client, or whose client moved on to
// a new session), the engine is destroyed on a thread of its own instead, since its
// destructor joins the pool, this thread included.
void ReleaseEngine(std::shared_ptr<Engine> engine);

}  // namespace tpd::calls_internal

#endif  // TPD_CLIENT_ENGINE_H_
