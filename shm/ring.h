// A single-producer single-consumer ring of Descriptors in shared memory, between two
// processes that do not trust each other.
//
// In shared memory (RingControl, then `slots` descriptors):
//   head   the consumer's count of descriptors taken (free-running u32, slot = head % slots)
//   tail   the producer's count of descriptors published
//   data   doorbell the consumer sleeps on when the ring is empty
//   space  doorbell the producer sleeps on when the ring is full
// The producer writes a slot, then publishes it with a release store of tail; the consumer
// reads tail with acquire, copies the slot out, then frees it with a release store of head.
//
// Each side keeps its own index in private memory and never reads it back from shared memory;
// the other side's index is read, checked and only then believed. Every way the peer can move
// its index wrongly — a tail more than `slots` ahead of head, a tail that moved backwards, a
// head past tail or moved backwards — makes the call return DATA_LOSS naming the ring and
// the values (the daemon then ends that session). A ring with an error stays broken:
// every later call returns the same error. Nothing loops on values read from shared memory,
// so no write by the peer can make a call hang or read outside the ring.
//
// Thread safety: a RingProducer and a RingConsumer are each used by one thread at a time;
// one of each per ring, in any two processes.

#ifndef TPD_SHM_RING_H_
#define TPD_SHM_RING_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "shm/descriptor.h"
#include "shm/doorbell.h"
#include "shm/layout.h"

namespace tpd::shm {

// The start of a ring region; slots follow at kRingControlBytes.
struct RingControl {
  alignas(64) std::atomic<uint32_t> head;  // written by the consumer only
  alignas(64) std::atomic<uint32_t> tail;  // written by the producer only
  DoorbellWord data;                       // rung by the producer, waited on by the consumer
  DoorbellWord space;                      // rung by the consumer, waited on by the producer
};
static_assert(sizeof(RingControl) == kRingControlBytes);

// Initializes the control block of a fresh ring (the daemon, before the client maps the
// segment): both indices at `start`, doorbells clear. Both sides' objects must be built with
// the same `start` (0 in production; tests start near 2^32 to cross the wrap).
void InitRing(void* segment_base, const RingLayout& ring, uint32_t start = 0);

class RingProducer {
 public:
  // `segment_base` maps a segment whose layout (the owner's private copy) contains `ring`;
  // both outlive this object. `name` ("submission ring") goes into messages.
  RingProducer(void* segment_base, const RingLayout& ring, std::string name, SpinOptions spin = {},
               uint32_t start = 0);

  // Copies `descriptors` into free slots, publishes them and rings the consumer once (unless
  // `wake` is false: a consumer spinning sees them, a sleeping one at its next wake-up — for
  // what is sure to be followed by a rung push, it saves a wake-up).
  // Returns how many fit (0 when the ring is full), or the ring's error.
  absl::StatusOr<size_t> TryPushBatch(absl::Span<const Descriptor> descriptors, bool wake = true);
  // TryPushBatch of one: true when it was pushed, false when the ring is full.
  absl::StatusOr<bool> TryPush(const Descriptor& descriptor, bool wake = true);

  // Waits (spin, then sleep) until at least one slot is free: true, false at `deadline`, or
  // the ring's error.
  absl::StatusOr<bool> WaitForSpace(absl::Time deadline);

  // Slots free now, or the ring's error.
  absl::StatusOr<uint32_t> FreeSlots();

  const std::string& name() const { return name_; }
  const Doorbell& doorbell() const { return space_; }
  // Times a push found the consumer asleep and woke it (any thread may read).
  uint64_t wakeups() const { return data_.wakeups(); }

 private:
  // Reads and checks the consumer's head; sets and returns error_ on a bad one.
  absl::Status RefreshHead();

  RingControl* control_;
  Descriptor* slots_;
  uint32_t capacity_;
  uint32_t mask_;
  std::string name_;
  Doorbell data_;           // rung here
  Doorbell space_;          // waited on here
  uint32_t tail_ = 0;       // ours: published up to here
  uint32_t seen_head_ = 0;  // the consumer's head as last checked
  absl::Status error_;
};

class RingConsumer {
 public:
  // As RingProducer's.
  RingConsumer(void* segment_base, const RingLayout& ring, std::string name, SpinOptions spin = {},
               uint32_t start = 0);

  // Copies up to out.size() published descriptors into `out` (private memory: validate the
  // copies, never the slots), frees their slots and rings the producer if it waits for space.
  // Returns how many were copied (0 when the ring is empty), or the ring's error.
  absl::StatusOr<size_t> TryPopBatch(absl::Span<Descriptor> out);
  // TryPopBatch of one: true when `*out` was filled, false when the ring is empty.
  absl::StatusOr<bool> TryPop(Descriptor* out);

  // Waits (spin, then sleep) until a descriptor is published: true, false at `deadline`, or
  // the ring's error. Returns by `deadline` whatever the producer writes.
  // `spin`: as Doorbell::Wait's. Returns false as soon as `interrupted()` is true, which
  // another thread of the consumer's makes it look at with Nudge.
  absl::StatusOr<bool> WaitForData(
      absl::Time deadline, SpinWindow* spin = nullptr,
      absl::FunctionRef<bool()> interrupted = [] { return false; });
  // Wakes the consumer's thread if it sleeps in WaitForData, so it looks at `interrupted`
  // (a wake-up with nothing published). Thread-safe: any thread of the consumer's process.
  void Nudge() const;

  // Descriptors published and not yet taken, or the ring's error.
  absl::StatusOr<uint32_t> Available();

  const std::string& name() const { return name_; }
  const Doorbell& doorbell() const { return data_; }
  // Times WaitForData slept: nothing came within the spin window (any thread may read).
  uint64_t sleeps() const { return data_.sleeps(); }

 private:
  // Reads and checks the producer's tail; sets and returns error_ on a bad one.
  absl::Status RefreshTail();

  RingControl* control_;
  Descriptor* slots_;
  uint32_t capacity_;
  uint32_t mask_;
  std::string name_;
  Doorbell data_;           // waited on here
  Doorbell space_;          // rung here
  uint32_t head_ = 0;       // ours: taken up to here
  uint32_t seen_tail_ = 0;  // the producer's tail as last checked
  absl::Status error_;
};

}  // namespace tpd::shm

#endif  // TPD_SHM_RING_H_
