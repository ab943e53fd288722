#include "client/segment/cuda_export.h"

#include <cstring>
#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cuda/driver.h"

namespace tpd::calls_internal {

#if TPD_HAVE_CUDA_H

namespace {
// Allocations whose IPC handles are remembered; past it the cache starts over.
constexpr size_t kMaxExported = 4096;
}  // namespace

struct CudaExporter::Impl {
  const cuda::Driver* driver = nullptr;
  absl::Mutex mu;
  std::map<int, CUcontext> contexts ABSL_GUARDED_BY(mu);
  // cuIpcGetMemHandle costs far more than a call: handles by allocation base, with the
  // allocation's process-unique buffer id, so memory freed and allocated again at the same
  // address gets a new handle.
  struct Exported {
    unsigned long long buffer_id = 0;
    size_t size = 0;
    CUipcMemHandle handle;
  };
  std::map<CUdeviceptr, Exported> exported ABSL_GUARDED_BY(mu);

  // Makes `device`'s primary context current on this thread; restores the previous one when
  // the returned guard goes.
  class Scope {
   public:
    Scope(const cuda::Driver* driver, CUcontext previous) : driver_(driver), previous_(previous) {}
    ~Scope() { (void)driver_->api().ctx_set_current(previous_); }

   private:
    const cuda::Driver* driver_;
    CUcontext previous_;
  };
  absl::StatusOr<std::unique_ptr<Scope>> Enter(int device) {
    const cuda::DriverApi& api = driver->api();
    CUcontext context = nullptr;
    {
      absl::MutexLock lock(&mu);
      auto it = contexts.find(device);
      if (it != contexts.end()) context = it->second;
    }
    if (context == nullptr) {
      CUdevice handle;
      const std::string name = absl::StrCat("cuda:", device);
      if (absl::Status s =
              driver->Check(api.device_get(&handle, device), "cuDeviceGet(" + name + ")");
          !s.ok()) {
        return s;
      }
      if (absl::Status s = driver->Check(api.device_primary_ctx_retain(&context, handle),
                                         "cuDevicePrimaryCtxRetain(" + name + ")");
          !s.ok()) {
        return s;
      }
      absl::MutexLock lock(&mu);
      contexts.emplace(device, context);  // a second retain by a racing thread is harmless
    }
    CUcontext previous = nullptr;
    (void)api.ctx_get_current(&previous);
    if (absl::Status s = driver->Check(api.ctx_set_current(context), "cuCtxSetCurrent"); !s.ok()) {
      return s;
    }
    return std::make_unique<Scope>(driver, previous);
  }
};

absl::StatusOr<CudaExporter*> CudaExporter::Get() {
  static const absl::StatusOr<CudaExporter*>* const exporter = [] {
    absl::StatusOr<const cuda::Driver*> driver = cuda::Driver::Load();
    if (driver.ok()) {
      if (absl::Status api = (*driver)->HasCopyApi(); !api.ok()) driver = api;
    }
    if (!driver.ok()) return new absl::StatusOr<CudaExporter*>(driver.status());
    auto impl = std::make_unique<Impl>();
    impl->driver = *driver;
    return new absl::StatusOr<CudaExporter*>(new CudaExporter(std::move(impl)));
  }();
  return *exporter;
}

CudaExporter::CudaExporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<uint64_t> CudaExporter::Export(uint64_t device_pointer, uint64_t bytes, int device,
                                              void* stream, shm::CudaExport* record) {
  const cuda::Driver* driver = impl_->driver;
  const cuda::DriverApi& api = driver->api();
  absl::StatusOr<std::unique_ptr<Impl::Scope>> scope = impl_->Enter(device);
  if (!scope.ok()) return scope.status();
  CUdeviceptr base = 0;
  size_t size = 0;
  if (absl::Status s = driver->Check(
          api.mem_get_address_range(&base, &size, static_cast<CUdeviceptr>(device_pointer)),
          "cuMemGetAddressRange");
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the pointer is not device memory of this process: ", s.message()));
  }
  const uint64_t offset = device_pointer - base;
  if (offset > size || bytes > size - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("[", offset, ", +", bytes, ") runs past its allocation of ", size, " bytes"));
  }
  unsigned long long buffer_id = 0;
  if (absl::Status s =
          driver->Check(api.pointer_get_attribute(&buffer_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, base),
                        "cuPointerGetAttribute(BUFFER_ID)");
      !s.ok()) {
    return s;
  }
  CUipcMemHandle memory;
  bool cached = false;
  {
    absl::MutexLock lock(&impl_->mu);
    auto it = impl_->exported.find(base);
    if (it != impl_->exported.end() && it->second.buffer_id == buffer_id &&
        it->second.size == size) {
      memory = it->second.handle;
      cached = true;
    }
  }
  if (!cached) {
    if (absl::Status s = driver->Check(api.ipc_get_mem_handle(&memory, base), "cuIpcGetMemHandle");
        !s.ok()) {
      return s;
    }
    absl::MutexLock lock(&impl_->mu);
    if (impl_->exported.size() >= kMaxExported) impl_->exported.clear();
    impl_->exported[base] = Impl::Exported{buffer_id, size, memory};
  }
  if (absl::Status s = driver->Check(api.stream_synchronize(static_cast<CUstream>(stream)),
                                     "cuStreamSynchronize on the tensor's stream");
      !s.ok()) {
    return s;
  }
  std::memset(record, 0, sizeof(*record));
  std::memcpy(record->memory, &memory, sizeof(memory));
  return offset;
}

absl::StatusOr<DevicePool> CudaExporter::AllocatePool(int device, uint64_t bytes) {
  const cuda::Driver* driver = impl_->driver;
  const cuda::DriverApi& api = driver->api();
  absl::StatusOr<std::unique_ptr<Impl::Scope>> scope = impl_->Enter(device);
  if (!scope.ok()) return scope.status();
  DevicePool pool;
  pool.device = device;
  pool.bytes = bytes;
  CUdeviceptr base = 0;
  if (absl::Status s =
          driver->Check(api.mem_alloc(&base, bytes),
                        absl::StrCat("cuMemAlloc(", bytes, " bytes on cuda:", device, ")"));
      !s.ok()) {
    return s;
  }
  pool.base = base;
  CUipcMemHandle memory;
  if (absl::Status s = driver->Check(api.ipc_get_mem_handle(&memory, base), "cuIpcGetMemHandle");
      !s.ok()) {
    (void)api.mem_free(base);
    return s;
  }
  std::memset(&pool.record, 0, sizeof(pool.record));
  std::memcpy(pool.record.memory, &memory, sizeof(memory));
  pool.record.device = static_cast<uint32_t>(device);
  pool.record.bytes = bytes;
  return pool;
}

void CudaExporter::FreePool(const DevicePool& pool) {
  absl::StatusOr<std::unique_ptr<Impl::Scope>> scope = impl_->Enter(pool.device);
  if (scope.ok()) (void)impl_->driver->api().mem_free(static_cast<CUdeviceptr>(pool.base));
}

#else  // !TPD_HAVE_CUDA_H

struct CudaExporter::Impl {};

absl::StatusOr<CudaExporter*> CudaExporter::Get() {
  return absl::UnimplementedError(
      "this client library was built without the CUDA toolkit's cuda.h: no CUDA tensors");
}
CudaExporter::CudaExporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
absl::StatusOr<uint64_t> CudaExporter::Export(uint64_t, uint64_t, int, void*, shm::CudaExport*) {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::StatusOr<DevicePool> CudaExporter::AllocatePool(int, uint64_t) {
  return absl::UnimplementedError("no CUDA in this build");
}
void CudaExporter::FreePool(const DevicePool&) {}

#endif  // TPD_HAVE_CUDA_H

}  // namespace tpd::calls_internal
