// This node's GPUs as the NVIDIA driver sees them: each device's name, memory, compute
// capability, PCI bus id and UUID, and which devices can access each other's memory (peer
// access, NVLink or PCIe). The daemon reports it in Admin.Status and derives the CUDA device
// count it gives groups from it; a CPU-only node gets an empty discovery with the reason.
//
// Device indices are the driver's ordinals as this process sees them (after
// CUDA_VISIBLE_DEVICES), which is what cuda:N means in device maps.
//
// Thread safety: the functions are thread-safe; a GpuDiscovery is a plain value.

#ifndef TPD_CUDA_DISCOVERY_H_
#define TPD_CUDA_DISCOVERY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cuda/driver.h"

namespace tpd::cuda {

struct Gpu {
  int index = 0;     // cuda:index
  std::string name;  // "NVIDIA H100 80GB HBM3"
  uint64_t total_memory_bytes = 0;
  int compute_capability_major = 0;  // 9.0 for Hopper
  int compute_capability_minor = 0;
  // "0000:19:00.0": PCI domain, bus, device, function 0, as cuDeviceGetPCIBusId prints it
  // (nvidia-smi widens the domain to 8 digits: "00000000:19:00.0").
  std::string pci_bus_id;
  // "GPU-5b5c0d8e-...": the form nvidia-smi -L prints, stable across reboots and
  // CUDA_VISIBLE_DEVICES orderings.
  std::string uuid;
};

struct GpuDiscovery {
  // Whether a driver was loaded and initialized.
  bool driver_loaded = false;
  // cuDriverGetVersion: the CUDA version the driver supports, 13000 for 13.0; 0 without one.
  int driver_version = 0;
  // Why there are no GPUs: no driver, cuInit failed, a query failed, or CUDA not built in.
  // Empty when the driver loaded and every query succeeded (even with no device).
  std::string unavailable_reason;
  std::vector<Gpu> gpus;
  // can_access_peer[i][j]: device i can map device j's memory (cuDeviceCanAccessPeer). Square,
  // gpus.size() rows, the diagonal true.
  std::vector<std::vector<bool>> can_access_peer;
};

// Asks `driver` for its version, devices and peer-access matrix. FAILED_PRECONDITION naming
// the call and device when a query fails ("cuDeviceGetName(cuda:1) failed: ...").
absl::StatusOr<GpuDiscovery> DiscoverGpus(const Driver& driver);

// The process's driver (Driver::Load) asked as above. Never fails: without a driver, or when
// a query fails, the result holds no GPUs and unavailable_reason says why.
GpuDiscovery DiscoverGpus();

// "13.0" for 13000; "none" for 0.
std::string DriverVersionText(int version);

}  // namespace tpd::cuda

#endif  // TPD_CUDA_DISCOVERY_H_
