#include "cuda/driver.h"

#include <dlfcn.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tpd::cuda {

bool BuiltWithCuda() {
#if TPD_HAVE_CUDA_H
  return true;
#else
  return false;
#endif
}

Driver::Driver(const DriverApi& api, std::string library)
    : api_(api), library_(std::move(library)) {}

#if TPD_HAVE_CUDA_H

namespace {

// One entry point: its exact symbol in libcuda (the versioned name where cuda.h's macros pick
// a _v2), and where it goes.
struct Entry {
  const char* symbol;
  void** slot;
  bool required;
};

// A function pointer's storage as void**, for dlsym's result. POSIX requires that a void*
// from dlsym converts to a function pointer.
template <typename F>
void** Slot(F* pointer) {
  return reinterpret_cast<void**>(pointer);
}

std::vector<Entry> Entries(DriverApi* api) {
  return {
      {"cuGetErrorName", Slot(&api->get_error_name), true},
      {"cuGetErrorString", Slot(&api->get_error_string), true},
      {"cuInit", Slot(&api->init), true},
      {"cuDriverGetVersion", Slot(&api->driver_get_version), true},
      {"cuDeviceGetCount", Slot(&api->device_get_count), true},
      {"cuDeviceGet", Slot(&api->device_get), true},
      {"cuDeviceGetName", Slot(&api->device_get_name), true},
      {"cuDeviceTotalMem_v2", Slot(&api->device_total_mem), true},
      {"cuDeviceGetAttribute", Slot(&api->device_get_attribute), true},
      {"cuDeviceCanAccessPeer", Slot(&api->device_can_access_peer), true},
      {"cuDeviceGetUuid_v2", Slot(&api->device_get_uuid), true},
      {"cuDevicePrimaryCtxRetain", Slot(&api->device_primary_ctx_retain), false},
      {"cuDevicePrimaryCtxRelease_v2", Slot(&api->device_primary_ctx_release), false},
      {"cuCtxSetCurrent", Slot(&api->ctx_set_current), false},
      {"cuMemGetInfo_v2", Slot(&api->mem_get_info), false},
      {"cuIpcGetMemHandle", Slot(&api->ipc_get_mem_handle), false},
      {"cuIpcOpenMemHandle_v2", Slot(&api->ipc_open_mem_handle), false},
      {"cuIpcCloseMemHandle", Slot(&api->ipc_close_mem_handle), false},
      {"cuCtxGetCurrent", Slot(&api->ctx_get_current), false},
      {"cuCtxEnablePeerAccess", Slot(&api->ctx_enable_peer_access), false},
      {"cuMemAlloc_v2", Slot(&api->mem_alloc), false},
      {"cuMemFree_v2", Slot(&api->mem_free), false},
      {"cuMemGetAddressRange_v2", Slot(&api->mem_get_address_range), false},
      {"cuPointerGetAttribute", Slot(&api->pointer_get_attribute), false},
      {"cuMemcpyAsync", Slot(&api->memcpy_async), false},
      {"cuMemcpyHtoD_v2", Slot(&api->memcpy_htod), false},
      {"cuMemcpyDtoH_v2", Slot(&api->memcpy_dtoh), false},
      {"cuMemsetD8_v2", Slot(&api->memset_d8), false},
      {"cuStreamCreate", Slot(&api->stream_create), false},
      {"cuStreamDestroy_v2", Slot(&api->stream_destroy), false},
      {"cuStreamSynchronize", Slot(&api->stream_synchronize), false},
      {"cuEventCreate", Slot(&api->event_create), false},
      {"cuEventRecord", Slot(&api->event_record), false},
      {"cuEventSynchronize", Slot(&api->event_synchronize), false},
      {"cuEventDestroy_v2", Slot(&api->event_destroy), false},
      {"cuMemHostAlloc", Slot(&api->mem_host_alloc), false},
      {"cuMemFreeHost", Slot(&api->mem_free_host), false},
  };
}

}  // namespace

absl::StatusOr<std::unique_ptr<Driver>> Driver::LoadFrom(const std::string& library) {
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace, where a CUDA runtime
  // some other library of the process brings could bind to them.
  dlerror();
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    const std::string why = error != nullptr ? error : "unknown dlopen error";
    if (absl::StrContains(why, "No such file")) {
      return absl::FailedPreconditionError(absl::StrCat(
          library, " not found: no NVIDIA driver on this machine (dlopen: ", why, ")"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(library, " cannot be loaded: ", why,
                     "; is the NVIDIA driver installed for this architecture?"));
  }
  DriverApi api;
  for (const Entry& entry : Entries(&api)) {
    dlerror();
    *entry.slot = dlsym(handle, entry.symbol);
    if (*entry.slot == nullptr && entry.required) {
      // The handle stays open: unloading a driver library is never safe to count on.
      return absl::FailedPreconditionError(absl::StrCat(
          library, " lacks ", entry.symbol,
          ": the NVIDIA driver is older than this build supports; install a driver for CUDA "
          "11.4 or newer"));
    }
  }
  auto driver = std::make_unique<Driver>(api, library);
  if (absl::Status status = driver->Check(api.init(0), "cuInit"); !status.ok()) return status;
  return driver;
}

absl::StatusOr<const Driver*> Driver::Load() {
  // Built once, on the first call; a failure is kept too, so a CPU-only node tries once.
  static const absl::StatusOr<const Driver*>* const loaded = [] {
    absl::StatusOr<std::unique_ptr<Driver>> driver = LoadFrom(kDriverLibrary);
    if (!driver.ok()) return new absl::StatusOr<const Driver*>(driver.status());
    return new absl::StatusOr<const Driver*>(driver->release());
  }();
  return *loaded;
}

std::string Driver::ErrorText(CUresult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api_.get_error_name(result, &name) != CUDA_SUCCESS || name == nullptr) {
    return absl::StrCat("CUresult ", static_cast<int>(result));
  }
  if (api_.get_error_string(result, &text) != CUDA_SUCCESS || text == nullptr) return name;
  return absl::StrCat(name, ": ", text);
}

absl::Status Driver::Check(CUresult result, absl::string_view what) const {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, " failed: ", ErrorText(result)));
}

absl::Status Driver::HasCopyApi() const {
  DriverApi api = api_;
  for (const Entry& entry : Entries(&api)) {
    if (*entry.slot == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(library_, " lacks ", entry.symbol,
                       ": calls with CUDA tensors need a driver for CUDA 11.4 or newer"));
    }
  }
  return absl::OkStatus();
}

#else  // !TPD_HAVE_CUDA_H

namespace {

absl::Status NotBuiltIn() {
  return absl::UnimplementedError(
      "tpd was built without the CUDA toolkit's cuda.h: CUDA support is off (build where "
      "/usr/local/cuda or $CUDA_HOME holds a toolkit to turn it on)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Driver>> Driver::LoadFrom(const std::string&) {
  return NotBuiltIn();
}

absl::StatusOr<const Driver*> Driver::Load() { return NotBuiltIn(); }

#endif  // TPD_HAVE_CUDA_H

}  // namespace tpd::cuda
