// What travels through the rings: fixed-size descriptors that point at payloads and tensor
// tables in the heaps, and the checks every reader applies before it believes one.
//
// A descriptor is 64 bytes (one cache line, one ring slot). Its payload and tensor table lie
// in the sender's heap: a submission (client → daemon) points into the tx heap, a completion
// (daemon → client) into the rx heap. A `release` names a block of the *other* heap that the
// sender is done with: the client returns rx blocks the daemon gave it, the daemon returns tx
// blocks it has finished reading. Offsets are absolute offsets into the segment.
//
// Everything read from shared memory is untrusted. The reader copies a descriptor (or a
// tensor table) out of shared memory exactly once and validates the private copy, so the
// writer cannot change it between the check and the use:
//
//   Descriptor d;                        // the ring's TryPop copies the slot out
//   if (!ValidateDescriptor(d, layout, Direction::kSubmission).ok()) → end the session
//   auto tensors = ReadTensorTable(d, base, layout, Direction::kSubmission);
//
// Thread safety: plain structs and stateless functions.

#ifndef TPD_SHM_DESCRIPTOR_H_
#define TPD_SHM_DESCRIPTOR_H_

#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shm/layout.h"

namespace tpd::shm {

enum class Op : uint8_t {
  kCall = 1,     // a call: to a worker (submission) or to this client's handler (completion)
  kReply = 2,    // the answer to a call, matched by call_id
  kRelease = 3,  // the sender is done with the other side's heap block at payload_offset
  kCancel = 4,   // the call call_id is cancelled
  // Submission only: the client lends the daemon a receive pool on a CUDA device (payload: a
  // DevicePoolRecord); answered by a kReply with the same call_id (an error, or empty).
  kDevicePool = 5,
  // Completion only: the session whose segment this client was sent as peer `call_id` (on its
  // data connection: shm/peer_notice.h) ended. Its mapping may go once no received
  // tensor points into it. Nothing else is set.
  kPeerGone = 6,
  // Submission only: a call of the daemon's Store service (the store over shared memory,
  // daemon/store_service.h ServeLocal): a message whose names are {group ("" for the
  // daemon's store), "", method ("Set", "Get", ...), ""} and whose body is the serialized
  // request; no tensors, no deadline (a waiting request carries its timeout). Answered by a
  // kReply with the same call_id whose body is the serialized response, or an error.
  kStore = 7,
};

// Descriptor::flags.
// kReply only: the payload holds an error (its code and message). An error reply from the
// daemon with no payload at all means RESOURCE_EXHAUSTED: the receiver's rx heap had no room
// for the message, and the call failed rather than go unanswered.
inline constexpr uint16_t kFlagError = 1u << 0;
// kCall only: its tensors go by the reverse of the callee's device map toward the caller (the
// map the callee's replies take), not by the caller's map toward the callee: PyTorch's
// distributed autograd sends gradients back by the map their forward pass took.
inline constexpr uint16_t kFlagReverseMap = 1u << 1;
inline constexpr uint16_t kKnownFlags = kFlagError | kFlagReverseMap;

// Which ring a descriptor came through; decides which heap its ranges must lie in.
enum class Direction : uint8_t {
  kSubmission,  // client → daemon: payloads in the tx heap, releases name rx blocks
  kCompletion,  // daemon → client: payloads in the rx heap, releases name tx blocks
};

// One ring slot. Fields not used by an op must be zero (reserved ones always), so garbage is
// refused rather than ignored and later versions can give them a meaning.
struct Descriptor {
  uint8_t op;                    // Op
  uint8_t reserved0;             // must be 0
  uint16_t flags;                // kFlag* bits
  uint32_t tensor_count;         // entries in the tensor table, at most kMaxTensorsPerMessage
  uint64_t call_id;              // non-zero; chosen by the side that made the call
  int64_t deadline_unix_ns;      // kCall only: absolute deadline, 0 for none
  uint64_t payload_offset;       // kRelease: the block released; 0 when payload_length is 0
  uint64_t payload_length;       // kRelease: 0
  uint64_t tensor_table_offset;  // tensor_count TensorEntry; 0 when tensor_count is 0
  // kRelease by the client only: 0 releases a block of the rx heap; 1 + d a block of its
  // receive pool on cuda:d, payload_offset then being the offset in that pool. Else 0.
  uint64_t device_pool;
  uint64_t reserved2;  // must be 0
};
static_assert(std::is_trivially_copyable_v<Descriptor>);
static_assert(std::is_standard_layout_v<Descriptor>);
static_assert(sizeof(Descriptor) == kDescriptorBytes);

inline constexpr uint32_t kMaxTensorsPerMessage = 4096;
// CUDA device indices a message may name: device_index < kMaxCudaDevices.
inline constexpr uint32_t kMaxCudaDevices = 64;
inline constexpr uint8_t kMaxTensorDims = 8;

enum class DType : uint8_t {
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt8 = 5,
  kUInt8 = 6,
  kInt16 = 7,
  kInt32 = 8,
  kInt64 = 9,
  kBool = 10,
  kComplex64 = 11,
  kComplex128 = 12,
};

enum class DeviceType : uint8_t {
  kCpu = 0,
  kCuda = 1,
};

// One tensor of a message: contiguous bytes in the sender's heap, or in CUDA device memory.
//
// A CPU tensor in a completion lies in the rx heap when `device_handle` is 0. Otherwise its
// bytes were not copied: they lie in the tx heap of the sending session, whose segment this
// client was sent as peer `device_handle` (shm/peer_notice.h), at `offset` in that
// segment; the client checks the range against the tx heap the notice named. In a
// submission a CPU tensor's device_handle is 0 (its bytes lie in the tx heap) or kInRxHeap:
// they lie in the sending session's own rx heap, where a message it received put them (a
// received tensor sent back or on where it lies; the client keeps that rx block until the
// daemon releases the submission, and the daemon reads nothing outside the rx heap).
//
// A CUDA tensor (device_type kCuda, device_index d) in a submission lies in an allocation
// the client exports with CUDA IPC: `offset` is the tensor's byte offset in that allocation
// and `device_handle` the segment offset of a CudaExport record in the tx heap naming it (0
// when length is 0). In a completion it lies in the receiving client's receive pool on
// cuda:d (kDevicePool): `offset` is the offset in the pool, and the bytes are there when the
// descriptor is (the daemon posted it after its copy completed) when device_handle is 0;
// otherwise device_handle is the segment offset of a CopySignal in the rx heap
// (shm/copy_signal.h, kCopySignalBytes) that says when they are.
struct TensorEntry {
  uint8_t dtype;                  // DType
  uint8_t ndim;                   // <= kMaxTensorDims
  uint8_t device_type;            // DeviceType
  uint8_t reserved0;              // must be 0
  uint32_t device_index;          // 0 for kCpu; < kMaxCudaDevices for kCuda
  uint64_t offset;                // aligned to the dtype's item size; 0 when length is 0
  uint64_t length;                // == product(shape[0..ndim)) * item size
  int64_t shape[kMaxTensorDims];  // >= 0; dims past ndim must be 0
  uint64_t device_handle;         // see above
};
static_assert(std::is_trivially_copyable_v<TensorEntry>);
static_assert(std::is_standard_layout_v<TensorEntry>);
static_assert(sizeof(TensorEntry) == kTensorEntryBytes);
static_assert(alignof(TensorEntry) == 8);

// TensorEntry::device_handle of a submitted CPU tensor whose bytes lie in the rx heap.
inline constexpr uint64_t kInRxHeap = 1;

// The size of a shm::CopySignal (shm/copy_signal.h), kHeapAlignment-aligned.
inline constexpr uint64_t kCopySignalBytes = 128;

// The size of a CUDA IPC handle (CU_IPC_HANDLE_SIZE), so this header needs no cuda.h.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// Where a submitted CUDA tensor's bytes are, in the tx heap (TensorEntry::device_handle).
// Untrusted like everything else: the daemon opens `memory` with the driver, which says the
// allocation's device and size; the tensor must lie inside it. The bytes must be final when
// the record is submitted (the client synchronizes the tensor's stream first): the daemon
// never waits on an event of a client's, which could stall every copy on that device.
struct alignas(8) CudaExport {
  uint8_t memory[kCudaIpcHandleBytes];         // CUipcMemHandle of the allocation's base
  uint8_t reserved[kCudaIpcHandleBytes + 16];  // must be 0
};
static_assert(std::is_trivially_copyable_v<CudaExport>);
static_assert(sizeof(CudaExport) == 144);

// The payload of a kDevicePool submission: device memory of the client's (cuMemAlloc) that
// the daemon may copy CUDA tensors into for it; it stays lent for the session's life.
struct DevicePoolRecord {
  uint8_t memory[kCudaIpcHandleBytes];  // CUipcMemHandle of the pool's allocation
  uint32_t device;                      // the CUDA device index it lies on
  uint32_t reserved;                    // must be 0
  uint64_t bytes;                       // the pool's size, at most the allocation's
};
static_assert(std::is_trivially_copyable_v<DevicePoolRecord>);
static_assert(sizeof(DevicePoolRecord) == 80);

// Where a message lies in a heap block: its `length` bytes (prefix, names, body) at the
// block's start, then `tensor_count` TensorEntry at `table` bytes from it.
struct MessageBlock {
  uint64_t offset = 0;  // the block's, in the segment
  uint64_t length = 0;
  uint64_t table = 0;
  uint32_t tensor_count = 0;
};

// The descriptor that posts `block` as a message (kCall or kReply) with `call_id`: every
// producer of messages, client and daemon, fills one through this.
Descriptor MessageDescriptor(Op op, uint64_t call_id, const MessageBlock& block, uint16_t flags = 0,
                             int64_t deadline_unix_ns = 0);

// Bytes per element of `dtype`, 0 for a code that is not a DType.
uint64_t ItemBytes(uint8_t dtype);
absl::string_view OpName(uint8_t op);

// Checks a private copy of a descriptor that came through the `direction` ring of a segment
// with `layout`: op known; flags known and allowed for the op; reserved fields zero; call_id
// non-zero; deadline non-negative (kCall) or zero; payload and tensor table (count bounded,
// aligned, no overflow) inside the heap `direction` allows; a release naming an offset inside
// the other heap with no length and no tensors; a cancel carrying nothing. INVALID_ARGUMENT
// naming the direction, the field and its value on the first problem.
absl::Status ValidateDescriptor(const Descriptor& descriptor, const Layout& layout,
                                Direction direction);

// Checks a private copy of the `index`-th tensor entry of a message: dtype known, ndim
// bounded, unused dims zero, shape × item size == length (checked arithmetic), offset
// aligned to the item size; a CPU tensor's [offset, offset + length) inside the heap
// `direction` allows (or, in a completion, a peer's: the client checks that range); a CUDA tensor's
// device index below kMaxCudaDevices and, in a submission, its CudaExport record inside the tx heap
// (what lies in device memory only the driver can check). INVALID_ARGUMENT naming the tensor index,
// the field and its value.
absl::Status ValidateTensorEntry(const TensorEntry& entry, uint32_t index, const Layout& layout,
                                 Direction direction);

// Copies the tensor table of `descriptor` out of the segment mapped at `segment_base` (once)
// and validates every entry. REQUIRES: ValidateDescriptor(descriptor, layout, direction) is OK
// (it bounds the table inside the mapping).
absl::StatusOr<std::vector<TensorEntry>> ReadTensorTable(const Descriptor& descriptor,
                                                         const void* segment_base,
                                                         const Layout& layout, Direction direction);

}  // namespace tpd::shm

#endif  // TPD_SHM_DESCRIPTOR_H_
