// The allocator of one heap of the segment: the client's allocator of the tx heap and the
// daemon's allocator of the rx heap are each an instance of this class, in their owner's
// private memory. No allocator state lies in shared memory, so neither side can corrupt the
// other's allocator; it only hands out offsets.
//
// A two-level segregated fit (TLSF) allocator: free blocks sit in size bins (a power of two,
// split in 16), found through two bitmaps, so Allocate and Free are O(1); a block's physical
// neighbours are linked, so Free coalesces with both at once. Allocation takes a block from
// the first bin whose blocks all fit, and only when no such bin has one does it search the
// request's own bin (so a request fails only when no free block can hold it). Live blocks are
// kept in a hash map by offset, so Free refuses an offset that is not a live block start (a
// client releasing an rx block twice, or one it was never given). Blocks are
// kHeapAlignment-aligned and sized in multiples of it. All state is in private memory:
// O(live + free blocks) of it.
//
// Thread safety: not thread-safe; the owner serializes calls (one lock per session).

#ifndef TPD_SHM_HEAP_H_
#define TPD_SHM_HEAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shm/layout.h"

namespace tpd::shm {

class HeapAllocator {
 public:
  struct Stats {
    uint64_t heap_bytes = 0;
    uint64_t used_bytes = 0;  // in live blocks (rounded sizes)
    uint64_t free_bytes = 0;
    uint64_t largest_free = 0;  // the largest request that can succeed now (rounded)
    uint64_t live_blocks = 0;
    uint64_t free_blocks = 0;
  };

  // Manages `heap` (offsets are the segment's, like the region's). `name` ("tx heap") goes
  // into messages. REQUIRES: heap.offset and heap.bytes are multiples of kHeapAlignment.
  HeapAllocator(std::string name, const Region& heap);

  HeapAllocator(const HeapAllocator&) = delete;
  HeapAllocator& operator=(const HeapAllocator&) = delete;

  // A block of at least `bytes` (0 counts as 1: every block has its own offset). Returns its
  // offset; RESOURCE_EXHAUSTED naming the heap, its size, the request and the largest free
  // block when no free block is big enough.
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes);

  // Returns the live block starting at `offset` to the heap. INVALID_ARGUMENT naming the heap
  // and the offset when no live block starts there (never allocated, or already freed).
  absl::Status Free(uint64_t offset);

  // The rounded size of the live block at `offset`, or NOT_FOUND.
  absl::StatusOr<uint64_t> BlockBytes(uint64_t offset) const;

  Stats GetStats() const;
  const std::string& name() const { return name_; }
  const Region& region() const { return heap_; }

  // For tests: blocks (free and live) tile the heap exactly and are linked both ways, free
  // blocks never touch, every free block is in its bin, the bitmaps match the bins, and the
  // live map matches the live blocks. INTERNAL naming the first broken rule. O(blocks).
  absl::Status CheckInvariants() const;

 private:
  static constexpr uint32_t kNone = ~uint32_t{0};
  static constexpr int kSubBinsLog2 = 4;
  static constexpr int kSubBins = 1 << kSubBinsLog2;
  static constexpr int kBins = 61;  // enough first-level bins for any 64-bit granule count

  // A block of the heap, free or live; sizes in granules of kHeapAlignment bytes.
  struct Block {
    uint64_t offset;
    uint64_t granules;
    uint32_t prev_phys;  // the blocks just before and after it in the heap
    uint32_t next_phys;
    uint32_t prev_free;  // its bin's list, while free
    uint32_t next_free;
    bool free;
  };

  // The bin of a free block of `granules`.
  static void BinOf(uint64_t granules, int* bin, int* sub_bin);
  // The first free block in bin (bin, sub_bin) or any bigger one, or kNone.
  uint32_t SearchFrom(int bin, int sub_bin) const;
  // A free block of at least `granules`, or kNone.
  uint32_t FindFree(uint64_t granules) const;
  void InsertFree(uint32_t index);
  void RemoveFree(uint32_t index);
  uint32_t NewBlock();
  void ReleaseBlock(uint32_t index);
  uint64_t LargestFree() const;

  std::string name_;
  Region heap_;
  std::vector<Block> blocks_;            // nodes; index 0 is the block at heap_.offset
  std::vector<uint32_t> spare_blocks_;   // unused nodes of blocks_
  uint64_t bin_bitmap_ = 0;              // bit b: sub_bin_bitmap_[b] != 0
  uint32_t sub_bin_bitmap_[kBins] = {};  // bit s: heads_[b][s] != kNone
  uint32_t heads_[kBins][kSubBins];
  absl::flat_hash_map<uint64_t, uint32_t> live_;  // offset → block
  uint64_t used_bytes_ = 0;
  uint64_t free_blocks_ = 0;
};

}  // namespace tpd::shm

#endif  // TPD_SHM_HEAP_H_
