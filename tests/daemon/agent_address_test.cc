// Which agent URLs read from a group record this daemon dials (daemon/agent_address.h), and
// how tensors read from a peer's message are checked (daemon/router/tensor_wire.h).

#include "daemon/agent_address.h"

#include "absl/strings/str_cat.h"
#include "daemon/router/tensor_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;

NetworkList Networks(const std::vector<std::string>& cidrs) {
  absl::StatusOr<NetworkList> list = NetworkList::Parse(cidrs);
  EXPECT_TRUE(list.ok()) << list.status();
  return *list;
}

TEST(DialableAgentUrlsTest, KeepsUrlsInsideDialNetworksAndShm) {
  const NetworkList allowed = Networks({"10.0.0.0/8", "::1/128"});
  absl::StatusOr<std::string> urls =
      DialableAgentUrls("uv://10.1.2.3:4000,shm://tpd-agent-1-ab", allowed);
  ASSERT_TRUE(urls.ok()) << urls.status();
  EXPECT_EQ(*urls, "uv://10.1.2.3:4000,shm://tpd-agent-1-ab");
  urls = DialableAgentUrls("uv://[::1]:4000", allowed);
  ASSERT_TRUE(urls.ok()) << urls.status();
  EXPECT_EQ(*urls, "uv://[::1]:4000");
}

TEST(DialableAgentUrlsTest, DropsUrlsOutsideAndRefusesWithoutUv) {
  const NetworkList allowed = Networks({"10.0.0.0/8"});
  absl::StatusOr<std::string> urls = DialableAgentUrls("uv://10.0.0.5:1,ibv://8.8.8.8:2", allowed);
  ASSERT_TRUE(urls.ok()) << urls.status();
  EXPECT_EQ(*urls, "uv://10.0.0.5:1");

  urls = DialableAgentUrls("uv://8.8.8.8:29500,shm://x", allowed);
  EXPECT_EQ(urls.status().code(), absl::StatusCode::kPermissionDenied) << urls.status();
  EXPECT_THAT(urls.status().message(), HasSubstr("uv://8.8.8.8:29500"));
  EXPECT_THAT(urls.status().message(), HasSubstr("dial_networks"));
  EXPECT_THAT(urls.status().message(), HasSubstr("10.0.0.0/8"));

  // Names are never resolved on a record's say-so.
  urls = DialableAgentUrls("uv://localhost:29500", Networks({"127.0.0.0/8"}));
  EXPECT_EQ(urls.status().code(), absl::StatusCode::kPermissionDenied) << urls.status();
  urls = DialableAgentUrls("tcp://10.0.0.5:1", allowed);
  EXPECT_EQ(urls.status().code(), absl::StatusCode::kPermissionDenied) << urls.status();
}

TEST(DialableAgentUrlsTest, RefusesEmptyAndMalformedAddresses) {
  const NetworkList allowed = Networks({"127.0.0.0/8"});
  EXPECT_EQ(DialableAgentUrls("", allowed).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DialableAgentUrls("127.0.0.1:5", allowed).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DialableAgentUrls("uv://127.0.0.1:5,,", allowed).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorWireTest, RoundTripsAnEntry) {
  shm::TensorEntry entry{};
  entry.dtype = static_cast<uint8_t>(shm::DType::kFloat32);
  entry.ndim = 2;
  entry.shape[0] = 3;
  entry.shape[1] = 5;
  entry.length = 60;
  entry.offset = 4096;
  const v1::TensorDescriptor wire = ToWire(entry);
  EXPECT_EQ(wire.dtype(), "float32");
  EXPECT_EQ(wire.device(), "cpu");
  int target = 7;
  absl::StatusOr<shm::TensorEntry> back = FromWire(wire, 60, 0, &target);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dtype, entry.dtype);
  EXPECT_EQ(back->ndim, 2);
  EXPECT_EQ(back->shape[0], 3);
  EXPECT_EQ(back->shape[1], 5);
  EXPECT_EQ(back->length, 60u);
  EXPECT_EQ(back->offset, 0u);  // the receiver places it
  EXPECT_EQ(target, -1) << "no target device: cpu";
  // Staged CUDA bytes travel from host memory, to land on the receiver's cuda:3.
  ASSERT_TRUE(FromWire(ToWire(entry, 3), 60, 0, &target).ok());
  EXPECT_EQ(target, 3);
}

TEST(TensorWireTest, RefusesWhatAPeerMustNotSend) {
  v1::TensorDescriptor wire;
  wire.set_dtype("float32");
  wire.add_shape(4);
  wire.set_nbytes(16);
  int target = 0;
  ASSERT_TRUE(FromWire(wire, 16, 0, &target).ok());
  EXPECT_THAT(FromWire(wire, 17, 2, &target).status().message(),
              HasSubstr("tensor 2"));  // size mismatch

  v1::TensorDescriptor bad = wire;
  bad.set_dtype("float128");
  EXPECT_THAT(FromWire(bad, 16, 0, &target).status().message(), HasSubstr("float128"));
  bad = wire;
  bad.set_shape(0, -4);
  EXPECT_THAT(FromWire(bad, 16, 0, &target).status().message(), HasSubstr("negative"));
  bad = wire;
  bad.set_device("cuda:0");
  EXPECT_THAT(FromWire(bad, 16, 0, &target).status().message(), HasSubstr("cuda:0"));
  for (const char* target_device : {"cuda:64", "cuda:-1", "gpu:0", "cuda:", "cuda:1x"}) {
    bad = wire;
    bad.set_target_device(target_device);
    EXPECT_THAT(FromWire(bad, 16, 0, &target).status().message(),
                HasSubstr(absl::StrCat("target device '", target_device, "'")));
  }
  bad = wire;
  for (int i = 0; i < 8; ++i) bad.add_shape(1);  // 9 dims
  EXPECT_THAT(FromWire(bad, 16, 0, &target).status().message(), HasSubstr("dims"));
  bad = wire;
  bad.set_shape(0, int64_t{1} << 62);  // overflows the byte size
  bad.set_nbytes(0);
  EXPECT_THAT(FromWire(bad, 0, 0, &target).status().message(), HasSubstr("overflow"));
}

}  // namespace
}  // namespace tpd
