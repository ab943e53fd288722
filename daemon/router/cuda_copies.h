// CUDA tensors in calls on this node (docs/cuda.md, "Calls with CUDA tensors").
//
// Clients never map each other's memory: the daemon does every copy. A client exports the
// allocation holding a CUDA tensor with CUDA IPC (a CudaExport record in its tx heap) and
// lends the daemon a receive pool on each device it receives on (kDevicePool). The daemon
// opens each exported allocation once per session (opening costs about a millisecond; later
// calls from the same allocation reuse the mapping), copies device to device (peer access enabled
// between every pair of GPUs that allows it, so cuda:0 -> cuda:1 goes over NVLink, never through
// the host), host to device or device to host for maps with `cpu` on one side, records an event,
// and runs the call's continuation once the event completed: on its copy thread, or inline when
// little is queued. A session's mappings are closed when the session is gone and no copy uses them
// any more (FAULTS C1: a dead client leaves nothing mapped in the daemon, and nothing was ever
// mapped in another client).
//
// Everything a client sends is checked with the driver, not believed: the exported
// allocation's device must be the one the tensor names and the tensor must lie inside it;
// a pool's allocation must be on its device and at least as large as it says.
//
// Thread safety: thread-safe. One copy thread ("tpd-cuda") waits for large copies and runs
// their continuations; session and TensorPipe threads issue copies (and wait for theirs when their
// streams hold at most kInlineBytes). A SessionMemory has its own mutex, never held while calling
// into another SessionMemory.

#ifndef TPD_DAEMON_ROUTER_CUDA_COPIES_H_
#define TPD_DAEMON_ROUTER_CUDA_COPIES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda/driver.h"
#include "shm/descriptor.h"

namespace tpd {

// What one session lent and exported: its receive pools, the allocations and events of its
// that the daemon opened. Closed when the last reference goes (the router's session, and
// each copy in flight from or into it).
class SessionMemory;

// Counters for Admin.Status: copies and bytes by route, "cuda:0->cuda:1", "cpu->cuda:0".
struct CudaCopyStats {
  struct Route {
    uint64_t copies = 0;
    uint64_t bytes = 0;
    uint64_t busy_us = 0;  // time the copies ran, summed (CudaCopyCount.busy_us)
  };
  std::map<std::string, Route> routes;
  uint64_t errors = 0;
};

struct SessionCudaStats {
  uint64_t open_allocations = 0;  // IPC mappings of its memory held by the daemon
  struct Pool {
    int device = 0;
    uint64_t bytes = 0;
    uint64_t used = 0;
  };
  std::vector<Pool> pools;
};

// One end of a copy: device memory (a pointer the daemon opened) or host memory.
struct CopyEnd {
  uint64_t address = 0;  // a device pointer, or a host pointer cast
  int device = -1;       // -1: host memory
};

class CudaCopies {
 public:
  // The staging region's size: room for a 1 GiB tensor in flight with some to spare.
  static constexpr uint64_t kStagingBytes = (uint64_t{1} << 30) + (uint64_t{256} << 20);
  // A Run is waited for by the thread that issues it when the streams its copies go on hold at
  // most this many bytes of copies in all (its own and any not finished yet).
  static constexpr uint64_t kInlineBytes = uint64_t{1} << 20;

  // The driver's devices: retains their primary contexts, makes a copy stream on each and
  // enables peer access between every pair that allows it. FAILED_PRECONDITION naming the
  // missing entry point or the failing call.
  static absl::StatusOr<std::unique_ptr<CudaCopies>> Start(const cuda::Driver* driver,
                                                           int device_count);
  ~CudaCopies();
  CudaCopies(const CudaCopies&) = delete;
  CudaCopies& operator=(const CudaCopies&) = delete;

  int device_count() const;

  std::shared_ptr<SessionMemory> NewSession(const std::string& session_id);

  // A pool lent by the session (kDevicePool): opened, its device and size checked.
  // INVALID_ARGUMENT naming the problem (no such device, the handle does not open, the
  // allocation is on another device or smaller than the record says, a second pool on one
  // device).
  absl::Status AddPool(SessionMemory& session, const shm::DevicePoolRecord& record);
  // A block of `bytes` of the session's pool on `device`; FAILED_PRECONDITION when it lent
  // none there, RESOURCE_EXHAUSTED when it is full. Returns the offset in the pool.
  absl::StatusOr<uint64_t> AllocatePool(SessionMemory& session, int device, uint64_t bytes);
  // INVALID_ARGUMENT for a block that is not live.
  absl::Status FreePool(SessionMemory& session, int device, uint64_t offset);
  // Where offset `offset` of the session's pool on `device` is, for a copy run by device
  // `via` (the pool is mapped into that device's context on first use: a peer copy is then a
  // copy within one context, over NVLink, never staged through the host).
  absl::StatusOr<CopyEnd> PoolAddress(SessionMemory& session, int device, uint64_t offset, int via);

  // The submitted CUDA tensor `entry` with its export record: opens the allocation (once per
  // session) and its event, checks that the tensor lies inside the allocation on its device.
  // INVALID_ARGUMENT naming the tensor and the problem.
  struct Source {
    CopyEnd end;
  };
  absl::StatusOr<Source> Resolve(SessionMemory& session, const shm::TensorEntry& entry,
                                 const shm::CudaExport& record, uint32_t index);

  struct Copy {
    CopyEnd dst;
    CopyEnd src;
    uint64_t bytes = 0;
  };
  // Issues `copies`, then runs `done` once all of them completed, with the first error: on
  // this thread before Run returns when their streams hold at most kInlineBytes of copies (a
  // wait of microseconds, cheaper than the hand-off), else on the copy thread (a wait here
  // would also wait for every copy queued ahead on those streams, a staged tensor's chunks
  // say). `keep` holds what the copies read and write (the sessions' memory) until then.
  void Run(std::vector<Copy> copies, std::vector<std::shared_ptr<const void>> keep,
           std::function<void(absl::Status)> done);

  // Pinned host memory the staged path between nodes copies through: one region of
  // kStagingBytes, allocated on first use (cuMemHostAlloc takes milliseconds) and kept. Returns
  // the host address of a block; RESOURCE_EXHAUSTED naming the region when it is full.
  absl::StatusOr<uint64_t> AllocateStaging(uint64_t bytes);
  void FreeStaging(uint64_t address);

  // Returns once every copy issued before the call completed and its continuation ran.
  void Flush();

  CudaCopyStats Stats();
  SessionCudaStats SessionStats(SessionMemory& session);

 private:
  struct Impl;
  explicit CudaCopies(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_ROUTER_CUDA_COPIES_H_
