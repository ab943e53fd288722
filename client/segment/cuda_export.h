// The client's half of CUDA tensors in calls (docs/cuda.md, "Calls with CUDA tensors"):
// exporting device memory and events to the daemon with CUDA IPC, and the receive pools the
// daemon copies incoming CUDA tensors into.
//
// Why legacy CUDA IPC (cuIpcGetMemHandle on the allocation, plus an offset) rather than the
// VMM API's file descriptors: it works on any cudaMalloc'd memory, which is what PyTorch's
// caching allocator and most users hand us; VMM handles exist only for memory allocated
// through cuMemCreate. The daemon opens each allocation once per session and keeps it open.
//
// Internal to the client library (the codec and the link use it).
//
// Thread safety: thread-safe. Calls save and restore the calling thread's current CUDA
// context, so a user thread's current device is left as it was.

#ifndef TPD_CLIENT_SEGMENT_CUDA_EXPORT_H_
#define TPD_CLIENT_SEGMENT_CUDA_EXPORT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shm/descriptor.h"

namespace tpd::calls_internal {

// Device memory this client lends the daemon as a receive pool.
struct DevicePool {
  int device = 0;
  uint64_t base = 0;  // the device pointer
  uint64_t bytes = 0;
  shm::DevicePoolRecord record;
};

class CudaExporter {
 public:
  // The process's exporter; FAILED_PRECONDITION (or UNIMPLEMENTED) saying why without a
  // usable driver.
  static absl::StatusOr<CudaExporter*> Get();

  // Fills `record` for `bytes` at `device_pointer` on `device`, written on `stream` (a
  // CUstream; null: the legacy default stream): the allocation's IPC handle (cached per
  // allocation) and the pointer's offset in it (returned). Waits for the work queued on
  // `stream` first, so the bytes are final when the daemon reads them: one host-side stream
  // synchronize, measured at ~2 us on an idle stream, where a cross-process IPC event cost
  // the call ~400 us (docs/BENCHMARKS.md, B6). The record carries no event.
  absl::StatusOr<uint64_t> Export(uint64_t device_pointer, uint64_t bytes, int device, void* stream,
                                  shm::CudaExport* record);

  // `bytes` of fresh device memory on `device` and its IPC handle.
  absl::StatusOr<DevicePool> AllocatePool(int device, uint64_t bytes);
  void FreePool(const DevicePool& pool);

  struct Impl;

 private:
  explicit CudaExporter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpd::calls_internal

#endif  // TPD_CLIENT_SEGMENT_CUDA_EXPORT_H_
