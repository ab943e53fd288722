#include "tests/client/segment/segment_fixture.h"

#include <unistd.h>

#include <cstring>
#include <utility>

namespace tpd::calls_internal {

std::shared_ptr<Link> SegmentFixture::LinkOverNewSegment(
    std::shared_ptr<shm::Segment>* daemon_side, std::shared_ptr<shm::Segment>* client_side) {
  shm::SegmentLimits limits;
  limits.submission_slots = kSlots;
  limits.completion_slots = kSlots;
  limits.tx_heap_bytes = kHeapBytes;
  limits.rx_heap_bytes = kHeapBytes;
  absl::StatusOr<shm::Segment> segment = shm::Segment::Create(limits);
  EXPECT_TRUE(segment.ok()) << segment.status();
  if (!segment.ok()) return nullptr;
  *daemon_side = std::make_shared<shm::Segment>(*std::move(segment));
  absl::StatusOr<shm::Segment> mapped = shm::Segment::Map(dup((*daemon_side)->fd()));
  EXPECT_TRUE(mapped.ok()) << mapped.status();
  if (!mapped.ok()) return nullptr;
  *client_side = std::make_shared<shm::Segment>(*std::move(mapped));
  return std::make_shared<Link>(*client_side);
}

void SegmentFixture::SetUp() {
  link_ = LinkOverNewSegment(&daemon_segment_, &segment_);
  ASSERT_NE(link_, nullptr);
  daemon_ = std::make_unique<shm::RingConsumer>(segment_->base(), segment_->layout().submission,
                                                "daemon's end");
}

std::vector<shm::Descriptor> SegmentFixture::Submitted() {
  std::vector<shm::Descriptor> out;
  shm::Descriptor d{};
  while (daemon_->TryPop(&d).value_or(false)) out.push_back(d);
  return out;
}

shm::Descriptor SegmentFixture::Post(shm::Op op, uint64_t call_id, uint64_t at,
                                     const shm::MessageNames& names, std::string_view payload,
                                     const std::vector<PostedTensor>& tensors, uint16_t flags,
                                     uint32_t code) {
  std::vector<uint64_t> slots;
  for (const PostedTensor& tensor : tensors) slots.push_back(tensor.bytes.size());
  const shm::BlockPlan plan = shm::PlanBlock(shm::MessagePrefixBytes(names), payload.size(), slots);
  const uint64_t block = Rx(at);
  EXPECT_LE(at + plan.total, kHeapBytes) << "the test's message does not fit the rx heap";
  uint8_t* out = daemon_segment_->base() + block;
  shm::WriteMessagePrefix(out, code, names);
  std::memcpy(out + plan.prefix, payload.data(), payload.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    shm::TensorEntry entry{};
    entry.dtype = static_cast<uint8_t>(tensors[i].dtype);
    entry.ndim = static_cast<uint8_t>(tensors[i].shape.size());
    for (size_t k = 0; k < tensors[i].shape.size(); ++k) entry.shape[k] = tensors[i].shape[k];
    entry.length = tensors[i].bytes.size();
    if (entry.length > 0) {
      entry.offset = block + plan.at[i];
      std::memcpy(out + plan.at[i], tensors[i].bytes.data(), entry.length);
    }
    std::memcpy(out + plan.table + i * sizeof(entry), &entry, sizeof(entry));
  }
  return shm::MessageDescriptor(
      op, call_id, {block, plan.payload, plan.table, static_cast<uint32_t>(tensors.size())}, flags);
}

shm::TensorEntry* SegmentFixture::Entry(const shm::Descriptor& d, uint32_t index) {
  return reinterpret_cast<shm::TensorEntry*>(daemon_segment_->base() + d.tensor_table_offset +
                                             index * sizeof(shm::TensorEntry));
}

}  // namespace tpd::calls_internal
