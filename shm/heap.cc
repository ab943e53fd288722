#include "shm/heap.h"

#include <algorithm>

#include "absl/numeric/bits.h"
#include "absl/strings/str_cat.h"

namespace tpd::shm {
namespace {

constexpr int kGranuleLog2 = 6;
static_assert(kHeapAlignment == uint64_t{1} << kGranuleLog2);

int HighestBit(uint64_t value) { return 63 - absl::countl_zero(value); }

}  // namespace

HeapAllocator::HeapAllocator(std::string name, const Region& heap)
    : name_(std::move(name)), heap_(heap) {
  for (auto& bin : heads_) std::fill(std::begin(bin), std::end(bin), kNone);
  const uint64_t granules = heap_.bytes >> kGranuleLog2;
  if (granules == 0) return;
  blocks_.push_back(Block{heap_.offset, granules, kNone, kNone, kNone, kNone, false});
  InsertFree(0);
}

// Sizes below kSubBins granules get a bin each (bin 0); above, bin b >= 1 holds
// [2^(b+3), 2^(b+4)) granules in kSubBins equal steps.
void HeapAllocator::BinOf(uint64_t granules, int* bin, int* sub_bin) {
  if (granules < kSubBins) {
    *bin = 0;
    *sub_bin = static_cast<int>(granules);
    return;
  }
  const int high = HighestBit(granules);
  *bin = high - kSubBinsLog2 + 1;
  *sub_bin = static_cast<int>(granules >> (high - kSubBinsLog2)) - kSubBins;
}

uint32_t HeapAllocator::SearchFrom(int bin, int sub_bin) const {
  if (bin >= kBins) return kNone;
  uint32_t sub_bins = sub_bin_bitmap_[bin] & (~uint32_t{0} << sub_bin);
  if (sub_bins == 0) {
    const uint64_t bins = bin + 1 < 64 ? bin_bitmap_ & (~uint64_t{0} << (bin + 1)) : 0;
    if (bins == 0) return kNone;
    bin = absl::countr_zero(bins);
    sub_bins = sub_bin_bitmap_[bin];
  }
  return heads_[bin][absl::countr_zero(sub_bins)];
}

uint32_t HeapAllocator::FindFree(uint64_t granules) const {
  // Good fit: round up to the next bin start, where every block is big enough.
  uint64_t rounded = granules;
  if (granules >= kSubBins) rounded += (uint64_t{1} << (HighestBit(granules) - kSubBinsLog2)) - 1;
  int bin, sub_bin;
  BinOf(rounded, &bin, &sub_bin);
  if (const uint32_t found = SearchFrom(bin, sub_bin); found != kNone) return found;
  // Nothing bigger: a block of the request's own bin may still fit. Only a nearly full heap
  // gets here; the scan is bounded by that bin's population.
  BinOf(granules, &bin, &sub_bin);
  for (uint32_t i = heads_[bin][sub_bin]; i != kNone; i = blocks_[i].next_free) {
    if (blocks_[i].granules >= granules) return i;
  }
  return kNone;
}

void HeapAllocator::InsertFree(uint32_t index) {
  Block& block = blocks_[index];
  int bin, sub_bin;
  BinOf(block.granules, &bin, &sub_bin);
  block.free = true;
  block.prev_free = kNone;
  block.next_free = heads_[bin][sub_bin];
  if (block.next_free != kNone) blocks_[block.next_free].prev_free = index;
  heads_[bin][sub_bin] = index;
  sub_bin_bitmap_[bin] |= uint32_t{1} << sub_bin;
  bin_bitmap_ |= uint64_t{1} << bin;
  ++free_blocks_;
}

void HeapAllocator::RemoveFree(uint32_t index) {
  Block& block = blocks_[index];
  int bin, sub_bin;
  BinOf(block.granules, &bin, &sub_bin);
  if (block.prev_free != kNone) {
    blocks_[block.prev_free].next_free = block.next_free;
  } else {
    heads_[bin][sub_bin] = block.next_free;
    if (block.next_free == kNone) {
      sub_bin_bitmap_[bin] &= ~(uint32_t{1} << sub_bin);
      if (sub_bin_bitmap_[bin] == 0) bin_bitmap_ &= ~(uint64_t{1} << bin);
    }
  }
  if (block.next_free != kNone) blocks_[block.next_free].prev_free = block.prev_free;
  block.free = false;
  block.prev_free = block.next_free = kNone;
  --free_blocks_;
}

uint32_t HeapAllocator::NewBlock() {
  if (!spare_blocks_.empty()) {
    const uint32_t index = spare_blocks_.back();
    spare_blocks_.pop_back();
    return index;
  }
  blocks_.emplace_back();
  return static_cast<uint32_t>(blocks_.size() - 1);
}

void HeapAllocator::ReleaseBlock(uint32_t index) { spare_blocks_.push_back(index); }

absl::StatusOr<uint64_t> HeapAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) bytes = 1;
  // Past the heap's size nothing fits; below it, the rounding cannot overflow.
  const uint64_t granules = bytes <= heap_.bytes ? (bytes + kHeapAlignment - 1) >> kGranuleLog2 : 0;
  const uint32_t index = granules == 0 ? kNone : FindFree(granules);
  if (index == kNone) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, " of ", heap_.bytes, " bytes cannot hold ", bytes, " more bytes (",
                     used_bytes_, " in use, largest free block ", LargestFree(), ")"));
  }
  RemoveFree(index);
  if (blocks_[index].granules > granules) {
    // Split: the tail goes back to the bins. NewBlock may move blocks_: indices only.
    const uint32_t rest = NewBlock();
    Block& block = blocks_[index];
    blocks_[rest] = Block{block.offset + (granules << kGranuleLog2),
                          block.granules - granules,
                          index,
                          block.next_phys,
                          kNone,
                          kNone,
                          false};
    if (block.next_phys != kNone) blocks_[block.next_phys].prev_phys = rest;
    block.next_phys = rest;
    block.granules = granules;
    InsertFree(rest);
  }
  const Block& block = blocks_[index];
  live_.emplace(block.offset, index);
  used_bytes_ += block.granules << kGranuleLog2;
  return block.offset;
}

absl::Status HeapAllocator::Free(uint64_t offset) {
  auto live = live_.find(offset);
  if (live == live_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": offset ", offset, " is not the start of a block in use (",
                     heap_.Contains(offset, 1) ? "never handed out, or already released"
                                               : "outside the heap " + DescribeRegion(heap_),
                     ")"));
  }
  uint32_t index = live->second;
  live_.erase(live);
  used_bytes_ -= blocks_[index].granules << kGranuleLog2;
  // Coalesce with the free neighbours on either side.
  const uint32_t next = blocks_[index].next_phys;
  if (next != kNone && blocks_[next].free) {
    RemoveFree(next);
    blocks_[index].granules += blocks_[next].granules;
    blocks_[index].next_phys = blocks_[next].next_phys;
    if (blocks_[next].next_phys != kNone) blocks_[blocks_[next].next_phys].prev_phys = index;
    ReleaseBlock(next);
  }
  const uint32_t prev = blocks_[index].prev_phys;
  if (prev != kNone && blocks_[prev].free) {
    RemoveFree(prev);
    blocks_[prev].granules += blocks_[index].granules;
    blocks_[prev].next_phys = blocks_[index].next_phys;
    if (blocks_[index].next_phys != kNone) blocks_[blocks_[index].next_phys].prev_phys = prev;
    ReleaseBlock(index);
    index = prev;
  }
  InsertFree(index);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HeapAllocator::BlockBytes(uint64_t offset) const {
  auto live = live_.find(offset);
  if (live == live_.end()) {
    return absl::NotFoundError(absl::StrCat(name_, ": no block in use at offset ", offset));
  }
  return blocks_[live->second].granules << kGranuleLog2;
}

uint64_t HeapAllocator::LargestFree() const {
  if (bin_bitmap_ == 0) return 0;
  const int bin = HighestBit(bin_bitmap_);
  const int sub_bin = HighestBit(sub_bin_bitmap_[bin]);
  uint64_t largest = 0;
  for (uint32_t i = heads_[bin][sub_bin]; i != kNone; i = blocks_[i].next_free) {
    largest = std::max(largest, blocks_[i].granules);
  }
  return largest << kGranuleLog2;
}

HeapAllocator::Stats HeapAllocator::GetStats() const {
  Stats stats;
  stats.heap_bytes = heap_.bytes;
  stats.used_bytes = used_bytes_;
  stats.free_bytes = heap_.bytes - used_bytes_;
  stats.largest_free = LargestFree();
  stats.live_blocks = live_.size();
  stats.free_blocks = free_blocks_;
  return stats;
}

absl::Status HeapAllocator::CheckInvariants() const {
  auto broken = [&](auto&&... what) {
    return absl::InternalError(absl::StrCat(name_, ": ", what...));
  };
  // Walk the heap in address order: blocks must tile it, linked both ways.
  uint64_t cursor = heap_.offset;
  uint64_t used = 0;
  uint64_t live_blocks = 0;
  uint64_t free_blocks = 0;
  bool previous_free = false;
  uint32_t previous = kNone;
  for (uint32_t i = blocks_.empty() ? kNone : 0; i != kNone; i = blocks_[i].next_phys) {
    const Block& block = blocks_[i];
    if (block.offset != cursor)
      return broken("a block starts at ", block.offset, ", expected ", cursor);
    if (block.prev_phys != previous)
      return broken("block at ", block.offset, " links back wrongly");
    if (block.granules == 0) return broken("block at ", block.offset, " is empty");
    if (block.free && previous_free) return broken("free blocks touch at ", block.offset);
    if (block.free) {
      ++free_blocks;
      int bin, sub_bin;
      BinOf(block.granules, &bin, &sub_bin);
      bool listed = false;
      for (uint32_t j = heads_[bin][sub_bin]; j != kNone && !listed; j = blocks_[j].next_free) {
        listed = j == i;
      }
      if (!listed) return broken("free block at ", block.offset, " is not in its bin");
    } else {
      ++live_blocks;
      used += block.granules << kGranuleLog2;
      auto live = live_.find(block.offset);
      if (live == live_.end() || live->second != i) {
        return broken("live block at ", block.offset, " is missing from the live map");
      }
    }
    previous_free = block.free;
    previous = i;
    cursor += block.granules << kGranuleLog2;
  }
  if (cursor != heap_.end()) return broken("blocks end at ", cursor, ", the heap at ", heap_.end());
  if (used != used_bytes_) return broken("live blocks hold ", used, ", counted ", used_bytes_);
  if (live_blocks != live_.size()) {
    return broken(live_blocks, " live blocks, ", live_.size(), " in the live map");
  }
  // Every bin holds free blocks of its size only, and the bitmaps say which bins are filled.
  uint64_t listed = 0;
  for (int bin = 0; bin < kBins; ++bin) {
    for (int sub_bin = 0; sub_bin < kSubBins; ++sub_bin) {
      const bool filled = heads_[bin][sub_bin] != kNone;
      if (filled != ((sub_bin_bitmap_[bin] >> sub_bin) & 1)) {
        return broken("bitmap of bin ", bin, ".", sub_bin, " is wrong");
      }
      uint32_t prev_free = kNone;
      for (uint32_t j = heads_[bin][sub_bin]; j != kNone; j = blocks_[j].next_free) {
        int b, s;
        BinOf(blocks_[j].granules, &b, &s);
        if (!blocks_[j].free || b != bin || s != sub_bin || blocks_[j].prev_free != prev_free) {
          return broken("bin ", bin, ".", sub_bin, " lists block at ", blocks_[j].offset,
                        " wrongly");
        }
        prev_free = j;
        ++listed;
      }
    }
    if ((sub_bin_bitmap_[bin] != 0) != ((bin_bitmap_ >> bin) & 1)) {
      return broken("bitmap of bin ", bin, " is wrong");
    }
  }
  if (listed != free_blocks || free_blocks != free_blocks_) {
    return broken(free_blocks, " free blocks, ", listed, " in bins, counted ", free_blocks_);
  }
  return absl::OkStatus();
}

}  // namespace tpd::shm
