// Unit tests of the limits on Control requests: every list, string and number a client
// sends is bounded, and a request past a limit names the field and the setting.

#include "daemon/control_limits.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

v1::JoinRequest ValidJoin() {
  v1::JoinRequest request;
  request.set_session_id("s");
  request.set_group("train");
  request.set_name("w0");
  request.set_rank(0);
  request.set_world_size(2);
  request.set_init_method("tcp://127.0.0.1:29400");
  request.mutable_options()->add_transports("uv");
  request.mutable_options()->add_channels("basic");
  request.mutable_options()->add_devices("cuda:0");
  (*(*request.mutable_options()->mutable_device_maps())["w1"].mutable_devices())["cuda:0"] =
      "cuda:1";
  return request;
}

void ExpectRefused(const absl::Status& status, const std::string& field,
                   const std::string& setting) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr(field), HasSubstr(setting)));
  EXPECT_LT(status.message().size(), 500u) << status;
}

TEST(ControlLimitsTest, AnOrdinaryJoinPasses) {
  EXPECT_TRUE(CheckJoinRequest(ValidJoin(), GroupConfig()).ok());
}

TEST(ControlLimitsTest, HugeWorldSizeIsRefusedNamingTheLimit) {
  v1::JoinRequest request = ValidJoin();
  request.set_world_size(int64_t{1} << 40);
  ExpectRefused(CheckJoinRequest(request, GroupConfig()), "world_size 1099511627776",
                "group.max_world_size 65536");

  GroupConfig limits;
  limits.max_world_size = 8;
  request.set_world_size(8);
  EXPECT_TRUE(CheckJoinRequest(request, limits).ok());
  request.set_world_size(9);
  EXPECT_EQ(CheckJoinRequest(request, limits).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ControlLimitsTest, WorldSizeFromTheUrlOrEnvIsBoundedToo) {
  v1::JoinRequest url = ValidJoin();
  url.clear_rank();
  url.clear_world_size();
  url.set_init_method("tcp://127.0.0.1:29400?rank=0&world_size=1099511627776");
  ExpectRefused(CheckJoinRequest(url, GroupConfig()), "world_size", "group.max_world_size");

  v1::JoinRequest env = ValidJoin();
  env.clear_rank();
  env.clear_world_size();
  env.set_init_method("env://");
  (*env.mutable_env())["MASTER_ADDR"] = "127.0.0.1";
  (*env.mutable_env())["MASTER_PORT"] = "29400";
  (*env.mutable_env())["RANK"] = "0";
  (*env.mutable_env())["WORLD_SIZE"] = "1099511627776";
  ExpectRefused(CheckJoinRequest(env, GroupConfig()), "world_size", "group.max_world_size");
}

TEST(ControlLimitsTest, RankOfADynamicGroupIsBoundedByMaxWorldSize) {
  v1::JoinRequest request = ValidJoin();
  request.clear_world_size();
  request.set_rank(int64_t{1} << 40);
  ExpectRefused(CheckJoinRequest(request, GroupConfig()), "rank", "group.max_world_size");
}

TEST(ControlLimitsTest, AMalformedUrlIsLeftToTheGroupManager) {
  v1::JoinRequest request = ValidJoin();
  request.set_init_method("foo://x");
  EXPECT_TRUE(CheckJoinRequest(request, GroupConfig()).ok());
}

TEST(ControlLimitsTest, TwoThousandTransportsAreRefusedWithASmallMessage) {
  v1::JoinRequest request = ValidJoin();
  for (int i = 0; i < 2000; ++i) request.mutable_options()->add_transports(absl::StrCat("t", i));
  ExpectRefused(CheckJoinRequest(request, GroupConfig()), "JoinRequest.options.transports",
                "group.max_transports is 64");
}

TEST(ControlLimitsTest, EveryOptionListIsBounded) {
  GroupConfig limits;
  limits.max_channels = 2;
  limits.max_devices = 2;
  v1::JoinRequest channels = ValidJoin();
  for (int i = 0; i < 3; ++i) channels.mutable_options()->add_channels("basic");
  ExpectRefused(CheckJoinRequest(channels, limits), "JoinRequest.options.channels",
                "group.max_channels is 2");
  v1::JoinRequest devices = ValidJoin();
  for (int i = 0; i < 3; ++i) devices.mutable_options()->add_devices(absl::StrCat("cuda:", i));
  ExpectRefused(CheckJoinRequest(devices, limits), "JoinRequest.options.devices",
                "group.max_devices is 2");
}

TEST(ControlLimitsTest, DeviceMapEntriesCountAcrossTargetsAndEmptyTargetsCount) {
  GroupConfig limits;
  limits.max_device_map_entries = 4;
  v1::JoinRequest entries = ValidJoin();
  auto* maps = entries.mutable_options()->mutable_device_maps();
  for (int i = 0; i < 5; ++i) {
    (*(*maps)[absl::StrCat("w", i)].mutable_devices())["cuda:0"] = "cuda:0";
  }
  ExpectRefused(CheckJoinRequest(entries, limits), "JoinRequest.options.device_maps",
                "group.max_device_map_entries is 4");

  v1::JoinRequest empty_targets = ValidJoin();
  for (int i = 0; i < 100000; ++i) {
    (*empty_targets.mutable_options()->mutable_device_maps())[absl::StrCat("w", i)];
  }
  ExpectRefused(CheckJoinRequest(empty_targets, GroupConfig()), "JoinRequest.options.device_maps",
                "group.max_device_map_entries is 1024");
}

TEST(ControlLimitsTest, DeviceMapTargetsMustBeWorkerNames) {
  v1::JoinRequest request = ValidJoin();
  (*request.mutable_options()->mutable_device_maps())["bad name\n"];
  absl::Status status = CheckJoinRequest(request, GroupConfig());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("Worker name must match"));
}

TEST(ControlLimitsTest, EnvIsBoundedInEntriesAndBytes) {
  v1::JoinRequest many = ValidJoin();
  for (int i = 0; i < 1000; ++i) (*many.mutable_env())[absl::StrCat("V", i)] = "x";
  ExpectRefused(CheckJoinRequest(many, GroupConfig()), "JoinRequest.env",
                "group.max_env_entries is 64");

  v1::JoinRequest long_value = ValidJoin();
  (*long_value.mutable_env())["MASTER_ADDR"] = std::string(1 << 20, 'h');
  ExpectRefused(CheckJoinRequest(long_value, GroupConfig()), "JoinRequest.env",
                "group.max_option_bytes is 256");
}

TEST(ControlLimitsTest, LongOptionStringsAreRefused) {
  v1::JoinRequest transport = ValidJoin();
  transport.mutable_options()->add_transports(std::string(10 << 20, 'u'));
  ExpectRefused(CheckJoinRequest(transport, GroupConfig()), "JoinRequest.options.transports",
                "group.max_option_bytes is 256");
  v1::JoinRequest device = ValidJoin();
  (*(*device.mutable_options()->mutable_device_maps())["w1"]
        .mutable_devices())[std::string(1000, 'c')] = "cuda:0";
  ExpectRefused(CheckJoinRequest(device, GroupConfig()), "JoinRequest.options.device_maps",
                "group.max_option_bytes");
}

TEST(ControlLimitsTest, NamesAndInitMethodAreChecked) {
  v1::JoinRequest group = ValidJoin();
  group.set_group("a\nb");
  EXPECT_THAT(CheckJoinRequest(group, GroupConfig()).message(), HasSubstr("JoinRequest.group"));
  v1::JoinRequest name = ValidJoin();
  name.set_name("");
  EXPECT_THAT(CheckJoinRequest(name, GroupConfig()).message(), HasSubstr("JoinRequest.name"));
  v1::JoinRequest url = ValidJoin();
  url.set_init_method(absl::StrCat("file:///var/lib/tpd/rendezvous/", std::string(5000, 'x')));
  ExpectRefused(CheckJoinRequest(url, GroupConfig()), "JoinRequest.init_method", "4096");
}

TEST(ControlLimitsTest, LeaveBarrierAndLookupsCheckTheirNames) {
  v1::LeaveRequest leave;
  leave.set_group("g");
  leave.set_name("w0");
  EXPECT_TRUE(CheckLeaveRequest(leave).ok());
  leave.set_name("w\n");
  EXPECT_THAT(CheckLeaveRequest(leave).message(), HasSubstr("LeaveRequest.name"));

  v1::BarrierRequest barrier;
  barrier.set_group("g g");
  barrier.set_name("w0");
  EXPECT_THAT(CheckBarrierRequest(barrier).message(), HasSubstr("BarrierRequest.group"));

  EXPECT_TRUE(CheckGroupLookup("GetGroupRequest", "train", "tcp://h:1").ok());
  EXPECT_THAT(CheckGroupLookup("WatchGroupRequest", std::string(200, 'g'), "").message(),
              HasSubstr("WatchGroupRequest.group"));
  EXPECT_THAT(CheckGroupLookup("GetGroupRequest", "g", std::string(5000, 'u')).message(),
              HasSubstr("GetGroupRequest.init_method"));
}

TEST(ControlLimitsTest, ClientDescriptionIsCutAndEscaped) {
  EXPECT_EQ(ClientDescription("pid 42"), "pid 42");
  EXPECT_EQ(ClientDescription("a\nb"), "a\\nb");
  EXPECT_LT(ClientDescription(std::string(1 << 20, 'c')).size(), 300u);
}

}  // namespace
}  // namespace tpd
