// The run-time driver loader and GPU discovery (cuda), and the daemon's GPU section.
//
// Three kinds of tests:
//   - everywhere: a missing driver library is an error that says so (never a crash), and the
//     process's Load and DiscoverGpus agree on why there are no GPUs;
//   - everywhere, over a fake driver (a table of plain functions behind DriverApi): what
//     discovery makes of devices, attributes, UUIDs and the peer matrix, and how a failing
//     query is reported;
//   - with a GPU (the device machine, docs/cuda.md): discovery against the real driver. They
//     skip with the reason ("no NVIDIA driver: libcuda.so.1 not found ...") elsewhere.
// The daemon tests run the real tpd and tpctl: Admin.Status and `tpctl status` report the
// GPUs, or "no GPUs: <reason>", and [group] cuda_device_count still overrides the count.

#include "cuda/driver.h"

#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "cuda/discovery.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"

namespace tpd::cuda {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

// The process's driver, or a skip that says why there is none.
#define SKIP_WITHOUT_GPU(driver)                                                       \
  absl::StatusOr<const Driver*> driver = Driver::Load();                               \
  if (!driver.ok()) GTEST_SKIP() << "no NVIDIA driver: " << driver.status().message(); \
  do {                                                                                 \
  } while (false)

TEST(DriverTest, MissingLibraryIsAnErrorThatSaysSo) {
  absl::StatusOr<std::unique_ptr<Driver>> driver = Driver::LoadFrom("libtpd-no-such-driver.so.1");
  ASSERT_FALSE(driver.ok());
  if (!BuiltWithCuda()) {
    EXPECT_EQ(driver.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(driver.status().message()),
                HasSubstr("built without the CUDA toolkit"));
    return;
  }
  EXPECT_EQ(driver.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(driver.status().message()),
              StartsWith("libtpd-no-such-driver.so.1 not found: no NVIDIA driver on this machine"));
}

TEST(DriverTest, LoadAndDiscoveryAgreeOnWhyThereAreNoGpus) {
  absl::StatusOr<const Driver*> driver = Driver::Load();
  const GpuDiscovery gpus = DiscoverGpus();
  if (driver.ok()) {
    EXPECT_TRUE(gpus.driver_loaded) << gpus.unavailable_reason;
    EXPECT_GT(gpus.driver_version, 0);
    return;
  }
  // The CPU-only case (CI): a reason, no devices, no crash. Load keeps its answer.
  EXPECT_FALSE(gpus.driver_loaded);
  EXPECT_THAT(gpus.gpus, ::testing::IsEmpty());
  EXPECT_THAT(gpus.can_access_peer, ::testing::IsEmpty());
  EXPECT_EQ(gpus.unavailable_reason, driver.status().message());
  EXPECT_FALSE(gpus.unavailable_reason.empty());
  EXPECT_EQ(Driver::Load().status(), driver.status());
  if (BuiltWithCuda() && driver.status().message().find("not found") != std::string::npos) {
    EXPECT_THAT(gpus.unavailable_reason,
                StartsWith("libcuda.so.1 not found: no NVIDIA driver on this machine"));
  }
}

TEST(DriverVersionTextTest, IsMajorDotMinor) {
  EXPECT_EQ(DriverVersionText(13000), "13.0");
  EXPECT_EQ(DriverVersionText(12080), "12.8");
  EXPECT_EQ(DriverVersionText(0), "none");
}

#if TPD_HAVE_CUDA_H

// --- A fake driver: three devices, 0 and 1 peers of each other, 2 alone -------------------

struct FakeGpu {
  const char* name;
  size_t memory;
  int major, minor;
  int domain, bus, slot;
  unsigned char uuid[16];
};

const FakeGpu kFakeGpus[] = {
    {"Fake H100",
     size_t{80} << 30,
     9,
     0,
     0,
     0x19,
     0,
     {0x5b, 0x5c, 0x0d, 0x8e, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xab, 0xcd}},
    {"Fake H100", size_t{80} << 30, 9, 0, 0, 0x3b, 0, {1}},
    {"Fake A10", size_t{24} << 30, 8, 6, 1, 0xc1, 2, {2}},
};
constexpr int kFakeCount = 3;

// The query that fails, if any: its device and code.
int fail_name_of = -1;

CUresult FakeErrorName(CUresult error, const char** text) {
  *text = error == CUDA_ERROR_INVALID_DEVICE ? "CUDA_ERROR_INVALID_DEVICE" : "CUDA_ERROR_UNKNOWN";
  return CUDA_SUCCESS;
}
CUresult FakeErrorString(CUresult error, const char** text) {
  *text = error == CUDA_ERROR_INVALID_DEVICE ? "invalid device ordinal" : "unknown error";
  return CUDA_SUCCESS;
}
CUresult FakeInit(unsigned int) { return CUDA_SUCCESS; }
CUresult FakeVersion(int* version) {
  *version = 12080;
  return CUDA_SUCCESS;
}
CUresult FakeCount(int* count) {
  *count = kFakeCount;
  return CUDA_SUCCESS;
}
// Device handles differ from ordinals, as nothing promises they are equal.
CUresult FakeGet(CUdevice* device, int ordinal) {
  if (ordinal < 0 || ordinal >= kFakeCount) return CUDA_ERROR_INVALID_DEVICE;
  *device = 100 + ordinal;
  return CUDA_SUCCESS;
}
const FakeGpu* Of(CUdevice device) {
  const int i = device - 100;
  return i >= 0 && i < kFakeCount ? &kFakeGpus[i] : nullptr;
}
CUresult FakeName(char* name, int length, CUdevice device) {
  if (Of(device) == nullptr || device - 100 == fail_name_of) return CUDA_ERROR_INVALID_DEVICE;
  std::strncpy(name, Of(device)->name, length);
  return CUDA_SUCCESS;
}
CUresult FakeMemory(size_t* bytes, CUdevice device) {
  if (Of(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = Of(device)->memory;
  return CUDA_SUCCESS;
}
CUresult FakeAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  const FakeGpu* gpu = Of(device);
  if (gpu == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = gpu->major;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *value = gpu->minor;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      *value = gpu->domain;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *value = gpu->bus;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
      *value = gpu->slot;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
CUresult FakeCanAccessPeer(int* can, CUdevice device, CUdevice peer) {
  if (Of(device) == nullptr || Of(peer) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *can = (device == 100 && peer == 101) || (device == 101 && peer == 100);
  return CUDA_SUCCESS;
}
CUresult FakeUuid(CUuuid* uuid, CUdevice device) {
  if (Of(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  std::memcpy(uuid->bytes, Of(device)->uuid, 16);
  return CUDA_SUCCESS;
}

DriverApi FakeApi() {
  DriverApi api;
  api.get_error_name = &FakeErrorName;
  api.get_error_string = &FakeErrorString;
  api.init = &FakeInit;
  api.driver_get_version = &FakeVersion;
  api.device_get_count = &FakeCount;
  api.device_get = &FakeGet;
  api.device_get_name = &FakeName;
  api.device_total_mem = &FakeMemory;
  api.device_get_attribute = &FakeAttribute;
  api.device_can_access_peer = &FakeCanAccessPeer;
  api.device_get_uuid = &FakeUuid;
  return api;
}

TEST(FakeDriverTest, DiscoversEveryDeviceWithItsAttributes) {
  fail_name_of = -1;
  const Driver driver(FakeApi());
  absl::StatusOr<GpuDiscovery> gpus = DiscoverGpus(driver);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_TRUE(gpus->driver_loaded);
  EXPECT_EQ(gpus->driver_version, 12080);
  EXPECT_EQ(gpus->unavailable_reason, "");
  ASSERT_EQ(gpus->gpus.size(), 3u);
  const Gpu& first = gpus->gpus[0];
  EXPECT_EQ(first.index, 0);
  EXPECT_EQ(first.name, "Fake H100");
  EXPECT_EQ(first.total_memory_bytes, uint64_t{80} << 30);
  EXPECT_EQ(first.compute_capability_major, 9);
  EXPECT_EQ(first.compute_capability_minor, 0);
  EXPECT_EQ(first.pci_bus_id, "0000:19:00.0");
  EXPECT_EQ(first.uuid, "GPU-5b5c0d8e-0001-0203-0405-06070809abcd");
  const Gpu& third = gpus->gpus[2];
  EXPECT_EQ(third.index, 2);
  EXPECT_EQ(third.name, "Fake A10");
  EXPECT_EQ(third.compute_capability_minor, 6);
  EXPECT_EQ(third.pci_bus_id, "0001:C1:02.0");
  EXPECT_EQ(third.uuid, "GPU-02000000-0000-0000-0000-000000000000");
}

TEST(FakeDriverTest, PeerMatrixIsSquareWithATrueDiagonal) {
  fail_name_of = -1;
  const Driver driver(FakeApi());
  absl::StatusOr<GpuDiscovery> gpus = DiscoverGpus(driver);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_THAT(gpus->can_access_peer,
              ElementsAre(ElementsAre(true, true, false), ElementsAre(true, true, false),
                          ElementsAre(false, false, true)));
}

TEST(FakeDriverTest, AFailingQueryNamesTheCallTheDeviceAndTheDriversError) {
  fail_name_of = 1;
  const Driver driver(FakeApi());
  absl::StatusOr<GpuDiscovery> gpus = DiscoverGpus(driver);
  fail_name_of = -1;
  ASSERT_FALSE(gpus.ok());
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpus.status().message(),
            "cuDeviceGetName(cuda:1) failed: CUDA_ERROR_INVALID_DEVICE: invalid device ordinal");
}

TEST(FakeDriverTest, ErrorTextOfACodeTheDriverDoesNotKnow) {
  DriverApi api = FakeApi();
  api.get_error_name = [](CUresult, const char**) { return CUDA_ERROR_INVALID_VALUE; };
  const Driver driver(api);
  EXPECT_EQ(driver.ErrorText(static_cast<CUresult>(12345)), "CUresult 12345");
  EXPECT_TRUE(driver.Check(CUDA_SUCCESS, "cuInit").ok());
}

// --- The real driver (the device machine) ----------------------------------------------------

TEST(GpuTest, DiscoveryMatchesTheDriversCount) {
  SKIP_WITHOUT_GPU(driver);
  int count = -1;
  ASSERT_EQ((*driver)->api().device_get_count(&count), CUDA_SUCCESS);
  absl::StatusOr<GpuDiscovery> gpus = DiscoverGpus(**driver);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_EQ(static_cast<int>(gpus->gpus.size()), count);
  EXPECT_GT(count, 0) << "cuInit succeeded, so the driver has a device";
  EXPECT_EQ(DiscoverGpus().gpus.size(), gpus->gpus.size());
  std::cout << "driver for CUDA " << DriverVersionText(gpus->driver_version) << ", " << count
            << " GPUs\n";
}

TEST(GpuTest, EveryDeviceHasANameMemoryCapabilityPciIdAndUuid) {
  SKIP_WITHOUT_GPU(driver);
  absl::StatusOr<GpuDiscovery> gpus = DiscoverGpus(**driver);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  for (size_t i = 0; i < gpus->gpus.size(); ++i) {
    const Gpu& gpu = gpus->gpus[i];
    SCOPED_TRACE(absl::StrCat("cuda:", i, " ", gpu.name));
    EXPECT_EQ(gpu.index, static_cast<int>(i));
    EXPECT_FALSE(gpu.name.empty());
    EXPECT_GT(gpu.total_memory_bytes, 0u);
    EXPECT_GE(gpu.compute_capability_major, 3);
    EXPECT_THAT(gpu.pci_bus_id, MatchesRegex("[0-9A-F]{4}:[0-9A-F]{2}:[0-9A-F]{2}\\.0"));
    EXPECT_THAT(gpu.uuid, MatchesRegex("GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                                       "[0-9a-f]{12}"));
    std::cout << "cuda:" << i << " " << gpu.name << ", " << (gpu.total_memory_bytes >> 20)
              << " MiB, " << gpu.compute_capability_major << "." << gpu.compute_capability_minor
              << ", " << gpu.pci_bus_id << ", " << gpu.uuid << "\n";
  }
}

TEST(GpuTest, PeerMatrixIsSquareWithATrueDiagonal) {
  SKIP_WITHOUT_GPU(driver);
  absl::StatusOr<GpuDiscovery> gpus = DiscoverGpus(**driver);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->can_access_peer.size(), gpus->gpus.size());
  for (size_t i = 0; i < gpus->can_access_peer.size(); ++i) {
    ASSERT_EQ(gpus->can_access_peer[i].size(), gpus->gpus.size());
    EXPECT_TRUE(gpus->can_access_peer[i][i]);
  }
}

TEST(GpuTest, EntryPointsForIpcAreResolved) {
  SKIP_WITHOUT_GPU(driver);
  const DriverApi& api = (*driver)->api();
  EXPECT_NE(api.device_primary_ctx_retain, nullptr);
  EXPECT_NE(api.device_primary_ctx_release, nullptr);
  EXPECT_NE(api.ctx_set_current, nullptr);
  EXPECT_NE(api.mem_get_info, nullptr);
  EXPECT_NE(api.ipc_get_mem_handle, nullptr);
  EXPECT_NE(api.ipc_open_mem_handle, nullptr);
  EXPECT_NE(api.ipc_close_mem_handle, nullptr);
}

#endif  // TPD_HAVE_CUDA_H

// --- The daemon's GPU section ----------------------------------------------------------------

class DaemonGpuTest : public ::testing::Test {
 protected:
  // Starts tpd with `config` (TOML) and returns its Status.
  v1::StatusResponse StartAndStatus(const std::string& config) {
    socket_ = absl::StrCat(dir_.path(), "/tpd.sock");
    const std::string path = dir_.WriteFile("tpd.toml", config);
    absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> daemon =
        testing::DaemonProcess::Start(socket_, {"--config", path});
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    if (!daemon.ok()) return {};
    daemon_ = *std::move(daemon);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket_);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return {};
    absl::StatusOr<v1::StatusResponse> status = (*client)->Status();
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::StatusResponse();
  }

  std::string TpctlStatus() {
    testing::ProcessResult result =
        testing::RunProcess({testing::RunfilePath("client/tpctl"), "--socket", socket_, "status"});
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.output;
  }

  testing::TempDir dir_;
  std::string socket_;
  std::unique_ptr<testing::DaemonProcess> daemon_;
};

TEST_F(DaemonGpuTest, StatusReportsWhatTheDriverReports) {
  const v1::StatusResponse status = StartAndStatus("[daemon]\nlog_level = \"info\"\n");
  const GpuDiscovery here = DiscoverGpus();  // this process sees the same driver
  const v1::GpuStatus& gpus = status.gpus();
  EXPECT_EQ(gpus.driver_loaded(), here.driver_loaded);
  EXPECT_EQ(gpus.driver_version(), here.driver_version);
  ASSERT_EQ(gpus.devices_size(), static_cast<int>(here.gpus.size()));
  // -1 (auto): groups are told the driver's count, 0 without a driver.
  EXPECT_EQ(status.node().device_count(), static_cast<int64_t>(here.gpus.size()));
  const std::string printed = TpctlStatus();
  if (here.gpus.empty()) {
    EXPECT_EQ(gpus.unavailable_reason(), here.unavailable_reason);
    EXPECT_FALSE(gpus.unavailable_reason().empty());
    EXPECT_THAT(printed, HasSubstr(absl::StrCat("  gpus:    no GPUs: ", here.unavailable_reason)));
    EXPECT_THAT(daemon_->Output(), HasSubstr(absl::StrCat("no GPUs: ", here.unavailable_reason)));
    return;
  }
  ASSERT_EQ(gpus.peer_access_size(), gpus.devices_size());
  for (int i = 0; i < gpus.devices_size(); ++i) {
    const v1::GpuDevice& device = gpus.devices(i);
    EXPECT_EQ(device.index(), i);
    EXPECT_EQ(device.name(), here.gpus[i].name);
    EXPECT_EQ(device.total_memory_bytes(), here.gpus[i].total_memory_bytes);
    EXPECT_EQ(device.uuid(), here.gpus[i].uuid);
    EXPECT_EQ(device.pci_bus_id(), here.gpus[i].pci_bus_id);
    EXPECT_TRUE(gpus.peer_access(i).can_access(i));
    EXPECT_THAT(printed, HasSubstr(absl::StrCat("    cuda:", i, " ", device.name(), ", ")));
  }
  std::cout << printed;
}

TEST_F(DaemonGpuTest, ConfiguredDeviceCountStillOverridesTheDrivers) {
  const v1::StatusResponse status = StartAndStatus("[group]\ncuda_device_count = 3\n");
  EXPECT_EQ(status.node().device_count(), 3);
  // The GPU section still says what the driver found.
  EXPECT_EQ(status.gpus().devices_size(), static_cast<int>(DiscoverGpus().gpus.size()));
  if (DiscoverGpus().gpus.size() != 3) {
    EXPECT_THAT(TpctlStatus(), HasSubstr("(groups are told 3 CUDA devices: [group] "
                                         "cuda_device_count)"));
  }
}

}  // namespace
}  // namespace tpd::cuda
