// What travels in a call: tensors (dtype, shape and bytes, wherever the bytes lie) and
// messages (a payload and tensors). Part of the client's public API, through client/calls.h.
//
// Thread safety: a const Tensor or Message may be read from any thread; a Tensor's bytes are
// the user's to synchronize.

#ifndef TPD_CLIENT_SEGMENT_TENSOR_H_
#define TPD_CLIENT_SEGMENT_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shm/descriptor.h"

namespace tpd {

namespace calls_internal {
struct ArenaBlock;   // a block of the tx heap (an arena tensor's bytes); client/segment/link.h
struct TensorParts;  // how the library builds and reads a Tensor's storage
}  // namespace calls_internal

// Where a tensor lives: "cpu" or "cuda:N".
struct Device {
  shm::DeviceType type = shm::DeviceType::kCpu;
  int index = 0;
  std::string ToString() const;  // "cpu", "cuda:0"
  bool operator==(const Device& other) const { return type == other.type && index == other.index; }
};

// Where a Tensor's bytes are.
enum class TensorStorage {
  kOwned,     // a std::string the Tensor owns (shared by its copies); copied once when sent
  kBorrowed,  // the caller's memory, not owned (host, or CUDA device memory: Tensor::Cuda)
  kArena,     // a block of the shared arena (AllocateTensor); sent with no copy
  kReceived,  // a view into the rx heap, into the sender's memory (mapped read-only: a
              // sender of the same uid and gid, docs/data_plane.md), or into this client's
              // receive pool on a CUDA device (a request or reply that arrived); read-only
};

// A dense tensor: dtype, shape and product(shape) * item size bytes. Copies share the bytes
// (as torch tensors share storage); Clone() makes an owned copy.
class Tensor {
 public:
  // An empty uint8 tensor of shape {0}.
  Tensor() = default;
  // Owns `bytes`.
  Tensor(shm::DType dtype, std::vector<int64_t> shape, std::string bytes);
  // Refers to `size` bytes at `data`, which must stay valid and unchanged until the
  // Call/CallAsync that sends it has returned (they are copied once into the arena before
  // it does). A handler's reply is sent after the handler returns: borrow only memory that
  // outlives the handler there.
  static Tensor Borrow(shm::DType dtype, std::vector<int64_t> shape, const void* data, size_t size);
  // Refers to CUDA device memory of this process: `device_pointer` (a CUdeviceptr, or a
  // torch tensor's data_ptr()) on cuda:`device`, written on `stream` (a CUstream or
  // cudaStream_t; null: the legacy default stream). Not copied when sent: the daemon copies
  // it straight to where the group's device map sends it, after the work queued on `stream`
  // before the call (an IPC event orders it). Keep the memory unchanged until the call's
  // future is ready. Any memory from cudaMalloc/cuMemAlloc (PyTorch's allocator included).
  //
  // `keep` (optional) is held until the daemon no longer reads the tensor: for a call, until
  // its future is ready at the latest; for a reply, which has no future, until the daemon
  // released the reply's message, after its copy. Its deleter is how a caller learns the
  // memory may change (the C ABI's TPD_EVENT_RELEASED).
  static Tensor Cuda(shm::DType dtype, std::vector<int64_t> shape, uint64_t device_pointer,
                     int device, void* stream = nullptr, std::shared_ptr<void> keep = nullptr);

  shm::DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const Device& device() const { return device_; }
  TensorStorage storage() const { return storage_; }

  // The host bytes, valid while this Tensor (or a copy) lives; empty for a CUDA tensor.
  std::string_view data() const {
    return is_cuda() ? std::string_view() : std::string_view(data_, size_);
  }
  size_t size() const { return size_; }
  bool is_cuda() const { return device_.type == shm::DeviceType::kCuda; }
  // A CUDA tensor's device pointer (a received one's stays valid while this Tensor, or a
  // copy, lives: its block of the receive pool is released then); 0 for a CPU tensor. A
  // received CUDA tensor's bytes are in place when the message arrives (the daemon posts it
  // after its copy completed), so any stream may read them at once.
  uint64_t device_pointer() const { return is_cuda() ? reinterpret_cast<uint64_t>(data_) : 0; }
  // An arena tensor that a sent message carrying it still holds: the daemon reads it in place,
  // and a receiver of this uid and gid on this node may read it in place for as long as it
  // keeps the message (docs/data_plane.md, "Tensors shared between sessions"), so it goes on
  // after the call returned. Write into an arena tensor only once this is false. False for
  // tensors of other storages (their bytes were copied when sent).
  bool in_flight() const;
  // A received host tensor that lies in its sender's memory, mapped read-only in this process
  // (a write through a cast-away const faults): hand out copies where consumers may write.
  bool in_sender_memory() const { return in_sender_memory_; }
  void* stream() const { return stream_; }
  // Writable bytes of an owned or arena tensor; nullptr for borrowed, received and CUDA ones.
  // An arena tensor is sent where it lies, so writing into it while in_flight() changes what
  // the daemon, or a receiver reading it in place, reads.
  char* mutable_data() {
    return storage_ == TensorStorage::kOwned || storage_ == TensorStorage::kArena ? data_ : nullptr;
  }

  // An owned copy of the bytes (releases nothing: this Tensor keeps what it holds). A CUDA
  // tensor is not copied: the result is this tensor (sharing its device memory).
  Tensor Clone() const;
  // The same bytes (shared, storage kept) as another dtype and shape of the same byte size:
  // an arena block allocated as bytes sent as the tensor it holds. INVALID_ARGUMENT when the
  // sizes differ or the dtype or shape is bad.
  absl::StatusOr<Tensor> Reshaped(shm::DType dtype, std::vector<int64_t> shape) const;

 private:
  friend struct calls_internal::TensorParts;

  shm::DType dtype_ = shm::DType::kUInt8;
  std::vector<int64_t> shape_ = {0};
  Device device_;
  TensorStorage storage_ = TensorStorage::kOwned;
  // What keeps the bytes alive: the owned string, the rx block, or the arena block.
  std::shared_ptr<void> keep_;
  std::shared_ptr<calls_internal::ArenaBlock> arena_;  // kArena only
  char* data_ = nullptr;                               // a device pointer for a CUDA tensor
  size_t size_ = 0;
  void* stream_ = nullptr;  // a CUDA tensor's stream
  bool in_sender_memory_ = false;
};

// A request or a reply.
struct Message {
  std::string payload;
  std::vector<Tensor> tensors;
  // A request given to a handler: the calling worker's name (checked by the daemon).
  std::string caller;
};

namespace calls_internal {

// product(shape) * item size, checked: INVALID_ARGUMENT naming `what` for a dtype that is
// none, too many dims, a negative dim or an overflow.
absl::StatusOr<uint64_t> TensorBytes(shm::DType dtype, const std::vector<int64_t>& shape,
                                     absl::string_view what);

// The library's way into a Tensor's storage (the link allocates arena tensors, the codec
// reads what it sends and builds what it received); users see only Tensor's API.
struct TensorParts {
  // A tensor whose bytes are `size` bytes at `data` in the arena block `block`.
  static Tensor Arena(shm::DType dtype, std::vector<int64_t> shape,
                      std::shared_ptr<ArenaBlock> block, char* data, size_t size);
  // A received tensor on `device` whose `size` bytes at `data` live while `keep` does;
  // `in_sender_memory`: mapped read-only from its sender's segment.
  static Tensor Received(shm::DType dtype, std::vector<int64_t> shape, Device device,
                         std::shared_ptr<void> keep, const char* data, size_t size,
                         bool in_sender_memory = false);
  // An arena tensor's block (null for other storages).
  static const std::shared_ptr<ArenaBlock>& ArenaOf(const Tensor& tensor) { return tensor.arena_; }
  // What keeps a tensor's bytes alive (a received CUDA tensor's receive-pool block, say).
  static const std::shared_ptr<void>& KeepOf(const Tensor& tensor) { return tensor.keep_; }
  // The bytes' address: host bytes, or a CUDA tensor's device pointer.
  static const char* Bytes(const Tensor& tensor) { return tensor.data_; }
};

}  // namespace calls_internal
}  // namespace tpd

#endif  // TPD_CLIENT_SEGMENT_TENSOR_H_
