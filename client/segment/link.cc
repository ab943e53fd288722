#include "client/segment/link.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tpd::calls_internal {
namespace {

// Set while this thread's releases of that link's rx blocks may wait for the next push: on
// the engine's reader, and in a handler between dropping its request and sending its reply.
thread_local const Link* defer_releases_of = nullptr;

std::string ArenaFull(const shm::HeapAllocator::Stats& stats, uint64_t request,
                      absl::string_view what) {
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

}  // namespace

Link::Link(std::shared_ptr<const shm::Segment> segment)
    : segment_(std::move(segment)),
      tx_("tx heap", segment_->layout().tx_heap),
      submissions_(segment_->base(), segment_->layout().submission, "submission ring") {}

Link::~Link() {
  if (pools_.empty()) return;
  absl::StatusOr<CudaExporter*> exporter = CudaExporter::Get();
  if (!exporter.ok()) return;
  for (const auto& [device, pool] : pools_) (*exporter)->FreePool(pool);
}

absl::StatusOr<uint64_t> Link::Allocate(uint64_t bytes, absl::string_view what) {
  absl::MutexLock lock(&mu_);
  if (!open_) return absl::UnavailableError("the client's shared memory is detached");
  absl::StatusOr<uint64_t> block = tx_.Allocate(bytes);
  if (!block.ok()) {
    return absl::ResourceExhaustedError(ArenaFull(tx_.GetStats(), bytes, what));
  }
  return block;
}

void Link::FreeBlock(uint64_t tx_offset) {
  absl::MutexLock lock(&mu_);
  (void)tx_.Free(tx_offset);
}

absl::Status Link::PushMessage(const shm::Descriptor& d, uint64_t block,
                               std::vector<std::shared_ptr<ArenaBlock>> pins,
                               std::vector<std::shared_ptr<void>> leases) {
  absl::MutexLock lock(&mu_);
  if (!open_) {
    (void)tx_.Free(block);
    return absl::UnavailableError("the client's shared memory is detached");
  }
  // Held before the push: the release for this block can only come after it.
  if (!pins.empty()) pinned_[block] = std::move(pins);
  if (!leases.empty()) leases_[block] = std::move(leases);
  absl::Status pushed = PushLocked(&d);
  if (!pushed.ok()) FreeBlockLocked(block, &pins, &leases);  // dropped with the arguments
  return pushed;
}

void Link::FreeBlockLocked(uint64_t block, std::vector<std::shared_ptr<ArenaBlock>>* pins,
                           std::vector<std::shared_ptr<void>>* leases) {
  (void)tx_.Free(block);
  auto it = pinned_.find(block);
  if (it != pinned_.end()) {
    *pins = std::move(it->second);
    pinned_.erase(it);
  }
  auto lease = leases_.find(block);
  if (lease != leases_.end()) {
    *leases = std::move(lease->second);
    leases_.erase(lease);
  }
}

absl::Status Link::Push(const shm::Descriptor& d) {
  absl::MutexLock lock(&mu_);
  if (!open_) return absl::UnavailableError("the client's shared memory is detached");
  return PushLocked(&d);
}

absl::Status Link::PushLocked(const shm::Descriptor* d) {
  shm::Descriptor one[1];
  absl::Span<const shm::Descriptor> batch;
  if (deferred_.empty()) {
    if (d == nullptr) return absl::OkStatus();
    one[0] = *d;
    batch = one;
  } else {
    if (d != nullptr) deferred_.push_back(*d);
    batch = deferred_;
  }
  absl::Status status;
  const absl::Time deadline = absl::Now() + kRingWait;
  while (!batch.empty()) {
    absl::StatusOr<size_t> pushed = submissions_.TryPushBatch(batch);
    if (!pushed.ok()) {
      status = absl::UnavailableError(pushed.status().message());
      break;
    }
    batch.remove_prefix(*pushed);
    if (batch.empty()) break;
    absl::StatusOr<bool> space = submissions_.WaitForSpace(deadline);
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
  deferred_.clear();
  deferred_since_ns_.store(0, std::memory_order_relaxed);
  return status;
}

void Link::SendRelease(uint64_t rx_offset, uint64_t bytes, uint64_t device_pool) {
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(shm::Op::kRelease);
  d.call_id = 1;
  d.payload_offset = rx_offset;
  d.device_pool = device_pool;
  absl::MutexLock lock(&mu_);
  if (!open_) return;
  if (DefersOnThisThread() && bytes <= kDeferredReleaseMaxBytes &&
      deferred_.size() < kMaxDeferredReleases) {
    if (deferred_.empty()) {
      deferred_since_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
    }
    deferred_.push_back(d);
    ++counters.releases_deferred;
    return;
  }
  (void)PushLocked(&d);  // a ring that broke ends the session anyway
}

void Link::FlushReleases(absl::Duration at_least) {
  const int64_t since = deferred_since_ns_.load(std::memory_order_relaxed);
  if (since == 0 || absl::GetCurrentTimeNanos() - since < absl::ToInt64Nanoseconds(at_least)) {
    return;
  }
  absl::MutexLock lock(&mu_);
  if (open_ && !deferred_.empty()) {
    ++counters.release_flushes;
    (void)PushLocked(nullptr);
  }
}

void Link::DeferReleasesOnThisThread(const Link* link) { defer_releases_of = link; }

bool Link::DefersOnThisThread() const { return defer_releases_of == this; }

void Link::OnReleased(uint64_t tx_offset) {
  std::vector<std::shared_ptr<ArenaBlock>> unpinned;  // dropped after the lock (they take it)
  std::vector<std::shared_ptr<void>> returned;        // the daemon is done with them
  absl::MutexLock lock(&mu_);
  FreeBlockLocked(tx_offset, &unpinned, &returned);
}

void Link::Close() {
  // Both go after the lock: their destructors take it.
  std::map<uint64_t, std::vector<std::shared_ptr<ArenaBlock>>> unpinned;
  std::map<uint64_t, std::vector<std::shared_ptr<void>>> unleased;
  absl::MutexLock lock(&mu_);
  open_ = false;
  unpinned.swap(pinned_);
  unleased.swap(leases_);
}

std::optional<DevicePool> Link::Pool(int device) const {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(device);
  if (it == pools_.end()) return std::nullopt;
  return it->second;
}

void Link::SetPool(int device, const DevicePool& pool) {
  absl::MutexLock lock(&mu_);
  pools_[device] = pool;
}

void Link::ErasePool(int device) {
  absl::MutexLock lock(&mu_);
  pools_.erase(device);
}

shm::HeapAllocator::Stats Link::ArenaStats() const {
  absl::MutexLock lock(&mu_);
  return tx_.GetStats();
}

uint64_t Link::DaemonWakeups() const {
  absl::MutexLock lock(&mu_);
  return submissions_.wakeups();
}

std::shared_ptr<ArenaBlock> Pin(std::shared_ptr<ArenaBlock> block) {
  ++block->messages;
  ArenaBlock* const raw = block.get();
  return std::shared_ptr<ArenaBlock>(raw, [held = std::move(block)](ArenaBlock* b) mutable {
    --b->messages;
    held.reset();
  });
}

RxBlock::RxBlock(std::shared_ptr<Link> link, uint64_t offset, uint64_t bytes)
    : link(std::move(link)), offset(offset), bytes(bytes) {
  ++this->link->counters.rx_blocks_held;
}

RxBlock::~RxBlock() {
  link->SendRelease(offset, bytes);
  --link->counters.rx_blocks_held;
}

PoolBlock::PoolBlock(std::shared_ptr<Link> link, int device, uint64_t offset, uint64_t bytes)
    : link(std::move(link)), device(device), offset(offset), bytes(bytes) {
  ++this->link->counters.cuda_pool_blocks_held;
}

PoolBlock::~PoolBlock() {
  // Never deferred by size alone: a pool holds a few large tensors, and the next call may
  // need this block at once.
  link->SendRelease(offset, std::max<uint64_t>(bytes, kDeferredReleaseMaxBytes + 1),
                    static_cast<uint64_t>(device) + 1);
  --link->counters.cuda_pool_blocks_held;
}

}  // namespace tpd::calls_internal
