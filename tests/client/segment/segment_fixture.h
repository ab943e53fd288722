// An in-process segment with the client's Link over it, the test playing the daemon's end:
// it reads what the client pushes on the submission ring and writes messages into the rx heap
// as the daemon posts them (laid out with shm::PlanBlock, as the daemon lays them out).

#ifndef TPD_TESTS_CLIENT_SEGMENT_SEGMENT_FIXTURE_H_
#define TPD_TESTS_CLIENT_SEGMENT_SEGMENT_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "client/segment/link.h"
#include "gtest/gtest.h"
#include "shm/descriptor.h"
#include "shm/message.h"
#include "shm/ring.h"
#include "shm/segment.h"

namespace tpd::calls_internal {

// A host tensor as the daemon places it in a posted message's block.
struct PostedTensor {
  shm::DType dtype = shm::DType::kUInt8;
  std::vector<int64_t> shape;
  std::string bytes;
};

class SegmentFixture : public ::testing::Test {
 protected:
  static constexpr uint64_t kHeapBytes = 64 << 10;
  static constexpr uint32_t kSlots = 16;

  void SetUp() override;

  // A link over a segment of its own (another session's, say): the daemon's mapping of it
  // in `daemon_side`, the client's (the link's) in `client_side`.
  static std::shared_ptr<Link> LinkOverNewSegment(std::shared_ptr<shm::Segment>* daemon_side,
                                                  std::shared_ptr<shm::Segment>* client_side);

  // The descriptors the client pushed since the last call, in order.
  std::vector<shm::Descriptor> Submitted();
  // Writes a message at `at` bytes into the rx heap (through the daemon's mapping) and returns the
  // descriptor that posts it.
  shm::Descriptor Post(shm::Op op, uint64_t call_id, uint64_t at, const shm::MessageNames& names,
                       std::string_view payload, const std::vector<PostedTensor>& tensors,
                       uint16_t flags = 0, uint32_t code = 0);
  // The segment offset of `at` bytes into the rx heap.
  uint64_t Rx(uint64_t at) const { return segment_->layout().rx_heap.offset + at; }
  // The tensor table entry `index` of the message `d` posts (to edit it in place).
  shm::TensorEntry* Entry(const shm::Descriptor& d, uint32_t index);

  // The daemon's mapping (the tx heap read-only) and the client's, which the link uses.
  std::shared_ptr<shm::Segment> daemon_segment_;
  std::shared_ptr<shm::Segment> segment_;
  std::shared_ptr<Link> link_;
  std::unique_ptr<shm::RingConsumer> daemon_;
};

}  // namespace tpd::calls_internal

#endif  // TPD_TESTS_CLIENT_SEGMENT_SEGMENT_FIXTURE_H_
