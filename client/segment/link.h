// The client's half of its session's segment: the tx heap it allocates messages and arena
// tensors in, the submission ring it pushes to, and the holds that give blocks back: arena
// blocks (freed when their last tensor and message go), received blocks of the rx heap and of
// the receive pools on CUDA devices (released to the daemon when their last view goes).
//
// A Link is shared by the engine and every tensor and view made from it, so they can free
// and release their blocks whenever they go, even after the engine (the segment stays
// mapped while anything holds a part of it). Releases of small rx blocks made on a thread
// that defers them (the engine's reader, a handler before its reply) wait to ride on the
// next descriptor pushed, so a release does not wake the daemon on its own.
//
// Internal to the client library.
//
// Thread safety: thread-safe.

#ifndef TPD_CLIENT_SEGMENT_LINK_H_
#define TPD_CLIENT_SEGMENT_LINK_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/segment/cuda_export.h"
#include "client/segment/peer_segments.h"
#include "shm/descriptor.h"
#include "shm/heap.h"
#include "shm/ring.h"
#include "shm/segment.h"

namespace tpd::calls_internal {

// How long a push waits for space in a full submission ring.
inline constexpr absl::Duration kRingWait = absl::Seconds(5);
// A deferred release goes on its own once it has waited this long (the reader's job, through
// FlushReleases), and at once when this many wait or a block is larger.
inline constexpr absl::Duration kReleaseDelay = absl::Microseconds(200);
inline constexpr size_t kMaxDeferredReleases = 32;
inline constexpr uint64_t kDeferredReleaseMaxBytes = 64 << 10;

struct ArenaBlock;

// What the link has counted, for CallEngineStats.
struct LinkCounters {
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

class Link {
 public:
  explicit Link(std::shared_ptr<const shm::Segment> segment);
  // The receive pools go with the last view into them (the engine holds the link too).
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  uint8_t* base() const { return segment_->base(); }
  const shm::Layout& layout() const { return segment_->layout(); }

  // A block of `bytes` of the tx heap, for `what` ("a message", "a tensor").
  // RESOURCE_EXHAUSTED naming the heap's size, the request and the largest free block (or
  // that no heap of this size could hold it); UNAVAILABLE once closed.
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(mu_);
  void FreeBlock(uint64_t tx_offset) ABSL_LOCKS_EXCLUDED(mu_);

  // Pushes `d`, which names the message block `block`, with the deferred releases: `pins`
  // (the arena blocks its tensor table points at) and `leases` (what keeps the memory of
  // CUDA tensors it passes on) are held until the daemon releases the block. When it cannot
  // go (a ring that broke or stayed full, a closed link) the block is freed, the holds are
  // dropped and the error returned, UNAVAILABLE.
  absl::Status PushMessage(const shm::Descriptor& d, uint64_t block,
                           std::vector<std::shared_ptr<ArenaBlock>> pins,
                           std::vector<std::shared_ptr<void>> leases) ABSL_LOCKS_EXCLUDED(mu_);
  // Pushes a descriptor that names no block of its own (a cancel). UNAVAILABLE once closed.
  absl::Status Push(const shm::Descriptor& d) ABSL_LOCKS_EXCLUDED(mu_);

  // Tells the daemon it may reuse the rx block at `rx_offset` of `bytes` (no-op once closed).
  // On a thread that defers releases for this link a small block's release waits for the
  // next push instead of ringing the daemon now.
  // `device_pool`: 0 for an rx block, 1 + d for a block of the receive pool on cuda:d.
  void SendRelease(uint64_t rx_offset, uint64_t bytes, uint64_t device_pool = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Pushes the deferred releases when the oldest has waited `at_least` (zero: any).
  void FlushReleases(absl::Duration at_least) ABSL_LOCKS_EXCLUDED(mu_);
  // When the oldest deferred release was deferred (GetCurrentTimeNanos), 0 when none waits.
  int64_t DeferredSince() const { return deferred_since_ns_.load(std::memory_order_relaxed); }
  // This thread's releases of `link`'s blocks wait for the next push from now on (null: no
  // link's do).
  static void DeferReleasesOnThisThread(const Link* link);
  // Whether this thread defers releases of this link's blocks.
  bool DefersOnThisThread() const;

  // The daemon is done with the message block at `tx_offset`: free it and drop the holds
  // PushMessage kept for it. A release naming no live block is the daemon's bug: ignored.
  void OnReleased(uint64_t tx_offset) ABSL_LOCKS_EXCLUDED(mu_);
  // The session is over: no more pushes nor releases; the holds go.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  // The receive pool lent to the daemon on cuda:`device`, if any. Set only before the
  // daemon accepted it (so before any view points into it); erased only when it refused it.
  std::optional<DevicePool> Pool(int device) const ABSL_LOCKS_EXCLUDED(mu_);
  void SetPool(int device, const DevicePool& pool) ABSL_LOCKS_EXCLUDED(mu_);
  void ErasePool(int device) ABSL_LOCKS_EXCLUDED(mu_);

  shm::HeapAllocator::Stats ArenaStats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Pushes that found the daemon's thread asleep and woke it.
  uint64_t DaemonWakeups() const ABSL_LOCKS_EXCLUDED(mu_);

  LinkCounters counters;

 private:
  // Pushes the deferred releases and then `d` (when given) with one doorbell ring, waiting
  // up to kRingWait for space. The deferred releases are gone after it either way (those
  // that could not go are lost with the session: a broken ring ends it).
  absl::Status PushLocked(const shm::Descriptor* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees tx block `block` and moves what held it (pins, leases) into `*pins` and `*leases`,
  // for the caller to drop after the lock (ArenaBlock's destructor takes it, and a lease's
  // deleter may take others).
  void FreeBlockLocked(uint64_t block, std::vector<std::shared_ptr<ArenaBlock>>* pins,
                       std::vector<std::shared_ptr<void>>* leases)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const shm::Segment> segment_;
  mutable absl::Mutex mu_;
  shm::HeapAllocator tx_ ABSL_GUARDED_BY(mu_);
  shm::RingProducer submissions_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  // Releases waiting to go with the next descriptor pushed.
  std::vector<shm::Descriptor> deferred_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> deferred_since_ns_{0};
  // Message block → the arena blocks its tensor table points at. Never destroy an entry's
  // blocks under `mu_` (ArenaBlock's destructor takes it).
  std::map<uint64_t, std::vector<std::shared_ptr<ArenaBlock>>> pinned_ ABSL_GUARDED_BY(mu_);
  // Message block → what keeps the pool blocks of received CUDA tensors it passes on, until
  // the daemon released it (its copies done).
  std::map<uint64_t, std::vector<std::shared_ptr<void>>> leases_ ABSL_GUARDED_BY(mu_);
  // Receive pools lent to the daemon, by device.
  std::map<int, DevicePool> pools_ ABSL_GUARDED_BY(mu_);
};

// A block of the tx heap an arena tensor lies in; freed when its last tensor and the last
// message pinning it go.
struct ArenaBlock {
  ArenaBlock(std::shared_ptr<Link> link, uint64_t offset) : link(std::move(link)), offset(offset) {}
  ~ArenaBlock() { link->FreeBlock(offset); }
  const std::shared_ptr<Link> link;
  const uint64_t offset;
  std::atomic<int> messages{0};  // sent messages pinning it, not yet released (Tensor::in_flight)
};

// A message's hold on `block`, counted in block->messages while it lives.
std::shared_ptr<ArenaBlock> Pin(std::shared_ptr<ArenaBlock> block);

// A received message's block of the rx heap; released to the daemon when it goes.
struct RxBlock {
  RxBlock(std::shared_ptr<Link> link, uint64_t offset, uint64_t bytes);
  ~RxBlock();
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
  PoolBlock(std::shared_ptr<Link> link, int device, uint64_t offset, uint64_t bytes);
  ~PoolBlock();
  const std::shared_ptr<Link> link;
  const int device;
  const uint64_t offset;
  const uint64_t bytes;
};

}  // namespace tpd::calls_internal

#endif  // TPD_CLIENT_SEGMENT_LINK_H_
