// Where everything lives in the shared-memory segment of one client session, and the header
// that tells the client so. Part of the wire contract between a client and its daemon (see
// docs/data_plane.md, "Shared memory between a client and its daemon"):
//
//   offset 0         SegmentHeader (one page): magic, layout version, sizes, region offsets
//   submission ring  RingControl + slots of Descriptor        client → daemon
//   completion ring  RingControl + slots of Descriptor        daemon → client
//   tx heap          client allocates, daemon only reads      (payloads the client sends)
//   rx heap          daemon allocates, client reads, releases (payloads the client receives)
//
// Every region starts on a page boundary. The daemon computes the layout from its limits
// (ComputeLayout), writes the header once (WriteHeader) and from then on uses only its own
// private copy: the client can scribble over the header and nothing of the daemon changes. The
// client reads the header once when it maps the segment (ReadHeader) and validates it against
// the size it mapped, so a wrong header cannot make the client read outside its mapping either.
//
// Thread safety: stateless functions and plain values.

#ifndef TPD_SHM_LAYOUT_H_
#define TPD_SHM_LAYOUT_H_

#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tpd::shm {

// "TPDSHM\0\1" read as a little-endian integer.
inline constexpr uint64_t kMagic = 0x0100'4d48'5344'5054ull;
// Bumped on any change to the header, RingControl, Descriptor or TensorEntry.
inline constexpr uint32_t kLayoutVersion = 1;

inline constexpr uint64_t kPageBytes = 4096;
inline constexpr uint64_t kCacheLineBytes = 64;
// Heap blocks, and so every payload and tensor the allocators hand out, are aligned to this.
inline constexpr uint64_t kHeapAlignment = 64;

// Bounds on what a daemon may configure (and on what a client accepts from a header).
inline constexpr uint32_t kMinRingSlots = 2;
inline constexpr uint32_t kMaxRingSlots = 1u << 16;
inline constexpr uint64_t kMinHeapBytes = kPageBytes;
inline constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 40;  // 1 TiB

// Sizes of the structures that lie in shared memory (ring.h and descriptor.h assert them).
inline constexpr uint64_t kRingControlBytes = 4 * kCacheLineBytes;
inline constexpr uint64_t kDescriptorBytes = 64;
inline constexpr uint64_t kTensorEntryBytes = 96;

// The sizes a daemon chooses for one session (later: its config's [data] section).
struct SegmentLimits {
  // Descriptors each ring holds; a power of two in [kMinRingSlots, kMaxRingSlots].
  uint32_t submission_slots = 1024;
  uint32_t completion_slots = 1024;
  // Heap sizes, rounded up to whole pages; at least kMinHeapBytes each.
  uint64_t tx_heap_bytes = uint64_t{64} << 20;
  uint64_t rx_heap_bytes = uint64_t{64} << 20;
};

// A byte range [offset, offset + bytes) of the segment.
struct Region {
  uint64_t offset = 0;
  uint64_t bytes = 0;

  uint64_t end() const { return offset + bytes; }
  // True when [offset, offset + length) lies inside this region; overflow-safe.
  bool Contains(uint64_t start, uint64_t length) const;
};

struct RingLayout {
  Region region;       // RingControl, then `slots` descriptors
  uint32_t slots = 0;  // a power of two
};

// The layout of one segment. The daemon's copy comes from ComputeLayout, the client's from
// ReadHeader; both are private memory and never change after that.
struct Layout {
  uint64_t total_bytes = 0;
  RingLayout submission;  // client → daemon
  RingLayout completion;  // daemon → client
  Region tx_heap;         // the client allocates here
  Region rx_heap;         // the daemon allocates here
};

// The header at offset 0, as it lies in shared memory. Written only by the daemon, read only
// by the client (ReadHeader copies it out before checking it).
struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;  // sizeof(SegmentHeader)
  uint64_t total_bytes;
  uint32_t descriptor_bytes;    // sizeof(Descriptor)
  uint32_t tensor_entry_bytes;  // sizeof(TensorEntry)
  uint64_t submission_offset;
  uint64_t submission_bytes;
  uint64_t completion_offset;
  uint64_t completion_bytes;
  uint32_t submission_slots;
  uint32_t completion_slots;
  uint64_t tx_heap_offset;
  uint64_t tx_heap_bytes;
  uint64_t rx_heap_offset;
  uint64_t rx_heap_bytes;
};
static_assert(std::is_trivially_copyable_v<SegmentHeader>);
static_assert(sizeof(SegmentHeader) == 104, "SegmentHeader is part of the wire contract");

// Bytes a ring region needs for `slots` descriptors: its RingControl plus the slots.
uint64_t RingRegionBytes(uint32_t slots);

// The layout for `limits`: INVALID_ARGUMENT naming the limit and its value when a slot count
// is not a power of two in range, a heap is too small, or the whole segment would exceed
// kMaxSegmentBytes.
absl::StatusOr<Layout> ComputeLayout(const SegmentLimits& limits);

// Checks that `layout` is one this library could have produced for a segment of
// `layout.total_bytes`: regions page-aligned, in order, inside the segment and not
// overlapping, ring sizes matching their slot counts. Messages name the region and values.
absl::Status ValidateLayout(const Layout& layout);

// Writes the header for `layout` at `segment_base` (the daemon, once, before the client maps).
void WriteHeader(const Layout& layout, void* segment_base);

// Copies the header out of a mapping of `mapped_bytes` at `segment_base` and validates it
// (magic, version, structure sizes, total size == mapped_bytes, ValidateLayout):
// FAILED_PRECONDITION naming the field and value when anything is off.
absl::StatusOr<Layout> ReadHeader(const void* segment_base, uint64_t mapped_bytes);

// "[offset, end)" for messages.
std::string DescribeRegion(const Region& region);

}  // namespace tpd::shm

#endif  // TPD_SHM_LAYOUT_H_
