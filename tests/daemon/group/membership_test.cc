// Unit tests of group membership transitions: who may join a GroupRecord, which rank a member
// gets, when a static group forms, fails or breaks, and the negotiated options after each change.

#include "daemon/group/membership.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/group_record.pb.h"

namespace tpd::group {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// A device map as plain maps, so expectations can spell it: local -> remote, by remote worker.
using DeviceMaps = std::map<std::string, std::map<std::string, std::string>>;

DeviceMaps Maps(const google::protobuf::Map<std::string, v1::DeviceMap>& maps) {
  DeviceMaps out;
  for (const auto& [to, map] : maps) out[to] = {map.devices().begin(), map.devices().end()};
  return out;
}

// A join with PyTorch's default options on a node with two CUDA devices. Without `world_size`
// it is a dynamic join.
JoinSpec Spec(std::string name, std::optional<int64_t> rank,
              std::optional<int64_t> world_size = std::nullopt, std::string node = "node-a") {
  JoinSpec spec;
  spec.name = std::move(name);
  spec.rank = rank;
  spec.world_size = world_size;
  spec.node = std::move(node);
  spec.incarnation = 7;
  spec.since_unix_ms = 1700000000000;
  spec.device_count = 2;
  return spec;
}

// `spec` with a device map toward `to`.
JoinSpec WithMap(JoinSpec spec, const std::string& to,
                 const std::map<std::string, std::string>& devices) {
  v1::DeviceMap& map = (*spec.options.mutable_device_maps())[to];
  for (const auto& [from, onto] : devices) (*map.mutable_devices())[from] = onto;
  return spec;
}

// The record of group "g" before anyone joined.
v1::GroupRecord NewRecord() {
  v1::GroupRecord record;
  record.mutable_view()->set_group("g");
  record.mutable_view()->set_store("tcp://10.0.0.1:29400");
  record.mutable_view()->set_phase(kEmpty);
  return record;
}

void Join(v1::GroupRecord* record, const JoinSpec& spec) {
  absl::StatusOr<int64_t> rank = AddMember(record, spec);
  ASSERT_TRUE(rank.ok()) << spec.name << ": " << rank.status();
}

// A FORMED static group of `size` members w0.. with ranks 0.. on nodes node-0...
v1::GroupRecord FormedGroup(int64_t size) {
  v1::GroupRecord record = NewRecord();
  for (int64_t rank = 0; rank < size; ++rank) {
    Join(&record, Spec(absl::StrCat("w", rank), rank, size, absl::StrCat("node-", rank)));
  }
  EXPECT_EQ(record.view().phase(), kFormed);
  return record;
}

// Asserts that AddMember refuses `spec` with `code` and every one of `parts` in its message,
// and leaves `record` exactly as it was.
void ExpectRefused(v1::GroupRecord* record, const JoinSpec& spec, absl::StatusCode code,
                   const std::vector<std::string>& parts) {
  const std::string before = record->SerializeAsString();
  absl::StatusOr<int64_t> rank = AddMember(record, spec);
  ASSERT_FALSE(rank.ok()) << spec.name << " got rank " << *rank;
  EXPECT_EQ(rank.status().code(), code) << rank.status();
  const std::string message(rank.status().message());
  for (const std::string& part : parts) EXPECT_THAT(message, HasSubstr(part));
  EXPECT_EQ(record->SerializeAsString(), before) << "record changed by a refused join";
}

std::vector<std::string> Names(const v1::GroupView& view) {
  std::vector<std::string> names;
  for (const v1::Member& member : view.members()) names.push_back(member.name());
  return names;
}

std::vector<int64_t> Ranks(const v1::GroupView& view) {
  std::vector<int64_t> ranks;
  for (const v1::Member& member : view.members()) ranks.push_back(member.rank());
  return ranks;
}

const v1::NegotiatedMember& Negotiated(const v1::GroupView& view, const std::string& name) {
  for (const v1::NegotiatedMember& member : view.negotiated()) {
    if (member.name() == name) return member;
  }
  ADD_FAILURE() << "no negotiated entry for " << name;
  return v1::NegotiatedMember::default_instance();
}

auto Named(std::vector<std::string> names) {
  return [names = std::move(names)](const v1::Member& member) {
    for (const std::string& name : names) {
      if (member.name() == name) return true;
    }
    return false;
  };
}

// --- Static groups: forming ------------------------------------------------------------------

TEST(MembershipStaticTest, FirstJoinerMakesTheGroupStaticAndForming) {
  v1::GroupRecord record = NewRecord();
  absl::StatusOr<int64_t> rank = AddMember(&record, Spec("w1", 1, 3, "node-b"));
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, 1);
  const v1::GroupView& view = record.view();
  EXPECT_TRUE(view.is_static());
  EXPECT_EQ(view.world_size(), 3);
  EXPECT_EQ(view.phase(), kForming);
  EXPECT_EQ(view.version(), 1);
  EXPECT_THAT(view.negotiated(), IsEmpty());
  EXPECT_EQ(record.change(), "JOINED");
  EXPECT_EQ(record.change_detail(), "w1 (rank 1) joined from node node-b");
  const v1::Member* member = FindMember(record, "w1");
  ASSERT_NE(member, nullptr);
  EXPECT_EQ(member->rank(), 1);
  EXPECT_EQ(member->node(), "node-b");
  EXPECT_EQ(member->incarnation(), 7u);
  EXPECT_EQ(member->since_unix_ms(), 1700000000000);
  ASSERT_EQ(record.options().count("w1"), 1u);
  EXPECT_EQ(record.options().at("w1").device_count(), 2);
}

TEST(MembershipStaticTest, VersionGrowsByOnePerChange) {
  v1::GroupRecord record = NewRecord();
  record.mutable_view()->set_version(41);
  Join(&record, Spec("w0", 0, 3));
  EXPECT_EQ(record.view().version(), 42);
  Join(&record, Spec("w1", 1, 3));
  EXPECT_EQ(record.view().version(), 43);
  Join(&record, Spec("w2", 2, 3));  // forms the group: still one change
  EXPECT_EQ(record.view().version(), 44);
  EXPECT_EQ(RemoveMembers(&record, Named({"w1"}), "LEFT", "bye"), 1);
  EXPECT_EQ(record.view().version(), 45);
}

TEST(MembershipStaticTest, RanksJoinInAnyOrderAndAreKeptByRank) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("w2", 2, 3));
  Join(&record, Spec("w0", 0, 3));
  EXPECT_EQ(record.view().phase(), kForming);
  EXPECT_THAT(Ranks(record.view()), ElementsAre(0, 2));
  Join(&record, Spec("w1", 1, 3));
  EXPECT_EQ(record.view().phase(), kFormed);
  EXPECT_THAT(Names(record.view()), ElementsAre("w0", "w1", "w2"));
  EXPECT_THAT(Ranks(record.view()), ElementsAre(0, 1, 2));
}

TEST(MembershipStaticTest, JoinCompletingTheWorldFormsTheGroupAndNegotiates) {
  v1::GroupRecord record = NewRecord();
  Join(&record, WithMap(Spec("w0", 0, 2, "node-a"), "w1", {{"cuda:0", "cuda:1"}}));
  EXPECT_THAT(record.view().negotiated(), IsEmpty());
  absl::StatusOr<int64_t> rank = AddMember(&record, Spec("w1", 1, 2, "node-b"));
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, 1);

  const v1::GroupView& view = record.view();
  EXPECT_EQ(view.phase(), kFormed);
  EXPECT_EQ(view.reason(), "");
  EXPECT_EQ(record.change(), "FORMED");
  EXPECT_EQ(record.change_detail(), "all 2 ranks joined; w1 was the last");
  ASSERT_EQ(view.negotiated_size(), 2);
  EXPECT_EQ(view.negotiated(0).name(), "w0");
  EXPECT_EQ(view.negotiated(1).name(), "w1");

  const v1::NegotiatedMember& w0 = Negotiated(view, "w0");
  EXPECT_EQ(Maps(w0.device_maps()), (DeviceMaps{{"w1", {{"cuda:0", "cuda:1"}}}}));
  EXPECT_THAT(w0.reverse_device_maps(), IsEmpty());
  EXPECT_THAT(w0.devices(), ElementsAre("cuda:0"));
  const v1::NegotiatedMember& w1 = Negotiated(view, "w1");
  EXPECT_THAT(w1.device_maps(), IsEmpty());
  EXPECT_EQ(Maps(w1.reverse_device_maps()), (DeviceMaps{{"w0", {{"cuda:1", "cuda:0"}}}}));
  EXPECT_THAT(w1.devices(), ElementsAre("cuda:1"));

  EXPECT_THAT(view.transports(), ElementsAre("shm", "ibv", "uv"));
  EXPECT_THAT(view.channels(), ElementsAre("cma", "mpt_uv", "basic", "cuda_xth", "cuda_ipc",
                                           "cuda_gdr", "cuda_basic"));
  EXPECT_EQ(view.num_worker_threads(), 16);
  EXPECT_EQ(view.rpc_timeout_ms(), 60000);
}

TEST(MembershipStaticTest, FormingIntersectsTransportsAndChannelsInRankOrder) {
  v1::GroupRecord record = NewRecord();
  JoinSpec w1 = Spec("w1", 1, 2);
  w1.options.add_transports("uv");
  w1.options.add_transports("shm");
  w1.options.add_channels("basic");
  w1.options.set_num_worker_threads(32);
  w1.options.set_rpc_timeout_ms(5000);
  Join(&record, w1);
  Join(&record, Spec("w0", 0, 2));
  EXPECT_EQ(record.view().phase(), kFormed);
  EXPECT_THAT(record.view().transports(), ElementsAre("shm", "uv"));  // w0's (default) order
  EXPECT_THAT(record.view().channels(), ElementsAre("basic"));
  EXPECT_EQ(record.view().num_worker_threads(), 32);
  EXPECT_EQ(record.view().rpc_timeout_ms(), 5000);
}

// `spec` from a node whose agent registered only these transports and channels.
JoinSpec OnNode(JoinSpec spec, std::vector<std::string> transports,
                std::vector<std::string> channels) {
  spec.node_transports = std::move(transports);
  spec.node_channels = std::move(channels);
  return spec;
}

TEST(MembershipStaticTest, NegotiationOffersOnlyWhatTheMembersNodesRegistered) {
  v1::GroupRecord record = NewRecord();
  // w0's node has a GPU and InfiniBand; w1's has neither.
  Join(&record,
       OnNode(Spec("w0", 0, 2, "gpu-node"), {"shm", "ibv", "uv"},
              {"cma", "mpt_uv", "basic", "cuda_xth", "cuda_ipc", "cuda_gdr", "cuda_basic"}));
  Join(&record, OnNode(Spec("w1", 1, 2, "cpu-node"), {"uv", "shm"}, {"basic", "mpt_uv", "cma"}));
  EXPECT_EQ(record.view().phase(), kFormed) << record.view().reason();
  // Every member's defaults within its node's lists, in w0's (default) priority order.
  EXPECT_THAT(record.view().transports(), ElementsAre("shm", "uv"));
  EXPECT_THAT(record.view().channels(), ElementsAre("cma", "mpt_uv", "basic"));
}

TEST(MembershipStaticTest, NodeThatRegisteredNoneOfAMembersTransportsFailsTheGroup) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("w1", 1, 2));
  JoinSpec w0 = OnNode(Spec("w0", 0, 2, "n1"), {"shm", "uv"}, {"cma", "basic"});
  w0.options.add_transports("ibv");
  Join(&record, w0);
  EXPECT_EQ(record.view().phase(), kFailed);
  EXPECT_THAT(record.view().reason(),
              HasSubstr("Node w0 asks for transports [ibv] but its node n1 registered only "
                        "[shm, uv]: no transport in common"));
}

// --- Static groups: refused joins ------------------------------------------------------------

TEST(MembershipStaticTest, RefusesWorldSizeMismatchNamingBothSizes) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("w0", 0, 4));
  ExpectRefused(&record, Spec("w1", 1, 3), absl::StatusCode::kInvalidArgument,
                {"group g has world_size 4", "w1", "joins with world_size 3"});
}

TEST(MembershipStaticTest, RefusesStaticJoinToDynamicGroup) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("d0", std::nullopt));
  ExpectRefused(&record, Spec("w1", 1, 2), absl::StatusCode::kFailedPrecondition,
                {"RPC group mixes statically and dynamically initialized members",
                 "group g is dynamic", "w1", "joins it as static"});
}

TEST(MembershipStaticTest, RefusesDynamicJoinToStaticGroup) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("w0", 0, 2));
  ExpectRefused(&record, Spec("d1", std::nullopt), absl::StatusCode::kFailedPrecondition,
                {"RPC group mixes statically and dynamically initialized members",
                 "group g is static", "d1", "joins it as dynamic"});
  ExpectRefused(&record, Spec("d1", 1), absl::StatusCode::kFailedPrecondition,
                {"group g is static", "d1", "joins it as dynamic"});
}

TEST(MembershipStaticTest, RefusesRankOutOfRange) {
  v1::GroupRecord record = NewRecord();
  ExpectRefused(&record, Spec("w2", 2, 2), absl::StatusCode::kInvalidArgument,
                {"rank 2 of worker w2 is out of range [0, 2)"});
  Join(&record, Spec("w0", 0, 2));
  ExpectRefused(&record, Spec("w5", 5, 2), absl::StatusCode::kInvalidArgument,
                {"rank 5 of worker w5 is out of range [0, 2)"});
  ExpectRefused(&record, Spec("wm", -1, 2), absl::StatusCode::kInvalidArgument,
                {"rank -1 of worker wm is out of range [0, 2)"});
}

TEST(MembershipStaticTest, RefusesTakenRankNamingItsHolderAndNode) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("w0", 0, 3, "node-a"));
  Join(&record, Spec("w1", 1, 3, "node-b"));
  ExpectRefused(&record, Spec("late", 1, 3, "node-c"), absl::StatusCode::kInvalidArgument,
                {"rank 1 of group g is already taken by w1 on node node-b"});
}

TEST(MembershipStaticTest, RefusesTakenName) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("w0", 0, 3, "node-a"));
  ExpectRefused(&record, Spec("w0", 1, 3, "node-b"), absl::StatusCode::kAlreadyExists,
                {"RPC worker name w0 is not unique. Workers 0 and 1 share the same name (group g, "
                 "rank 0 on node node-a)"});
}

TEST(MembershipStaticTest, RefusesStaticJoinWithoutRank) {
  v1::GroupRecord record = NewRecord();
  ExpectRefused(&record, Spec("w0", std::nullopt, 2), absl::StatusCode::kInvalidArgument,
                {"worker w0 joins static group g without a rank"});
  Join(&record, Spec("w1", 1, 2));
  ExpectRefused(&record, Spec("w0", std::nullopt, 2), absl::StatusCode::kInvalidArgument,
                {"without a rank"});
}

TEST(MembershipStaticTest, RefusesJoinToFormedGroupWithFailedPrecondition) {
  v1::GroupRecord record = FormedGroup(2);
  ExpectRefused(&record, Spec("w2", 1, 2), absl::StatusCode::kFailedPrecondition,
                {"static group g is already formed with all 2 ranks"});
}

TEST(MembershipStaticTest, RefusesJoinToBrokenGroupWhileMembersRemain) {
  v1::GroupRecord record = FormedGroup(3);
  ASSERT_EQ(RemoveMembers(&record, Named({"w1"}), "LEFT", "its session closed"), 1);
  ASSERT_EQ(record.view().phase(), kBroken);
  // Even the lost rank cannot be taken again: the group must empty first.
  ExpectRefused(&record, Spec("w1", 1, 3, "node-1"), absl::StatusCode::kFailedPrecondition,
                {"group g is BROKEN", "w1 left: its session closed", "remaining members"});
}

TEST(MembershipStaticTest, RefusesJoinToFailedGroupWhileMembersRemain) {
  v1::GroupRecord record = NewRecord();
  Join(&record, WithMap(Spec("w0", 0, 2), "ghost", {{"cuda:0", "cuda:0"}}));
  Join(&record, Spec("w1", 1, 2));
  ASSERT_EQ(record.view().phase(), kFailed);
  ASSERT_EQ(RemoveMembers(&record, Named({"w1"}), "LEFT", "gave up"), 1);
  EXPECT_EQ(record.view().phase(), kFailed);
  ExpectRefused(&record, Spec("w1", 1, 2), absl::StatusCode::kFailedPrecondition,
                {"group g is FAILED", "once its remaining members have left"});
}

TEST(MembershipStaticTest, RefusesNonPositiveWorldSize) {
  v1::GroupRecord record = NewRecord();
  ExpectRefused(&record, Spec("w0", 0, 0), absl::StatusCode::kInvalidArgument,
                {"world_size must be positive, got 0"});
  ExpectRefused(&record, Spec("w0", 0, -2), absl::StatusCode::kInvalidArgument,
                {"world_size must be positive, got -2"});
}

TEST(MembershipStaticTest, InvalidOwnOptionsFailTheGroupSoEveryRankLearnsWhy) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("w1", 1, 2));
  JoinSpec bad = Spec("w0", 0, 2);
  bad.options.add_transports("tcp");
  // Recorded, so w1 (waiting for the group) is answered with the same reason at once.
  absl::StatusOr<int64_t> rank = AddMember(&record, bad);
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(record.view().phase(), kFailed);
  EXPECT_THAT(record.view().reason(), HasSubstr("Node w0"));
  EXPECT_THAT(record.view().reason(), HasSubstr("Unknown transport: tcp"));
  EXPECT_EQ(record.change(), "FAILED");
  // Later ranks are told the group failed, and why.
  ExpectRefused(&record, Spec("w2", 2, 2), absl::StatusCode::kFailedPrecondition,
                {"FAILED", "Unknown transport: tcp"});
}

TEST(MembershipStaticTest, EveryRankLearnsTheFirstInvalidRankInRankOrderWhateverTheJoinOrder) {
  v1::GroupRecord record = NewRecord();
  JoinSpec bad2 = Spec("w2", 2, 3);
  bad2.options.add_transports("carrier-pigeon");
  JoinSpec bad1 = Spec("w1", 1, 3);
  bad1.options.add_devices("cuda:7");  // the node has two: a check of the gathered options
  // Ranks 2 and then 1 bring invalid options while rank 0 has not joined: rank 0 might be
  // invalid too, and PyTorch would name it first, so the group keeps forming.
  ASSERT_TRUE(AddMember(&record, bad2).ok());
  EXPECT_EQ(record.view().phase(), kForming);
  ASSERT_TRUE(AddMember(&record, bad1).ok());
  EXPECT_EQ(record.view().phase(), kForming);
  // Rank 0 is valid: rank 1, the first invalid rank, is the reason, not rank 2 who came first.
  Join(&record, Spec("w0", 0, 3));
  EXPECT_EQ(record.view().phase(), kFailed);
  EXPECT_THAT(record.view().reason(), HasSubstr("Node w1 has devices with invalid indices"));
  EXPECT_THAT(record.view().reason(), Not(HasSubstr("carrier-pigeon")));
}

TEST(MembershipStaticTest, OptionsTorchRefusesAsTheyAreSetAreRefusedAtTheJoinAndFailTheGroup) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("w1", 1, 3));
  // An unparsable device: the rank's own error, at once, and the group fails naming it, so w1
  // (waiting) and rank 2 (not there yet) do not wait for a group that cannot form.
  bool failed = false;
  absl::StatusOr<int64_t> rank =
      AddMember(&record, WithMap(Spec("w0", 0, 3, "node-a"), "w1", {{"gpu0", "cuda:0"}}), &failed);
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rank.status().message(), HasSubstr("worker w0 on node node-a: device map toward w1"));
  EXPECT_THAT(rank.status().message(), HasSubstr("Invalid device string"));
  EXPECT_TRUE(failed);
  EXPECT_EQ(record.view().phase(), kFailed);
  EXPECT_EQ(record.failure_code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_THAT(record.view().reason(), HasSubstr("rank 0 (w0) was refused at its join: "));
  EXPECT_THAT(record.view().reason(), HasSubstr("Invalid device string"));
  EXPECT_EQ(FindMember(record, "w0"), nullptr);
  // A CPU device among the devices: the same (set_devices refuses it in PyTorch).
  v1::GroupRecord other = NewRecord();
  JoinSpec cpu = Spec("w0", 0, 2);
  cpu.options.add_devices("cpu");
  rank = AddMember(&other, cpu, &failed);
  EXPECT_THAT(rank.status().message(), HasSubstr("expect a list of CUDA devices"));
  EXPECT_TRUE(failed);
  EXPECT_EQ(other.view().phase(), kFailed);
  // Without `failed` the join is refused and nothing changes.
  v1::GroupRecord untouched = NewRecord();
  EXPECT_FALSE(AddMember(&untouched, cpu).ok());
  EXPECT_EQ(untouched.view().phase(), kEmpty);
}

TEST(MembershipStaticTest, ARankThatAbandonsFailsTheGroupNamingItselfAndWhy) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("w0", 0, 3));
  JoinSpec abandon = Spec("w2", 2, 3);
  abandon.abandon = "data.sessions_kept_free (32): uid 0 has 96 sessions attached";
  bool failed = false;
  absl::StatusOr<int64_t> rank = AddMember(&record, abandon, &failed);
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(failed);
  EXPECT_EQ(record.view().phase(), kFailed);
  EXPECT_EQ(record.view().reason(),
            "rank 2 (w2) cannot take part: data.sessions_kept_free (32): uid 0 has 96 "
            "sessions attached");
  EXPECT_EQ(record.failure_code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_EQ(FindMember(record, "w2"), nullptr);
  EXPECT_EQ(record.view().version(), 2);
  // A dynamic group has nobody waiting: nothing to abandon.
  v1::GroupRecord dynamic = NewRecord();
  JoinSpec dynamic_abandon = Spec("d0", std::nullopt);
  dynamic_abandon.abandon = "no";
  EXPECT_EQ(AddMember(&dynamic, dynamic_abandon, &failed).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(failed);
}

TEST(MembershipStaticTest, AnyRankRefusedWhileTheGroupFormsFailsIt) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("w0", 0, 3));
  bool failed = false;
  absl::StatusOr<int64_t> rank = AddMember(&record, Spec("w1", 1, 4), &failed);
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(failed);
  EXPECT_EQ(record.view().phase(), kFailed);
  EXPECT_THAT(record.view().reason(),
              HasSubstr("rank 1 (w1) was refused at its join: group g has world_size 3"));
  // Refusals of a group already failed change nothing more.
  const int64_t version = record.view().version();
  EXPECT_FALSE(AddMember(&record, Spec("w2", 2, 3), &failed).ok());
  EXPECT_FALSE(failed);
  EXPECT_EQ(record.view().version(), version);
}

TEST(MembershipStaticTest, AFailureOutlivesItsMembersForLateRanksThenTheNameIsFree) {
  v1::GroupRecord record = NewRecord();
  JoinSpec first = Spec("w0", 0, 3);
  first.secret_verifier = SecretVerifier("g", "s3cret");
  Join(&record, first);
  JoinSpec abandon = Spec("w1", 1, 3);
  abandon.secret_verifier = first.secret_verifier;
  abandon.abandon = "no shared memory";
  bool failed = false;
  ASSERT_FALSE(AddMember(&record, abandon, &failed).ok());
  ASSERT_TRUE(failed);
  ASSERT_EQ(RemoveMembers(&record, Named({"w0"}), "LEFT", "the group failed to form"), 1);
  EXPECT_EQ(record.view().phase(), kFailed);
  EXPECT_TRUE(record.view().is_static());
  EXPECT_TRUE(ValidateGroupRecord(record, "g", record.view().version(), "k").ok());
  // A rank that starts late, with the secret: told why at once.
  JoinSpec late = Spec("w2", 2, 3);
  late.secret_verifier = first.secret_verifier;
  late.since_unix_ms = first.since_unix_ms + 5000;
  ExpectRefused(&record, late, absl::StatusCode::kFailedPrecondition,
                {"group g failed to form 5 s ago: rank 1 (w1) cannot take part: no shared "
                 "memory"});
  // Without the secret: refused, and not told why.
  JoinSpec stranger = Spec("x0", 0, 1);
  stranger.since_unix_ms = late.since_unix_ms;
  ExpectRefused(&record, stranger, absl::StatusCode::kPermissionDenied, {"secret"});
  // Once the failure is old, the name is free: anyone starts it afresh.
  stranger.since_unix_ms = first.since_unix_ms + kFailureLingerMs + 1;
  Join(&record, stranger);
  EXPECT_EQ(record.view().phase(), kFormed);
  EXPECT_EQ(record.failed_unix_ms(), 0);
  EXPECT_EQ(record.view().reason(), "");
}

// --- Records read from a store: validated before use ----------------------------------------

void ExpectInvalidRecord(const v1::GroupRecord& record, const std::string& problem) {
  absl::Status status =
      ValidateGroupRecord(record, "g", record.view().version(), "tpd/group/g/v/1");
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("tpd/group/g/v/1"));
  EXPECT_THAT(status.message(), HasSubstr(problem));
}

TEST(MembershipRecordTest, AcceptsRecordsTheTransitionsWrite) {
  v1::GroupRecord record = FormedGroup(3);
  EXPECT_TRUE(ValidateGroupRecord(record, "g", record.view().version(), "k").ok());
  v1::GroupRecord dynamic = NewRecord();
  Join(&dynamic, Spec("d0", std::nullopt));
  EXPECT_TRUE(ValidateGroupRecord(dynamic, "g", dynamic.view().version(), "k").ok());
}

TEST(MembershipRecordTest, RefusesAMemberWithoutOptions) {
  // This record aborted every daemon following the group (options().at() on a missing key).
  v1::GroupRecord record = FormedGroup(2);
  record.mutable_options()->erase("w1");
  ExpectInvalidRecord(record, "no options for member w1");
  // And renegotiating such a record (a dynamic group's, after a removal) does not crash.
  v1::GroupRecord dynamic = NewRecord();
  Join(&dynamic, Spec("d0", std::nullopt));
  Join(&dynamic, Spec("d1", std::nullopt));
  dynamic.mutable_options()->erase("d1");
  EXPECT_EQ(RemoveMembers(
                &dynamic, [](const v1::Member& m) { return m.name() == "d0"; }, "LEFT", "test"),
            1);
  EXPECT_THAT(dynamic.view().negotiated(), IsEmpty());
}

TEST(MembershipRecordTest, RefusesStructuralLies) {
  v1::GroupRecord base = FormedGroup(2);
  {
    v1::GroupRecord record = base;
    record.mutable_view()->set_group("other");
    ExpectInvalidRecord(record, "names another group");
  }
  {
    v1::GroupRecord record = base;
    record.mutable_view()->mutable_members(1)->set_rank(0);
    ExpectInvalidRecord(record, "rank held twice");
  }
  {
    v1::GroupRecord record = base;
    record.mutable_view()->mutable_members(1)->set_name("w0");
    ExpectInvalidRecord(record, "worker name held twice");
  }
  {
    v1::GroupRecord record = base;
    record.mutable_view()->mutable_members(1)->set_rank(7);
    ExpectInvalidRecord(record, "rank 7 out of range");
  }
  {
    v1::GroupRecord record = base;
    record.mutable_view()->set_world_size(int64_t{1} << 40);
    ExpectInvalidRecord(record, "world_size");
  }
  {
    v1::GroupRecord record = base;
    record.mutable_view()->set_phase("BOGUS");
    ExpectInvalidRecord(record, "unknown phase");
  }
  {
    v1::GroupRecord record = base;
    (*record.mutable_options())["ghost"];
    ExpectInvalidRecord(record, "not members");
  }
  {
    v1::GroupRecord record = base;
    record.mutable_view()->mutable_members(0)->set_node("");
    ExpectInvalidRecord(record, "empty or oversized");
  }
  absl::Status version = ValidateGroupRecord(base, "g", base.view().version() + 1, "k");
  EXPECT_EQ(version.code(), absl::StatusCode::kDataLoss);
}

// --- Static groups: negotiation failing on completion ---------------------------------------

TEST(MembershipStaticTest, NegotiationFailureOnCompletionRecordsAFailedGroup) {
  v1::GroupRecord record = NewRecord();
  Join(&record, WithMap(Spec("w0", 0, 2, "node-a"), "w9", {{"cuda:0", "cuda:1"}}));
  ASSERT_EQ(record.view().phase(), kForming);  // w9 is not checked until the world is complete
  absl::StatusOr<int64_t> rank = AddMember(&record, Spec("w1", 1, 2, "node-b"));
  // The join is recorded; the caller reports the failure from the record.
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, 1);
  const v1::GroupView& view = record.view();
  EXPECT_EQ(view.phase(), kFailed);
  EXPECT_THAT(view.reason(), HasSubstr("Node w0 has invalid target node names"));
  EXPECT_THAT(view.reason(), HasSubstr("unknown names = [w9]"));
  EXPECT_EQ(record.change(), "FAILED");
  EXPECT_EQ(record.change_detail(), view.reason());
  EXPECT_EQ(view.version(), 2);
  EXPECT_THAT(Names(view), ElementsAre("w0", "w1"));
  EXPECT_EQ(record.options().count("w1"), 1u);
  EXPECT_THAT(view.negotiated(), IsEmpty());
  EXPECT_THAT(view.transports(), IsEmpty());
  EXPECT_THAT(view.channels(), IsEmpty());
}

// --- Dynamic groups --------------------------------------------------------------------------

TEST(MembershipDynamicTest, FirstJoinerMakesTheGroupDynamicAndNegotiated) {
  v1::GroupRecord record = NewRecord();
  absl::StatusOr<int64_t> rank = AddMember(&record, Spec("d0", std::nullopt));
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, 0);
  const v1::GroupView& view = record.view();
  EXPECT_FALSE(view.is_static());
  EXPECT_EQ(view.world_size(), 0);
  EXPECT_EQ(view.phase(), kDynamic);
  EXPECT_EQ(view.version(), 1);
  EXPECT_EQ(record.change(), "JOINED");
  ASSERT_EQ(view.negotiated_size(), 1);
  EXPECT_EQ(view.negotiated(0).name(), "d0");
  EXPECT_THAT(view.transports(), ElementsAre("shm", "ibv", "uv"));
}

TEST(MembershipDynamicTest, AssignsTheLowestFreeRank) {
  v1::GroupRecord record = NewRecord();
  for (const char* name : {"d0", "d1", "d2"}) Join(&record, Spec(name, std::nullopt));
  EXPECT_THAT(Ranks(record.view()), ElementsAre(0, 1, 2));
  ASSERT_EQ(RemoveMembers(&record, Named({"d1"}), "LEFT", "done"), 1);
  EXPECT_EQ(record.view().phase(), kDynamic);
  absl::StatusOr<int64_t> rank = AddMember(&record, Spec("d3", std::nullopt));
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, 1);
  EXPECT_THAT(Names(record.view()), ElementsAre("d0", "d3", "d2"));
  rank = AddMember(&record, Spec("d4", std::nullopt));
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, 3);
}

TEST(MembershipDynamicTest, HonorsARequestedRank) {
  v1::GroupRecord record = NewRecord();
  absl::StatusOr<int64_t> rank = AddMember(&record, Spec("d5", 5));
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, 5);
  rank = AddMember(&record, Spec("d0", std::nullopt));
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, 0);
  EXPECT_THAT(Ranks(record.view()), ElementsAre(0, 5));
  ExpectRefused(&record, Spec("dx", 5, std::nullopt, "node-z"), absl::StatusCode::kInvalidArgument,
                {"rank 5 of group g is already taken by d5 on node node-a"});
  ExpectRefused(&record, Spec("dn", -1), absl::StatusCode::kInvalidArgument,
                {"rank -1 of worker dn is out of range (must be >= 0)"});
}

TEST(MembershipDynamicTest, AcceptsMapTowardAbsentWorkerAndReversesItWhenItJoins) {
  v1::GroupRecord record = NewRecord();
  Join(&record, WithMap(Spec("d0", std::nullopt), "d1", {{"cuda:0", "cuda:1"}}));
  ASSERT_EQ(record.view().negotiated_size(), 1);
  EXPECT_EQ(Maps(Negotiated(record.view(), "d0").device_maps()),
            (DeviceMaps{{"d1", {{"cuda:0", "cuda:1"}}}}));

  Join(&record, Spec("d1", std::nullopt));
  ASSERT_EQ(record.view().negotiated_size(), 2);
  const v1::NegotiatedMember& d1 = Negotiated(record.view(), "d1");
  EXPECT_EQ(Maps(d1.reverse_device_maps()), (DeviceMaps{{"d0", {{"cuda:1", "cuda:0"}}}}));
  EXPECT_THAT(d1.devices(), ElementsAre("cuda:1"));
}

TEST(MembershipDynamicTest, RefusesNewcomerMapWithInvalidTargetIndexTowardAPresentMember) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("d0", std::nullopt));
  ExpectRefused(&record, WithMap(Spec("d1", std::nullopt), "d0", {{"cuda:0", "cuda:5"}}),
                absl::StatusCode::kInvalidArgument,
                {"Node d1 has target devices with invalid indices in its device map for d0"});
}

TEST(MembershipDynamicTest, RefusesNewcomerThatAnEarlierMembersMapDoesNotFit) {
  v1::GroupRecord record = NewRecord();
  Join(&record, WithMap(Spec("d0", std::nullopt), "d1", {{"cuda:0", "cuda:1"}}));
  JoinSpec d1 = Spec("d1", std::nullopt);
  d1.device_count = 1;  // d0 maps onto its cuda:1
  ExpectRefused(&record, d1, absl::StatusCode::kInvalidArgument,
                {"Node d0 has target devices with invalid indices in its device map for d1"});
}

TEST(MembershipDynamicTest, RefusesInvalidOwnOptions) {
  v1::GroupRecord record = NewRecord();
  JoinSpec bad = Spec("d0", std::nullopt);
  bad.options.add_transports("tcp");
  ExpectRefused(&record, bad, absl::StatusCode::kInvalidArgument,
                {"Node d0", "Unknown transport: tcp"});
}

TEST(MembershipDynamicTest, RefusesNewcomerWhoseNodeLeavesItNoCpuChannel) {
  v1::GroupRecord record = NewRecord();
  JoinSpec d0 =
      OnNode(Spec("d0", std::nullopt, std::nullopt, "n1"), {"shm", "uv"}, {"cma", "cuda_ipc"});
  d0.options.add_channels("cuda_ipc");
  d0.options.add_channels("basic");
  ExpectRefused(&record, d0, absl::StatusCode::kInvalidArgument,
                {"Node d0 asks for channels [cuda_ipc, basic] but its node n1 registered only "
                 "[cma, cuda_ipc]: no CPU channel in common"});
}

TEST(MembershipDynamicTest, NewcomerFromACpuOnlyNodeNarrowsTheGroupsChannels) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("d0", std::nullopt));  // node lists unknown: PyTorch's defaults
  EXPECT_THAT(record.view().transports(), ElementsAre("shm", "ibv", "uv"));
  EXPECT_THAT(record.view().channels(), ElementsAre("cma", "mpt_uv", "basic", "cuda_xth",
                                                    "cuda_ipc", "cuda_gdr", "cuda_basic"));
  Join(&record, OnNode(Spec("d1", std::nullopt, std::nullopt, "cpu-node"), {"shm", "uv"},
                       {"cma", "mpt_uv", "basic"}));
  EXPECT_THAT(record.view().transports(), ElementsAre("shm", "uv"));
  EXPECT_THAT(record.view().channels(), ElementsAre("cma", "mpt_uv", "basic"));
}

TEST(MembershipDynamicTest, LeavingRenegotiatesTheRest) {
  v1::GroupRecord record = NewRecord();
  Join(&record, WithMap(Spec("d0", std::nullopt), "d1", {{"cuda:0", "cuda:1"}}));
  JoinSpec d1 = Spec("d1", std::nullopt);
  d1.options.add_transports("uv");
  Join(&record, d1);
  EXPECT_THAT(record.view().transports(), ElementsAre("uv"));
  ASSERT_EQ(RemoveMembers(&record, Named({"d1"}), "LEFT", "done"), 1);
  EXPECT_EQ(record.view().phase(), kDynamic);
  EXPECT_EQ(record.change(), "LEFT");
  EXPECT_EQ(record.options().count("d1"), 0u);
  ASSERT_EQ(record.view().negotiated_size(), 1);
  EXPECT_EQ(record.view().negotiated(0).name(), "d0");
  EXPECT_THAT(record.view().transports(), ElementsAre("shm", "ibv", "uv"));
}

// --- RemoveMembers ---------------------------------------------------------------------------

TEST(RemoveMembersTest, RemovingFromAFormedGroupBreaksIt) {
  v1::GroupRecord record = FormedGroup(3);
  const int64_t version = record.view().version();
  EXPECT_EQ(RemoveMembers(&record, Named({"w1"}), "LEFT", "its session closed"), 1);
  const v1::GroupView& view = record.view();
  EXPECT_EQ(view.phase(), kBroken);
  EXPECT_EQ(view.reason(), "w1 left: its session closed");
  EXPECT_EQ(record.change(), "BROKEN");
  EXPECT_EQ(record.change_detail(), "w1: its session closed");
  EXPECT_EQ(view.version(), version + 1);
  EXPECT_THAT(Names(view), ElementsAre("w0", "w2"));
  EXPECT_EQ(FindMember(record, "w1"), nullptr);
  EXPECT_EQ(record.options().count("w1"), 0u);
  EXPECT_TRUE(view.is_static());
  EXPECT_EQ(view.world_size(), 3);
}

TEST(RemoveMembersTest, EvictionIsWordedEvictedInTheReason) {
  v1::GroupRecord record = FormedGroup(3);
  EXPECT_EQ(RemoveMembers(&record, Named({"w2"}), "EVICTED", "node node-2 missed heartbeats"), 1);
  EXPECT_EQ(record.view().phase(), kBroken);
  EXPECT_EQ(record.view().reason(), "w2 evicted: node node-2 missed heartbeats");
  EXPECT_EQ(record.change(), "BROKEN");
}

TEST(RemoveMembersTest, ChangeDetailNamesEveryRemovedMemberInRankOrder) {
  v1::GroupRecord record = NewRecord();
  for (const char* name : {"d0", "d1", "d2", "d3"}) Join(&record, Spec(name, std::nullopt));
  EXPECT_EQ(RemoveMembers(&record, Named({"d3", "d0", "d2"}), "EVICTED", "node-a restarted"), 3);
  EXPECT_EQ(record.change(), "EVICTED");
  EXPECT_EQ(record.change_detail(), "d0, d2, d3: node-a restarted");
  EXPECT_THAT(Names(record.view()), ElementsAre("d1"));

  v1::GroupRecord formed = FormedGroup(4);
  EXPECT_EQ(RemoveMembers(&formed, Named({"w3", "w1"}), "LEFT", "job ended"), 2);
  EXPECT_EQ(formed.change_detail(), "w1, w3: job ended");
  EXPECT_EQ(formed.view().reason(), "w1, w3 left: job ended");
}

TEST(RemoveMembersTest, RemovingNothingChangesNothing) {
  v1::GroupRecord record = FormedGroup(2);
  const std::string before = record.SerializeAsString();
  EXPECT_EQ(RemoveMembers(&record, Named({"nobody"}), "LEFT", "why"), 0);
  EXPECT_EQ(record.SerializeAsString(), before);
  EXPECT_EQ(record.view().version(), 2);
  EXPECT_EQ(record.view().phase(), kFormed);
}

TEST(RemoveMembersTest, RemovingFromAFormingGroupKeepsItForming) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("w0", 0, 3));
  Join(&record, Spec("w2", 2, 3));
  EXPECT_EQ(RemoveMembers(&record, Named({"w0"}), "LEFT", "restarting"), 1);
  EXPECT_EQ(record.view().phase(), kForming);
  EXPECT_EQ(record.view().reason(), "");
  EXPECT_EQ(record.change(), "LEFT");
  // The rank is free again.
  Join(&record, Spec("w0b", 0, 3));
  Join(&record, Spec("w1", 1, 3));
  EXPECT_EQ(record.view().phase(), kFormed);
}

TEST(RemoveMembersTest, RemovingEveryMemberEmptiesTheGroupForANewStart) {
  v1::GroupRecord record = FormedGroup(2);
  ASSERT_EQ(RemoveMembers(&record, Named({"w1"}), "LEFT", "done"), 1);
  ASSERT_EQ(record.view().phase(), kBroken);
  EXPECT_EQ(RemoveMembers(&record, Named({"w0"}), "LEFT", "done"), 1);
  const v1::GroupView& view = record.view();
  EXPECT_EQ(view.phase(), kEmpty);
  EXPECT_EQ(view.reason(), "");
  EXPECT_FALSE(view.is_static());
  EXPECT_EQ(view.world_size(), 0);
  EXPECT_THAT(view.members(), IsEmpty());
  EXPECT_THAT(view.negotiated(), IsEmpty());
  EXPECT_THAT(view.transports(), IsEmpty());
  EXPECT_THAT(view.channels(), IsEmpty());
  EXPECT_THAT(record.options(), IsEmpty());
  EXPECT_EQ(view.version(), 4);

  // Formed anew, static with another world size; versions keep growing.
  Join(&record, Spec("x0", 0, 3, "node-x"));
  EXPECT_TRUE(record.view().is_static());
  EXPECT_EQ(record.view().world_size(), 3);
  EXPECT_EQ(record.view().phase(), kForming);
  EXPECT_EQ(record.view().version(), 5);
  Join(&record, Spec("x1", 1, 3, "node-x"));
  Join(&record, Spec("x2", 2, 3, "node-x"));
  EXPECT_EQ(record.view().phase(), kFormed);
  EXPECT_EQ(record.view().negotiated_size(), 3);
}

TEST(RemoveMembersTest, RemovingEveryMemberClearsTheNegotiatedOptions) {
  v1::GroupRecord record = NewRecord();
  JoinSpec d0 = Spec("d0", std::nullopt);
  d0.options.set_num_worker_threads(64);
  d0.options.set_rpc_timeout_ms(5000);
  Join(&record, d0);
  ASSERT_EQ(record.view().num_worker_threads(), 64);
  ASSERT_EQ(record.view().rpc_timeout_ms(), 5000);
  ASSERT_EQ(RemoveMembers(&record, Named({"d0"}), "LEFT", "done"), 1);
  EXPECT_EQ(record.view().phase(), kEmpty);
  EXPECT_EQ(record.view().num_worker_threads(), 0);
  EXPECT_EQ(record.view().rpc_timeout_ms(), 0);
  // A static group forming anew shows nothing negotiated until it forms.
  Join(&record, Spec("w0", 0, 2));
  EXPECT_EQ(record.view().num_worker_threads(), 0);
  EXPECT_EQ(record.view().rpc_timeout_ms(), 0);
}

TEST(RemoveMembersTest, RemovingEveryMemberOfADynamicGroupAllowsAStaticOne) {
  v1::GroupRecord record = NewRecord();
  Join(&record, Spec("d0", std::nullopt));
  Join(&record, Spec("d1", std::nullopt));
  EXPECT_EQ(RemoveMembers(
                &record, [](const v1::Member&) { return true; }, "EVICTED", "node-a restarted"),
            2);
  EXPECT_EQ(record.view().phase(), kEmpty);
  Join(&record, Spec("w0", 0, 1));
  EXPECT_EQ(record.view().phase(), kFormed);
  EXPECT_TRUE(record.view().is_static());
}

// --- FindMember ------------------------------------------------------------------------------

TEST(FindMemberTest, FindsByNameOrReturnsNull) {
  v1::GroupRecord record = FormedGroup(2);
  const v1::Member* w1 = FindMember(record, "w1");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->rank(), 1);
  EXPECT_EQ(w1->node(), "node-1");
  EXPECT_EQ(FindMember(record, "w9"), nullptr);
  EXPECT_EQ(FindMember(NewRecord(), "w0"), nullptr);
}

}  // namespace
}  // namespace tpd::group

namespace tpd::group {
namespace {

// `spec` from user `uid`, bringing `secret`.
JoinSpec From(JoinSpec spec, int64_t uid, const std::string& secret = "") {
  spec.uid = uid;
  spec.secret_verifier = SecretVerifier("g", secret);
  return spec;
}

TEST(MembershipAdmissionTest, TheFirstMemberSetsTheSecretAndLaterJoinsMustBringIt) {
  v1::GroupRecord record = NewRecord();
  ASSERT_TRUE(AddMember(&record, From(Spec("a", std::nullopt), 0, "k1")).ok());
  EXPECT_EQ(record.secret_verifier().size(), 32u);
  EXPECT_EQ(record.secret_verifier().find("k1"), std::string::npos);  // a MAC, not the secret

  absl::StatusOr<int64_t> none = AddMember(&record, From(Spec("b", std::nullopt), 0));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(none.status().message(), HasSubstr("brought none"));
  absl::StatusOr<int64_t> wrong = AddMember(&record, From(Spec("b", std::nullopt), 0, "k2"));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(wrong.status().message(), HasSubstr("brought another one"));
  EXPECT_EQ(record.view().members_size(), 1);  // refusals change nothing
  EXPECT_TRUE(AddMember(&record, From(Spec("b", std::nullopt), 0, "k1")).ok());
}

TEST(MembershipAdmissionTest, AGroupWithoutASecretRefusesJoinsThatBringOne) {
  v1::GroupRecord record = NewRecord();
  ASSERT_TRUE(AddMember(&record, From(Spec("a", std::nullopt), 0)).ok());
  absl::StatusOr<int64_t> brought = AddMember(&record, From(Spec("b", std::nullopt), 0, "k"));
  EXPECT_EQ(brought.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(brought.status().message(), HasSubstr("started without a secret"));
}

TEST(MembershipAdmissionTest, EachNodeAdmitsOnlyItsOwnersUid) {
  v1::GroupRecord record = NewRecord();
  ASSERT_TRUE(AddMember(&record, From(Spec("a", std::nullopt), 1000)).ok());
  absl::StatusOr<int64_t> other = AddMember(&record, From(Spec("x", std::nullopt), 1001));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.status().message(),
              HasSubstr("belongs to uid 1000 on node node-a: uid 1001 may not join it there"));
  // On another node, the first member's uid owns it there: uids of two nodes are unrelated.
  ASSERT_TRUE(AddMember(&record, From(Spec("b", std::nullopt, std::nullopt, "node-b"), 1001)).ok());
  EXPECT_EQ(record.node_owner_uids().at("node-a"), 1000);
  EXPECT_EQ(record.node_owner_uids().at("node-b"), 1001);
  // A departed member's name stays its owner's while the group lives.
  ASSERT_EQ(RemoveMembers(&record, Named({"a"}), "LEFT", "bye"), 1);
  absl::StatusOr<int64_t> taken = AddMember(&record, From(Spec("a", std::nullopt), 1001));
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(AddMember(&record, From(Spec("a", std::nullopt), 1000)).ok());
}

TEST(MembershipAdmissionTest, AnEmptiedGroupIsStartedAfreshByItsNextFirstMember) {
  v1::GroupRecord record = NewRecord();
  ASSERT_TRUE(AddMember(&record, From(Spec("a", std::nullopt), 1000, "k1")).ok());
  ASSERT_EQ(RemoveMembers(&record, Named({"a"}), "LEFT", "bye"), 1);
  EXPECT_TRUE(record.secret_verifier().empty());
  EXPECT_TRUE(record.node_owner_uids().empty());
  ASSERT_TRUE(AddMember(&record, From(Spec("z", std::nullopt), 1001)).ok());
  EXPECT_EQ(record.node_owner_uids().at("node-a"), 1001);
}

TEST(MembershipAdmissionTest, ARecordWithAMalformedVerifierIsDataLoss) {
  v1::GroupRecord record = NewRecord();
  ASSERT_TRUE(AddMember(&record, From(Spec("a", std::nullopt), 0, "k1")).ok());
  record.mutable_view()->set_version(1);
  record.set_secret_verifier("short");
  absl::Status status = ValidateGroupRecord(record, "g", 1, "tpd/group/g/v/1");
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("secret verifier of 5 bytes"));
}

}  // namespace
}  // namespace tpd::group
