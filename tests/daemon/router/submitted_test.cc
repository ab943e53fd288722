// Where a message's tensors land by the group's device maps (router::PlaceTensors), with
// PyTorch's errors for a tensor no map places: "Request ..." for a call, "Response ..." for a
// reply, as torch's TensorPipe agent words them.

#include "daemon/router/submitted.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tpd::router {
namespace {

using ::testing::HasSubstr;

shm::TensorEntry On(shm::DeviceType type, uint32_t index) {
  shm::TensorEntry entry{};
  entry.device_type = static_cast<uint8_t>(type);
  entry.device_index = index;
  return entry;
}

v1::DeviceMap Map(std::vector<std::pair<std::string, std::string>> entries) {
  v1::DeviceMap map;
  for (const auto& [from, to] : entries) (*map.mutable_devices())[from] = to;
  return map;
}

const std::string kGroup = "job", kA = "trainer0", kB = "ps";

TEST(PlaceTensorsTest, CudaTensorsLandWhereTheMapSaysAndHostTensorsStay) {
  absl::StatusOr<std::vector<Place>> places =
      PlaceTensors({kGroup, kA, kB}, /*reply=*/false, Map({{"cuda:0", "cuda:1"}}),
                   {On(shm::DeviceType::kCpu, 0), On(shm::DeviceType::kCuda, 0)});
  ASSERT_TRUE(places.ok()) << places.status();
  ASSERT_EQ(places->size(), 2u);
  EXPECT_EQ((*places)[0].device, -1);
  EXPECT_EQ((*places)[1].device, 1);
}

TEST(PlaceTensorsTest, OnlyHostTensorsNeedNoPlaces) {
  absl::StatusOr<std::vector<Place>> places =
      PlaceTensors({kGroup, kA, kB}, /*reply=*/false, std::nullopt, {On(shm::DeviceType::kCpu, 0)});
  ASSERT_TRUE(places.ok()) << places.status();
  EXPECT_TRUE(places->empty());
}

TEST(PlaceTensorsTest, HostTensorsMoveByACpuEntry) {
  absl::StatusOr<std::vector<Place>> places = PlaceTensors(
      {kGroup, kA, kB}, /*reply=*/false, Map({{"cpu", "cuda:0"}}), {On(shm::DeviceType::kCpu, 0)});
  ASSERT_TRUE(places.ok()) << places.status();
  ASSERT_EQ(places->size(), 1u);
  EXPECT_EQ((*places)[0].device, 0);
}

TEST(PlaceTensorsTest, AnUnmappedCudaTensorInACallIsTorchsRequestError) {
  absl::StatusOr<std::vector<Place>> places =
      PlaceTensors({kGroup, kA, kB}, /*reply=*/false, Map({{"cuda:1", "cuda:0"}}),
                   {On(shm::DeviceType::kCuda, 0)});
  ASSERT_EQ(places.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(places.status().message(),
              HasSubstr("Request device mapping is not available for destination ps for "
                        "device cuda:0 but received a tensor on that device."));
  EXPECT_THAT(places.status().message(),
              HasSubstr("call `set_device_map` on `TensorPipeRpcBackendOptions`"));
}

TEST(PlaceTensorsTest, AnUnmappedCudaTensorInAReplyIsTorchsResponseError) {
  absl::StatusOr<std::vector<Place>> places =
      PlaceTensors({kGroup, kB, kA}, /*reply=*/true, std::nullopt, {On(shm::DeviceType::kCuda, 2)});
  ASSERT_EQ(places.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(places.status().message(),
              HasSubstr("Response device mapping is not available for destination trainer0 "
                        "for device cuda:2"));
}

}  // namespace
}  // namespace tpd::router
