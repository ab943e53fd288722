#include "daemon/router/cuda_copies.h"

#include <pthread.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/logging.h"
#include "shm/heap.h"

namespace tpd {

#if TPD_HAVE_CUDA_H

namespace {

// Mappings one session may make the daemon hold. An allocation is opened once and kept until
// the session ends (closing it while a later call reuses it would cost the open again);
// a client cycling through more allocations than this gets RESOURCE_EXHAUSTED.
constexpr size_t kMaxOpenAllocations = 1024;

std::string HandleKey(const uint8_t (&bytes)[shm::kCudaIpcHandleBytes]) {
  return std::string(reinterpret_cast<const char*>(bytes), shm::kCudaIpcHandleBytes);
}

struct Mapping {
  CUdeviceptr base = 0;
  size_t size = 0;
};

// Opens the memory handle `bytes` (a client's) in the current context and asks the driver
// where it lies: it must be an allocation on `device`. The reason otherwise, the mapping
// closed again.
absl::StatusOr<Mapping> OpenOnDevice(const cuda::Driver& driver,
                                     const uint8_t (&bytes)[shm::kCudaIpcHandleBytes], int device) {
  const cuda::DriverApi& api = driver.api();
  CUipcMemHandle handle;
  std::memcpy(&handle, bytes, sizeof(handle));
  Mapping mapping;
  const CUresult opened =
      api.ipc_open_mem_handle(&mapping.base, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (opened != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(
        absl::StrCat("its IPC memory handle does not open (", driver.ErrorText(opened),
                     "): a stale or forged handle, or memory already freed"));
  }
  int ordinal = -1;
  CUdeviceptr base = 0;
  const bool found = api.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                               mapping.base) == CUDA_SUCCESS &&
                     api.mem_get_address_range(&base, &mapping.size, mapping.base) == CUDA_SUCCESS;
  if (!found || ordinal != device) {
    (void)api.ipc_close_mem_handle(mapping.base);
    return absl::InvalidArgumentError(found ? absl::StrCat("its allocation is on cuda:", ordinal)
                                            : "its handle names no device memory");
  }
  return mapping;
}

}  // namespace

struct CudaCopies::Impl {
  const cuda::Driver* driver = nullptr;
  std::vector<CUcontext> contexts;
  std::vector<CUstream> streams;

  absl::Mutex mu;
  absl::CondVar cv;
  struct Job {
    std::vector<std::pair<int, CUevent>> events;
    std::vector<std::shared_ptr<const void>> keep;
    std::function<void(absl::Status)> done;
    absl::Status status;
    // For the routes' busy time: when the copies were issued, and their bytes by route.
    absl::Time issued;
    std::vector<std::pair<std::pair<int, int>, uint64_t>> route_bytes;
    // Its bytes on each device's stream (counted in stream_bytes until it is finished).
    std::vector<uint64_t> stream_bytes;
  };
  std::deque<Job> jobs ABSL_GUARDED_BY(mu);
  bool running ABSL_GUARDED_BY(mu) = false;  // a job taken off `jobs` is being finished
  std::vector<std::vector<CUevent>> free_events ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::thread thread;

  // By (source, destination) device, -1 for host memory.
  std::map<std::pair<int, int>, CudaCopyStats::Route> routes ABSL_GUARDED_BY(mu);
  // Per device: when a job with copies on its stream was last seen complete.
  std::vector<absl::Time> last_completion ABSL_GUARDED_BY(mu);
  // Per device: bytes of copies issued on its stream by jobs not finished yet.
  std::vector<uint64_t> stream_bytes ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> errors{0};

  absl::Mutex staging_mu;
  void* staging ABSL_GUARDED_BY(staging_mu) = nullptr;
  std::unique_ptr<shm::HeapAllocator> staging_heap ABSL_GUARDED_BY(staging_mu);

  absl::Status Current(int device) const {
    return driver->Check(driver->api().ctx_set_current(contexts[device]),
                         absl::StrCat("cuCtxSetCurrent(cuda:", device, ")"));
  }

  // Waits for `job`'s events (returning them to the pool) and runs its continuation.
  void Finish(Job& job) {
    for (const auto& [device, event] : job.events) {
      absl::Status synced = Current(device);
      if (synced.ok()) {
        synced = driver->Check(driver->api().event_synchronize(event),
                               absl::StrCat("cuEventSynchronize(cuda:", device, ")"));
      }
      if (!synced.ok() && job.status.ok()) job.status = synced;
      absl::MutexLock lock(&mu);
      free_events[device].push_back(event);
    }
    if (!job.status.ok()) ++errors;
    {
      absl::MutexLock lock(&mu);
      for (size_t d = 0; d < job.stream_bytes.size(); ++d) stream_bytes[d] -= job.stream_bytes[d];
    }
    uint64_t total = 0;
    for (const auto& [route, bytes] : job.route_bytes) total += bytes;
    if (total > 0) {
      // A job's copies ran from when they were issued or, queued behind earlier jobs on the
      // same streams, from when those completed: jobs issued together (a tensor's chunks)
      // count their copies once, not each the wait for all those ahead of it.
      const absl::Time now = absl::Now();
      absl::MutexLock lock(&mu);
      absl::Time start = job.issued;
      for (const auto& [device, event] : job.events) {
        start = std::max(start, last_completion[device]);
        last_completion[device] = now;
      }
      const double busy_us = std::max(0.0, absl::ToDoubleMicroseconds(now - start));
      for (const auto& [route, bytes] : job.route_bytes) {
        routes[route].busy_us += static_cast<uint64_t>(busy_us * static_cast<double>(bytes) /
                                                       static_cast<double>(total));
      }
    }
    job.done(job.status);
  }

  void Loop() {
    pthread_setname_np(pthread_self(), "tpd-cuda");
    while (true) {
      Job job;
      {
        absl::MutexLock lock(&mu);
        while (jobs.empty() && !stop) cv.Wait(&mu);
        if (jobs.empty()) return;
        job = std::move(jobs.front());
        jobs.pop_front();
        running = true;
      }
      Finish(job);
      job = Job();  // what it kept goes before Flush returns
      absl::MutexLock lock(&mu);
      running = false;
      cv.SignalAll();
    }
  }
};

class SessionMemory {
 public:
  SessionMemory(const cuda::Driver* driver, std::vector<CUcontext> contexts, std::string id)
      : driver_(driver), contexts_(std::move(contexts)), id_(std::move(id)) {}

  ~SessionMemory() {
    const DriverApi& api = driver_->api();
    absl::MutexLock lock(&mu_);
    for (const auto& [key, opened] : allocations_) {
      (void)api.ctx_set_current(contexts_[opened.device]);
      (void)api.ipc_close_mem_handle(opened.base);
    }
    for (const auto& [device, pool] : pools_) {
      for (const auto& [via, base] : pool.bases) {
        (void)api.ctx_set_current(contexts_[via]);
        (void)api.ipc_close_mem_handle(base);
      }
    }
    if (!allocations_.empty() || !pools_.empty()) {
      CudaLog().info("[session {}] closed {} CUDA IPC mappings and {} pools", id_,
                     allocations_.size(), pools_.size());
    }
  }

  using DriverApi = cuda::DriverApi;
  struct Opened {
    CUdeviceptr base = 0;
    size_t size = 0;
    int device = 0;
  };
  struct Pool {
    CUipcMemHandle handle;
    // Its mapping in each device's context that copied into it; bases[device] first.
    std::map<int, CUdeviceptr> bases;
    uint64_t bytes = 0;
    std::unique_ptr<shm::HeapAllocator> heap;
  };

  const cuda::Driver* const driver_;
  const std::vector<CUcontext> contexts_;
  const std::string id_;
  absl::Mutex mu_;
  std::map<std::string, Opened> allocations_ ABSL_GUARDED_BY(mu_);
  std::map<int, Pool> pools_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<CudaCopies>> CudaCopies::Start(const cuda::Driver* driver,
                                                              int device_count) {
  if (absl::Status api = driver->HasCopyApi(); !api.ok()) return api;
  const cuda::DriverApi& api = driver->api();
  auto impl = std::make_unique<Impl>();
  impl->driver = driver;
  for (int d = 0; d < device_count; ++d) {
    CUdevice device;
    CUcontext context;
    CUstream stream;
    const std::string name = absl::StrCat("cuda:", d);
    if (absl::Status s = driver->Check(api.device_get(&device, d), "cuDeviceGet(" + name + ")");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = driver->Check(api.device_primary_ctx_retain(&context, device),
                                       "cuDevicePrimaryCtxRetain(" + name + ")");
        !s.ok()) {
      return s;
    }
    impl->contexts.push_back(context);
    if (absl::Status s = impl->Current(d); !s.ok()) return s;
    if (absl::Status s = driver->Check(api.stream_create(&stream, CU_STREAM_NON_BLOCKING),
                                       "cuStreamCreate(" + name + ")");
        !s.ok()) {
      return s;
    }
    impl->streams.push_back(stream);
  }
  // Peer access both ways between every pair that allows it: copies across GPUs then go
  // over NVLink or PCIe peer-to-peer instead of through host memory.
  for (int a = 0; a < device_count; ++a) {
    for (int b = 0; b < device_count; ++b) {
      int can = 0;
      if (a == b || api.device_can_access_peer(&can, a, b) != CUDA_SUCCESS || can == 0) continue;
      if (absl::Status s = impl->Current(a); !s.ok()) return s;
      const CUresult enabled = api.ctx_enable_peer_access(impl->contexts[b], 0);
      if (enabled != CUDA_SUCCESS && enabled != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
        CudaLog().warn("[node] peer access cuda:{} -> cuda:{} not enabled: {}", a, b,
                       driver->ErrorText(enabled));
      }
    }
  }
  {
    absl::MutexLock lock(&impl->mu);
    impl->free_events.resize(device_count);
    impl->last_completion.assign(device_count, absl::InfinitePast());
    impl->stream_bytes.assign(device_count, 0);
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<CudaCopies>(new CudaCopies(std::move(impl)));
}

CudaCopies::CudaCopies(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaCopies::~CudaCopies() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stop = true;
    impl_->cv.SignalAll();
  }
  impl_->thread.join();
  const cuda::DriverApi& api = impl_->driver->api();
  absl::MutexLock lock(&impl_->mu);
  for (size_t d = 0; d < impl_->streams.size(); ++d) {
    (void)impl_->Current(static_cast<int>(d));
    for (CUevent event : impl_->free_events[d]) (void)api.event_destroy(event);
    (void)api.stream_destroy(impl_->streams[d]);
  }
  absl::MutexLock staging(&impl_->staging_mu);
  if (impl_->staging != nullptr) (void)api.mem_free_host(impl_->staging);
}

int CudaCopies::device_count() const { return static_cast<int>(impl_->contexts.size()); }

std::shared_ptr<SessionMemory> CudaCopies::NewSession(const std::string& session_id) {
  return std::make_shared<SessionMemory>(impl_->driver, impl_->contexts, session_id);
}

absl::Status CudaCopies::AddPool(SessionMemory& session, const shm::DevicePoolRecord& record) {
  const cuda::DriverApi& api = impl_->driver->api();
  const int device = static_cast<int>(record.device);
  if (record.device >= impl_->contexts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("receive pool on cuda:", record.device,
                                                   ": this node has ", device_count(),
                                                   " CUDA devices"));
  }
  if (record.reserved != 0 || record.bytes < 2 * shm::kHeapAlignment) {
    return absl::InvalidArgumentError(
        absl::StrCat("receive pool on cuda:", device, ": ", record.bytes, " bytes is too small"));
  }
  absl::MutexLock lock(&session.mu_);
  if (session.pools_.count(device) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("this session lent a receive pool on cuda:", device, " already"));
  }
  if (absl::Status s = impl_->Current(device); !s.ok()) return s;
  absl::StatusOr<Mapping> mapping = OpenOnDevice(*impl_->driver, record.memory, device);
  if (!mapping.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("receive pool on cuda:", device, ": ", mapping.status().message()));
  }
  if (mapping->size < record.bytes) {
    (void)api.ipc_close_mem_handle(mapping->base);
    return absl::InvalidArgumentError(absl::StrCat("receive pool on cuda:", device,
                                                   ": its allocation is ", mapping->size,
                                                   " bytes, not ", record.bytes));
  }
  SessionMemory::Pool& pool = session.pools_[device];
  std::memcpy(&pool.handle, record.memory, sizeof(pool.handle));
  pool.bases[device] = mapping->base;
  pool.bytes = record.bytes;
  // Offsets start at one alignment unit so that 0 never names a block.
  const uint64_t usable = (record.bytes / shm::kHeapAlignment - 1) * shm::kHeapAlignment;
  pool.heap = std::make_unique<shm::HeapAllocator>(absl::StrCat("receive pool on cuda:", device),
                                                   shm::Region{shm::kHeapAlignment, usable});
  CudaLog().info("[session {}] lent a receive pool of {} bytes on cuda:{}", session.id_,
                 record.bytes, device);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CudaCopies::AllocatePool(SessionMemory& session, int device,
                                                  uint64_t bytes) {
  absl::MutexLock lock(&session.mu_);
  auto it = session.pools_.find(device);
  if (it == session.pools_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("its client lent no receive pool on cuda:", device,
                     " (a client makes one for each device its group's negotiation gives it)"));
  }
  return it->second.heap->Allocate(bytes);
}

absl::Status CudaCopies::FreePool(SessionMemory& session, int device, uint64_t offset) {
  absl::MutexLock lock(&session.mu_);
  auto it = session.pools_.find(device);
  if (it == session.pools_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("release of a block of cuda:", device, ", where it lent no pool"));
  }
  return it->second.heap->Free(offset);
}

absl::StatusOr<CopyEnd> CudaCopies::PoolAddress(SessionMemory& session, int device, uint64_t offset,
                                                int via) {
  absl::MutexLock lock(&session.mu_);
  auto it = session.pools_.find(device);
  if (it == session.pools_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("no receive pool on cuda:", device));
  }
  SessionMemory::Pool& pool = it->second;
  auto mapped = pool.bases.find(via);
  if (mapped == pool.bases.end()) {
    if (absl::Status s = impl_->Current(via); !s.ok()) return s;
    CUdeviceptr base = 0;
    if (absl::Status s = impl_->driver->Check(
            impl_->driver->api().ipc_open_mem_handle(&base, pool.handle,
                                                     CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
            absl::StrCat("cuIpcOpenMemHandle(pool of cuda:", device, " in cuda:", via, ")"));
        !s.ok()) {
      return s;
    }
    mapped = pool.bases.emplace(via, base).first;
  }
  return CopyEnd{mapped->second + offset, device};
}

absl::StatusOr<CudaCopies::Source> CudaCopies::Resolve(SessionMemory& session,
                                                       const shm::TensorEntry& entry,
                                                       const shm::CudaExport& record,
                                                       uint32_t index) {
  const int device = static_cast<int>(entry.device_index);
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", index, " (cuda:", device, "): ", why));
  };
  if (device >= device_count()) {
    return refuse(absl::StrCat("this node has ", device_count(), " CUDA devices"));
  }
  for (uint8_t byte : record.reserved) {
    if (byte != 0) {
      return refuse(
          "its export record's reserved bytes are not zero (the daemon waits on no "
          "event of a client's: synchronize the tensor's stream before sending)");
    }
  }
  absl::MutexLock lock(&session.mu_);
  if (absl::Status s = impl_->Current(device); !s.ok()) return s;
  const std::string key = HandleKey(record.memory);
  auto it = session.allocations_.find(key);
  if (it == session.allocations_.end()) {
    if (session.allocations_.size() >= kMaxOpenAllocations) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tensor ", index, ": this session has ", kMaxOpenAllocations,
          " CUDA allocations open in the daemon; send from fewer distinct allocations"));
    }
    absl::StatusOr<Mapping> mapping = OpenOnDevice(*impl_->driver, record.memory, device);
    if (!mapping.ok()) return refuse(mapping.status().message());
    it = session.allocations_
             .emplace(key, SessionMemory::Opened{mapping->base, mapping->size, device})
             .first;
  }
  const SessionMemory::Opened& opened = it->second;
  if (opened.device != device) {
    return refuse(absl::StrCat("its allocation is on cuda:", opened.device));
  }
  if (entry.offset > opened.size || entry.length > opened.size - entry.offset) {
    return refuse(absl::StrCat("bytes [", entry.offset, ", +", entry.length,
                               ") run past its allocation of ", opened.size, " bytes"));
  }
  Source source;
  source.end = CopyEnd{opened.base + entry.offset, device};
  return source;
}

void CudaCopies::Run(std::vector<Copy> copies, std::vector<std::shared_ptr<const void>> keep,
                     std::function<void(absl::Status)> done) {
  const cuda::DriverApi& api = impl_->driver->api();
  Impl::Job job;
  job.keep = std::move(keep);
  job.done = std::move(done);
  job.issued = absl::Now();
  // On the stream of the device that holds the source (the destination's for host sources):
  // a peer copy is pulled or pushed by one engine either way.
  auto stream_of = [](const Copy& copy) {
    return copy.src.device >= 0 ? copy.src.device : copy.dst.device;
  };
  job.stream_bytes.assign(impl_->streams.size(), 0);
  for (const Copy& copy : copies) job.stream_bytes[stream_of(copy)] += copy.bytes;
  {
    // Counted before they are issued, so a Run deciding whether to wait sees them.
    absl::MutexLock lock(&impl_->mu);
    for (size_t d = 0; d < job.stream_bytes.size(); ++d) {
      impl_->stream_bytes[d] += job.stream_bytes[d];
    }
  }
  std::vector<bool> used(impl_->streams.size(), false);
  for (const Copy& copy : copies) {
    if (copy.bytes == 0) continue;
    const int device = stream_of(copy);
    absl::Status issued = impl_->Current(device);
    CUstream stream = impl_->streams[device];
    if (issued.ok()) {
      issued = impl_->driver->Check(
          api.memcpy_async(copy.dst.address, copy.src.address, copy.bytes, stream),
          absl::StrCat("cuMemcpyAsync(", copy.bytes, " bytes)"));
    }
    if (!issued.ok()) {
      if (job.status.ok()) job.status = issued;
      break;
    }
    used[device] = true;
    job.route_bytes.push_back({{copy.src.device, copy.dst.device}, copy.bytes});
    absl::MutexLock lock(&impl_->mu);
    CudaCopyStats::Route& route = impl_->routes[{copy.src.device, copy.dst.device}];
    ++route.copies;
    route.bytes += copy.bytes;
  }
  for (size_t d = 0; d < used.size(); ++d) {
    if (!used[d]) continue;
    const int device = static_cast<int>(d);
    CUevent event = nullptr;
    {
      absl::MutexLock lock(&impl_->mu);
      if (!impl_->free_events[d].empty()) {
        event = impl_->free_events[d].back();
        impl_->free_events[d].pop_back();
      }
    }
    absl::Status recorded = impl_->Current(device);
    if (recorded.ok() && event == nullptr) {
      recorded =
          impl_->driver->Check(api.event_create(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
    if (recorded.ok()) {
      recorded = impl_->driver->Check(api.event_record(event, impl_->streams[d]), "cuEventRecord");
      if (recorded.ok()) {
        job.events.push_back({device, event});
        continue;
      }
    }
    // Without an event this device's copies cannot be waited for one by one: wait for the
    // whole stream here (rare: only when the driver fails).
    if (job.status.ok()) job.status = recorded;
    (void)api.stream_synchronize(impl_->streams[d]);
    if (event != nullptr) (void)api.event_destroy(event);
  }
  bool small = true;
  {
    absl::MutexLock lock(&impl_->mu);
    for (size_t d = 0; d < used.size(); ++d) {
      if (used[d] && impl_->stream_bytes[d] > kInlineBytes) small = false;
    }
    if (!small) {
      impl_->jobs.push_back(std::move(job));
      impl_->cv.SignalAll();  // Flush waits on it too
    }
  }
  // Done in microseconds: waiting here costs less than waking the copy thread.
  if (small) impl_->Finish(job);
}

absl::StatusOr<uint64_t> CudaCopies::AllocateStaging(uint64_t bytes) {
  absl::MutexLock lock(&impl_->staging_mu);
  if (impl_->staging == nullptr) {
    if (absl::Status s = impl_->Current(0); !s.ok()) return s;
    void* region = nullptr;
    if (absl::Status s = impl_->driver->Check(
            impl_->driver->api().mem_host_alloc(&region, kStagingBytes, CU_MEMHOSTALLOC_PORTABLE),
            absl::StrCat("cuMemHostAlloc(", kStagingBytes, " bytes of staging)"));
        !s.ok()) {
      return s;
    }
    impl_->staging = region;
    // Offsets from one alignment unit on, so 0 never names a block.
    impl_->staging_heap = std::make_unique<shm::HeapAllocator>(
        "pinned staging of calls between nodes",
        shm::Region{shm::kHeapAlignment, kStagingBytes - shm::kHeapAlignment});
    CudaLog().info("[node] {} bytes of pinned staging for CUDA tensors between nodes",
                   kStagingBytes);
  }
  absl::StatusOr<uint64_t> offset = impl_->staging_heap->Allocate(bytes);
  if (!offset.ok()) return offset.status();
  return reinterpret_cast<uint64_t>(impl_->staging) + *offset;
}

void CudaCopies::FreeStaging(uint64_t address) {
  absl::MutexLock lock(&impl_->staging_mu);
  if (impl_->staging == nullptr) return;
  (void)impl_->staging_heap->Free(address - reinterpret_cast<uint64_t>(impl_->staging));
}

void CudaCopies::Flush() {
  absl::MutexLock lock(&impl_->mu);
  while (!impl_->jobs.empty() || impl_->running) impl_->cv.Wait(&impl_->mu);
}

CudaCopyStats CudaCopies::Stats() {
  auto name = [](int device) {
    return device < 0 ? std::string("cpu") : absl::StrCat("cuda:", device);
  };
  CudaCopyStats stats;
  absl::MutexLock lock(&impl_->mu);
  for (const auto& [route, counts] : impl_->routes) {
    stats.routes[absl::StrCat(name(route.first), "->", name(route.second))] = counts;
  }
  stats.errors = impl_->errors;
  return stats;
}

SessionCudaStats CudaCopies::SessionStats(SessionMemory& session) {
  SessionCudaStats stats;
  absl::MutexLock lock(&session.mu_);
  stats.open_allocations = session.allocations_.size();
  for (const auto& [device, pool] : session.pools_) {
    stats.pools.push_back({device, pool.bytes, pool.heap->GetStats().used_bytes});
    stats.open_allocations += pool.bases.size();
  }
  return stats;
}

#else  // !TPD_HAVE_CUDA_H

struct CudaCopies::Impl {};
class SessionMemory {};

absl::StatusOr<std::unique_ptr<CudaCopies>> CudaCopies::Start(const cuda::Driver*, int) {
  return absl::UnimplementedError("tpd was built without the CUDA toolkit's cuda.h");
}
CudaCopies::CudaCopies(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaCopies::~CudaCopies() = default;
int CudaCopies::device_count() const { return 0; }
std::shared_ptr<SessionMemory> CudaCopies::NewSession(const std::string&) { return nullptr; }
absl::Status CudaCopies::AddPool(SessionMemory&, const shm::DevicePoolRecord&) {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::StatusOr<uint64_t> CudaCopies::AllocatePool(SessionMemory&, int, uint64_t) {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::Status CudaCopies::FreePool(SessionMemory&, int, uint64_t) {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::StatusOr<CopyEnd> CudaCopies::PoolAddress(SessionMemory&, int, uint64_t, int) {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::StatusOr<CudaCopies::Source> CudaCopies::Resolve(SessionMemory&, const shm::TensorEntry&,
                                                       const shm::CudaExport&, uint32_t) {
  return absl::UnimplementedError("no CUDA in this build");
}
void CudaCopies::Run(std::vector<Copy>, std::vector<std::shared_ptr<const void>>,
                     std::function<void(absl::Status)> done) {
  done(absl::UnimplementedError("no CUDA in this build"));
}
absl::StatusOr<uint64_t> CudaCopies::AllocateStaging(uint64_t) {
  return absl::UnimplementedError("no CUDA in this build");
}
void CudaCopies::FreeStaging(uint64_t) {}
void CudaCopies::Flush() {}
CudaCopyStats CudaCopies::Stats() { return {}; }
SessionCudaStats CudaCopies::SessionStats(SessionMemory&) { return {}; }

#endif  // TPD_HAVE_CUDA_H

}  // namespace tpd
