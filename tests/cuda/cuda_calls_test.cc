// Calls with CUDA tensors between two clients of one daemon, moved by the group's device maps
// (docs/cuda.md, "Calls with CUDA tensors"). Real daemon, real CUDA IPC, contents checked by
// copying them back from the device. Without a GPU (CI) every case skips with the reason;
// cases that need two GPUs skip on a machine with one.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "cuda/driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_nodes.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_session.h"
#include "tests/testing/test_bytes.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;
using testing::Pattern;
using testing::RawSession;
using testing::WaitUntil;

#if TPD_HAVE_CUDA_H

// The test's own use of the GPUs, through the driver API: allocate, fill, read back.
// Thread-safe.
class Gpus {
 public:
  static absl::StatusOr<std::unique_ptr<Gpus>> Open() {
    absl::StatusOr<const cuda::Driver*> driver = cuda::Driver::Load();
    if (!driver.ok()) return driver.status();
    auto gpus = std::unique_ptr<Gpus>(new Gpus(*driver));
    int count = 0;
    if ((*driver)->api().device_get_count(&count) != CUDA_SUCCESS) {
      return absl::FailedPreconditionError("cuDeviceGetCount failed");
    }
    for (int d = 0; d < count; ++d) {
      CUdevice device;
      CUcontext context;
      (*driver)->api().device_get(&device, d);
      if ((*driver)->api().device_primary_ctx_retain(&context, device) != CUDA_SUCCESS) {
        return absl::FailedPreconditionError("cuDevicePrimaryCtxRetain failed");
      }
      gpus->contexts_.push_back(context);
    }
    return gpus;
  }
  ~Gpus() {
    absl::MutexLock lock(&mu_);
    for (const auto& [ptr, device] : allocations_) {
      Use(device);
      api().mem_free(ptr);
    }
  }

  int count() const { return static_cast<int>(contexts_.size()); }
  const cuda::DriverApi& api() const { return driver_->api(); }
  void Use(int device) const { api().ctx_set_current(contexts_[device]); }

  // `bytes` on `device` holding Pattern(bytes, seed).
  CUdeviceptr Alloc(int device, size_t bytes, uint32_t seed) {
    Use(device);
    CUdeviceptr ptr = 0;
    EXPECT_EQ(api().mem_alloc(&ptr, std::max<size_t>(bytes, 1)), CUDA_SUCCESS);
    {
      absl::MutexLock lock(&mu_);
      allocations_[ptr] = device;
    }
    if (bytes > 0) {
      const std::string pattern = Pattern(bytes, seed);
      EXPECT_EQ(api().memcpy_htod(ptr, pattern.data(), bytes), CUDA_SUCCESS);
    }
    return ptr;
  }
  void Free(CUdeviceptr ptr) {
    absl::MutexLock lock(&mu_);
    auto it = allocations_.find(ptr);
    if (it == allocations_.end()) return;
    Use(it->second);
    api().mem_free(ptr);
    allocations_.erase(it);
  }
  std::string Read(const Tensor& tensor) const {
    std::string out(tensor.size(), '\0');
    if (tensor.size() == 0) return out;
    Use(tensor.device().index);
    EXPECT_EQ(api().memcpy_dtoh(out.data(), tensor.device_pointer(), tensor.size()), CUDA_SUCCESS);
    return out;
  }
  // The IPC handle of the allocation at `ptr`, as a client would export it.
  shm::CudaExport Export(CUdeviceptr ptr) const {
    shm::CudaExport record{};
    CUipcMemHandle handle;
    EXPECT_EQ(api().ipc_get_mem_handle(&handle, ptr), CUDA_SUCCESS);
    std::memcpy(record.memory, &handle, sizeof(handle));
    return record;
  }
  // Free memory on `device` by the driver (cuMemGetInfo).
  size_t FreeBytes(int device) const {
    Use(device);
    size_t free = 0, total = 0;
    api().mem_get_info(&free, &total);
    return free;
  }

 private:
  explicit Gpus(const cuda::Driver* driver) : driver_(driver) {}
  const cuda::Driver* driver_;
  std::vector<CUcontext> contexts_;
  absl::Mutex mu_;
  std::map<CUdeviceptr, int> allocations_ ABSL_GUARDED_BY(mu_);
};

#define REQUIRE_GPUS(n)                                                              \
  if (gpus_ == nullptr) GTEST_SKIP() << "no usable NVIDIA driver: " << gpus_error_;  \
  if (gpus_->count() < (n)) {                                                        \
    GTEST_SKIP() << "needs " << (n) << " GPUs, this machine has " << gpus_->count(); \
  }

// The bytes of `tensor` wherever it lies.
std::string Bytes(Gpus& gpus, const Tensor& tensor) {
  return tensor.is_cuda() ? gpus.Read(tensor) : std::string(tensor.data());
}

class CudaCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Gpus>> gpus = Gpus::Open();
    if (!gpus.ok()) {
      gpus_error_ = std::string(gpus.status().message());
      return;
    }
    gpus_ = *std::move(gpus);
    ASSERT_NO_FATAL_FAILURE(nodes_.Start(0));
  }

  // A second daemon on this host standing in for a second node (both see every GPU): calls
  // between them take the staged path.
  void StartSecondNode() { ASSERT_NO_FATAL_FAILURE(nodes_.Start(1)); }

  std::unique_ptr<Client> Connect(uint64_t pool_bytes = uint64_t{256} << 20,
                                  bool second_node = false) {
    ClientOptions options;
    options.cuda_pool_bytes = pool_bytes;
    return nodes_.Connect(second_node ? 1 : 0, options);
  }

  // `devices`: set_devices (a worker that receives from members joining after it names the
  // devices it receives on; its negotiated list only grows from maps known when it joins).
  absl::Status Join(Client* client, const std::string& name,
                    const std::map<std::string, std::map<std::string, std::string>>& maps,
                    const std::vector<std::string>& devices = {}) {
    JoinOptions options;
    options.group = "g";
    options.name = name;
    options.init_method = nodes_.init_method();  // the first daemon's store
    options.timeout = absl::Seconds(30);
    for (const auto& [to, map] : maps) {
      auto& out = (*options.options.mutable_device_maps())[to];
      for (const auto& [from_device, to_device] : map)
        (*out.mutable_devices())[from_device] = to_device;
    }
    for (const std::string& device : devices) options.options.add_devices(device);
    return client->Join(options).status();
  }

  // a (pool `a_pool`) and b (pool `b_pool`, on the second daemon when `b_remote`) in group g,
  // a's map sending cuda:0 to b's cuda:1. Sets a_ and b_.
  void CrossGpuPair(uint64_t a_pool, uint64_t b_pool, bool b_remote = false) {
    a_ = Connect(a_pool);
    b_ = Connect(b_pool, b_remote);
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    ASSERT_TRUE(Join(a_.get(), "a", {{"b", {{"cuda:0", "cuda:1"}}}}).ok());
    ASSERT_TRUE(Join(b_.get(), "b", {}).ok());
  }

  // b answers "echo" with its request's tensors (views into its pools or rx heap, sent on)
  // and, in the payload, each tensor's device and a checksum of its bytes read on b's side.
  void HandleEcho(Client* b) {
    ASSERT_TRUE(b->Handle("echo", [this](const Message& request) -> absl::StatusOr<Message> {
                   Message reply;
                   reply.tensors = request.tensors;
                   for (const Tensor& t : request.tensors) {
                     absl::StrAppend(&reply.payload, t.device().ToString(), "=",
                                     std::hash<std::string>()(Bytes(*gpus_, t)), ";");
                   }
                   return reply;
                 }).ok());
  }

  // b answers "sum" with its request's first tensor's device and a hash of its bytes.
  void HandleSum(Client* b) {
    ASSERT_TRUE(b->Handle("sum", [this](const Message& request) -> absl::StatusOr<Message> {
                   const Tensor& t = request.tensors.at(0);
                   return Message{absl::StrCat(t.device().ToString(), ":",
                                               std::hash<std::string>()(gpus_->Read(t))),
                                  {},
                                  ""};
                 }).ok());
  }

  // From `a` to worker b (which echoes, and whose map swaps cuda:0 and cuda:1 with a's): 64
  // tensors alternating cuda:0 and cuda:1, tensor i of `bytes(i)` bytes filled from seed + i.
  // Each must reach b on the other device and come home with its bytes.
  void EchoSwapped(Client* a, const std::function<size_t(int)>& bytes, uint32_t seed) {
    std::vector<Tensor> tensors;
    std::vector<std::pair<std::string, std::string>> expected;
    for (int i = 0; i < 64; ++i) {
      const int device = i % 2;
      const size_t size = bytes(i);
      const CUdeviceptr ptr = gpus_->Alloc(device, size, seed + i);
      tensors.push_back(
          Tensor::Cuda(shm::DType::kInt32, {static_cast<int64_t>(size / 4)}, ptr, device));
      expected.push_back({device == 0 ? "cuda:1" : "cuda:0", Pattern(size, seed + i)});
    }
    absl::StatusOr<Message> reply = a->Call("g", "b", "echo", "", tensors);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->payload, Expect(expected));
    ASSERT_EQ(reply->tensors.size(), 64u);
    for (int i = 0; i < 64; ++i) {
      EXPECT_EQ(reply->tensors[i].device().index, i % 2) << "tensor " << i << " came home";
      EXPECT_EQ(gpus_->Read(reply->tensors[i]), expected[i].second) << "tensor " << i;
    }
  }

  static std::string Expect(const std::vector<std::pair<std::string, std::string>>& tensors) {
    std::string out;
    for (const auto& [device, bytes] : tensors) {
      absl::StrAppend(&out, device, "=", std::hash<std::string>()(bytes), ";");
    }
    return out;
  }

  std::unique_ptr<Gpus> gpus_;
  std::string gpus_error_;
  testing::DaemonNodes nodes_{{"gpu-node", "gpu-node-2"},
                              [](int) { return "[data]\narena_bytes = 67108864\n"; }};
  std::unique_ptr<Client> a_;  // CrossGpuPair's
  std::unique_ptr<Client> b_;
};

TEST_F(CudaCallsTest, SameGpuThereAndBackEverySize) {
  REQUIRE_GPUS(1);
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(Join(a.get(), "a", {{"b", {{"cuda:0", "cuda:0"}}}}).ok());
  ASSERT_TRUE(Join(b.get(), "b", {}).ok());
  HandleEcho(b.get());
  const std::vector<size_t> sizes = {0, 1, 4096, (1 << 20) + 3, 64 << 20};
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, std::string>> expected;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const CUdeviceptr ptr = gpus_->Alloc(0, sizes[i], static_cast<uint32_t>(i));
    tensors.push_back(Tensor::Cuda(shm::DType::kUInt8, {static_cast<int64_t>(sizes[i])}, ptr, 0));
    expected.push_back({"cuda:0", Pattern(sizes[i], static_cast<uint32_t>(i))});
  }
  absl::StatusOr<Message> reply = a->Call("g", "b", "echo", "", tensors);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, Expect(expected)) << "b saw every tensor on cuda:0, intact";
  ASSERT_EQ(reply->tensors.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(reply->tensors[i].device().ToString(), "cuda:0");
    EXPECT_EQ(gpus_->Read(reply->tensors[i]), expected[i].second) << "tensor " << i;
  }
  absl::StatusOr<CallEngineStats> stats = a->GetCallStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->cuda_tensors_sent, sizes.size() - 1) << "the empty one exports nothing";
  EXPECT_EQ(stats->cuda_tensors_received, sizes.size() - 1);
  EXPECT_EQ(stats->bytes_copied_in, 0u) << "no CUDA byte passes through the arena";
}

TEST_F(CudaCallsTest, Cuda0ToCuda1AndBackByTheReverseMap) {
  REQUIRE_GPUS(2);
  CrossGpuPair(uint64_t{1} << 30, uint64_t{1} << 30);
  Client* a = a_.get();
  HandleEcho(b_.get());
  for (size_t bytes : {size_t{0}, size_t{8}, size_t{1} << 20, size_t{256} << 20}) {
    const CUdeviceptr ptr = gpus_->Alloc(0, bytes, 7);
    absl::StatusOr<Message> reply =
        a->Call("g", "b", "echo", "",
                {Tensor::Cuda(shm::DType::kUInt8, {static_cast<int64_t>(bytes)}, ptr, 0)});
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->payload, Expect({{"cuda:1", Pattern(bytes, 7)}})) << bytes << " bytes";
    ASSERT_EQ(reply->tensors.size(), 1u);
    EXPECT_EQ(reply->tensors[0].device().ToString(), "cuda:0") << "back by b's reverse map";
    EXPECT_EQ(gpus_->Read(reply->tensors[0]), Pattern(bytes, 7));
    gpus_->Free(ptr);
  }
}

TEST_F(CudaCallsTest, AGibibyteCrossesGpus) {
  REQUIRE_GPUS(2);
  CrossGpuPair(uint64_t{1} << 30, (uint64_t{1} << 30) + (1 << 20));
  Client* a = a_.get();
  const size_t bytes = size_t{1} << 30;
  HandleSum(b_.get());
  const CUdeviceptr ptr = gpus_->Alloc(0, bytes, 11);
  absl::StatusOr<Message> reply = a->Call(
      "g", "b", "sum", "", {Tensor::Cuda(shm::DType::kFloat32, {int64_t{1} << 28}, ptr, 0)});
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, absl::StrCat("cuda:1:", std::hash<std::string>()(Pattern(bytes, 11))));
}

TEST_F(CudaCallsTest, SwappedDevicesAndManyTensors) {
  REQUIRE_GPUS(2);
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(Join(a.get(), "a", {{"b", {{"cuda:0", "cuda:1"}, {"cuda:1", "cuda:0"}}}}).ok());
  ASSERT_TRUE(Join(b.get(), "b", {}).ok());
  HandleEcho(b.get());
  EchoSwapped(
      a.get(), [](int i) { return 1000 + 4 * static_cast<size_t>(i); }, 100);
}

TEST_F(CudaCallsTest, CpuAndCudaMixedInOneCallByCpuMaps) {
  REQUIRE_GPUS(1);
  auto a = Connect();
  auto b = Connect();
  // a's cpu tensors land on b's cuda:0, a's cuda:0 tensors on b's cpu; the reply goes back
  // by b's reverse map (cuda:0 -> cpu, cpu -> cuda:0).
  ASSERT_TRUE(Join(a.get(), "a", {{"b", {{"cpu", "cuda:0"}, {"cuda:0", "cpu"}}}}).ok());
  ASSERT_TRUE(Join(b.get(), "b", {}).ok());
  HandleEcho(b.get());
  const std::string host = Pattern(3 << 20, 1);
  const CUdeviceptr ptr = gpus_->Alloc(0, 5 << 20, 2);
  absl::StatusOr<Message> reply = a->Call("g", "b", "echo", "",
                                          {Tensor(shm::DType::kUInt8, {3 << 20}, host),
                                           Tensor::Cuda(shm::DType::kUInt8, {5 << 20}, ptr, 0)});
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, Expect({{"cuda:0", host}, {"cpu", Pattern(5 << 20, 2)}}));
  ASSERT_EQ(reply->tensors.size(), 2u);
  EXPECT_EQ(reply->tensors[0].device().ToString(), "cpu");
  EXPECT_EQ(reply->tensors[0].data(), host);
  EXPECT_EQ(reply->tensors[1].device().ToString(), "cuda:0");
  EXPECT_EQ(gpus_->Read(reply->tensors[1]), Pattern(5 << 20, 2));
}

TEST_F(CudaCallsTest, StagedAcrossTwoDaemonsThereAndBack) {
  REQUIRE_GPUS(2);
  StartSecondNode();
  auto a = Connect();
  auto b = Connect(uint64_t{512} << 20, /*second_node=*/true);
  // a's cuda:0 lands on b's cuda:1 and a's cpu tensors on b's cuda:0, through pinned staging
  // and TensorPipe between the daemons; b's reverse map brings them back.
  ASSERT_TRUE(Join(a.get(), "a", {{"b", {{"cuda:0", "cuda:1"}, {"cpu", "cuda:0"}}}}).ok());
  ASSERT_TRUE(Join(b.get(), "b", {}).ok());
  HandleEcho(b.get());
  for (size_t bytes : {size_t{0}, size_t{8}, (size_t{1} << 20) + 3, size_t{64} << 20}) {
    const CUdeviceptr ptr = gpus_->Alloc(0, bytes, 21);
    const std::string host = Pattern(bytes / 2, 22);
    absl::StatusOr<Message> reply =
        a->Call("g", "b", "echo", "",
                {Tensor::Cuda(shm::DType::kUInt8, {static_cast<int64_t>(bytes)}, ptr, 0),
                 Tensor(shm::DType::kUInt8, {static_cast<int64_t>(host.size())}, host)});
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->payload, Expect({{"cuda:1", Pattern(bytes, 21)}, {"cuda:0", host}}))
        << bytes << " bytes";
    ASSERT_EQ(reply->tensors.size(), 2u);
    EXPECT_EQ(reply->tensors[0].device().ToString(), "cuda:0");
    EXPECT_EQ(gpus_->Read(reply->tensors[0]), Pattern(bytes, 21));
    EXPECT_EQ(reply->tensors[1].device().ToString(), "cpu");
    EXPECT_EQ(reply->tensors[1].data(), host);
    gpus_->Free(ptr);
  }
  absl::StatusOr<v1::StatusResponse> status = a->Status();
  ASSERT_TRUE(status.ok());
  std::map<std::string, uint64_t> routes;
  for (const v1::CudaCopyCount& route : status->gpus().copies())
    routes[route.route()] = route.bytes();
  EXPECT_GT(routes["cuda:0->cpu"], 0u) << "a's daemon staged a's tensors to host";
  EXPECT_GT(routes["cpu->cuda:0"], 0u) << "and landed b's replies on a's cuda:0";
}

TEST_F(CudaCallsTest, AGibibyteStagedAcrossTwoDaemons) {
  REQUIRE_GPUS(2);
  StartSecondNode();
  CrossGpuPair(uint64_t{256} << 20, (uint64_t{1} << 30) + (1 << 20), /*b_remote=*/true);
  Client* a = a_.get();
  HandleSum(b_.get());
  const size_t bytes = size_t{1} << 30;
  const CUdeviceptr ptr = gpus_->Alloc(0, bytes, 31);
  absl::StatusOr<Message> reply =
      a->Call("g", "b", "sum", "", {Tensor::Cuda(shm::DType::kUInt8, {int64_t{1} << 30}, ptr, 0)});
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, absl::StrCat("cuda:1:", std::hash<std::string>()(Pattern(bytes, 31))));
}

TEST_F(CudaCallsTest, StagedSwappedDevicesManyTensorsSomeInChunks) {
  REQUIRE_GPUS(2);
  StartSecondNode();
  auto a = Connect();
  auto b = Connect(uint64_t{256} << 20, /*second_node=*/true);
  ASSERT_TRUE(Join(a.get(), "a", {{"b", {{"cuda:0", "cuda:1"}, {"cuda:1", "cuda:0"}}}}).ok());
  ASSERT_TRUE(Join(b.get(), "b", {}).ok());
  HandleEcho(b.get());
  // Every 16th tensor is 9 MiB + a few bytes, so it crosses in chunks of 4 MiB ([agent]
  // cuda_chunk_bytes) with a short last one, among whole small tensors.
  EchoSwapped(
      a.get(),
      [](int i) {
        return i % 16 == 0 ? (size_t{9} << 20) + 4 * static_cast<size_t>(i + 1)
                           : 1000 + 4 * static_cast<size_t>(i);
      },
      300);
}

TEST_F(CudaCallsTest, StagedCallsBothWaysAtOnceInChunks) {
  REQUIRE_GPUS(2);
  StartSecondNode();
  auto a = Connect(uint64_t{512} << 20);
  auto b = Connect(uint64_t{512} << 20, /*second_node=*/true);
  ASSERT_TRUE(Join(a.get(), "a", {{"b", {{"cuda:0", "cuda:1"}}}}).ok());
  ASSERT_TRUE(Join(b.get(), "b", {{"a", {{"cuda:1", "cuda:0"}}}}).ok());
  HandleEcho(a.get());
  HandleEcho(b.get());
  // 20 calls each way at once, each with a tensor of two chunks and a short one: chunks of
  // many messages interleave on both daemons' pipes, requests and replies alike.
  constexpr size_t kLarge = (size_t{6} << 20) + 7;
  auto run = [&](Client* from, const std::string& to, int device, int other, uint32_t seed) {
    std::vector<CallFuture> futures;
    for (int i = 0; i < 20; ++i) {
      const CUdeviceptr large = gpus_->Alloc(device, kLarge, seed + 2 * i);
      const CUdeviceptr small = gpus_->Alloc(device, 4096, seed + 2 * i + 1);
      futures.push_back(from->CallAsync(
          "g", to, "echo", "",
          {Tensor::Cuda(shm::DType::kUInt8, {static_cast<int64_t>(kLarge)}, large, device),
           Tensor::Cuda(shm::DType::kUInt8, {4096}, small, device)}));
    }
    for (int i = 0; i < 20; ++i) {
      const absl::StatusOr<Message>& reply = futures[i].Wait();
      ASSERT_TRUE(reply.ok()) << reply.status();
      const std::string device_name = absl::StrCat("cuda:", other);
      EXPECT_EQ(reply->payload, Expect({{device_name, Pattern(kLarge, seed + 2 * i)},
                                        {device_name, Pattern(4096, seed + 2 * i + 1)}}));
      ASSERT_EQ(reply->tensors.size(), 2u);
      EXPECT_EQ(gpus_->Read(reply->tensors[0]), Pattern(kLarge, seed + 2 * i));
      EXPECT_EQ(gpus_->Read(reply->tensors[1]), Pattern(4096, seed + 2 * i + 1));
    }
  };
  std::thread there([&] { run(a.get(), "b", 0, 1, 7000); });
  run(b.get(), "a", 1, 0, 9000);
  there.join();
}

TEST_F(CudaCallsTest, CallsBothWaysAtOnce) {
  REQUIRE_GPUS(2);
  auto a = Connect();
  auto b = Connect();
  // a's devices come from its own map; b's from its map and a's (a joined first).
  ASSERT_TRUE(Join(a.get(), "a", {{"b", {{"cuda:0", "cuda:1"}}}}).ok());
  ASSERT_TRUE(Join(b.get(), "b", {{"a", {{"cuda:1", "cuda:0"}}}}).ok());
  HandleEcho(a.get());
  HandleEcho(b.get());
  auto run = [&](Client* from, const std::string& to, int device, int other, uint32_t seed) {
    std::vector<CallFuture> futures;
    std::vector<CUdeviceptr> ptrs;
    for (int i = 0; i < 50; ++i) {
      ptrs.push_back(gpus_->Alloc(device, 65536, seed + i));
      futures.push_back(from->CallAsync(
          "g", to, "echo", "", {Tensor::Cuda(shm::DType::kUInt8, {65536}, ptrs.back(), device)}));
    }
    for (int i = 0; i < 50; ++i) {
      const absl::StatusOr<Message>& reply = futures[i].Wait();
      ASSERT_TRUE(reply.ok()) << reply.status();
      EXPECT_EQ(reply->payload, Expect({{absl::StrCat("cuda:", other), Pattern(65536, seed + i)}}));
      EXPECT_EQ(gpus_->Read(reply->tensors.at(0)), Pattern(65536, seed + i));
    }
  };
  std::thread there([&] { run(a.get(), "b", 0, 1, 1000); });
  run(b.get(), "a", 1, 0, 5000);
  there.join();
}

TEST_F(CudaCallsTest, NoMapIsRefusedWithPyTorchsWordingBeforeAnythingMoves) {
  REQUIRE_GPUS(1);
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(Join(a.get(), "a", {}).ok());
  ASSERT_TRUE(Join(b.get(), "b", {}).ok());
  HandleEcho(b.get());
  const CUdeviceptr ptr = gpus_->Alloc(0, 256, 3);
  absl::StatusOr<Message> reply =
      a->Call("g", "b", "echo", "", {Tensor::Cuda(shm::DType::kUInt8, {256}, ptr, 0)});
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reply.status().message(),
              HasSubstr("TensorPipe RPC backend only supports CPU tensors by default"));
  EXPECT_THAT(reply.status().message(),
              HasSubstr("Request device mapping is not available for destination b for device "
                        "cuda:0 but received a tensor on that device."));
  // The daemon is still serving and CPU calls go on.
  EXPECT_TRUE(a->Call("g", "b", "echo", "", {Tensor(shm::DType::kUInt8, {3}, "abc")}).ok());
}

TEST_F(CudaCallsTest, BadDeviceAndBadPointerAreRefusedNamingThem) {
  REQUIRE_GPUS(1);
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(Join(a.get(), "a", {{"b", {{"cuda:0", "cuda:0"}}}}).ok());
  ASSERT_TRUE(Join(b.get(), "b", {}).ok());
  HandleEcho(b.get());
  absl::StatusOr<Message> nowhere = a->Call(
      "g", "b", "echo", "", {Tensor::Cuda(shm::DType::kUInt8, {16}, 0x1000, gpus_->count() + 3)});
  ASSERT_FALSE(nowhere.ok());
  EXPECT_THAT(nowhere.status().message(), HasSubstr(absl::StrCat("cuda:", gpus_->count() + 3)));
  const std::string host(64, 'x');
  absl::StatusOr<Message> host_memory =
      a->Call("g", "b", "echo", "",
              {Tensor::Cuda(shm::DType::kUInt8, {64}, reinterpret_cast<uint64_t>(host.data()), 0)});
  ASSERT_FALSE(host_memory.ok());
  EXPECT_EQ(host_memory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(host_memory.status().message(), HasSubstr("is not device memory of this process"));
  // A tensor said to be longer than its allocation.
  const CUdeviceptr small = gpus_->Alloc(0, 4096, 1);
  absl::StatusOr<Message> overrun =
      a->Call("g", "b", "echo", "", {Tensor::Cuda(shm::DType::kUInt8, {1 << 20}, small, 0)});
  ASSERT_FALSE(overrun.ok());
  EXPECT_THAT(overrun.status().message(), HasSubstr("runs past its allocation"));
  const CUdeviceptr ok = gpus_->Alloc(0, 4096, 9);
  absl::StatusOr<Message> fine =
      a->Call("g", "b", "echo", "", {Tensor::Cuda(shm::DType::kUInt8, {4096}, ok, 0)});
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(gpus_->Read(fine->tensors.at(0)), Pattern(4096, 9));
}

TEST_F(CudaCallsTest, MemoryFreedAndAllocatedAgainIsExportedAnew) {
  REQUIRE_GPUS(1);
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(Join(a.get(), "a", {{"b", {{"cuda:0", "cuda:0"}}}}).ok());
  ASSERT_TRUE(Join(b.get(), "b", {}).ok());
  HandleEcho(b.get());
  // The daemon keeps each allocation it opened; memory freed and allocated again (often at
  // the same address) is another allocation, and its bytes are what arrive.
  for (uint32_t round = 0; round < 4; ++round) {
    const CUdeviceptr ptr = gpus_->Alloc(0, 1 << 20, 40 + round);
    absl::StatusOr<Message> reply =
        a->Call("g", "b", "echo", "", {Tensor::Cuda(shm::DType::kUInt8, {1 << 20}, ptr, 0)});
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->payload, Expect({{"cuda:0", Pattern(1 << 20, 40 + round)}})) << round;
    gpus_->Free(ptr);
  }
}

TEST_F(CudaCallsTest, ACallTimingOutMidCopyLeavesNothingHeld) {
  REQUIRE_GPUS(2);
  CrossGpuPair(uint64_t{1} << 30, (uint64_t{1} << 30) + (1 << 20));
  Client* a = a_.get();
  HandleEcho(b_.get());
  const CUdeviceptr ptr = gpus_->Alloc(0, size_t{1} << 30, 51);
  // A 1 GiB peer copy takes milliseconds: a 1 ms deadline passes during it.
  absl::StatusOr<Message> late =
      a->Call("g", "b", "echo", "", {Tensor::Cuda(shm::DType::kUInt8, {int64_t{1} << 30}, ptr, 0)},
              absl::Milliseconds(1));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  // The copy completes, b answers a call nobody waits for, and every pool block goes back.
  EXPECT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<v1::StatusResponse> status = a->Status();
        if (!status.ok()) return false;
        for (const v1::AttachedSession& session : status->attached_sessions()) {
          for (const v1::CudaPoolStatus& pool : session.cuda_pools()) {
            if (pool.used() != 0) return false;
          }
        }
        return true;
      },
      absl::Seconds(10)))
      << "receive pool blocks still held";
  absl::StatusOr<Message> next =
      a->Call("g", "b", "echo", "", {Tensor::Cuda(shm::DType::kUInt8, {4096}, ptr, 0)});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(gpus_->Read(next->tensors.at(0)), Pattern(4096, 51)) << "a prefix of the same bytes";
}

// What a buggy or hostile client can put in its CUDA export records, sent by hand: the daemon
// asks the driver and refuses each, naming the tensor and why, and serves on.
TEST_F(CudaCallsTest, ForgedStaleAndMisplacedExportsAreRefusedNamingThem) {
  REQUIRE_GPUS(1);
  auto b = Connect();
  ASSERT_TRUE(Join(b.get(), "b", {}, {"cuda:0"}).ok());
  HandleEcho(b.get());
  HandleSum(b.get());
  // No receive pool: lending one starts the client's call engine, which would read the ring
  // this test reads by hand.
  std::unique_ptr<Client> forger = Connect(/*pool_bytes=*/0);
  ASSERT_TRUE(Join(forger.get(), "forger", {{"b", {{"cuda:0", "cuda:0"}}}}).ok());
  absl::StatusOr<std::unique_ptr<RawSession>> raw = RawSession::Open(std::move(forger));
  ASSERT_TRUE(raw.ok()) << raw.status();
  const uint64_t tx = (*raw)->layout.tx_heap.offset;
  shm::TensorEntry entry{};
  entry.dtype = static_cast<uint8_t>(shm::DType::kUInt8);
  entry.ndim = 1;
  entry.shape[0] = 4096;
  entry.length = 4096;
  entry.device_type = static_cast<uint8_t>(shm::DeviceType::kCuda);
  auto call = [&](uint64_t id, const shm::TensorEntry& tensor, const shm::CudaExport& record,
                  const std::string& method = "echo") {
    EXPECT_TRUE((*raw)->SubmitCall(tx + id * 8192, "g", "b", method, "forger", "", id,
                                   absl::Seconds(5), {tensor}, {record}));
    auto replies = (*raw)->Replies(1, absl::Now() + absl::Seconds(10));
    return replies.count(id) > 0 ? replies[id]
                                 : std::make_pair(absl::StatusCode::kUnknown, "no reply");
  };
  shm::CudaExport garbage{};
  std::memset(garbage.memory, 0x5a, sizeof(garbage.memory));
  auto [code, why] = call(1, entry, garbage);
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument) << why;
  EXPECT_THAT(why, HasSubstr("tensor 0 (cuda:0): its IPC memory handle does not open"));

  // The handle of memory freed since: stale.
  const CUdeviceptr gone = gpus_->Alloc(0, 4096, 1);
  const shm::CudaExport stale = gpus_->Export(gone);
  gpus_->Free(gone);
  std::tie(code, why) = call(2, entry, stale);
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument) << why;
  EXPECT_THAT(why, HasSubstr("does not open"));

  // A real allocation of 4096 bytes: a tensor said to lie past it, or on a device that does
  // not exist.
  const CUdeviceptr real = gpus_->Alloc(0, 4096, 2);
  const shm::CudaExport good = gpus_->Export(real);
  shm::TensorEntry past = entry;
  past.offset = 4096;
  std::tie(code, why) = call(3, past, good);
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument) << why;
  EXPECT_THAT(why, HasSubstr("run past its allocation of 4096 bytes"));
  shm::TensorEntry elsewhere = entry;
  elsewhere.device_index = static_cast<uint32_t>(gpus_->count());
  std::tie(code, why) = call(4, elsewhere, good);
  EXPECT_NE(code, absl::StatusCode::kOk) << why;
  EXPECT_THAT(why, HasSubstr(absl::StrCat("cuda:", gpus_->count())));
  // The real one goes through: b reads it on cuda:0.
  std::tie(code, why) = call(5, entry, good, "sum");
  EXPECT_EQ(code, absl::StatusCode::kOk) << why;
  // A reply of CUDA tensors to a client that lent no pool: refused, naming the missing pool.
  std::tie(code, why) = call(6, entry, good);
  EXPECT_EQ(code, absl::StatusCode::kFailedPrecondition) << why;
  EXPECT_THAT(why, HasSubstr("lent no receive pool on cuda:0"));

  // The daemon serves on: a well-behaved client's CUDA call.
  auto c = Connect();
  ASSERT_TRUE(Join(c.get(), "c", {{"b", {{"cuda:0", "cuda:0"}}}}).ok());
  absl::StatusOr<Message> reply =
      c->Call("g", "b", "echo", "", {Tensor::Cuda(shm::DType::kUInt8, {4096}, real, 0)});
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(gpus_->Read(reply->tensors.at(0)), Pattern(4096, 2));
}

// Entry point of CallerKilledWhileExported's victim: joins as "victim", sends one call of a
// 512 MiB CUDA tensor to "b" (whose handler holds it) and waits to be killed.
TEST(CudaCallsVictim, Run) {
  const char* socket = std::getenv("TPD_CUDA_VICTIM_SOCKET");
  if (socket == nullptr) GTEST_SKIP() << "only run as the victim of CallerKilledWhileExported";
  absl::StatusOr<std::unique_ptr<Gpus>> gpus = Gpus::Open();
  ASSERT_TRUE(gpus.ok());
  auto client = Client::Connect(socket);
  ASSERT_TRUE(client.ok());
  JoinOptions options;
  options.group = "g";
  options.name = "victim";
  options.init_method = std::getenv("TPD_CUDA_VICTIM_INIT");
  (*(*options.options.mutable_device_maps())["b"].mutable_devices())["cuda:0"] = "cuda:0";
  ASSERT_TRUE((*client)->Join(options).ok());
  const CUdeviceptr ptr = (*gpus)->Alloc(0, size_t{512} << 20, 5);
  CallFuture future = (*client)->CallAsync(
      "g", "b", "hold", "", {Tensor::Cuda(shm::DType::kUInt8, {int64_t{512} << 20}, ptr, 0)});
  absl::SleepFor(absl::Seconds(60));  // killed before this ends
}

TEST_F(CudaCallsTest, CallerKilledWhileExportedLeavesNoMemoryBehind) {
  REQUIRE_GPUS(1);
  auto b = Connect(uint64_t{1} << 30);  // room for the victim's 512 MiB
  ASSERT_TRUE(Join(b.get(), "b", {}, {"cuda:0"}).ok());
  absl::Notification held;
  ASSERT_TRUE(b->Handle("hold", [&](const Message& request) -> absl::StatusOr<Message> {
                 held.Notify();
                 absl::SleepFor(absl::Seconds(3));
                 return Message{};
               }).ok());
  const size_t before = gpus_->FreeBytes(0);
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("TPD_CUDA_VICTIM_SOCKET", nodes_.socket(0).c_str(), 1);
    setenv("TPD_CUDA_VICTIM_INIT", nodes_.init_method().c_str(), 1);
    execl("/proc/self/exe", "cuda_calls_test", "--gtest_filter=CudaCallsVictim.Run", nullptr);
    _exit(127);
  }
  ASSERT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(60)))
      << "the victim's call never reached b";
  // The daemon has the victim's allocation mapped now; the victim dies holding it.
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  // Once the victim's session is gone, the daemon closes its mapping and the driver frees
  // the 512 MiB: free memory comes back to (about) where it was before the victim started.
  EXPECT_TRUE(
      WaitUntil([&] { return gpus_->FreeBytes(0) + (64 << 20) >= before; }, absl::Seconds(20)))
      << "free on cuda:0: " << gpus_->FreeBytes(0) << " of " << before << " before";
  absl::StatusOr<v1::StatusResponse> status_now = b->Status();
  ASSERT_TRUE(status_now.ok());
  EXPECT_EQ(status_now->attached_sessions_size(), 1) << "only b's session is left";
}

#else

TEST(CudaCallsTest, NeedsCudaHeaders) {
  GTEST_SKIP() << "built without the CUDA toolkit's cuda.h: no CUDA calls to test";
}

#endif  // TPD_HAVE_CUDA_H

}  // namespace
}  // namespace tpd
