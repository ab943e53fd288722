// Unit tests of HeapAllocator, the allocator of each shared heap: alignment, exhaustion,
// refusing releases of blocks that were not handed out, coalescing, and a seeded random
// alloc/free run checked against the allocator's invariants and a model of live blocks.

#include "shm/heap.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/layout.h"

namespace tpd::shm {
namespace {

using ::testing::HasSubstr;

constexpr Region kHeap{1 << 20, 1 << 20};  // 1 MiB at offset 1 MiB

TEST(HeapAllocatorTest, BlocksAreAlignedInsideTheHeapAndDistinct) {
  HeapAllocator heap("tx heap", kHeap);
  std::vector<uint64_t> offsets;
  for (uint64_t bytes : {0, 1, 63, 64, 65, 1000, 4096}) {
    absl::StatusOr<uint64_t> offset = heap.Allocate(bytes);
    ASSERT_TRUE(offset.ok()) << offset.status();
    EXPECT_EQ(*offset % kHeapAlignment, 0u);
    EXPECT_TRUE(kHeap.Contains(*offset, std::max<uint64_t>(bytes, 1)));
    absl::StatusOr<uint64_t> block = heap.BlockBytes(*offset);
    ASSERT_TRUE(block.ok());
    EXPECT_GE(*block, std::max<uint64_t>(bytes, 1));
    EXPECT_EQ(*block % kHeapAlignment, 0u);
    offsets.push_back(*offset);
  }
  std::sort(offsets.begin(), offsets.end());
  EXPECT_EQ(std::unique(offsets.begin(), offsets.end()), offsets.end());
  EXPECT_TRUE(heap.CheckInvariants().ok()) << heap.CheckInvariants();
}

TEST(HeapAllocatorTest, FullHeapIsResourceExhaustedNamingSizeAndRequest) {
  HeapAllocator heap("rx heap", kHeap);
  ASSERT_TRUE(heap.Allocate(kHeap.bytes).ok());
  absl::StatusOr<uint64_t> more = heap.Allocate(100);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(more.status().message(),
              HasSubstr("rx heap of 1048576 bytes cannot hold 100 more bytes"));
  EXPECT_THAT(more.status().message(), HasSubstr("largest free block 0"));

  HeapAllocator empty("tx heap", kHeap);
  absl::StatusOr<uint64_t> too_big = empty.Allocate(kHeap.bytes + 1);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_big.status().message(), HasSubstr("cannot hold 1048577 more bytes"));
  absl::StatusOr<uint64_t> huge = empty.Allocate(~uint64_t{0});
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << "no overflow";
  EXPECT_TRUE(empty.CheckInvariants().ok());
}

TEST(HeapAllocatorTest, FragmentationIsReportedWithTheLargestFreeBlock) {
  HeapAllocator heap("tx heap", kHeap);
  std::vector<uint64_t> blocks;
  for (int i = 0; i < 256; ++i) blocks.push_back(*heap.Allocate(4096));
  // Free every other block: half the heap is free, in 4 KiB holes.
  for (int i = 0; i < 256; i += 2) ASSERT_TRUE(heap.Free(blocks[i]).ok());
  HeapAllocator::Stats stats = heap.GetStats();
  EXPECT_EQ(stats.free_bytes, kHeap.bytes / 2);
  EXPECT_EQ(stats.largest_free, 4096u);
  EXPECT_EQ(stats.free_blocks, 128u);
  absl::StatusOr<uint64_t> big = heap.Allocate(8192);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("524288 in use, largest free block 4096"));
  // A hole is reused, not the free space split further...
  absl::StatusOr<uint64_t> small = heap.Allocate(4000);
  ASSERT_TRUE(small.ok());
  const auto hole = std::find(blocks.begin(), blocks.end(), *small);
  ASSERT_NE(hole, blocks.end());
  const int used_hole = static_cast<int>(hole - blocks.begin());
  EXPECT_EQ(used_hole % 2, 0) << "a freed block";
  // ...and freeing a live block between two holes merges the three.
  const int middle = used_hole < 128 ? 201 : 51;
  ASSERT_TRUE(heap.Free(blocks[middle]).ok());
  absl::StatusOr<uint64_t> merged = heap.Allocate(3 * 4096);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(*merged, blocks[middle - 1]);
  EXPECT_TRUE(heap.CheckInvariants().ok()) << heap.CheckInvariants();
}

TEST(HeapAllocatorTest, FreeingEverythingInAnyOrderLeavesOneFreeBlock) {
  for (int order = 0; order < 3; ++order) {
    HeapAllocator heap("tx heap", kHeap);
    std::vector<uint64_t> blocks;
    for (int i = 0; i < 100; ++i) blocks.push_back(*heap.Allocate(64 * (1 + i % 5)));
    if (order == 1) std::reverse(blocks.begin(), blocks.end());
    if (order == 2) std::shuffle(blocks.begin(), blocks.end(), std::mt19937(order));
    for (uint64_t block : blocks) ASSERT_TRUE(heap.Free(block).ok());
    const HeapAllocator::Stats stats = heap.GetStats();
    EXPECT_EQ(stats.free_blocks, 1u) << "order " << order;
    EXPECT_EQ(stats.largest_free, kHeap.bytes);
    EXPECT_EQ(stats.used_bytes, 0u);
    EXPECT_EQ(stats.live_blocks, 0u);
    EXPECT_TRUE(heap.CheckInvariants().ok()) << heap.CheckInvariants();
  }
}

TEST(HeapAllocatorTest, ReleasingABlockNotHandedOutIsRefused) {
  HeapAllocator heap("rx heap", kHeap);
  const uint64_t block = *heap.Allocate(256);
  absl::Status inside = heap.Free(block + 64);
  EXPECT_EQ(inside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(inside.message(),
              HasSubstr("rx heap: offset 1048640 is not the start of a block in use "
                        "(never handed out, or already released)"));
  absl::Status outside = heap.Free(7);
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.message(), HasSubstr("outside the heap [1048576, 2097152)"));
  ASSERT_TRUE(heap.Free(block).ok());
  absl::Status twice = heap.Free(block);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.message(), HasSubstr("already released"));
  EXPECT_EQ(heap.BlockBytes(block).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(heap.CheckInvariants().ok());
}

TEST(HeapAllocatorTest, RandomAllocAndFreeKeepTheInvariants) {
  constexpr Region kSmall{4096, 256 * 1024};
  HeapAllocator heap("tx heap", kSmall);
  std::mt19937_64 rng(12345);
  std::map<uint64_t, uint64_t> live;  // the model: offset → requested bytes
  int exhausted = 0;
  for (int step = 0; step < 50'000; ++step) {
    const bool allocate = live.empty() || rng() % 100 < 55;
    if (allocate) {
      // Mostly small, sometimes large requests.
      const uint64_t bytes = rng() % 10 == 0 ? rng() % (64 * 1024) : rng() % 2048;
      absl::StatusOr<uint64_t> offset = heap.Allocate(bytes);
      if (!offset.ok()) {
        ASSERT_EQ(offset.status().code(), absl::StatusCode::kResourceExhausted);
        ASSERT_LT(heap.GetStats().largest_free, std::max<uint64_t>(bytes, 1))
            << "refused though a block fits";
        ++exhausted;
        continue;
      }
      ASSERT_TRUE(kSmall.Contains(*offset, std::max<uint64_t>(bytes, 1)));
      // No overlap with the live neighbours.
      auto next = live.lower_bound(*offset);
      if (next != live.end()) {
        ASSERT_LE(*offset + bytes, next->first);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + *heap.BlockBytes(prev->first), *offset);
      }
      live.emplace(*offset, bytes);
    } else {
      auto victim = live.begin();
      std::advance(victim, rng() % live.size());
      ASSERT_TRUE(heap.Free(victim->first).ok());
      live.erase(victim);
    }
    if (step % 97 == 0) {
      ASSERT_TRUE(heap.CheckInvariants().ok()) << "step " << step << ": " << heap.CheckInvariants();
      ASSERT_EQ(heap.GetStats().live_blocks, live.size());
    }
  }
  EXPECT_GT(exhausted, 0) << "the run should have filled the heap at times";
  for (const auto& [offset, bytes] : live) ASSERT_TRUE(heap.Free(offset).ok());
  EXPECT_EQ(heap.GetStats().free_blocks, 1u);
  EXPECT_TRUE(heap.CheckInvariants().ok());
}

}  // namespace
}  // namespace tpd::shm
