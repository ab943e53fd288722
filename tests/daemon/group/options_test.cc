// Unit tests of member option validation and group negotiation against the PyTorch semantics
// in the seeds: options.py, tensorpipe_agent.h and backend_registry.py.

#include "daemon/group/options.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd::group {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

Device Cuda(int index) { return Device::Cuda(index); }

// A valid member with two CUDA devices and PyTorch's default options.
MemberOptions Member(std::string name, int64_t rank, int64_t device_count = 2,
                     std::string node = "host-a") {
  MemberOptions member;
  member.name = std::move(name);
  member.rank = rank;
  member.node = std::move(node);
  member.device_count = device_count;
  return member;
}

// Asserts INVALID_ARGUMENT with every one of `parts` in the message.
void ExpectInvalid(const absl::Status& status, const std::vector<std::string>& parts) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  const std::string message(status.message());
  for (const std::string& part : parts) EXPECT_THAT(message, HasSubstr(part));
}

const NegotiatedMember& Find(const Negotiated& negotiated, const std::string& name) {
  for (const NegotiatedMember& member : negotiated.members) {
    if (member.name == name) return member;
  }
  ADD_FAILURE() << "no member " << name;
  static const NegotiatedMember* none = new NegotiatedMember();
  return *none;
}

// --- Devices: parsing and rendering ------------------------------------------------------

TEST(ParseDeviceTest, AcceptsCpuCudaAndBareIndexLikeTorchDevice) {
  EXPECT_EQ(*ParseDevice("cpu"), Device::Cpu());
  EXPECT_EQ(*ParseDevice("cpu:0"), Device::Cpu());
  EXPECT_EQ(*ParseDevice("cuda:0"), Cuda(0));
  EXPECT_EQ(*ParseDevice("cuda:12"), Cuda(12));
  EXPECT_EQ(*ParseDevice("0"), Cuda(0));
  EXPECT_EQ(*ParseDevice("3"), Cuda(3));
}

TEST(ParseDeviceTest, RejectsCudaWithoutIndex) {
  ExpectInvalid(ParseDevice("cuda").status(), {"'cuda' names no device index", "cuda:0"});
}

TEST(ParseDeviceTest, RejectsMalformedStringsWithTorchWording) {
  for (const char* text : {"cuda:01", "cuda:", "CUDA:0", " cuda:0", "cuda:0 ", "cuda:-1",
                           "cuda:0:1", "mps:0", "gpu", "", "00"}) {
    SCOPED_TRACE(text);
    ExpectInvalid(ParseDevice(text).status(), {"Invalid device string: '"});
  }
}

TEST(ParseDeviceTest, RejectsNegativeBareIndex) {
  ExpectInvalid(ParseDevice("-1").status(), {"Device index must not be negative, got -1"});
}

TEST(ParseDeviceTest, RejectsCpuIndexOtherThanZero) {
  ExpectInvalid(ParseDevice("cpu:1").status(), {"CPU device index must be -1 or zero, got 1"});
}

TEST(ParseDeviceTest, RejectsIndexThatOverflows) {
  ExpectInvalid(ParseDevice("cuda:99999999999").status(),
                {"Could not parse device index '99999999999'"});
}

TEST(DeviceTest, ToStringIsTorchDeviceStr) {
  EXPECT_EQ(Device::Cpu().ToString(), "cpu");
  EXPECT_EQ(Cuda(3).ToString(), "cuda:3");
  EXPECT_EQ(Device().ToString(), "cpu");
}

TEST(DeviceTest, RendersListsAndMapsInTheDocumentedForm) {
  EXPECT_EQ(DevicesToString({Cuda(1), Cuda(0)}), "[cuda:1, cuda:0]");
  EXPECT_EQ(DevicesToString({}), "[]");
  EXPECT_EQ(DeviceMapToString({{Cuda(1), Cuda(2)}, {Cuda(0), Cuda(1)}}),
            "{cuda:0: cuda:1, cuda:1: cuda:2}");
  EXPECT_EQ(DeviceMapsToString({{"w1", {{Cuda(0), Cuda(1)}}}, {"w0", {}}}),
            "{w0: {}, w1: {cuda:0: cuda:1}}");
}

TEST(ParseDeviceMapTest, AcceptsMixedSpellings) {
  absl::StatusOr<DeviceMap> map = ParseDeviceMap({{"0", "1"}, {"cuda:1", "2"}});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_THAT(*map, ElementsAre(Pair(Cuda(0), Cuda(1)), Pair(Cuda(1), Cuda(2))));
}

TEST(ParseDeviceMapTest, LeavesTwoSourcesOnOneTargetToValidation) {
  // set_device_map({1: 0}) then set_device_map({0: 0}) passes in PyTorch; init_rpc's
  // validation names the node (ValidateMemberOptionsTest covers that message).
  absl::StatusOr<DeviceMap> map = ParseDeviceMap({{"0", "2"}, {"1", "2"}});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_THAT(*map, ElementsAre(Pair(Cuda(0), Cuda(2)), Pair(Cuda(1), Cuda(2))));
}

TEST(ParseDeviceMapTest, RejectsOneSourceSpelledTwice) {
  ExpectInvalid(ParseDeviceMap({{"0", "1"}, {"cuda:0", "2"}}).status(),
                {"maps cuda:0 twice", "'0'", "'cuda:0'"});
}

TEST(ParseDevicesTest, RejectsCpuWithSetDevicesWording) {
  ExpectInvalid(ParseDevices({"cuda:0", "cpu"}).status(),
                {"`set_devices` expect a list of CUDA devices, but got device type cpu."});
  absl::StatusOr<std::vector<Device>> devices = ParseDevices({"1", "cuda:0"});
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_THAT(*devices, ElementsAre(Cuda(1), Cuda(0)));
}

// --- One member's options ------------------------------------------------------------------

TEST(ValidateMemberOptionsTest, AcceptsPyTorchDefaults) {
  BackendOptions defaults;
  EXPECT_EQ(defaults.num_worker_threads, 16);
  EXPECT_EQ(defaults.rpc_timeout, absl::Seconds(60));
  EXPECT_TRUE(ValidateMemberOptions(Member("worker0", 0)).ok());
}

TEST(ValidateMemberOptionsTest, AcceptsEveryKnownTransportAndChannel) {
  MemberOptions member = Member("w0", 0);
  member.options.transports = {"uv", "shm", "ibv"};
  member.options.channels = {"basic",    "cma",      "mpt_uv",  "cuda_basic",
                             "cuda_ipc", "cuda_gdr", "cuda_xth"};
  EXPECT_TRUE(ValidateMemberOptions(member).ok());
}

TEST(ValidateMemberOptionsTest, RejectsNonPositiveNumWorkerThreads) {
  MemberOptions member = Member("w0", 0);
  member.options.num_worker_threads = 0;
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0", "num_worker_threads must be positive, got 0"});
}

TEST(ValidateMemberOptionsTest, RejectsNegativeRpcTimeoutButAcceptsZero) {
  MemberOptions member = Member("w0", 0);
  member.options.rpc_timeout = absl::Seconds(-1);
  ExpectInvalid(ValidateMemberOptions(member), {"Node w0", "rpc_timeout must be", "got -1s"});
  member.options.rpc_timeout = absl::InfiniteDuration();
  ExpectInvalid(ValidateMemberOptions(member), {"Node w0", "rpc_timeout must be finite"});
  member.options.rpc_timeout = absl::ZeroDuration();
  EXPECT_TRUE(ValidateMemberOptions(member).ok());
}

TEST(ValidateMemberOptionsTest, RejectsUnknownTransport) {
  MemberOptions member = Member("w0", 0);
  member.options.transports = {"uv", "tcp"};
  ExpectInvalid(ValidateMemberOptions(member), {"Node w0", "Unknown transport: tcp"});
}

TEST(ValidateMemberOptionsTest, RejectsUnknownChannel) {
  MemberOptions member = Member("w0", 0);
  member.options.channels = {"basic", "xth"};
  ExpectInvalid(ValidateMemberOptions(member), {"Node w0", "Unknown channel: xth"});
}

TEST(ValidateMemberOptionsTest, RejectsDuplicateTransport) {
  MemberOptions member = Member("w0", 0);
  member.options.transports = {"uv", "shm", "uv"};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0 lists uv twice in its transports", "[uv, shm, uv]"});
}

TEST(ValidateMemberOptionsTest, RejectsDuplicateChannel) {
  MemberOptions member = Member("w0", 0);
  member.options.channels = {"basic", "basic"};
  ExpectInvalid(ValidateMemberOptions(member), {"Node w0 lists basic twice in its channels"});
}

TEST(ValidateMemberOptionsTest, RejectsChannelsWithoutACpuChannel) {
  MemberOptions member = Member("w0", 0);
  member.options.channels = {"cuda_ipc", "cuda_basic"};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0 has no CPU channel", "[cma, mpt_uv, basic]"});
}

TEST(ValidateMemberOptionsTest, RejectsWorkerNamesWorkerInfoRejects) {
  const std::string worker_info_wording =
      "Worker name must match ^[A-Za-z0-9-_:]*$, and must be non-empty and shorter than 128 "
      "chars, but got";
  for (const std::string& name : {std::string(""), std::string(128, 'a'), std::string("w 0"),
                                  std::string("w/0"), std::string("w.0")}) {
    SCOPED_TRACE(name);
    ExpectInvalid(ValidateMemberOptions(Member(name, 0)), {worker_info_wording});
  }
  EXPECT_TRUE(ValidateMemberOptions(Member(std::string(127, 'a'), 0)).ok());
  EXPECT_TRUE(ValidateMemberOptions(Member("trainer-0:ps_1", 0)).ok());
}

TEST(ValidateMemberOptionsTest, RejectsInvalidTargetNameInDeviceMaps) {
  MemberOptions member = Member("w0", 0);
  member.options.device_maps["bad name"] = {{Cuda(0), Cuda(0)}};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0 has an invalid target name in its device maps", "bad name"});
}

TEST(ValidateMemberOptionsTest, RejectsNegativeRankAndDeviceCountAndEmptyNode) {
  ExpectInvalid(ValidateMemberOptions(Member("w0", -1)),
                {"Node w0", "rank must be non-negative, got -1"});
  ExpectInvalid(ValidateMemberOptions(Member("w0", 0, -1)),
                {"Node w0", "device count must be non-negative, got -1"});
  ExpectInvalid(ValidateMemberOptions(Member("w0", 0, 2, "")), {"Node w0", "node"});
}

TEST(ValidateMemberOptionsTest, RejectsCpuInDevicesWithSetDevicesWording) {
  MemberOptions member = Member("w0", 0);
  member.options.devices = {Cuda(0), Device::Cpu()};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0", "`set_devices` expect a list of CUDA devices, but got device type cpu.",
                 "devices = [cuda:0, cpu]"});
}

// PyTorch accepts cpu on either side of a map (_tensorpipe_validate_devices: cpu is always
// valid), and its tests use each of these.
TEST(ValidateMemberOptionsTest, AcceptsCpuOnEitherSideOfADeviceMap) {
  MemberOptions member = Member("w0", 0);
  for (const DeviceMap& map :
       {DeviceMap{{Device::Cpu(), Cuda(0)}}, DeviceMap{{Cuda(0), Device::Cpu()}},
        DeviceMap{{Device::Cpu(), Device::Cpu()}},
        DeviceMap{{Device::Cpu(), Cuda(1)}, {Cuda(1), Device::Cpu()}}}) {
    member.options.device_maps["w1"] = map;
    EXPECT_TRUE(ValidateMemberOptions(member).ok())
        << DeviceMapToString(map) << ": " << ValidateMemberOptions(member);
  }
}

TEST(ValidateMemberOptionsTest, AcceptsCpuToCpuOnAMemberWithoutCudaDevices) {
  MemberOptions member = Member("w0", 0, /*device_count=*/0, "cpu-host");
  member.options.device_maps["w1"] = {{Device::Cpu(), Device::Cpu()}};
  EXPECT_TRUE(ValidateMemberOptions(member).ok()) << ValidateMemberOptions(member);
}

TEST(ValidateMemberOptionsTest, RejectsCpuSourceOutsideTheGivenDevices) {
  // `devices` holds CUDA devices only (set_devices), so a cpu source is outside it, as in
  // PyTorch's subset check.
  MemberOptions member = Member("w0", 0);
  member.options.devices = {Cuda(0)};
  member.options.device_maps["w1"] = {{Device::Cpu(), Cuda(0)}};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0 has unexpected source devices in its device map for w1\n"
                 "device map = {cpu: cuda:0}\ndevices = [cuda:0]"});
}

TEST(ValidateMemberOptionsTest, RejectsTwoSourcesOnTheCpu) {
  MemberOptions member = Member("w0", 0);
  member.options.device_maps["w1"] = {{Device::Cpu(), Device::Cpu()}, {Cuda(0), Device::Cpu()}};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0 has duplicated target devices in its device map for w1\n"
                 "device map = {cpu: cpu, cuda:0: cpu}"});
}

TEST(ValidateMemberOptionsTest, CpuSourceDoesNotExcuseAnInvalidCudaSource) {
  MemberOptions member = Member("w0", 0, /*device_count=*/1);
  member.options.device_maps["w1"] = {{Device::Cpu(), Cuda(0)}, {Cuda(1), Device::Cpu()}};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0 has source devices with invalid indices in its device map for w1\n"
                 "device map = {cpu: cuda:0, cuda:1: cpu}\ndevice count = 1"});
}

TEST(ValidateMemberOptionsTest, RejectsDuplicatedDevices) {
  MemberOptions member = Member("w0", 0);
  member.options.devices = {Cuda(1), Cuda(0), Cuda(1)};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0 has duplicated devices\ndevices = [cuda:1, cuda:0, cuda:1]"});
}

TEST(ValidateMemberOptionsTest, RejectsDevicesWithInvalidIndices) {
  MemberOptions member = Member("w0", 0, /*device_count=*/2);
  member.options.devices = {Cuda(0), Cuda(2)};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0 has devices with invalid indices\ndevices = [cuda:0, cuda:2]\n"
                 "device count = 2"});
}

TEST(ValidateMemberOptionsTest, RejectsDuplicatedTargetDevices) {
  MemberOptions member = Member("w0", 0);
  member.options.device_maps["w1"] = {{Cuda(0), Cuda(1)}, {Cuda(1), Cuda(1)}};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0 has duplicated target devices in its device map for w1\n"
                 "device map = {cuda:0: cuda:1, cuda:1: cuda:1}",
                 "`device_map` only supports 1-to-1 mapping, trying to map cuda:1 and cuda:0 to "
                 "cuda:1"});
}

TEST(ValidateMemberOptionsTest, RejectsUnexpectedSourceDevices) {
  MemberOptions member = Member("w0", 0);
  member.options.devices = {Cuda(0)};
  member.options.device_maps["w1"] = {{Cuda(1), Cuda(0)}};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0 has unexpected source devices in its device map for w1\n"
                 "device map = {cuda:1: cuda:0}\ndevices = [cuda:0]"});
}

TEST(ValidateMemberOptionsTest, RejectsSourceDevicesWithInvalidIndices) {
  MemberOptions member = Member("w0", 0, /*device_count=*/2);
  member.options.device_maps["w1"] = {{Cuda(2), Cuda(0)}};
  ExpectInvalid(ValidateMemberOptions(member),
                {"Node w0 has source devices with invalid indices in its device map for w1\n"
                 "device map = {cuda:2: cuda:0}\ndevice count = 2"});
}

TEST(ValidateMemberOptionsTest, RejectsNegativeTargetIndexFromAHandBuiltDevice) {
  MemberOptions member = Member("w0", 0);
  member.options.device_maps["w1"] = {{Cuda(0), Device{-5}}};
  ExpectInvalid(
      ValidateMemberOptions(member),
      {"Node w0 has target devices with invalid indices in its device map for w1", "cuda:-5"});
}

// --- Group negotiation: validation ---------------------------------------------------------

TEST(NegotiateTest, RejectsEmptyGroup) {
  ExpectInvalid(Negotiate({}, /*is_static=*/true).status(), {"without members"});
}

TEST(NegotiateTest, RejectsAnInvalidMemberWithItsOwnMessage) {
  MemberOptions bad = Member("w1", 1);
  bad.options.num_worker_threads = -3;
  ExpectInvalid(Negotiate({Member("w0", 0), bad}, true).status(),
                {"Node w1", "num_worker_threads must be positive, got -3"});
}

TEST(NegotiateTest, RejectsDuplicateNames) {
  ExpectInvalid(Negotiate({Member("w0", 0), Member("w0", 1)}, true).status(),
                {"Node w0 appears twice in the group, with ranks 0 and 1"});
}

TEST(NegotiateTest, RejectsDuplicateRanks) {
  ExpectInvalid(Negotiate({Member("w0", 0), Member("w1", 0)}, false).status(),
                {"Node w1 has rank 0, as Node w0 does"});
}

TEST(NegotiateTest, StaticGroupRejectsRankOutsideItsSize) {
  ExpectInvalid(Negotiate({Member("w0", 0), Member("w1", 2)}, true).status(),
                {"Node w1 has rank 2, but a static group of 2 members has ranks 0 to 1"});
  EXPECT_TRUE(Negotiate({Member("w0", 0), Member("w1", 2)}, false).ok());
}

TEST(NegotiateTest, StaticGroupRejectsInvalidTargetNodeNames) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.device_maps["w1"] = {{Cuda(0), Cuda(0)}};
  w0.options.device_maps["w9"] = {{Cuda(1), Cuda(1)}};
  ExpectInvalid(Negotiate({w0, Member("w1", 1)}, /*is_static=*/true).status(),
                {"Node w0 has invalid target node names in its device maps\n"
                 "device maps = {w1: {cuda:0: cuda:0}, w9: {cuda:1: cuda:1}}\n"
                 "node names = [w0, w1]",
                 "unknown names = [w9]"});
}

TEST(NegotiateTest, DynamicGroupAcceptsTargetThatHasNotJoined) {
  MemberOptions w0 = Member("w0", 0);
  // Index 7 would be invalid on a 2-device w9; it is checked only once w9 joins.
  w0.options.device_maps["w9"] = {{Cuda(1), Cuda(7)}};
  absl::StatusOr<Negotiated> negotiated = Negotiate({w0, Member("w1", 1)}, /*is_static=*/false);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_THAT(Find(*negotiated, "w0").devices, ElementsAre(Cuda(1)));

  ExpectInvalid(Negotiate({w0, Member("w1", 1), Member("w9", 2)}, false).status(),
                {"Node w0 has target devices with invalid indices in its device map for w9"});
}

TEST(NegotiateTest, RejectsUnexpectedTargetDevices) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.device_maps["w1"] = {{Cuda(0), Cuda(1)}};
  MemberOptions w1 = Member("w1", 1);
  w1.options.devices = {Cuda(0)};
  ExpectInvalid(Negotiate({w0, w1}, true).status(),
                {"Node w0 has unexpected target devices in its device map for w1\n"
                 "device map = {cuda:0: cuda:1}\ndevices = [cuda:0]"});
}

TEST(NegotiateTest, RejectsTargetDevicesWithInvalidIndices) {
  MemberOptions w0 = Member("w0", 0, /*device_count=*/4);
  w0.options.device_maps["w1"] = {{Cuda(3), Cuda(3)}};
  ExpectInvalid(Negotiate({w0, Member("w1", 1, /*device_count=*/2)}, true).status(),
                {"Node w0 has target devices with invalid indices in its device map for w1\n"
                 "device map = {cuda:3: cuda:3}\ndevice count = 2"});
}

TEST(NegotiateTest, DeviceCountZeroMemberWithAMapFailsWithInvalidSourceIndices) {
  // A CPU-only node (device count overridden to 0) that still maps cuda:0 toward w1.
  MemberOptions w0 = Member("w0", 0, /*device_count=*/0, "cpu-host");
  w0.options.device_maps["w1"] = {{Cuda(0), Cuda(0)}};
  ExpectInvalid(Negotiate({w0, Member("w1", 1)}, true).status(),
                {"Node w0 has source devices with invalid indices in its device map for w1\n"
                 "device map = {cuda:0: cuda:0}\ndevice count = 0"});
}

TEST(NegotiateTest, DeviceCountZeroTargetRejectsMapsOntoIt) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.device_maps["w1"] = {{Cuda(0), Cuda(0)}};
  ExpectInvalid(Negotiate({w0, Member("w1", 1, /*device_count=*/0)}, true).status(),
                {"Node w0 has target devices with invalid indices", "device count = 0"});
}

TEST(NegotiateTest, AcceptsCpuTargetOnAMemberWithoutCudaDevices) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.device_maps["w1"] = {{Cuda(0), Device::Cpu()}};
  absl::StatusOr<Negotiated> negotiated =
      Negotiate({w0, Member("w1", 1, /*device_count=*/0, "cpu-host")}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
}

TEST(NegotiateTest, CpuSourceStillNeedsAValidCudaTarget) {
  MemberOptions w0 = Member("w0", 0, /*device_count=*/0, "cpu-host");
  w0.options.device_maps["w1"] = {{Device::Cpu(), Cuda(2)}};
  ExpectInvalid(Negotiate({w0, Member("w1", 1, /*device_count=*/2)}, true).status(),
                {"Node w0 has target devices with invalid indices in its device map for w1\n"
                 "device map = {cpu: cuda:2}\ndevice count = 2"});
}

TEST(NegotiateTest, RejectsCpuTargetOutsideTheTargetsGivenDevices) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.device_maps["w1"] = {{Cuda(0), Device::Cpu()}};
  MemberOptions w1 = Member("w1", 1);
  w1.options.devices = {Cuda(0)};
  ExpectInvalid(Negotiate({w0, w1}, true).status(),
                {"Node w0 has unexpected target devices in its device map for w1\n"
                 "device map = {cuda:0: cpu}\ndevices = [cuda:0]"});
}

// --- Group negotiation: reverse maps and device lists --------------------------------------

TEST(NegotiateTest, ReverseMapInvertsTheSourcesMapTowardThisMember) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.device_maps["w1"] = {{Cuda(0), Cuda(1)}};
  absl::StatusOr<Negotiated> negotiated = Negotiate({w0, Member("w1", 1)}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_EQ(DeviceMapsToString(Find(*negotiated, "w1").reverse_device_maps),
            "{w0: {cuda:1: cuda:0}}");
  EXPECT_THAT(Find(*negotiated, "w0").reverse_device_maps, IsEmpty());
  EXPECT_EQ(DeviceMapsToString(Find(*negotiated, "w0").device_maps), "{w1: {cuda:0: cuda:1}}");
}

TEST(NegotiateTest, ReverseMapsHoldEveryMemberThatMapsOntoThisOne) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.device_maps["w1"] = {{Cuda(0), Cuda(1)}, {Cuda(1), Cuda(0)}};
  MemberOptions w2 = Member("w2", 2);
  w2.options.device_maps["w1"] = {{Cuda(1), Cuda(1)}};
  w2.options.device_maps["w2"] = {{Cuda(0), Cuda(1)}};  // a map toward itself is allowed
  absl::StatusOr<Negotiated> negotiated = Negotiate({w0, Member("w1", 1), w2}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_EQ(DeviceMapsToString(Find(*negotiated, "w1").reverse_device_maps),
            "{w0: {cuda:0: cuda:1, cuda:1: cuda:0}, w2: {cuda:1: cuda:1}}");
  EXPECT_EQ(DeviceMapsToString(Find(*negotiated, "w2").reverse_device_maps),
            "{w2: {cuda:1: cuda:0}}");
}

TEST(NegotiateTest, DeviceListIsTheGivenDevicesSortedByIndex) {
  MemberOptions w0 = Member("w0", 0, /*device_count=*/4);
  w0.options.devices = {Cuda(3), Cuda(0), Cuda(2)};
  w0.options.device_maps["w1"] = {{Cuda(0), Cuda(0)}};
  absl::StatusOr<Negotiated> negotiated = Negotiate({w0, Member("w1", 1)}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  // Given devices are kept as given (not narrowed to what the maps use), only sorted.
  EXPECT_THAT(Find(*negotiated, "w0").devices, ElementsAre(Cuda(0), Cuda(2), Cuda(3)));
}

TEST(NegotiateTest, DeviceListIsOwnMapSourcesAndOthersTargetsWhenNotGiven) {
  MemberOptions w0 = Member("w0", 0, /*device_count=*/4);
  w0.options.device_maps["w1"] = {{Cuda(3), Cuda(1)}};
  MemberOptions w1 = Member("w1", 1, /*device_count=*/4);
  w1.options.device_maps["w0"] = {{Cuda(2), Cuda(0)}};
  absl::StatusOr<Negotiated> negotiated = Negotiate({w0, w1, Member("w2", 2)}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  // w0: cuda:3 from its own map, cuda:0 because w1 maps onto it.
  EXPECT_THAT(Find(*negotiated, "w0").devices, ElementsAre(Cuda(0), Cuda(3)));
  // w1: cuda:2 from its own map, cuda:1 because w0 maps onto it.
  EXPECT_THAT(Find(*negotiated, "w1").devices, ElementsAre(Cuda(1), Cuda(2)));
  // w2 neither maps nor is mapped onto: a CPU-only member.
  EXPECT_THAT(Find(*negotiated, "w2").devices, IsEmpty());
}

TEST(NegotiateTest, DeviceListCountsASharedDeviceOnce) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.device_maps["w1"] = {{Cuda(1), Cuda(1)}};
  MemberOptions w1 = Member("w1", 1);
  w1.options.device_maps["w0"] = {{Cuda(1), Cuda(1)}};
  absl::StatusOr<Negotiated> negotiated = Negotiate({w0, w1}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_THAT(Find(*negotiated, "w0").devices, ElementsAre(Cuda(1)));
  EXPECT_THAT(Find(*negotiated, "w1").devices, ElementsAre(Cuda(1)));
}

TEST(NegotiateTest, CpuMapsInvertLikePyTorchAndLeaveCpuOutOfDeviceLists) {
  // w0's CPU tensors land on w1's cuda:0 and its cuda:1 tensors on w1's CPU; replies follow
  // the inverse: w1's cuda:0 comes back to w0 as a CPU tensor, w1's CPU tensors to cuda:1.
  MemberOptions w0 = Member("w0", 0);
  w0.options.device_maps["w1"] = {{Device::Cpu(), Cuda(0)}, {Cuda(1), Device::Cpu()}};
  absl::StatusOr<Negotiated> negotiated = Negotiate({w0, Member("w1", 1)}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_EQ(DeviceMapsToString(Find(*negotiated, "w1").reverse_device_maps),
            "{w0: {cpu: cuda:1, cuda:0: cpu}}");
  EXPECT_EQ(DeviceMapsToString(Find(*negotiated, "w0").device_maps),
            "{w1: {cpu: cuda:0, cuda:1: cpu}}");
  // _create_device_list discards cpu.
  EXPECT_THAT(Find(*negotiated, "w0").devices, ElementsAre(Cuda(1)));
  EXPECT_THAT(Find(*negotiated, "w1").devices, ElementsAre(Cuda(0)));
}

TEST(NegotiateTest, CpuToCpuMapsBetweenCpuOnlyNodes) {
  MemberOptions w0 = Member("w0", 0, /*device_count=*/0, "cpu-a");
  w0.options.device_maps["w1"] = {{Device::Cpu(), Device::Cpu()}};
  absl::StatusOr<Negotiated> negotiated =
      Negotiate({w0, Member("w1", 1, /*device_count=*/0, "cpu-b")}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_EQ(DeviceMapsToString(Find(*negotiated, "w1").reverse_device_maps), "{w0: {cpu: cpu}}");
  EXPECT_THAT(Find(*negotiated, "w0").devices, IsEmpty());
  EXPECT_THAT(Find(*negotiated, "w1").devices, IsEmpty());
}

TEST(NegotiateTest, DynamicGroupChecksACpuMapWhenItsTargetJoins) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.device_maps["w1"] = {{Device::Cpu(), Cuda(1)}};
  // w1 has not joined: nothing to check the target against yet.
  ASSERT_TRUE(Negotiate({w0}, /*is_static=*/false).ok());
  // It joins with one device: cuda:1 is out of range there.
  ExpectInvalid(Negotiate({w0, Member("w1", 1, /*device_count=*/1)}, false).status(),
                {"Node w0 has target devices with invalid indices in its device map for w1"});
}

TEST(NegotiateTest, MembersComeOutInRankOrderWithTheirOwnSettings) {
  MemberOptions w1 = Member("w1", 1, 2, "host-b");
  w1.options.num_worker_threads = 4;
  w1.options.rpc_timeout = absl::Seconds(5);
  absl::StatusOr<Negotiated> negotiated = Negotiate({w1, Member("w0", 0)}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  ASSERT_EQ(negotiated->members.size(), 2);
  EXPECT_EQ(negotiated->members[0].name, "w0");
  EXPECT_EQ(negotiated->members[1].name, "w1");
  EXPECT_EQ(negotiated->members[1].node, "host-b");
  EXPECT_EQ(negotiated->members[1].rank, 1);
  EXPECT_EQ(negotiated->members[1].device_count, 2);
  EXPECT_EQ(negotiated->members[1].num_worker_threads, 4);
  EXPECT_EQ(negotiated->members[1].rpc_timeout, absl::Seconds(5));
  EXPECT_EQ(negotiated->members[0].num_worker_threads, 16);
}

TEST(NegotiateTest, GroupThreadsAreTheLargestAndTimeoutTheShortestNonZero) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.num_worker_threads = 8;
  w0.options.rpc_timeout = absl::ZeroDuration();  // no deadline: does not shorten the group's
  MemberOptions w1 = Member("w1", 1);
  w1.options.num_worker_threads = 32;
  w1.options.rpc_timeout = absl::Seconds(30);
  MemberOptions w2 = Member("w2", 2);
  w2.options.rpc_timeout = absl::Seconds(90);
  absl::StatusOr<Negotiated> negotiated = Negotiate({w0, w1, w2}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_EQ(negotiated->num_worker_threads, 32);
  EXPECT_EQ(negotiated->rpc_timeout, absl::Seconds(30));
}

TEST(NegotiateTest, GroupTimeoutIsZeroOnlyWhenNoMemberHasADeadline) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.rpc_timeout = absl::ZeroDuration();
  MemberOptions w1 = Member("w1", 1);
  w1.options.rpc_timeout = absl::ZeroDuration();
  absl::StatusOr<Negotiated> negotiated = Negotiate({w0, w1}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_EQ(negotiated->rpc_timeout, absl::ZeroDuration());
}

// --- Group negotiation: transports and channels --------------------------------------------

TEST(NegotiateTest, UsesPyTorchDefaultPrioritiesWhenNoMemberSetsAny) {
  absl::StatusOr<Negotiated> negotiated = Negotiate({Member("w0", 0), Member("w1", 1)}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_THAT(negotiated->transports, ElementsAre("shm", "ibv", "uv"));
  EXPECT_THAT(negotiated->channels, ElementsAre("cma", "mpt_uv", "basic", "cuda_xth", "cuda_ipc",
                                                "cuda_gdr", "cuda_basic"));
}

TEST(NegotiateTest, KeepsTheLowestRankPriorityOrderOfTheCommonTransports) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.transports = {"uv", "ibv", "shm"};
  MemberOptions w1 = Member("w1", 1);
  w1.options.transports = {"shm", "uv"};
  absl::StatusOr<Negotiated> negotiated = Negotiate({w1, w0}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_THAT(negotiated->transports, ElementsAre("uv", "shm"));
}

TEST(NegotiateTest, IntersectsAnExplicitListWithAnotherMembersDefaults) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.channels = {"cuda_ipc", "basic"};
  absl::StatusOr<Negotiated> negotiated = Negotiate({Member("w1", 1), w0}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_THAT(negotiated->channels, ElementsAre("cuda_ipc", "basic"));
  EXPECT_THAT(negotiated->transports, ElementsAre("shm", "ibv", "uv"));
}

TEST(NegotiateTest, RejectsGroupWithoutACommonTransportNamingTheMember) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.transports = {"uv"};
  MemberOptions w1 = Member("w1", 1);
  w1.options.transports = {"shm"};
  ExpectInvalid(Negotiate({w0, w1, Member("w2", 2)}, true).status(),
                {"Node w1 has no transport in common with the members ranked before it",
                 "transports = [shm]", "common to lower ranks = [uv]"});
}

TEST(NegotiateTest, RejectsGroupWithoutACommonCpuChannelNamingTheMember) {
  MemberOptions w0 = Member("w0", 0);
  w0.options.channels = {"basic", "cuda_ipc"};
  MemberOptions w2 = Member("w2", 2);
  w2.options.channels = {"cma", "cuda_ipc"};
  ExpectInvalid(Negotiate({w0, Member("w1", 1), w2}, false).status(),
                {"Node w2 has no CPU channel in common with the members ranked before it",
                 "channels = [cma, cuda_ipc]", "common to lower ranks = [basic, cuda_ipc]"});
}

TEST(NegotiateTest, MembersThatSetNoTransportsDoNotNarrowTheCommonList) {
  MemberOptions w1 = Member("w1", 1);
  w1.options.transports = {"ibv"};
  MemberOptions w2 = Member("w2", 2);
  w2.options.transports = {"uv"};
  ExpectInvalid(Negotiate({Member("w0", 0), w1, w2}, true).status(),
                {"Node w2 has no transport", "transports = [uv]", "common to lower ranks = [ibv]"});
}

// --- Effective offers: what each member's node registered ----------------------------------

// `member` on node `node`, whose agent registered only `transports` and `channels`.
MemberOptions OnNode(MemberOptions member, std::string node, std::vector<std::string> transports,
                     std::vector<std::string> channels) {
  member.node = std::move(node);
  member.node_transports = std::move(transports);
  member.node_channels = std::move(channels);
  return member;
}

// What a daemon without a GPU or InfiniBand registers, and one with both.
const std::vector<std::string> kCpuNodeTransports = {"shm", "uv"};
const std::vector<std::string> kCpuNodeChannels = {"cma", "mpt_uv", "basic"};
const std::vector<std::string> kGpuNodeTransports = {"shm", "ibv", "uv"};
const std::vector<std::string> kGpuNodeChannels = {"cma",      "mpt_uv",   "basic",     "cuda_xth",
                                                   "cuda_ipc", "cuda_gdr", "cuda_basic"};

TEST(EffectiveOfferTest, DefaultsAreNarrowedToWhatTheNodeRegistered) {
  MemberOptions w0 = OnNode(Member("w0", 0), "n1", kCpuNodeTransports, kCpuNodeChannels);
  EXPECT_THAT(EffectiveTransports(w0), ElementsAre("shm", "uv"));
  EXPECT_THAT(EffectiveChannels(w0), ElementsAre("cma", "mpt_uv", "basic"));
  EXPECT_TRUE(ValidateMemberOptions(w0).ok()) << ValidateMemberOptions(w0);
}

TEST(EffectiveOfferTest, ExplicitNamesOutsideTheNodesListsAreDroppedInTheMembersOrder) {
  MemberOptions w0 = OnNode(Member("w0", 0), "n1", {"shm", "uv"}, {"basic", "cma", "cuda_ipc"});
  w0.options.transports = {"uv", "ibv", "shm"};
  w0.options.channels = {"cuda_gdr", "cma", "cuda_ipc", "basic"};
  EXPECT_THAT(EffectiveTransports(w0), ElementsAre("uv", "shm"));
  EXPECT_THAT(EffectiveChannels(w0), ElementsAre("cma", "cuda_ipc", "basic"));
  EXPECT_TRUE(ValidateMemberOptions(w0).ok()) << ValidateMemberOptions(w0);
}

TEST(EffectiveOfferTest, EmptyNodeListsMeanUnknownAndRestrictNothing) {
  MemberOptions w0 = Member("w0", 0);
  EXPECT_EQ(EffectiveTransports(w0), DefaultTransports());
  EXPECT_EQ(EffectiveChannels(w0), DefaultChannels());
  w0.options.transports = {"ibv"};
  w0.options.channels = {"cuda_gdr", "basic"};
  EXPECT_THAT(EffectiveTransports(w0), ElementsAre("ibv"));
  EXPECT_THAT(EffectiveChannels(w0), ElementsAre("cuda_gdr", "basic"));
  // Each list on its own: a known transport list does not make the channel list known.
  w0.node_transports = {"shm", "ibv"};
  EXPECT_THAT(EffectiveTransports(w0), ElementsAre("ibv"));
  EXPECT_THAT(EffectiveChannels(w0), ElementsAre("cuda_gdr", "basic"));
  EXPECT_TRUE(ValidateMemberOptions(w0).ok()) << ValidateMemberOptions(w0);
}

TEST(EffectiveOfferTest, RejectsAMemberWhoseNodeRegisteredNoneOfItsTransports) {
  MemberOptions w0 = OnNode(Member("w0", 0), "n1", kCpuNodeTransports, kCpuNodeChannels);
  w0.options.transports = {"ibv"};
  const absl::Status status = ValidateMemberOptions(w0);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message(),
            "Node w0 asks for transports [ibv] but its node n1 registered only [shm, uv]: no "
            "transport in common");
}

TEST(EffectiveOfferTest, RejectsDefaultsWhenTheNodeRegisteredNoKnownTransport) {
  MemberOptions w0 = OnNode(Member("w0", 0), "n1", {"tcp"}, kCpuNodeChannels);
  EXPECT_THAT(EffectiveTransports(w0), IsEmpty());
  ExpectInvalid(ValidateMemberOptions(w0),
                {"Node w0 asks for transports [shm, ibv, uv] (the defaults) but its node n1 "
                 "registered only [tcp]: no transport in common"});
}

TEST(EffectiveOfferTest, RejectsAMemberWhoseNodeLeavesItNoCpuChannel) {
  MemberOptions w0 = OnNode(Member("w0", 0), "n1", kGpuNodeTransports, {"cma", "cuda_ipc"});
  w0.options.channels = {"basic", "cuda_ipc"};
  const absl::Status status = ValidateMemberOptions(w0);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message(),
            "Node w0 asks for channels [basic, cuda_ipc] but its node n1 registered only [cma, "
            "cuda_ipc]: no CPU channel in common");
}

TEST(EffectiveOfferTest, NegotiateRefusesAMemberItsNodeCannotServeNamingIt) {
  MemberOptions w1 = OnNode(Member("w1", 1), "n2", kCpuNodeTransports, kCpuNodeChannels);
  w1.options.channels = {"cuda_ipc", "cuda_basic"};
  ExpectInvalid(Negotiate({Member("w0", 0), w1}, /*is_static=*/true).status(),
                {"Node w1 has no CPU channel in its channels"});
  w1.options.channels = {"cuda_ipc", "cma"};
  w1.node_channels = {"basic", "cuda_ipc"};
  ExpectInvalid(Negotiate({Member("w0", 0), w1}, true).status(),
                {"Node w1 asks for channels [cuda_ipc, cma] but its node n2 registered only "
                 "[basic, cuda_ipc]: no CPU channel in common"});
}

TEST(EffectiveOfferTest, CpuOnlyGroupIsNeverToldIbvOrCudaChannels) {
  absl::StatusOr<Negotiated> negotiated =
      Negotiate({OnNode(Member("w0", 0), "n1", kCpuNodeTransports, kCpuNodeChannels),
                 OnNode(Member("w1", 1), "n2", kCpuNodeTransports, kCpuNodeChannels)},
                /*is_static=*/true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_THAT(negotiated->transports, ElementsAre("shm", "uv"));
  EXPECT_THAT(negotiated->channels, ElementsAre("cma", "mpt_uv", "basic"));
}

TEST(EffectiveOfferTest, MixedNodesGetTheIntersectionInTheLowestRanksOrder) {
  MemberOptions gpu = OnNode(Member("w0", 0), "gpu-node", kGpuNodeTransports, kGpuNodeChannels);
  gpu.options.channels = {"cuda_ipc", "basic", "cma"};
  MemberOptions cpu = OnNode(Member("w1", 1), "cpu-node", kCpuNodeTransports, kCpuNodeChannels);
  absl::StatusOr<Negotiated> negotiated = Negotiate({cpu, gpu}, /*is_static=*/true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_THAT(negotiated->transports, ElementsAre("shm", "uv"));
  EXPECT_THAT(negotiated->channels, ElementsAre("basic", "cma"));  // w0's order
  // The same GPU node with an older daemon's record (lists unknown) still narrows nothing.
  gpu.node_transports.clear();
  gpu.node_channels.clear();
  negotiated = Negotiate({cpu, gpu}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_THAT(negotiated->transports, ElementsAre("shm", "uv"));
  EXPECT_THAT(negotiated->channels, ElementsAre("basic", "cma"));
  negotiated = Negotiate({gpu, Member("w1", 1)}, true);
  ASSERT_TRUE(negotiated.ok()) << negotiated.status();
  EXPECT_THAT(negotiated->transports, ElementsAre("shm", "ibv", "uv"));
  EXPECT_THAT(negotiated->channels, ElementsAre("cuda_ipc", "basic", "cma"));
}

TEST(EffectiveOfferTest, NodesWithNoTransportInCommonNameTheMemberAndItsNode) {
  MemberOptions w0 = OnNode(Member("w0", 0), "n1", {"shm"}, kCpuNodeChannels);
  MemberOptions w1 = OnNode(Member("w1", 1), "n2", {"ibv", "uv"}, kCpuNodeChannels);
  ExpectInvalid(Negotiate({w0, w1}, true).status(),
                {"Node w1 has no transport in common with the members ranked before it\n"
                 "transports = [ibv, uv]\n"
                 "registered by its node n2 = [ibv, uv]\n"
                 "common to lower ranks = [shm]"});
}

}  // namespace
}  // namespace tpd::group
