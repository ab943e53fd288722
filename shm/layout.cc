#include "shm/layout.h"

#include <cstring>

#include "absl/numeric/bits.h"
#include "absl/strings/str_cat.h"

namespace tpd::shm {
namespace {

// Rounds `value` up to a multiple of `to` (a power of two); false on overflow.
bool RoundUp(uint64_t value, uint64_t to, uint64_t* out) {
  uint64_t sum;
  if (__builtin_add_overflow(value, to - 1, &sum)) return false;
  *out = sum & ~(to - 1);
  return true;
}

absl::Status CheckSlots(const char* name, uint32_t slots) {
  if (slots < kMinRingSlots || slots > kMaxRingSlots || !absl::has_single_bit(slots)) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is ", slots,
                                                   ": it must be a power of two in [",
                                                   kMinRingSlots, ", ", kMaxRingSlots, "]"));
  }
  return absl::OkStatus();
}

// Appends a region of `bytes` (rounded up to pages) at `*cursor`; false on overflow.
bool Place(uint64_t bytes, uint64_t* cursor, Region* region) {
  uint64_t rounded;
  if (!RoundUp(bytes, kPageBytes, &rounded)) return false;
  region->offset = *cursor;
  region->bytes = rounded;
  return !__builtin_add_overflow(*cursor, rounded, cursor);
}

absl::Status CheckRegion(const char* name, const Region& region, uint64_t not_before,
                         uint64_t total) {
  if (region.offset % kPageBytes != 0 || region.bytes % kPageBytes != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared-memory layout: ", name, " ", DescribeRegion(region), " is not page-aligned"));
  }
  if (region.offset < not_before) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory layout: ", name, " ", DescribeRegion(region), " starts before ",
                     not_before, " (it overlaps the region before it)"));
  }
  if (!Region{0, total}.Contains(region.offset, region.bytes)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory layout: ", name, " ", DescribeRegion(region),
                     " ends past the segment's ", total, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckRing(const char* name, const RingLayout& ring, uint64_t not_before,
                       uint64_t total) {
  if (absl::Status s = CheckSlots(name, ring.slots); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("shared-memory layout: ", s.message()));
  }
  if (absl::Status s = CheckRegion(name, ring.region, not_before, total); !s.ok()) return s;
  if (ring.region.bytes < RingRegionBytes(ring.slots)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory layout: ", name, " ", DescribeRegion(ring.region), " holds ",
                     ring.region.bytes, " bytes, fewer than the ", RingRegionBytes(ring.slots),
                     " its ", ring.slots, " slots need"));
  }
  return absl::OkStatus();
}

absl::Status CheckHeap(const char* name, const Region& heap, uint64_t not_before, uint64_t total) {
  if (absl::Status s = CheckRegion(name, heap, not_before, total); !s.ok()) return s;
  if (heap.bytes < kMinHeapBytes) {
    return absl::FailedPreconditionError(absl::StrCat("shared-memory layout: ", name, " holds ",
                                                      heap.bytes, " bytes, fewer than ",
                                                      kMinHeapBytes));
  }
  return absl::OkStatus();
}

}  // namespace

bool Region::Contains(uint64_t start, uint64_t length) const {
  uint64_t stop;
  if (__builtin_add_overflow(start, length, &stop)) return false;
  return start >= offset && stop <= end();
}

std::string DescribeRegion(const Region& region) {
  return absl::StrCat("[", region.offset, ", ", region.offset + region.bytes, ")");
}

uint64_t RingRegionBytes(uint32_t slots) {
  return kRingControlBytes + uint64_t{slots} * kDescriptorBytes;
}

absl::StatusOr<Layout> ComputeLayout(const SegmentLimits& limits) {
  if (absl::Status s = CheckSlots("submission_slots", limits.submission_slots); !s.ok()) return s;
  if (absl::Status s = CheckSlots("completion_slots", limits.completion_slots); !s.ok()) return s;
  if (limits.tx_heap_bytes < kMinHeapBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tx_heap_bytes is ", limits.tx_heap_bytes,
                                                   ": it must be at least ", kMinHeapBytes));
  }
  if (limits.rx_heap_bytes < kMinHeapBytes) {
    return absl::InvalidArgumentError(absl::StrCat("rx_heap_bytes is ", limits.rx_heap_bytes,
                                                   ": it must be at least ", kMinHeapBytes));
  }
  Layout layout;
  uint64_t cursor = kPageBytes;  // the header's page
  bool ok = Place(RingRegionBytes(limits.submission_slots), &cursor, &layout.submission.region) &&
            Place(RingRegionBytes(limits.completion_slots), &cursor, &layout.completion.region) &&
            Place(limits.tx_heap_bytes, &cursor, &layout.tx_heap) &&
            Place(limits.rx_heap_bytes, &cursor, &layout.rx_heap);
  if (!ok || cursor > kMaxSegmentBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory segment for tx_heap_bytes ", limits.tx_heap_bytes, " and rx_heap_bytes ",
        limits.rx_heap_bytes, " would exceed ", kMaxSegmentBytes, " bytes"));
  }
  layout.submission.slots = limits.submission_slots;
  layout.completion.slots = limits.completion_slots;
  layout.total_bytes = cursor;
  if (absl::Status s = ValidateLayout(layout); !s.ok()) {
    return absl::InternalError(absl::StrCat("computed an invalid layout: ", s.message()));
  }
  return layout;
}

absl::Status ValidateLayout(const Layout& layout) {
  const uint64_t total = layout.total_bytes;
  if (total > kMaxSegmentBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory layout: total_bytes ", total, " exceeds ", kMaxSegmentBytes));
  }
  if (absl::Status s = CheckRing("submission ring", layout.submission, kPageBytes, total);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckRing("completion ring", layout.completion, layout.submission.region.end(), total);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckHeap("tx heap", layout.tx_heap, layout.completion.region.end(), total);
      !s.ok()) {
    return s;
  }
  return CheckHeap("rx heap", layout.rx_heap, layout.tx_heap.end(), total);
}

void WriteHeader(const Layout& layout, void* segment_base) {
  SegmentHeader header{};
  header.magic = kMagic;
  header.version = kLayoutVersion;
  header.header_bytes = sizeof(SegmentHeader);
  header.total_bytes = layout.total_bytes;
  header.descriptor_bytes = kDescriptorBytes;
  header.tensor_entry_bytes = kTensorEntryBytes;
  header.submission_offset = layout.submission.region.offset;
  header.submission_bytes = layout.submission.region.bytes;
  header.completion_offset = layout.completion.region.offset;
  header.completion_bytes = layout.completion.region.bytes;
  header.submission_slots = layout.submission.slots;
  header.completion_slots = layout.completion.slots;
  header.tx_heap_offset = layout.tx_heap.offset;
  header.tx_heap_bytes = layout.tx_heap.bytes;
  header.rx_heap_offset = layout.rx_heap.offset;
  header.rx_heap_bytes = layout.rx_heap.bytes;
  std::memcpy(segment_base, &header, sizeof(header));
}

absl::StatusOr<Layout> ReadHeader(const void* segment_base, uint64_t mapped_bytes) {
  if (mapped_bytes < kPageBytes) {
    return absl::FailedPreconditionError(absl::StrCat("shared-memory segment of ", mapped_bytes,
                                                      " bytes is smaller than its header page"));
  }
  SegmentHeader header;
  std::memcpy(&header, segment_base, sizeof(header));  // one copy; only the copy is checked
  auto field = [](const char* name, uint64_t value, uint64_t expected) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory header: ", name, " is ", value, ", expected ", expected));
  };
  if (header.magic != kMagic) return field("magic", header.magic, kMagic);
  if (header.version != kLayoutVersion) {
    return field("layout version", header.version, kLayoutVersion);
  }
  if (header.header_bytes != sizeof(SegmentHeader)) {
    return field("header_bytes", header.header_bytes, sizeof(SegmentHeader));
  }
  if (header.descriptor_bytes != kDescriptorBytes) {
    return field("descriptor_bytes", header.descriptor_bytes, kDescriptorBytes);
  }
  if (header.tensor_entry_bytes != kTensorEntryBytes) {
    return field("tensor_entry_bytes", header.tensor_entry_bytes, kTensorEntryBytes);
  }
  if (header.total_bytes != mapped_bytes) {
    return field("total_bytes", header.total_bytes, mapped_bytes);
  }
  Layout layout;
  layout.total_bytes = header.total_bytes;
  layout.submission.region = {header.submission_offset, header.submission_bytes};
  layout.submission.slots = header.submission_slots;
  layout.completion.region = {header.completion_offset, header.completion_bytes};
  layout.completion.slots = header.completion_slots;
  layout.tx_heap = {header.tx_heap_offset, header.tx_heap_bytes};
  layout.rx_heap = {header.rx_heap_offset, header.rx_heap_bytes};
  if (absl::Status s = ValidateLayout(layout); !s.ok()) return s;
  return layout;
}

}  // namespace tpd::shm
