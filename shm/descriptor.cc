#include "shm/descriptor.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tpd::shm {
namespace {

const char* DirectionName(Direction direction) {
  return direction == Direction::kSubmission ? "submission" : "completion";
}

// The heap a message's payload, table and tensors lie in, and the one a release names.
const Region& SendHeap(const Layout& layout, Direction direction) {
  return direction == Direction::kSubmission ? layout.tx_heap : layout.rx_heap;
}
const Region& ReleaseHeap(const Layout& layout, Direction direction) {
  return direction == Direction::kSubmission ? layout.rx_heap : layout.tx_heap;
}
const char* SendHeapName(Direction direction) {
  return direction == Direction::kSubmission ? "tx heap" : "rx heap";
}
const char* ReleaseHeapName(Direction direction) {
  return direction == Direction::kSubmission ? "rx heap" : "tx heap";
}

class Refuser {
 public:
  Refuser(Direction direction, const Descriptor& d) : direction_(direction), d_(d) {}

  absl::Status operator()(absl::string_view field, const absl::AlphaNum& value,
                          absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(DirectionName(direction_), " descriptor (op ",
                                                   OpName(d_.op), ", call ", d_.call_id,
                                                   "): ", field, " ", value, " ", why));
  }

 private:
  Direction direction_;
  const Descriptor& d_;
};

// [offset, offset + length) must lie in `heap`; an empty range must have offset 0.
absl::Status CheckRange(const Refuser& refuse, absl::string_view offset_field, uint64_t offset,
                        absl::string_view length_field, uint64_t length, const Region& heap,
                        const char* heap_name) {
  if (length == 0) {
    if (offset != 0)
      return refuse(offset_field, offset, absl::StrCat("must be 0 when ", length_field, " is 0"));
    return absl::OkStatus();
  }
  if (!heap.Contains(offset, 0) || offset == heap.end()) {
    return refuse(offset_field, offset,
                  absl::StrCat("is outside the ", heap_name, " ", DescribeRegion(heap)));
  }
  if (!heap.Contains(offset, length)) {
    return refuse(length_field, length,
                  absl::StrCat("at ", offset_field, " ", offset, " runs past the end of the ",
                               heap_name, " ", DescribeRegion(heap)));
  }
  return absl::OkStatus();
}

// The fields every descriptor has: a known op going its way, reserved fields 0, known flags
// where they may be, a call id, a deadline only on a call.
absl::Status CheckHeader(const Descriptor& d, Direction direction, const Refuser& refuse) {
  const Op op = static_cast<Op>(d.op);
  if (op != Op::kCall && op != Op::kReply && op != Op::kRelease && op != Op::kCancel &&
      op != Op::kDevicePool && op != Op::kPeerGone && op != Op::kStore) {
    return refuse("op", d.op,
                  "is not an op (call 1, reply 2, release 3, cancel 4, device pool 5, peer "
                  "gone 6, store 7)");
  }
  if (op == Op::kStore && direction != Direction::kSubmission) {
    return refuse("op", d.op, "(store) only goes from the client to the daemon");
  }
  if (op == Op::kDevicePool && direction != Direction::kSubmission) {
    return refuse("op", d.op, "(device pool) only goes from the client to the daemon");
  }
  if (op == Op::kPeerGone && direction != Direction::kCompletion) {
    return refuse("op", d.op, "(peer gone) only goes from the daemon to the client");
  }
  if (d.reserved0 != 0) return refuse("reserved0", d.reserved0, "must be 0");
  if (d.device_pool != 0 && (op != Op::kRelease || direction != Direction::kSubmission)) {
    return refuse("device_pool", d.device_pool, "must be 0 except in a client's release");
  }
  if (d.device_pool > kMaxCudaDevices) {
    return refuse("device_pool", d.device_pool,
                  absl::StrCat("names no CUDA device (1 + an index below ", kMaxCudaDevices, ")"));
  }
  if (d.reserved2 != 0) return refuse("reserved2", d.reserved2, "must be 0");
  if ((d.flags & ~kKnownFlags) != 0) {
    return refuse("flags", d.flags, absl::StrCat("has unknown bits (known: ", kKnownFlags, ")"));
  }
  if ((d.flags & kFlagError) != 0 && op != Op::kReply) {
    return refuse("flags", d.flags, "has the error bit, which only a reply may carry");
  }
  if ((d.flags & kFlagReverseMap) != 0 && op != Op::kCall) {
    return refuse("flags", d.flags, "has the reverse-map bit, which only a call may carry");
  }
  if (d.call_id == 0) return refuse("call_id", d.call_id, "must not be 0");
  if (d.deadline_unix_ns < 0) {
    return refuse("deadline_unix_ns", d.deadline_unix_ns, "is negative (0 means no deadline)");
  }
  if (d.deadline_unix_ns != 0 && op != Op::kCall) {
    return refuse("deadline_unix_ns", d.deadline_unix_ns, "must be 0: only a call has a deadline");
  }
  return absl::OkStatus();
}

// A release, a cancel or a peer's end: no message, and a release's block start in the heap (or
// the receive pool) it goes back to.
absl::Status CheckRelease(const Descriptor& d, Op op, const Layout& layout, Direction direction,
                          const Refuser& refuse) {
  if (d.payload_length != 0) return refuse("payload_length", d.payload_length, "must be 0");
  if (d.tensor_count != 0) return refuse("tensor_count", d.tensor_count, "must be 0");
  if (d.tensor_table_offset != 0) {
    return refuse("tensor_table_offset", d.tensor_table_offset, "must be 0");
  }
  if (op == Op::kCancel || op == Op::kPeerGone) {
    if (d.payload_offset != 0) return refuse("payload_offset", d.payload_offset, "must be 0");
    return absl::OkStatus();
  }
  if (d.device_pool != 0) {
    // An offset in the client's receive pool: the daemon's pool allocator checks it.
    if (d.payload_offset == 0 || d.payload_offset % kHeapAlignment != 0) {
      return refuse("payload_offset", d.payload_offset,
                    absl::StrCat("is not a block start of a receive pool (blocks are ",
                                 kHeapAlignment, "-byte aligned)"));
    }
    return absl::OkStatus();
  }
  const Region& heap = ReleaseHeap(layout, direction);
  if (!heap.Contains(d.payload_offset, 1)) {
    return refuse("payload_offset", d.payload_offset,
                  absl::StrCat("is outside the ", ReleaseHeapName(direction), " ",
                               DescribeRegion(heap), " it releases into"));
  }
  if ((d.payload_offset - heap.offset) % kHeapAlignment != 0) {
    return refuse(
        "payload_offset", d.payload_offset,
        absl::StrCat("is not a block start (blocks are ", kHeapAlignment, "-byte aligned)"));
  }
  return absl::OkStatus();
}

// A message (call, reply, store call, device pool): its payload and tensor table inside the
// sender's heap.
absl::Status CheckMessage(const Descriptor& d, Op op, const Layout& layout, Direction direction,
                          const Refuser& refuse) {
  const Region& heap = SendHeap(layout, direction);
  const char* heap_name = SendHeapName(direction);
  if (absl::Status s = CheckRange(refuse, "payload_offset", d.payload_offset, "payload_length",
                                  d.payload_length, heap, heap_name);
      !s.ok()) {
    return s;
  }
  if (d.tensor_count > kMaxTensorsPerMessage) {
    return refuse("tensor_count", d.tensor_count,
                  absl::StrCat("exceeds the limit of ", kMaxTensorsPerMessage));
  }
  // At most 4096 × 96 bytes: cannot overflow.
  const uint64_t table_bytes = uint64_t{d.tensor_count} * sizeof(TensorEntry);
  if (absl::Status s = CheckRange(refuse, "tensor_table_offset", d.tensor_table_offset,
                                  "tensor_count × 96", table_bytes, heap, heap_name);
      !s.ok()) {
    return s;
  }
  if (d.tensor_table_offset % alignof(TensorEntry) != 0) {
    return refuse("tensor_table_offset", d.tensor_table_offset,
                  absl::StrCat("is not ", alignof(TensorEntry), "-byte aligned"));
  }
  if (op == Op::kStore && d.tensor_count != 0) {
    return refuse("tensor_count", d.tensor_count, "must be 0: a store call carries no tensors");
  }
  if (op == Op::kDevicePool) {
    if (d.payload_length != sizeof(DevicePoolRecord)) {
      return refuse("payload_length", d.payload_length,
                    absl::StrCat("must be ", sizeof(DevicePoolRecord), " (a device pool record)"));
    }
    if (d.tensor_count != 0) return refuse("tensor_count", d.tensor_count, "must be 0");
  }
  return absl::OkStatus();
}

// Says why a tensor entry is refused, naming its index.
class TensorRefuser {
 public:
  TensorRefuser(Direction direction, uint32_t index) : direction_(direction), index_(index) {}

  absl::Status operator()(absl::string_view field, const absl::AlphaNum& value,
                          absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(DirectionName(direction_), " tensor ", index_,
                                                   ": ", field, " ", value, " ", why));
  }

 private:
  Direction direction_;
  uint32_t index_;
};

bool IsCuda(const TensorEntry& e) {
  return e.device_type == static_cast<uint8_t>(DeviceType::kCuda);
}

// A CPU tensor of a completion with a device handle lies in that peer's tx heap.
bool InPeerHeap(const TensorEntry& e, Direction direction) {
  return direction == Direction::kCompletion && !IsCuda(e) && e.device_handle != 0;
}

// What the entry is: a dtype, at most kMaxTensorDims dimensions, a device it may name.
absl::Status CheckTensorKind(const TensorEntry& e, Direction direction,
                             const TensorRefuser& refuse) {
  if (ItemBytes(e.dtype) == 0) return refuse("dtype", e.dtype, "is not a dtype code (1..12)");
  if (e.ndim > kMaxTensorDims) {
    return refuse("ndim", e.ndim, absl::StrCat("exceeds ", int{kMaxTensorDims}));
  }
  if (e.reserved0 != 0) return refuse("reserved0", e.reserved0, "must be 0");
  const bool cuda = IsCuda(e);
  if (!cuda && e.device_type != static_cast<uint8_t>(DeviceType::kCpu)) {
    return refuse("device_type", e.device_type, "is not a device type (cpu 0, cuda 1)");
  }
  if (!cuda) {
    if (e.device_index != 0) return refuse("device_index", e.device_index, "must be 0 for cpu");
    if (direction == Direction::kSubmission && e.device_handle != 0 &&
        e.device_handle != kInRxHeap) {
      return refuse("device_handle", e.device_handle,
                    "must be 0 (tx heap) or 1 (rx heap) for cpu in a submission");
    }
  } else if (e.device_index >= kMaxCudaDevices) {
    return refuse("device_index", e.device_index, absl::StrCat("is not below ", kMaxCudaDevices));
  }
  return absl::OkStatus();
}

// Its length is its shape's product times the item size, with no overflow.
absl::Status CheckTensorLength(const TensorEntry& e, const TensorRefuser& refuse) {
  const uint64_t item = ItemBytes(e.dtype);
  uint64_t expected = item;
  for (int dim = 0; dim < kMaxTensorDims; ++dim) {
    const std::string field = absl::StrCat("shape[", dim, "]");
    if (dim >= e.ndim) {
      if (e.shape[dim] != 0) {
        return refuse(field, e.shape[dim], absl::StrCat("must be 0 past ndim ", int{e.ndim}));
      }
      continue;
    }
    if (e.shape[dim] < 0) return refuse(field, e.shape[dim], "is negative");
    if (__builtin_mul_overflow(expected, static_cast<uint64_t>(e.shape[dim]), &expected)) {
      return refuse(field, e.shape[dim], "makes the tensor's byte size overflow");
    }
  }
  if (e.length != expected) {
    return refuse("length", e.length,
                  absl::StrCat("differs from shape × item size (", item, ") = ", expected));
  }
  return absl::OkStatus();
}

// A CUDA tensor's offset and device handle: in a submission the handle is an export record in
// the client's tx heap, in a completion 0 or a copy signal in the rx heap.
absl::Status CheckCudaPlacement(const TensorEntry& e, uint64_t item, const Region& heap,
                                const char* heap_name, Direction direction,
                                const TensorRefuser& refuse) {
  if (e.offset % item != 0) {
    return refuse("offset", e.offset,
                  absl::StrCat("is not aligned to the dtype's ", item, "-byte items"));
  }
  if (direction == Direction::kCompletion) {
    if (e.device_handle != 0 &&
        (e.device_handle % kHeapAlignment != 0 || !heap.Contains(e.device_handle, 0) ||
         !heap.Contains(e.device_handle, kCopySignalBytes))) {
      return refuse("device_handle", e.device_handle,
                    absl::StrCat("is not 0 or an aligned copy signal inside the ", heap_name, " ",
                                 DescribeRegion(heap)));
    }
    return absl::OkStatus();
  }
  if (e.device_handle % alignof(CudaExport) != 0 || !heap.Contains(e.device_handle, 0) ||
      !heap.Contains(e.device_handle, sizeof(CudaExport))) {
    return refuse("device_handle", e.device_handle,
                  absl::StrCat("is not an aligned CUDA export record inside the ", heap_name, " ",
                               DescribeRegion(heap)));
  }
  return absl::OkStatus();
}

// A host tensor's bytes: in a peer's heap (checked by who maps it) or inside the sender's heap.
absl::Status CheckHostPlacement(const TensorEntry& e, uint64_t item, const Region& heap,
                                const char* heap_name, Direction direction,
                                const TensorRefuser& refuse) {
  if (InPeerHeap(e, direction)) {
    if (e.offset % item != 0) {
      return refuse("offset", e.offset,
                    absl::StrCat("is not aligned to the dtype's ", item, "-byte items"));
    }
    return absl::OkStatus();
  }
  if (!heap.Contains(e.offset, 0) || e.offset == heap.end()) {
    return refuse("offset", e.offset,
                  absl::StrCat("is outside the ", heap_name, " ", DescribeRegion(heap)));
  }
  if (!heap.Contains(e.offset, e.length)) {
    return refuse("length", e.length,
                  absl::StrCat("at offset ", e.offset, " runs past the end of the ", heap_name, " ",
                               DescribeRegion(heap)));
  }
  if (e.offset % item != 0) {
    return refuse("offset", e.offset,
                  absl::StrCat("is not aligned to the dtype's ", item, "-byte items"));
  }
  return absl::OkStatus();
}

}  // namespace

Descriptor MessageDescriptor(Op op, uint64_t call_id, const MessageBlock& block, uint16_t flags,
                             int64_t deadline_unix_ns) {
  Descriptor d{};
  d.op = static_cast<uint8_t>(op);
  d.flags = flags;
  d.tensor_count = block.tensor_count;
  d.call_id = call_id;
  d.deadline_unix_ns = deadline_unix_ns;
  d.payload_offset = block.offset;
  d.payload_length = block.length;
  d.tensor_table_offset = block.tensor_count == 0 ? 0 : block.offset + block.table;
  return d;
}

uint64_t ItemBytes(uint8_t dtype) {
  switch (static_cast<DType>(dtype)) {
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
    case DType::kComplex64:
      return 8;
    case DType::kComplex128:
      return 16;
  }
  return 0;
}

absl::string_view OpName(uint8_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kCall:
      return "call";
    case Op::kReply:
      return "reply";
    case Op::kRelease:
      return "release";
    case Op::kCancel:
      return "cancel";
    case Op::kDevicePool:
      return "device pool";
    case Op::kPeerGone:
      return "peer gone";
    case Op::kStore:
      return "store";
  }
  return "unknown";
}

absl::Status ValidateDescriptor(const Descriptor& d, const Layout& layout, Direction direction) {
  const Refuser refuse(direction, d);
  if (absl::Status s = CheckHeader(d, direction, refuse); !s.ok()) return s;
  const Op op = static_cast<Op>(d.op);
  if (op == Op::kRelease || op == Op::kCancel || op == Op::kPeerGone) {
    return CheckRelease(d, op, layout, direction, refuse);
  }
  return CheckMessage(d, op, layout, direction, refuse);
}

absl::Status ValidateTensorEntry(const TensorEntry& e, uint32_t index, const Layout& layout,
                                 Direction direction) {
  const TensorRefuser refuse(direction, index);
  if (absl::Status s = CheckTensorKind(e, direction, refuse); !s.ok()) return s;
  if (absl::Status s = CheckTensorLength(e, refuse); !s.ok()) return s;
  const Region& heap = SendHeap(layout, direction);
  const char* heap_name = SendHeapName(direction);
  if (e.length == 0) {
    if (e.offset != 0) return refuse("offset", e.offset, "must be 0 when length is 0");
    if (e.device_handle != 0) {
      return refuse("device_handle", e.device_handle, "must be 0 when length is 0");
    }
    return absl::OkStatus();
  }
  const uint64_t item = ItemBytes(e.dtype);
  if (IsCuda(e)) return CheckCudaPlacement(e, item, heap, heap_name, direction, refuse);
  if (direction == Direction::kSubmission && e.device_handle == kInRxHeap) {
    return CheckHostPlacement(e, item, layout.rx_heap, "rx heap", direction, refuse);
  }
  return CheckHostPlacement(e, item, heap, heap_name, direction, refuse);
}

absl::StatusOr<std::vector<TensorEntry>> ReadTensorTable(const Descriptor& descriptor,
                                                         const void* segment_base,
                                                         const Layout& layout,
                                                         Direction direction) {
  // Cheap, and keeps a caller that skipped ValidateDescriptor in bounds.
  if (absl::Status s = ValidateDescriptor(descriptor, layout, direction); !s.ok()) return s;
  std::vector<TensorEntry> table(descriptor.tensor_count);
  if (table.empty()) return table;
  std::memcpy(table.data(),
              static_cast<const uint8_t*>(segment_base) + descriptor.tensor_table_offset,
              table.size() * sizeof(TensorEntry));
  for (uint32_t i = 0; i < table.size(); ++i) {
    if (absl::Status s = ValidateTensorEntry(table[i], i, layout, direction); !s.ok()) return s;
  }
  return table;
}

}  // namespace tpd::shm
