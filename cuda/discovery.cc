#include "cuda/discovery.h"

#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tpd::cuda {

std::string DriverVersionText(int version) {
  if (version <= 0) return "none";
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

#if TPD_HAVE_CUDA_H

namespace {

std::string Device(int index) { return absl::StrCat("cuda:", index); }

// GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, lower-case hex, as nvidia-smi -L prints it.
std::string UuidText(const CUuuid& uuid) {
  std::string text = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    absl::StrAppendFormat(&text, "%02x", static_cast<unsigned char>(uuid.bytes[i]));
  }
  return text;
}

}  // namespace

absl::StatusOr<GpuDiscovery> DiscoverGpus(const Driver& driver) {
  const DriverApi& api = driver.api();
  GpuDiscovery out;
  if (absl::Status s =
          driver.Check(api.driver_get_version(&out.driver_version), "cuDriverGetVersion");
      !s.ok()) {
    return s;
  }
  int count = 0;
  if (absl::Status s = driver.Check(api.device_get_count(&count), "cuDeviceGetCount"); !s.ok()) {
    return s;
  }
  std::vector<CUdevice> devices(count);
  for (int i = 0; i < count; ++i) {
    const std::string what = absl::StrCat("(", Device(i), ")");
    if (absl::Status s = driver.Check(api.device_get(&devices[i], i), "cuDeviceGet" + what);
        !s.ok()) {
      return s;
    }
    const CUdevice device = devices[i];
    Gpu& gpu = out.gpus.emplace_back();
    gpu.index = i;
    char name[256] = {};
    if (absl::Status s = driver.Check(api.device_get_name(name, sizeof(name) - 1, device),
                                      "cuDeviceGetName" + what);
        !s.ok()) {
      return s;
    }
    gpu.name = name;
    size_t bytes = 0;
    if (absl::Status s =
            driver.Check(api.device_total_mem(&bytes, device), "cuDeviceTotalMem" + what);
        !s.ok()) {
      return s;
    }
    gpu.total_memory_bytes = bytes;
    int domain = 0, bus = 0, slot = 0;
    for (auto [attribute, value, label] :
         {std::make_tuple(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                          &gpu.compute_capability_major, "COMPUTE_CAPABILITY_MAJOR"),
          std::make_tuple(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                          &gpu.compute_capability_minor, "COMPUTE_CAPABILITY_MINOR"),
          std::make_tuple(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, &domain, "PCI_DOMAIN_ID"),
          std::make_tuple(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, &bus, "PCI_BUS_ID"),
          std::make_tuple(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, &slot, "PCI_DEVICE_ID")}) {
      if (absl::Status s =
              driver.Check(api.device_get_attribute(value, attribute, device),
                           absl::StrCat("cuDeviceGetAttribute(", Device(i), ", ", label, ")"));
          !s.ok()) {
        return s;
      }
    }
    gpu.pci_bus_id = absl::StrFormat("%04X:%02X:%02X.0", domain, bus, slot);
    CUuuid uuid;
    std::memset(&uuid, 0, sizeof(uuid));
    if (absl::Status s = driver.Check(api.device_get_uuid(&uuid, device), "cuDeviceGetUuid" + what);
        !s.ok()) {
      return s;
    }
    gpu.uuid = UuidText(uuid);
  }
  out.can_access_peer.assign(count, std::vector<bool>(count, false));
  for (int i = 0; i < count; ++i) {
    for (int j = 0; j < count; ++j) {
      if (i == j) {
        out.can_access_peer[i][j] = true;
        continue;
      }
      int can = 0;
      if (absl::Status s =
              driver.Check(api.device_can_access_peer(&can, devices[i], devices[j]),
                           absl::StrCat("cuDeviceCanAccessPeer(", Device(i), ", ", Device(j), ")"));
          !s.ok()) {
        return s;
      }
      out.can_access_peer[i][j] = can != 0;
    }
  }
  out.driver_loaded = true;
  return out;
}

#endif  // TPD_HAVE_CUDA_H

GpuDiscovery DiscoverGpus() {
  GpuDiscovery none;
  absl::StatusOr<const Driver*> driver = Driver::Load();
  if (!driver.ok()) {
    none.unavailable_reason = std::string(driver.status().message());
    return none;
  }
#if TPD_HAVE_CUDA_H
  absl::StatusOr<GpuDiscovery> found = DiscoverGpus(**driver);
  if (found.ok()) return *std::move(found);
  none.unavailable_reason = std::string(found.status().message());
  // The driver loaded: say which one, though a query failed (a version it cannot tell stays 0).
  if ((**driver).api().driver_get_version(&none.driver_version) != CUDA_SUCCESS) {
    none.driver_version = 0;
  }
  none.driver_loaded = true;
#endif
  return none;
}

}  // namespace tpd::cuda
