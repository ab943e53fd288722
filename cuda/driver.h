// The NVIDIA driver API (libcuda), loaded at run time.
//
// tpd never links against libcuda or the CUDA runtime: Driver::Load opens libcuda.so.1 with
// dlopen, as TensorPipe and PyTorch do, and resolves the entry points below by their exact
// (versioned) symbols. The same binary therefore runs on a CPU-only machine, where Load
// reports why there is no driver, and on a GPU node. At build time only the toolkit's cuda.h
// is needed (@cuda//:headers, see bazel/cuda.bzl); a build without it still compiles this
// library, and Load then reports that CUDA support was not built in.
//
// Why under proto/: like shm/, this is shared by the daemon (GPU discovery, and later
// the device-to-device and staged copies) and the client library (which will export its
// device memory with CUDA IPC). The layering rule (daemon -> agent -> store -> proto,
// client -> proto) lets both of them reach proto/ and nothing else in common.
//
// Thread safety: Load is thread-safe and opens the library once per process. A Driver is
// immutable once built; its entry points are the driver's own, which are thread-safe.

#ifndef TPD_CUDA_DRIVER_H_
#define TPD_CUDA_DRIVER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#if TPD_HAVE_CUDA_H
#include "cuda.h"
#endif

namespace tpd::cuda {

// The shared object Load opens: the driver's soname, which the NVIDIA driver package installs
// (never the unversioned libcuda.so, which only the toolkit's stubs or -dev packages provide).
inline constexpr const char kDriverLibrary[] = "libcuda.so.1";

// Whether this build has the driver API's types (cuda.h was found at build time).
bool BuiltWithCuda();

#if TPD_HAVE_CUDA_H

// Driver API entry points, each the version cuda.h's macros select for this toolkit (so
// `device_total_mem` is cuDeviceTotalMem_v2). Required ones are never null in a loaded Driver;
// optional ones are null when the driver lacks them.
struct DriverApi {
  // Required: loading, errors and discovery.
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cuDeviceGetCount) device_get_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetName) device_get_name = nullptr;
  decltype(&::cuDeviceTotalMem) device_total_mem = nullptr;  // cuDeviceTotalMem_v2
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuDeviceCanAccessPeer) device_can_access_peer = nullptr;
  decltype(&::cuDeviceGetUuid) device_get_uuid = nullptr;  // cuDeviceGetUuid_v2

  // Optional: contexts and CUDA IPC of memory.
  decltype(&::cuDevicePrimaryCtxRetain) device_primary_ctx_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) device_primary_ctx_release = nullptr;  // _v2
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuMemGetInfo) mem_get_info = nullptr;  // cuMemGetInfo_v2
  decltype(&::cuIpcGetMemHandle) ipc_get_mem_handle = nullptr;
  decltype(&::cuIpcOpenMemHandle) ipc_open_mem_handle = nullptr;  // cuIpcOpenMemHandle_v2
  decltype(&::cuIpcCloseMemHandle) ipc_close_mem_handle = nullptr;

  // Optional: what calls with CUDA tensors use (HasCopyApi says whether all are there).
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuCtxEnablePeerAccess) ctx_enable_peer_access = nullptr;
  decltype(&::cuMemAlloc) mem_alloc = nullptr;                        // cuMemAlloc_v2
  decltype(&::cuMemFree) mem_free = nullptr;                          // cuMemFree_v2
  decltype(&::cuMemGetAddressRange) mem_get_address_range = nullptr;  // _v2
  decltype(&::cuPointerGetAttribute) pointer_get_attribute = nullptr;
  decltype(&::cuMemcpyAsync) memcpy_async = nullptr;
  decltype(&::cuMemcpyHtoD) memcpy_htod = nullptr;  // cuMemcpyHtoD_v2
  decltype(&::cuMemcpyDtoH) memcpy_dtoh = nullptr;  // cuMemcpyDtoH_v2
  decltype(&::cuMemsetD8) memset_d8 = nullptr;      // cuMemsetD8_v2
  decltype(&::cuStreamCreate) stream_create = nullptr;
  decltype(&::cuStreamDestroy) stream_destroy = nullptr;  // cuStreamDestroy_v2
  decltype(&::cuStreamSynchronize) stream_synchronize = nullptr;
  decltype(&::cuEventCreate) event_create = nullptr;
  decltype(&::cuEventRecord) event_record = nullptr;
  decltype(&::cuEventSynchronize) event_synchronize = nullptr;
  decltype(&::cuEventDestroy) event_destroy = nullptr;  // cuEventDestroy_v2
  decltype(&::cuMemHostAlloc) mem_host_alloc = nullptr;
  decltype(&::cuMemFreeHost) mem_free_host = nullptr;
};

#else

struct DriverApi {};

#endif  // TPD_HAVE_CUDA_H

class Driver {
 public:
  // The process's driver: kDriverLibrary opened, its entry points resolved and cuInit(0)
  // called on the first call; every later call returns the same Driver or the same error.
  // Errors say why there is no usable driver, and never crash or exit the process:
  //   FAILED_PRECONDITION "libcuda.so.1 not found: no NVIDIA driver on this machine (...)"
  //   FAILED_PRECONDITION "libcuda.so.1 (...) lacks cuDeviceGetUuid_v2: the NVIDIA driver is
  //                        older than this build supports; ..."
  //   FAILED_PRECONDITION "cuInit failed: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is
  //                        detected" (a driver but no usable GPU)
  //   UNIMPLEMENTED       "tpd was built without the CUDA toolkit's cuda.h: ..."
  static absl::StatusOr<const Driver*> Load();

  // Opens `library` (a soname or a path) anew, bypassing Load's cache, and calls cuInit(0);
  // errors as Load's, naming `library`. For tests (a library that does not exist shows the
  // "not found" path on any machine). The handle stays open for the life of the process, as
  // drivers are never unloaded.
  static absl::StatusOr<std::unique_ptr<Driver>> LoadFrom(const std::string& library);

  // A driver over the given entry points, for fakes in tests: nothing is opened and cuInit is
  // not called. REQUIRES: every required entry point of `api` is set.
  explicit Driver(const DriverApi& api, std::string library = "fake");

  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  const DriverApi& api() const { return api_; }
  // What was opened ("libcuda.so.1", a path, or "fake").
  const std::string& library() const { return library_; }

#if TPD_HAVE_CUDA_H
  // "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"; "CUresult 999" for a code
  // the driver does not know.
  std::string ErrorText(CUresult result) const;
  // OK for CUDA_SUCCESS, else FAILED_PRECONDITION "<what> failed: <ErrorText>", where `what`
  // names the call and its object ("cuDeviceGetName(cuda:1)").
  absl::Status Check(CUresult result, absl::string_view what) const;
  // OK when every entry point that calls with CUDA tensors use (IPC of memory and events,
  // contexts, streams, events, copies) was found; else FAILED_PRECONDITION naming the first
  // missing one.
  absl::Status HasCopyApi() const;
#endif

 private:
  DriverApi api_;
  std::string library_;
};

}  // namespace tpd::cuda

#endif  // TPD_CUDA_DRIVER_H_
