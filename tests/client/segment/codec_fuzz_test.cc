// Mutation driver over what the daemon posts to a client: a completion descriptor and the
// message block it names in the rx heap (header, names, body, tensor table). Each mutant is
// validated and decoded as the engine does; whatever decodes stays inside the memory the
// client maps, and every block is released exactly once. Seeded, so a failure replays.

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "client/segment/codec.h"
#include "gtest/gtest.h"
#include "shm/descriptor.h"
#include "tests/client/segment/segment_fixture.h"

namespace tpd::calls_internal {
namespace {

constexpr int kRounds = 20000;

using CodecFuzzTest = SegmentFixture;

// Changes 1-3 bytes of `bytes`, or sets one to a boundary value.
void Mutate(uint8_t* bytes, size_t size, std::mt19937_64& rng) {
  if (rng() % 4 == 0) {
    const uint8_t edges[] = {0, 1, 0x7f, 0x80, 0xff};
    bytes[rng() % size] = edges[rng() % sizeof(edges)];
    return;
  }
  for (int m = 1 + static_cast<int>(rng() % 3); m > 0; --m) {
    bytes[rng() % size] = static_cast<uint8_t>(rng());
  }
}

TEST_F(CodecFuzzTest, MutatedMessagesDecodeInsideTheSegmentOrFailAndAreReleasedOnce) {
  std::mt19937_64 rng(20261128);
  PeerSegments peers(-1);
  const shm::Region rx = segment_->layout().rx_heap;
  int decoded_ok = 0;
  int refused = 0;
  for (int round = 0; round < kRounds; ++round) {
    shm::Descriptor d = Post(
        round % 2 == 0 ? shm::Op::kCall : shm::Op::kReply, 1 + round, 0,
        {"group", "worker", "method", "caller"}, "payload bytes",
        {{shm::DType::kFloat32, {2, 2}, std::string(16, '\1')}, {shm::DType::kUInt8, {3}, "abc"}});
    const uint64_t block_bytes =
        d.tensor_table_offset + 2 * sizeof(shm::TensorEntry) - d.payload_offset;
    if (rng() % 3 == 0) {
      Mutate(reinterpret_cast<uint8_t*>(&d), sizeof(d), rng);
    } else {
      Mutate(daemon_segment_->base() + d.payload_offset, block_bytes, rng);
    }
    if (!shm::ValidateDescriptor(d, segment_->layout(), shm::Direction::kCompletion).ok() ||
        (d.op != static_cast<uint8_t>(shm::Op::kCall) &&
         d.op != static_cast<uint8_t>(shm::Op::kReply))) {
      ++refused;
      continue;
    }
    {
      DecodedMessage message = DecodeMessage(d, link_, peers);
      if (message.message.ok()) {
        ++decoded_ok;
        for (const Tensor& tensor : message.message->tensors) {
          if (tensor.is_cuda() || tensor.size() == 0) continue;
          const auto* at = reinterpret_cast<const uint8_t*>(tensor.data().data());
          ASSERT_TRUE(rx.Contains(at - segment_->base(), tensor.size())) << "round " << round;
        }
      }
    }
    // Everything the message held is released now, the rx block once.
    int rx_releases = 0;
    for (const shm::Descriptor& released : Submitted()) {
      ASSERT_EQ(released.op, static_cast<uint8_t>(shm::Op::kRelease)) << "round " << round;
      if (released.device_pool == 0) {
        ++rx_releases;
        EXPECT_EQ(released.payload_offset, d.payload_offset) << "round " << round;
      }
    }
    EXPECT_EQ(rx_releases, d.payload_offset != 0 ? 1 : 0) << "round " << round;
    ASSERT_EQ(link_->counters.rx_blocks_held.load(), 0u) << "round " << round;
    ASSERT_EQ(link_->counters.cuda_pool_blocks_held.load(), 0u) << "round " << round;
  }
  // The driver exercised both sides: mutants that still decode and mutants refused.
  EXPECT_GT(decoded_ok, kRounds / 10);
  EXPECT_GT(refused, kRounds / 10);
}

}  // namespace
}  // namespace tpd::calls_internal
