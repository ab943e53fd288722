#include "client/calls.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "client/cuda_export.h"
#include "proto/shm/doorbell.h"
#include "proto/shm/heap.h"
#include "proto/shm/message.h"
#include "proto/shm/ring.h"

namespace tpd {

namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(50);
constexpr absl::Duration kRingWait = absl::Seconds(5);
// How long past its deadline a call waits for the daemon's own DEADLINE_EXCEEDED.
constexpr absl::Duration kDeadlineGrace = absl::Seconds(2);
// How a handler's error is marked on its way back: the caller sees whose handler failed.
constexpr absl::string_view kRemotePrefix = "remote handler of worker '";
// Releases of rx blocks made on the reader (and by a handler before its reply) wait to ride
// on the next descriptor this client pushes, so a release does not wake the daemon on its
// own; the reader pushes them by themselves once they have waited this long, and at once
// when this many wait or a block is large.
constexpr absl::Duration kReleaseDelay = absl::Microseconds(200);
constexpr size_t kMaxDeferredReleases = 32;
constexpr uint64_t kDeferredReleaseMaxBytes = 64 << 10;
// How long the client's threads spin before they sleep: the reader on the completion ring,
// an idle engine thread waiting for work, a caller waiting for its result. The doorbell's adaptive
// rule (pause 1 µs, then yield; a window of four times the typical wait; 2 µs once waits keep
// running longer than max_spin, so an idle client sleeps at once), with a max_spin of
// 100 µs rather than the doorbell's 50: where every hop of a call sleeps, a round trip on a
// 16-core VM takes 35-40 µs, and a 50 µs cap sat so close to that that tails kept
// collapsing the window, so the hops never spun and the round trip stayed there
// (docs/BENCHMARKS.md, B2).
constexpr shm::SpinOptions kSpin{absl::Microseconds(2), absl::Microseconds(100),
                                 absl::Microseconds(1)};

#if defined(__x86_64__) || defined(__i386__)
inline void CpuRelax() { __builtin_ia32_pause(); }
#elif defined(__aarch64__)
inline void CpuRelax() { asm volatile("yield" ::: "memory"); }
#else
inline void CpuRelax() {}
#endif

// Spins until done() or `window` has passed since `start` (pause for `pause_ns`, then
// sched_yield between looks, as shm::Doorbell does). Returns done() at the last look.
template <typename Done>
bool Spin(Done done, int64_t start, int64_t window_ns, int64_t pause_ns) {
  const int64_t until = start + window_ns;
  const int64_t yield_after = start + std::min(window_ns, pause_ns);
  int64_t now = start;
  for (uint32_t i = 1; now < until; ++i) {
    if (done()) return true;
    if ((i & 15) == 0) now = absl::GetCurrentTimeNanos();
    if (now >= yield_after) {
      sched_yield();
    } else {
      CpuRelax();
    }
  }
  return done();
}

// The caller's spin window, learnt per thread: a thread making back-to-back calls spins
// through a typical reply; one whose calls take long sleeps almost at once.
thread_local shm::SpinWindow caller_spin(kSpin);
// The same for calls that send CUDA tensors, whose reply waits for the copy (shm::kCopySpin).
thread_local shm::SpinWindow cuda_caller_spin(shm::kCopySpin);

std::string CallName(const std::string& group, const std::string& worker,
                     const std::string& method) {
  return absl::StrCat("call to worker '", worker, "' method '", method, "' of group '", group, "'");
}

// product(shape) * item size, checked.
absl::StatusOr<uint64_t> ShapeBytes(shm::DType dtype, const std::vector<int64_t>& shape,
                                    absl::string_view what) {
  const uint64_t item = shm::ItemBytes(static_cast<uint8_t>(dtype));
  if (item == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dtype ", static_cast<int>(dtype), " is not a dtype"));
  }
  if (shape.size() > shm::kMaxTensorDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", shape.size(), " dims, at most ", int{shm::kMaxTensorDims}));
  }
  uint64_t n = item;
  for (int64_t dim : shape) {
    if (dim < 0 || (dim != 0 && n > UINT64_MAX / static_cast<uint64_t>(dim))) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": bad shape (dim ", dim, ")"));
    }
    n *= static_cast<uint64_t>(dim);
  }
  return n;
}

std::string ArenaFull(const shm::HeapAllocator& tx, uint64_t request, absl::string_view what) {
  const shm::HeapAllocator::Stats stats = tx.GetStats();
  if (request > stats.heap_bytes) {
    // Nothing freed or awaited would make room: only a larger heap can.
    return absl::StrCat("the shared arena (tx heap of ", stats.heap_bytes, " bytes) cannot hold ",
                        what, " of ", request,
                        " bytes at all: the daemon's [data] arena_bytes "
                        "sizes each heap; it must be at least ",
                        request, " (docs/python.md, \"Tensors, memory and arena_bytes\")");
  }
  return absl::StrCat("the shared arena (tx heap of ", stats.heap_bytes, " bytes) cannot hold ",
                      what, " of ", request, " bytes (", stats.used_bytes,
                      " in use, largest free block ", stats.largest_free,
                      "): drop arena tensors no longer needed, or wait for calls in flight");
}

// The engine whose reader or handler thread this is.
thread_local const CallEngine* own_engine = nullptr;
// Set while this thread's releases of that link's rx blocks may wait for the next push: on
// the reader, and in a handler between dropping its request and sending its reply.
thread_local const void* defer_releases_of = nullptr;

}  // namespace

namespace calls_internal {

// The engine's half of the segment, shared with every arena tensor and received view so
// they can free and release their blocks whenever they go, even after the engine.
class Link {
 public:
  explicit Link(std::shared_ptr<const shm::Segment> segment)
      : segment_(std::move(segment)),
        tx("tx heap", segment_->layout().tx_heap),
        submissions(segment_->base(), segment_->layout().submission, "submission ring") {}
  // The receive pools go with the last view into them (the engine holds the link too).
  ~Link() {
    if (pools.empty()) return;
    absl::StatusOr<CudaExporter*> exporter = CudaExporter::Get();
    if (!exporter.ok()) return;
    for (const auto& [device, pool] : pools) (*exporter)->FreePool(pool);
  }

  uint8_t* base() const { return segment_->base(); }
  const shm::Layout& layout() const { return segment_->layout(); }

  // Pushes the deferred releases and then `d` (when given) with one doorbell ring, waiting
  // up to kRingWait for space.
  absl::Status Push(const shm::Descriptor* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    shm::Descriptor one[1];
    absl::Span<const shm::Descriptor> batch;
    if (deferred.empty()) {
      if (d == nullptr) return absl::OkStatus();
      one[0] = *d;
      batch = one;
    } else {
      if (d != nullptr) deferred.push_back(*d);
      batch = deferred;
    }
    absl::Status status;
    const absl::Time deadline = absl::Now() + kRingWait;
    while (!batch.empty()) {
      absl::StatusOr<size_t> pushed = submissions.TryPushBatch(batch);
      if (!pushed.ok()) {
        status = absl::UnavailableError(pushed.status().message());
        break;
      }
      batch.remove_prefix(*pushed);
      if (batch.empty()) break;
      absl::StatusOr<bool> space = submissions.WaitForSpace(deadline);
      if (!space.ok()) {
        status = absl::UnavailableError(space.status().message());
        break;
      }
      if (!*space) {
        status = absl::UnavailableError(
            absl::StrCat("the submission ring stayed full for ", absl::FormatDuration(kRingWait)));
        break;
      }
    }
    // Releases that could not go are lost with the session (a broken ring ends it).
    deferred.clear();
    deferred_since_ns.store(0, std::memory_order_relaxed);
    return status;
  }

  // Tells the daemon it may reuse the rx block at `rx_offset` of `bytes` (no-op once
  // closed). On a thread that defers releases (defer_releases_of) a small block's release
  // waits for the next push instead of ringing the daemon now.
  // `device_pool`: 0 for an rx block, 1 + d for a block of the receive pool on cuda:d.
  void SendRelease(uint64_t rx_offset, uint64_t bytes, uint64_t device_pool = 0) {
    shm::Descriptor d{};
    d.op = static_cast<uint8_t>(shm::Op::kRelease);
    d.call_id = 1;
    d.payload_offset = rx_offset;
    d.device_pool = device_pool;
    absl::MutexLock lock(&mu);
    if (!open) return;
    if (defer_releases_of == this && bytes <= kDeferredReleaseMaxBytes &&
        deferred.size() < kMaxDeferredReleases) {
      if (deferred.empty()) {
        deferred_since_ns.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
      }
      deferred.push_back(d);
      ++releases_deferred;
      return;
    }
    (void)Push(&d);  // a ring that broke ends the session anyway
  }

  // Pushes the deferred releases when the oldest has waited `at_least` (the reader).
  void FlushReleases(absl::Duration at_least) {
    const int64_t since = deferred_since_ns.load(std::memory_order_relaxed);
    if (since == 0 || absl::GetCurrentTimeNanos() - since < absl::ToInt64Nanoseconds(at_least)) {
      return;
    }
    absl::MutexLock lock(&mu);
    if (open && !deferred.empty()) {
      ++release_flushes;
      (void)Push(nullptr);
    }
  }
  // When the oldest deferred release was deferred (GetCurrentTimeNanos), 0 when none waits.
  int64_t DeferredSince() const { return deferred_since_ns.load(std::memory_order_relaxed); }

  // The daemon is done with the message block at `tx_offset`: free it and unpin the arena
  // blocks its tensor table pointed at.
  void OnReleased(uint64_t tx_offset) {
    std::vector<std::shared_ptr<ArenaBlock>> unpinned;  // freed after the lock (they lock it)
    std::vector<std::shared_ptr<void>> returned;  // the daemon is done with them (they lock mu)
    absl::MutexLock lock(&mu);
    (void)tx.Free(tx_offset);  // a release naming no live block is the daemon's bug: ignored
    auto it = pinned.find(tx_offset);
    if (it != pinned.end()) {
      unpinned = std::move(it->second);
      pinned.erase(it);
    }
    auto lease = leases.find(tx_offset);
    if (lease != leases.end()) {
      returned = std::move(lease->second);
      leases.erase(lease);
    }
  }

  void FreeBlock(uint64_t tx_offset) {
    absl::MutexLock lock(&mu);
    (void)tx.Free(tx_offset);
  }

  // The session is over: no more releases; pinned blocks go.
  void Close() {
    // Both go after the lock: their destructors take it.
    std::map<uint64_t, std::vector<std::shared_ptr<ArenaBlock>>> unpinned;
    std::map<uint64_t, std::vector<std::shared_ptr<void>>> unleased;
    absl::MutexLock lock(&mu);
    open = false;
    unpinned.swap(pinned);
    unleased.swap(leases);
  }

 private:
  const std::shared_ptr<const shm::Segment> segment_;

 public:
  absl::Mutex mu;
  shm::HeapAllocator tx ABSL_GUARDED_BY(mu);
  shm::RingProducer submissions ABSL_GUARDED_BY(mu);
  bool open ABSL_GUARDED_BY(mu) = true;
  // Releases waiting to go with the next descriptor pushed (Push).
  std::vector<shm::Descriptor> deferred ABSL_GUARDED_BY(mu);
  std::atomic<int64_t> deferred_since_ns{0};
  // Message block → the arena blocks its tensor table points at. Never destroy an entry's
  // blocks under `mu` (ArenaBlock's destructor takes it).
  std::map<uint64_t, std::vector<std::shared_ptr<ArenaBlock>>> pinned ABSL_GUARDED_BY(mu);
  // Message block → what keeps the pool blocks of received CUDA tensors it passes on, until
  // the daemon released it (its copies done).
  std::map<uint64_t, std::vector<std::shared_ptr<void>>> leases ABSL_GUARDED_BY(mu);
  // Receive pools lent to the daemon, by device. Written under the engine's pool_mu_ only
  // before the daemon accepted them (so before any view points into them); read by the reader.
  std::map<int, DevicePool> pools ABSL_GUARDED_BY(mu);

  std::atomic<uint64_t> bytes_copied_in{0};
  std::atomic<uint64_t> tensors_copied_in{0};
  std::atomic<uint64_t> tensors_in_place{0};
  std::atomic<uint64_t> bytes_copied_out{0};
  std::atomic<uint64_t> rx_blocks_held{0};
  std::atomic<uint64_t> releases_deferred{0};
  std::atomic<uint64_t> release_flushes{0};
  std::atomic<uint64_t> cuda_tensors_sent{0};
  std::atomic<uint64_t> cuda_tensors_received{0};
  std::atomic<uint64_t> cuda_pool_blocks_held{0};
  std::atomic<uint64_t> tensors_received_shared{0};
  std::atomic<uint64_t> store_calls{0};
};

struct ArenaBlock {
  ArenaBlock(std::shared_ptr<Link> link, uint64_t offset) : link(std::move(link)), offset(offset) {}
  ~ArenaBlock() { link->FreeBlock(offset); }
  const std::shared_ptr<Link> link;
  const uint64_t offset;
  std::atomic<int> messages{0};  // sent messages pinning it, not yet released (Tensor::in_flight)
};

// A message's hold on `block`, counted in block->messages while it lives.
std::shared_ptr<ArenaBlock> Pin(std::shared_ptr<ArenaBlock> block) {
  ++block->messages;
  ArenaBlock* const raw = block.get();
  return std::shared_ptr<ArenaBlock>(raw, [held = std::move(block)](ArenaBlock* b) mutable {
    --b->messages;
    held.reset();
  });
}

struct RxBlock {
  RxBlock(std::shared_ptr<Link> link, uint64_t offset, uint64_t bytes)
      : link(std::move(link)), offset(offset), bytes(bytes) {
    ++this->link->rx_blocks_held;
  }
  ~RxBlock() {
    link->SendRelease(offset, bytes);
    --link->rx_blocks_held;
  }
  const std::shared_ptr<Link> link;
  const uint64_t offset;
  // At least the message's payload and tensor table, plus the bytes of tensors it holds in a
  // sender's memory (the release gives those back to the sender, so size it by them).
  uint64_t bytes;
};

// What a tensor received in a sender's memory holds: its message's rx block (whose release
// gives the sender's block back) and the mapping of the sender's segment.
struct PeerView {
  std::shared_ptr<RxBlock> block;
  std::shared_ptr<const PeerSegment> peer;
};

// A block of a receive pool a received CUDA tensor lies in; released when its views go.
struct PoolBlock {
  PoolBlock(std::shared_ptr<Link> link, int device, uint64_t offset, uint64_t bytes)
      : link(std::move(link)), device(device), offset(offset), bytes(bytes) {
    ++this->link->cuda_pool_blocks_held;
  }
  ~PoolBlock() {
    // Never deferred by size alone: a pool holds a few large tensors, and the next call may
    // need this block at once.
    link->SendRelease(offset, std::max<uint64_t>(bytes, kDeferredReleaseMaxBytes + 1),
                      static_cast<uint64_t>(device) + 1);
    --link->cuda_pool_blocks_held;
  }
  const std::shared_ptr<Link> link;
  const int device;
  const uint64_t offset;
  const uint64_t bytes;
};

struct CallState {
  absl::Mutex mu;
  absl::CondVar cv;
  bool done ABSL_GUARDED_BY(mu) = false;
  // `done`, readable without the lock: a waiting caller spins on it before it sleeps on cv.
  std::atomic<bool> ready{false};
  // For Cancel: the engine's half of the segment (gone with the engine) and the call's id on
  // this client's ring; 0 for a future that was never sent.
  std::weak_ptr<Link> link;
  uint64_t call_id = 0;
  // It sends CUDA bytes the daemon copies between devices: its wait is learnt apart
  // (cuda_caller_spin), since it runs as long as the copy.
  bool copies = false;
  bool cancel_sent ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<Message> result ABSL_GUARDED_BY(mu) = absl::UnknownError("no result yet");
  std::vector<CallCallback> callbacks ABSL_GUARDED_BY(mu);

  // REQUIRES: done (the result never changes after that).
  const absl::StatusOr<Message>& Result() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return result; }
};

struct PendingReply {
  PendingReply(std::weak_ptr<CallEngine> engine, uint64_t call_id, std::string worker,
               std::string method)
      : engine(std::move(engine)),
        call_id(call_id),
        worker(std::move(worker)),
        method(std::move(method)) {}
  // The last Responder went without an answer: the caller hears so now, not at its deadline.
  ~PendingReply() {
    if (answered.exchange(true)) return;
    std::shared_ptr<CallEngine> live = engine.lock();
    if (live == nullptr) return;
    (void)live->Answer(
        call_id, worker, method, /*from_handler=*/false,
        absl::InternalError(absl::StrCat("the handler of worker '", worker, "' method '", method,
                                         "' dropped the call without answering it")));
    ReleaseCallEngine(std::move(live));
  }

  const std::weak_ptr<CallEngine> engine;
  const uint64_t call_id;
  const std::string worker;
  const std::string method;
  std::atomic<bool> answered{false};
};

}  // namespace calls_internal

using calls_internal::ArenaBlock;
using calls_internal::CallState;
using calls_internal::CudaExporter;
using calls_internal::DevicePool;
using calls_internal::Link;
using calls_internal::PeerView;
using calls_internal::PendingReply;
using calls_internal::PoolBlock;
using calls_internal::RxBlock;

// --- Device, Tensor ---

std::string Device::ToString() const {
  switch (type) {
    case shm::DeviceType::kCpu:
      return "cpu";
    case shm::DeviceType::kCuda:
      return absl::StrCat("cuda:", index);
  }
  return absl::StrCat("device-type-", static_cast<int>(type));
}

Tensor::Tensor(shm::DType dtype, std::vector<int64_t> shape, std::string bytes)
    : dtype_(dtype), shape_(std::move(shape)) {
  auto owned = std::make_shared<std::string>(std::move(bytes));
  data_ = owned->data();
  size_ = owned->size();
  keep_ = std::move(owned);
}

Tensor Tensor::Borrow(shm::DType dtype, std::vector<int64_t> shape, const void* data, size_t size) {
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.shape_ = std::move(shape);
  tensor.storage_ = TensorStorage::kBorrowed;
  tensor.data_ = const_cast<char*>(static_cast<const char*>(data));  // never written
  tensor.size_ = size;
  return tensor;
}

Tensor Tensor::Cuda(shm::DType dtype, std::vector<int64_t> shape, uint64_t device_pointer,
                    int device, void* stream, std::shared_ptr<void> keep) {
  Tensor tensor;
  tensor.keep_ = std::move(keep);
  tensor.dtype_ = dtype;
  tensor.shape_ = std::move(shape);
  tensor.storage_ = TensorStorage::kBorrowed;
  tensor.device_ = Device{shm::DeviceType::kCuda, device};
  tensor.data_ = reinterpret_cast<char*>(device_pointer);
  tensor.stream_ = stream;
  const uint64_t item = shm::ItemBytes(static_cast<uint8_t>(dtype));
  uint64_t bytes = item;
  for (int64_t dim : tensor.shape_) bytes *= dim < 0 ? 0 : static_cast<uint64_t>(dim);
  tensor.size_ = bytes;  // Submit checks the shape and dtype again, with overflow
  return tensor;
}

Tensor Tensor::Clone() const {
  if (is_cuda()) return *this;
  Tensor copy(dtype_, shape_, std::string(data()));
  copy.device_ = device_;
  return copy;
}

bool Tensor::in_flight() const { return arena_ != nullptr && arena_->messages.load() > 0; }

absl::StatusOr<Tensor> Tensor::Reshaped(shm::DType dtype, std::vector<int64_t> shape) const {
  absl::StatusOr<uint64_t> bytes = ShapeBytes(dtype, shape, "reshaped tensor");
  if (!bytes.ok()) return bytes.status();
  if (*bytes != size_) {
    return absl::InvalidArgumentError(absl::StrCat("reshaped tensor: its dtype and shape make ",
                                                   *bytes, " bytes, the tensor has ", size_));
  }
  Tensor same = *this;
  same.dtype_ = dtype;
  same.shape_ = std::move(shape);
  return same;
}

// --- CallFuture ---

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

namespace {

// Spins for the caller's adaptive window (at most `limit_ns`) on the result of `state`
// before the caller sleeps on its condition variable; learns how long the wait took.
// Returns true when the result is there.
bool SpinOnResult(const CallState& state, int64_t start, int64_t limit_ns) {
  shm::SpinWindow& spin = state.copies ? cuda_caller_spin : caller_spin;
  const bool ready = Spin([&state] { return state.ready.load(std::memory_order_acquire); }, start,
                          std::min(limit_ns, spin.window_ns()), spin.pause_ns());
  if (ready) spin.Learn(absl::GetCurrentTimeNanos() - start);
  return ready;
}

}  // namespace

const absl::StatusOr<Message>& CallFuture::Wait() const {
  if (!state_->ready.load(std::memory_order_acquire)) {
    const int64_t start = absl::GetCurrentTimeNanos();
    if (!SpinOnResult(*state_, start, INT64_MAX)) {
      absl::MutexLock lock(&state_->mu);
      while (!state_->done) state_->cv.Wait(&state_->mu);
      (state_->copies ? cuda_caller_spin : caller_spin).Learn(absl::GetCurrentTimeNanos() - start);
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
  absl::MutexLock lock(&link->mu);
  // The daemon answers CANCELLED (or the reply got there first); a ring that broke answers
  // the call UNAVAILABLE.
  if (link->open) (void)link->Push(&d);
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

// --- Responder ---

absl::Status Responder::Reply(absl::StatusOr<Message> reply) const {
  if (state_ == nullptr) {
    return absl::FailedPreconditionError("Reply on a Responder that holds no call");
  }
  const PendingReply& call = *state_;
  if (state_->answered.exchange(true)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the call to worker '", call.worker, "' method '", call.method, "' was answered already"));
  }
  std::shared_ptr<CallEngine> engine = call.engine.lock();
  if (engine == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the call to worker '", call.worker, "' method '", call.method,
        "' cannot be answered: the client's shared memory was detached (the daemon answered "
        "its caller)"));
  }
  absl::Status sent = engine->Answer(call.call_id, call.worker, call.method, /*from_handler=*/true,
                                     std::move(reply));
  ReleaseCallEngine(std::move(engine));
  return sent;
}

// --- CallEngine ---

CallEngine::CallEngine(std::shared_ptr<const shm::Segment> segment, int handler_threads,
                       int notice_fd)
    : link_(std::make_shared<Link>(segment)),
      peers_(notice_fd),
      completions_(segment->base(), segment->layout().completion, "completion ring", kSpin),
      copy_reply_spin_(shm::kCopySpin),
      pool_spin_(kSpin) {
  extra_thread_ = std::thread([this] { ThreadLoop(); });
  absl::MutexLock lock(&mu_);
  EnsureThreadsLocked(handler_threads);
}

CallEngine::~CallEngine() {
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

DeferredHandler AnswerOnReturn(Handler handler) {
  return [handler = std::move(handler)](Message request, Responder responder) {
    absl::StatusOr<Message> reply = handler(request);
    request = Message{};                      // its rx blocks' releases ride on the reply
    (void)responder.Reply(std::move(reply));  // a failure went to the caller instead
  };
}

void CallEngine::Handle(const std::string& method, Handler handler) {
  HandleDeferred(method, AnswerOnReturn(std::move(handler)));
}

void CallEngine::HandleDeferred(const std::string& method, DeferredHandler handler) {
  absl::MutexLock lock(&mu_);
  handlers_[method] = std::move(handler);
}

void CallEngine::EnsureHandlerThreads(int threads) {
  absl::MutexLock lock(&mu_);
  EnsureThreadsLocked(threads);
}

void CallEngine::EnsureThreadsLocked(int threads) {
  while (!pool_exit_ && static_cast<int>(pool_.size()) < threads) {
    pool_.emplace_back([this] { ThreadLoop(); });
  }
}

absl::StatusOr<Tensor> CallEngine::AllocateTensor(shm::DType dtype, std::vector<int64_t> shape) {
  absl::StatusOr<uint64_t> bytes = ShapeBytes(dtype, shape, "arena tensor");
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<uint64_t> block;
  {
    absl::MutexLock lock(&link_->mu);
    if (!link_->open) {
      return absl::UnavailableError("the call engine's shared memory is detached");
    }
    block = link_->tx.Allocate(std::max<uint64_t>(*bytes, 1));
    if (!block.ok()) {
      return absl::ResourceExhaustedError(ArenaFull(link_->tx, *bytes, "a tensor"));
    }
  }
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.shape_ = std::move(shape);
  tensor.storage_ = TensorStorage::kArena;
  tensor.arena_ = std::make_shared<ArenaBlock>(link_, *block);
  tensor.keep_ = tensor.arena_;
  tensor.data_ = reinterpret_cast<char*>(link_->base() + *block);
  tensor.size_ = *bytes;
  return tensor;
}

void CallEngine::Complete(const std::shared_ptr<CallState>& state, absl::StatusOr<Message> result) {
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

void CallEngine::WorkQueued() {
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

bool CallEngine::ReadingFree() const { return !reading_ && !stop_ && broken_.ok(); }

bool CallEngine::OwnTurnFree() const { return ReadingFree() && lent_waiting_ == 0; }

void CallEngine::PublishQueued() {
  queued_.store(callbacks_.size() + incoming_.size() + (OwnTurnFree() ? 1 : 0),
                std::memory_order_release);
  reading_free_.store(ReadingFree(), std::memory_order_release);
}

void CallEngine::EnableLentReaders(std::function<void()> waker) {
  absl::MutexLock lock(&mu_);
  if (!lent_waker_) lent_waker_ = std::move(waker);
}

bool CallEngine::LentReaderWaits(int delta) {
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

bool CallEngine::SpinForTurn(absl::Time until, absl::FunctionRef<bool()> interrupted) {
  {
    absl::MutexLock lock(&mu_);
    if (ReadingFree()) return true;
    ++lent_spinners_;
  }
  const int64_t start = absl::GetCurrentTimeNanos();
  Spin([&] { return reading_free_.load(std::memory_order_acquire) || interrupted(); }, start,
       absl::ToUnixNanos(until) - start, absl::ToInt64Nanoseconds(kSpin.pause_spin));
  absl::MutexLock lock(&mu_);
  --lent_spinners_;
  return ReadingFree();
}

bool CallEngine::ReadAsLent(absl::Time deadline, absl::FunctionRef<bool()> interrupted) {
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

void CallEngine::Finish(uint64_t id, absl::StatusOr<Message> result) {
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

void CallEngine::Expire() {
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

CallFuture CallEngine::CallAsync(const std::string& group, const std::string& from,
                                 const std::string& worker, const std::string& method,
                                 std::string_view payload, absl::Span<const Tensor> tensors,
                                 absl::Duration timeout, uint16_t flags) {
  return Start(shm::Op::kCall, group, from, worker, method, payload, tensors, timeout, flags);
}

absl::StatusOr<std::string> CallEngine::StoreCall(const std::string& group,
                                                  const std::string& method,
                                                  std::string_view request,
                                                  absl::Duration timeout) {
  ++link_->store_calls;
  CallFuture future = Start(shm::Op::kStore, group, "", "", method, request, {}, timeout);
  future.Wait();
  absl::MutexLock lock(&future.state_->mu);
  if (!future.state_->result.ok()) return future.state_->result.status();
  return std::move(future.state_->result->payload);
}

CallFuture CallEngine::Start(shm::Op op, const std::string& group, const std::string& from,
                             const std::string& worker, const std::string& method,
                             std::string_view payload, absl::Span<const Tensor> tensors,
                             absl::Duration timeout, uint16_t flags) {
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
  absl::Status submitted =
      Submit(op, id, deadline_ns, flags, 0, {group, worker, method, from}, payload, tensors);
  if (!submitted.ok()) {
    absl::MutexLock lock(&mu_);
    Finish(id, Prefixed(submitted, CallName(group, worker, method), " was not sent: "));
  }
  return CallFuture(state);
}

absl::StatusOr<Message> CallEngine::Call(const std::string& group, const std::string& from,
                                         const std::string& worker, const std::string& method,
                                         std::string_view payload, absl::Span<const Tensor> tensors,
                                         absl::Duration timeout) {
  CallFuture future = CallAsync(group, from, worker, method, payload, tensors, timeout);
  future.Wait();
  // Nobody else reads this result: the engine is done with it once it is set.
  absl::MutexLock lock(&future.state_->mu);
  return std::move(future.state_->result);
}

absl::Status CallEngine::Submit(shm::Op op, uint64_t call_id, int64_t deadline_ns, uint16_t flags,
                                uint32_t code, const shm::MessageNames& names,
                                std::string_view payload, absl::Span<const Tensor> tensors) {
  for (const std::string& name : names) {
    if (name.size() > shm::kMaxMessageName) {
      return absl::InvalidArgumentError(absl::StrCat("group, worker and method names are at most ",
                                                     shm::kMaxMessageName, " bytes"));
    }
  }
  if (tensors.size() > shm::kMaxTensorsPerMessage) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", shm::kMaxTensorsPerMessage, " tensors per message"));
  }
  // What each tensor needs in the block: a CUDA tensor its export record, an arena tensor of
  // this segment nothing (it stays in place), any other its bytes.
  std::vector<uint64_t> slots(tensors.size(), 0);
  std::vector<bool> in_block(tensors.size(), false);
  std::vector<std::shared_ptr<ArenaBlock>> pins;  // declared before the locks: freed after
  uint64_t copied = payload.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i];
    const std::string what = absl::StrCat("tensor ", i);
    absl::StatusOr<uint64_t> bytes = ShapeBytes(tensor.dtype_, tensor.shape_, what);
    if (!bytes.ok()) return bytes.status();
    if (*bytes != tensor.size_) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": shape and dtype need ", *bytes, " bytes, data has ", tensor.size_));
    }
    if (tensor.is_cuda()) {
      if (tensor.device_.index < 0 ||
          tensor.device_.index >= static_cast<int>(shm::kMaxCudaDevices)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": device ", tensor.device_.ToString(), " does not exist"));
      }
      if (*bytes > 0) slots[i] = sizeof(shm::CudaExport);
      continue;
    }
    if (tensor.storage_ == TensorStorage::kArena && tensor.arena_ != nullptr &&
        tensor.arena_->link == link_) {
      if (*bytes > 0) pins.push_back(calls_internal::Pin(tensor.arena_));
      continue;
    }
    in_block[i] = true;
    slots[i] = *bytes;
    copied += *bytes;
  }
  const shm::BlockPlan plan = shm::PlanBlock(shm::MessagePrefixBytes(names), payload.size(), slots);
  const uint64_t total = plan.total;
  absl::StatusOr<uint64_t> block;
  {
    absl::MutexLock lock(&link_->mu);
    if (!link_->open) return absl::UnavailableError("the client's shared memory is detached");
    block = link_->tx.Allocate(total);
    if (!block.ok()) {
      return absl::ResourceExhaustedError(ArenaFull(link_->tx, total, "a message"));
    }
  }
  // The block is ours until pushed: fill it without the lock.
  uint8_t* const base = link_->base();
  uint8_t* out = base + *block;
  shm::WriteMessagePrefix(out, code, names);
  if (!payload.empty()) std::memcpy(out + plan.prefix, payload.data(), payload.size());
  uint64_t in_place = 0;
  uint64_t cuda_sent = 0;
  std::vector<std::shared_ptr<void>> leases;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i];
    shm::TensorEntry entry{};
    entry.dtype = static_cast<uint8_t>(tensor.dtype_);
    entry.ndim = static_cast<uint8_t>(tensor.shape_.size());
    for (size_t k = 0; k < tensor.shape_.size(); ++k) entry.shape[k] = tensor.shape_[k];
    entry.length = tensor.size_;
    if (tensor.is_cuda()) {
      entry.device_type = static_cast<uint8_t>(shm::DeviceType::kCuda);
      entry.device_index = static_cast<uint32_t>(tensor.device_.index);
      if (entry.length > 0) {
        absl::StatusOr<CudaExporter*> exporter = CudaExporter::Get();
        shm::CudaExport record;
        absl::StatusOr<uint64_t> offset =
            exporter.ok() ? (*exporter)->Export(tensor.device_pointer(), tensor.size_,
                                                tensor.device_.index, tensor.stream_, &record)
                          : exporter.status();
        if (!offset.ok()) {
          absl::MutexLock lock(&link_->mu);
          (void)link_->tx.Free(*block);
          return Prefixed(offset.status(), "tensor ", i, " (", tensor.device_.ToString(), "): ");
        }
        std::memcpy(out + plan.at[i], &record, sizeof(record));
        // A received tensor passed on: its pool block must not go back to the daemon (and be
        // reused) before the daemon has copied from it.
        if (tensor.keep_ != nullptr) leases.push_back(tensor.keep_);
        entry.offset = *offset;
        entry.device_handle = *block + plan.at[i];
        ++cuda_sent;
      }
      std::memcpy(out + plan.table + i * sizeof(entry), &entry, sizeof(entry));
      continue;
    }
    if (entry.length > 0) {
      if (in_block[i]) {
        entry.offset = *block + plan.at[i];
        std::memcpy(out + plan.at[i], tensor.data_, tensor.size_);
      } else {
        entry.offset = tensor.arena_->offset;
        ++in_place;
      }
    }
    std::memcpy(out + plan.table + i * sizeof(entry), &entry, sizeof(entry));
  }
  shm::Descriptor d = shm::MessageDescriptor(
      op, call_id, {*block, plan.payload, plan.table, static_cast<uint32_t>(tensors.size())}, flags,
      deadline_ns);
  absl::MutexLock lock(&link_->mu);
  // Pinned before the push: the release for this block can only come after it.
  if (!pins.empty()) link_->pinned[*block] = std::move(pins);
  if (!leases.empty()) link_->leases[*block] = std::move(leases);
  absl::Status pushed = link_->open
                            ? link_->Push(&d)
                            : absl::UnavailableError("the client's shared memory is detached");
  if (!pushed.ok()) {
    (void)link_->tx.Free(*block);
    auto it = link_->pinned.find(*block);
    if (it != link_->pinned.end()) {
      pins = std::move(it->second);  // freed after the lock, as declared before it
      link_->pinned.erase(it);
    }
    auto lease = link_->leases.find(*block);
    if (lease != link_->leases.end()) {
      leases = std::move(lease->second);  // returned after the lock (they take another)
      link_->leases.erase(lease);
    }
    return pushed;
  }
  link_->cuda_tensors_sent += cuda_sent;
  link_->bytes_copied_in += copied;
  link_->tensors_copied_in += tensors.size() - in_place;
  link_->tensors_in_place += in_place;
  return absl::OkStatus();
}

void CallEngine::ReplyError(uint64_t call_id, const absl::Status& status) {
  std::string message(status.message());
  if (message.size() > shm::kMaxMessageName) message.resize(shm::kMaxMessageName);
  const auto code =
      status.code() == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : status.code();
  // Nothing more to do when even this cannot go: the caller's deadline answers the call.
  (void)Submit(shm::Op::kReply, call_id, 0, shm::kFlagError, static_cast<uint32_t>(code),
               {"", "", message, ""}, "", {});
}

std::optional<CallEngine::Incoming> CallEngine::Read(const LentTurn* lent) {
  // Releases made while reading ride on the next push (the reply of the call kept, say).
  defer_releases_of = link_.get();
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
  defer_releases_of = nullptr;
  if (ended) link_->FlushReleases(absl::ZeroDuration());
  return kept;
}

void CallEngine::Break(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  BreakLocked(why);
}

void CallEngine::BreakLocked(const absl::Status& why) {
  if (broken_.ok()) broken_ = absl::UnavailableError(why.message());
  std::vector<uint64_t> ids;
  for (const auto& [id, call] : waiting_) ids.push_back(id);
  for (uint64_t id : ids) {
    const Outgoing& call = waiting_.at(id);
    Finish(id, absl::UnavailableError(absl::StrCat(
                   CallName(call.from.first, call.worker, call.method), ": ", broken_.message())));
  }
}

bool CallEngine::ReadUntilKept(absl::Span<shm::Descriptor> batch, std::optional<Incoming>* kept,
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

void CallEngine::OnCompletion(const shm::Descriptor& d, std::optional<Incoming>* keep) {
  const shm::Layout& layout = link_->layout();
  if (!shm::ValidateDescriptor(d, layout, shm::Direction::kCompletion).ok()) return;
  if (d.op == static_cast<uint8_t>(shm::Op::kRelease)) {
    link_->OnReleased(d.payload_offset);
    return;
  }
  if (d.op == static_cast<uint8_t>(shm::Op::kPeerGone)) {
    peers_.Forget(d.call_id);
    return;
  }
  if (d.op != static_cast<uint8_t>(shm::Op::kCall) &&
      d.op != static_cast<uint8_t>(shm::Op::kReply)) {
    return;
  }
  uint8_t* const base = link_->base();
  // Released when the last view of it goes: right after this function when no tensor
  // holds it.
  std::shared_ptr<RxBlock> block =
      d.payload_offset != 0
          ? std::make_shared<RxBlock>(
                link_, d.payload_offset,
                d.payload_length + uint64_t{d.tensor_count} * sizeof(shm::TensorEntry))
          : nullptr;
  absl::StatusOr<shm::ParsedMessage> parsed =
      shm::ParseMessage(base, d.payload_offset, d.payload_length);
  absl::StatusOr<std::vector<shm::TensorEntry>> entries =
      parsed.ok() ? shm::ReadTensorTable(d, base, layout, shm::Direction::kCompletion)
                  : parsed.status();
  absl::StatusOr<Message> message = absl::UnknownError("unset");
  const bool error = (d.flags & shm::kFlagError) != 0;
  std::vector<shm::CopySignal*> copies;  // of a message posted while the daemon copies
  if (!entries.ok()) {
    message = entries.status();
  } else if (!error) {
    Message in;
    absl::Status misplaced;
    in.payload.assign(reinterpret_cast<const char*>(base + parsed->body_offset),
                      parsed->body_length);
    link_->bytes_copied_out += parsed->body_length;
    for (const shm::TensorEntry& entry : *entries) {
      Tensor tensor;
      tensor.dtype_ = static_cast<shm::DType>(entry.dtype);
      tensor.shape_.assign(entry.shape, entry.shape + entry.ndim);
      tensor.storage_ = TensorStorage::kReceived;
      if (entry.device_type == static_cast<uint8_t>(shm::DeviceType::kCuda)) {
        const int device = static_cast<int>(entry.device_index);
        tensor.device_ = Device{shm::DeviceType::kCuda, device};
        if (entry.length == 0) {
          in.tensors.push_back(std::move(tensor));
          continue;
        }
        uint64_t pool_base = 0;
        uint64_t pool_bytes = 0;
        {
          absl::MutexLock lock(&link_->mu);
          auto pool = link_->pools.find(device);
          if (pool != link_->pools.end()) {
            pool_base = pool->second.base;
            pool_bytes = pool->second.bytes;
          }
        }
        // The daemon's block of our pool: released even when the message is refused.
        auto held = std::make_shared<PoolBlock>(link_, device, entry.offset, entry.length);
        if (pool_base == 0 || entry.offset > pool_bytes ||
            entry.length > pool_bytes - entry.offset) {
          misplaced = absl::InternalError(absl::StrCat(
              "the daemon placed a tensor outside this client's receive pool on cuda:", device));
          continue;  // the later entries' blocks are released too
        }
        if (entry.device_handle != 0) {
          auto* signal = reinterpret_cast<shm::CopySignal*>(base + entry.device_handle);
          if (std::find(copies.begin(), copies.end(), signal) == copies.end()) {
            copies.push_back(signal);
          }
        }
        tensor.keep_ = std::move(held);
        tensor.data_ = reinterpret_cast<char*>(pool_base + entry.offset);
        tensor.size_ = entry.length;
        ++link_->cuda_tensors_received;
        in.tensors.push_back(std::move(tensor));
        continue;
      }
      if (entry.length > 0 && entry.device_handle != 0) {
        // In the sender's tx heap, which this client maps as peer `device_handle`.
        absl::StatusOr<std::shared_ptr<const PeerSegment>> peer = peers_.Get(entry.device_handle);
        const char* at = peer.ok() ? (*peer)->Find(entry.offset, entry.length) : nullptr;
        if (at == nullptr) {
          misplaced = peer.ok() ? absl::InternalError(absl::StrCat(
                                      "the daemon placed a tensor outside the memory of peer "
                                      "session ",
                                      entry.device_handle))
                                : peer.status();
          continue;
        }
        block->bytes += entry.length;
        tensor.keep_ = std::make_shared<PeerView>(PeerView{block, *std::move(peer)});
        tensor.data_ = const_cast<char*>(at);
        tensor.size_ = entry.length;
        tensor.in_sender_memory_ = true;
        ++link_->tensors_received_shared;
      } else if (entry.length > 0) {
        tensor.keep_ = block;
        tensor.data_ = reinterpret_cast<char*>(base + entry.offset);
        tensor.size_ = entry.length;
      }
      in.tensors.push_back(std::move(tensor));
    }
    if (misplaced.ok()) {
      message = std::move(in);
    } else {
      message = misplaced;
    }
  }
  // `block` (when no tensor holds it) is released on the way out, after the caller or the
  // handler has its message: on this thread the release waits for the next push.
  if (d.op == static_cast<uint8_t>(shm::Op::kReply)) {
    if (error && d.payload_length == 0) {
      // The daemon answers even when this session's rx heap has no room for the message.
      message = absl::ResourceExhaustedError(absl::StrCat(
          "the daemon could not place the answer to this call: this session's receive heap "
          "(data.arena_bytes) was full; release received messages and tensors sooner"));
    } else if (entries.ok() && error) {
      const auto code = static_cast<absl::StatusCode>(parsed->code);
      message = absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
                             parsed->names[2]);
    } else if (message.ok() && !copies.empty()) {
      // The daemon posts replies once their copies completed: this returns at once.
      if (absl::Status copied = AwaitCopies(copies, absl::InfiniteFuture()); !copied.ok()) {
        message = copied;
      }
    }
    absl::MutexLock lock(&mu_);
    Finish(d.call_id, std::move(message));  // a call given up on already: ignored
    return;
  }
  if (!message.ok()) return;  // a malformed call: the caller's deadline answers it
  message->caller = parsed->names[3];
  Incoming incoming;
  incoming.call_id = d.call_id;
  incoming.to = {parsed->names[0], parsed->names[1]};
  incoming.method = parsed->names[2];
  if (d.deadline_unix_ns != 0) incoming.deadline = absl::FromUnixNanos(d.deadline_unix_ns);
  incoming.request = *std::move(message);
  if (!copies.empty()) {
    incoming.copies = std::move(copies);
    incoming.copies_block = block;
  }
  bool refused;
  {
    absl::MutexLock lock(&mu_);
    refused = stop_ || leaving_.count(incoming.to) > 0;
    if (!refused) {
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

void CallEngine::ThreadLoop() {
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

void CallEngine::Serve(Incoming incoming) {
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
  defer_releases_of = link_.get();
  handler(std::move(incoming.request), Responder(std::move(pending)));
  defer_releases_of = nullptr;
  link_->FlushReleases(absl::ZeroDuration());  // when nothing above was pushed
}

absl::Status CallEngine::AwaitCopies(absl::Span<shm::CopySignal* const> signals,
                                     absl::Time deadline) {
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

absl::Status CallEngine::Answer(uint64_t id, const std::string& worker, const std::string& method,
                                bool from_handler, absl::StatusOr<Message> reply) {
  absl::Status sent;
  if (reply.ok()) {
    sent = Submit(shm::Op::kReply, id, 0, 0, 0, {}, reply->payload, reply->tensors);
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
  if (defer_releases_of != link_.get()) link_->FlushReleases(absl::ZeroDuration());
  reply = Message{};
  absl::MutexLock lock(&mu_);
  --handlers_running_;
  serving_.erase(id);
  idle_cv_.SignalAll();
  return sent;
}

void CallEngine::BeginLeave(const std::string& group, const std::string& worker) {
  absl::MutexLock lock(&mu_);
  leaving_.insert({group, worker});
}

void CallEngine::Rejoined(const std::string& group, const std::string& worker) {
  absl::MutexLock lock(&mu_);
  leaving_.erase({group, worker});
}

int CallEngine::DrainLeave(const std::string& group, const std::string& worker,
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

bool CallEngine::OnOwnThread() const { return own_engine == this; }

void ReleaseCallEngine(std::shared_ptr<CallEngine> engine) {
  if (engine == nullptr || engine.use_count() > 1 || !engine->OnOwnThread()) return;
  // Its destructor joins this very thread, which goes back to its loop and exits once the
  // destructor has told the pool to.
  std::thread([engine = std::move(engine)]() mutable { engine.reset(); }).detach();
}

absl::Status CallEngine::LendDevicePool(int device, uint64_t bytes) {
  const std::string what = absl::StrCat("receive pool of ", bytes, " bytes on cuda:", device);
  absl::MutexLock lend(&lend_mu_);
  {
    absl::MutexLock lock(&link_->mu);
    if (link_->pools.count(device) > 0) return absl::OkStatus();
  }
  absl::StatusOr<CudaExporter*> exporter = CudaExporter::Get();
  absl::StatusOr<DevicePool> pool =
      exporter.ok() ? (*exporter)->AllocatePool(device, bytes) : exporter.status();
  if (!pool.ok()) {
    return Prefixed(pool.status(), what, ": ");
  }
  {
    // Known before the daemon can place anything in it.
    absl::MutexLock lock(&link_->mu);
    link_->pools[device] = *pool;
  }
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
  absl::Status sent;
  {
    absl::MutexLock lock(&link_->mu);
    absl::StatusOr<uint64_t> block =
        link_->open ? link_->tx.Allocate(sizeof(pool->record))
                    : absl::UnavailableError("the client's shared memory is detached");
    if (block.ok()) {
      std::memcpy(link_->base() + *block, &pool->record, sizeof(pool->record));
      shm::Descriptor d{};
      d.op = static_cast<uint8_t>(shm::Op::kDevicePool);
      d.call_id = id;
      d.payload_offset = *block;
      d.payload_length = sizeof(pool->record);
      sent = link_->Push(&d);
      if (!sent.ok()) (void)link_->tx.Free(*block);
    } else {
      sent = block.status();
    }
  }
  if (!sent.ok()) {
    absl::MutexLock lock(&mu_);
    Finish(id, sent);
  }
  CallFuture future(state);
  absl::Status lent = future.Wait().status();
  if (lent.ok()) return absl::OkStatus();
  // Freed only when the daemon refused it; unanswered (the ring, a timeout), the daemon may
  // still take it, so it stays lent for the engine's life.
  const bool refused = lent.code() == absl::StatusCode::kInvalidArgument ||
                       lent.code() == absl::StatusCode::kFailedPrecondition ||
                       lent.code() == absl::StatusCode::kAlreadyExists ||
                       lent.code() == absl::StatusCode::kUnimplemented;
  if (refused) {
    {
      absl::MutexLock lock(&link_->mu);
      link_->pools.erase(device);
    }
    (*exporter)->FreePool(*pool);
  }
  return Prefixed(lent, what, ": ");
}

CallEngineStats CallEngine::Stats() {
  CallEngineStats stats;
  {
    absl::MutexLock lock(&link_->mu);
    const shm::HeapAllocator::Stats tx = link_->tx.GetStats();
    stats.arena_bytes = tx.heap_bytes;
    stats.arena_used_bytes = tx.used_bytes;
    stats.arena_live_blocks = tx.live_blocks;
    stats.daemon_wakeups = link_->submissions.wakeups();
  }
  stats.reader_sleeps = completions_.sleeps();
  stats.bytes_copied_in = link_->bytes_copied_in;
  stats.tensors_copied_in = link_->tensors_copied_in;
  stats.tensors_in_place = link_->tensors_in_place;
  stats.bytes_copied_out = link_->bytes_copied_out;
  stats.rx_blocks_held = link_->rx_blocks_held;
  stats.releases_deferred = link_->releases_deferred;
  stats.release_flushes = link_->release_flushes;
  stats.cuda_tensors_sent = link_->cuda_tensors_sent;
  stats.cuda_tensors_received = link_->cuda_tensors_received;
  stats.cuda_pool_blocks_held = link_->cuda_pool_blocks_held;
  stats.tensors_received_shared = link_->tensors_received_shared;
  stats.peer_segments_mapped = peers_.size();
  stats.store_calls = link_->store_calls;
  absl::MutexLock lock(&mu_);
  stats.handler_threads = static_cast<int>(pool_.size());
  stats.handlers_running = handlers_running_;
  stats.workers_leaving = static_cast<int>(leaving_.size());
  stats.handoffs_to_spinner = handoffs_to_spinner_;
  stats.handoffs_woken = handoffs_woken_;
  stats.calls_run_by_reader = calls_kept_;
  return stats;
}

}  // namespace tpd
