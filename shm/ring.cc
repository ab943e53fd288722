#include "shm/ring.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tpd::shm {
namespace {

RingControl* ControlAt(void* segment_base, const RingLayout& ring) {
  return reinterpret_cast<RingControl*>(static_cast<uint8_t*>(segment_base) + ring.region.offset);
}

Descriptor* SlotsAt(void* segment_base, const RingLayout& ring) {
  return reinterpret_cast<Descriptor*>(static_cast<uint8_t*>(segment_base) + ring.region.offset +
                                       kRingControlBytes);
}

}  // namespace

void InitRing(void* segment_base, const RingLayout& ring, uint32_t start) {
  RingControl* control = new (ControlAt(segment_base, ring)) RingControl;
  control->head.store(start, std::memory_order_relaxed);
  control->tail.store(start, std::memory_order_relaxed);
  control->data.seq.store(0, std::memory_order_relaxed);
  control->data.sleeping.store(0, std::memory_order_relaxed);
  control->space.seq.store(0, std::memory_order_relaxed);
  control->space.sleeping.store(0, std::memory_order_release);
}

RingProducer::RingProducer(void* segment_base, const RingLayout& ring, std::string name,
                           SpinOptions spin, uint32_t start)
    : control_(ControlAt(segment_base, ring)),
      slots_(SlotsAt(segment_base, ring)),
      capacity_(ring.slots),
      mask_(ring.slots - 1),
      name_(std::move(name)),
      data_(&control_->data, spin),
      space_(&control_->space, spin),
      tail_(start),
      seen_head_(start) {}

absl::Status RingProducer::RefreshHead() {
  if (!error_.ok()) return error_;
  const uint32_t head = control_->head.load(std::memory_order_acquire);
  // The consumer's head only moves forward, and never past what we published: it lies in
  // [seen_head_, tail_], distances taken modulo 2^32.
  if (head - seen_head_ > tail_ - seen_head_) {
    error_ = absl::DataLossError(
        absl::StrCat(name_, ": the consumer's head ", head, " is outside [", seen_head_, ", ",
                     tail_, "] (it moved backwards or past the producer's tail ", tail_, ")"));
    return error_;
  }
  seen_head_ = head;
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> RingProducer::FreeSlots() {
  if (absl::Status s = RefreshHead(); !s.ok()) return s;
  return capacity_ - (tail_ - seen_head_);
}

absl::StatusOr<size_t> RingProducer::TryPushBatch(absl::Span<const Descriptor> descriptors,
                                                  bool wake) {
  absl::StatusOr<uint32_t> free = FreeSlots();
  if (!free.ok()) return free.status();
  const size_t n = std::min<size_t>(*free, descriptors.size());
  if (n == 0) return 0;
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(&slots_[(tail_ + i) & mask_], &descriptors[i], sizeof(Descriptor));
  }
  tail_ += static_cast<uint32_t>(n);
  control_->tail.store(tail_, std::memory_order_release);
  if (wake) data_.Ring();
  return n;
}

absl::StatusOr<bool> RingProducer::TryPush(const Descriptor& descriptor, bool wake) {
  absl::StatusOr<size_t> pushed = TryPushBatch(absl::MakeConstSpan(&descriptor, 1), wake);
  if (!pushed.ok()) return pushed.status();
  return *pushed == 1;
}

absl::StatusOr<bool> RingProducer::WaitForSpace(absl::Time deadline) {
  const bool ready = space_.Wait(
      [this] { return !RefreshHead().ok() || tail_ - seen_head_ < capacity_; }, deadline);
  if (!error_.ok()) return error_;
  return ready;
}

RingConsumer::RingConsumer(void* segment_base, const RingLayout& ring, std::string name,
                           SpinOptions spin, uint32_t start)
    : control_(ControlAt(segment_base, ring)),
      slots_(SlotsAt(segment_base, ring)),
      capacity_(ring.slots),
      mask_(ring.slots - 1),
      name_(std::move(name)),
      data_(&control_->data, spin),
      space_(&control_->space, spin),
      head_(start),
      seen_tail_(start) {}

absl::Status RingConsumer::RefreshTail() {
  if (!error_.ok()) return error_;
  const uint32_t tail = control_->tail.load(std::memory_order_acquire);
  // The producer's tail only moves forward, and at most `capacity_` past our head: it lies in
  // [seen_tail_, head_ + capacity_], distances taken modulo 2^32.
  if (tail - head_ > capacity_) {
    error_ = absl::DataLossError(absl::StrCat(name_, ": the producer's tail ", tail, " is ",
                                              tail - head_, " ahead of the head ", head_,
                                              ", more than the ring's ", capacity_, " slots"));
    return error_;
  }
  if (tail - head_ < seen_tail_ - head_) {
    error_ = absl::DataLossError(absl::StrCat(name_, ": the producer's tail moved backwards from ",
                                              seen_tail_, " to ", tail));
    return error_;
  }
  seen_tail_ = tail;
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> RingConsumer::Available() {
  if (absl::Status s = RefreshTail(); !s.ok()) return s;
  return seen_tail_ - head_;
}

absl::StatusOr<size_t> RingConsumer::TryPopBatch(absl::Span<Descriptor> out) {
  absl::StatusOr<uint32_t> available = Available();
  if (!available.ok()) return available.status();
  const size_t n = std::min<size_t>(*available, out.size());
  if (n == 0) return 0;
  for (size_t i = 0; i < n; ++i) {
    // One copy out of shared memory; the caller validates the copy.
    std::memcpy(&out[i], &slots_[(head_ + i) & mask_], sizeof(Descriptor));
  }
  head_ += static_cast<uint32_t>(n);
  control_->head.store(head_, std::memory_order_release);
  space_.Ring();
  return n;
}

absl::StatusOr<bool> RingConsumer::TryPop(Descriptor* out) {
  absl::StatusOr<size_t> popped = TryPopBatch(absl::MakeSpan(out, 1));
  if (!popped.ok()) return popped.status();
  return *popped == 1;
}

absl::StatusOr<bool> RingConsumer::WaitForData(absl::Time deadline, SpinWindow* spin,
                                               absl::FunctionRef<bool()> interrupted) {
  bool ready = false;
  data_.Wait(
      [&] {
        ready = !RefreshTail().ok() || seen_tail_ != head_;
        return ready || interrupted();
      },
      deadline, spin);
  if (!error_.ok()) return error_;
  return ready;
}

void RingConsumer::Nudge() const {
  // A Doorbell of its own: Ring touches only the shared word and the ringing object's counters.
  Doorbell(&control_->data).Ring();
}

}  // namespace tpd::shm
