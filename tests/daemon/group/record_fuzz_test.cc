// A bounded random driver over the group record decoder: records that any writer of a
// rendezvous store could leave (valid ones, mutated bytes, truncations, random bytes) are read
// through GroupLog, and whatever it accepts is fed to the membership transitions. Nothing may
// crash, hang or allocate without bound; every refusal is DATA_LOSS naming the key. (libFuzzer
// would explore more, but a fixed-seed driver runs in every CI build in a bounded time.)

#include <cstdint>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/group/group_log.h"
#include "daemon/group/membership.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/group_record.pb.h"
#include "store/memory/memory_store.h"

namespace tpd::group {
namespace {

using ::testing::HasSubstr;

JoinSpec Spec(const std::string& name, std::optional<int64_t> rank,
              std::optional<int64_t> world_size) {
  JoinSpec spec;
  spec.name = name;
  spec.rank = rank;
  spec.world_size = world_size;
  spec.node = "node-a";
  spec.incarnation = 3;
  spec.device_count = 2;
  (*(*spec.options.mutable_device_maps())["w1"].mutable_devices())["cuda:0"] = "cuda:1";
  spec.options.add_devices("cuda:0");
  spec.options.add_transports("uv");
  return spec;
}

// Valid records of group "g" in several shapes: seeds for the mutations.
std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  for (bool is_static : {true, false}) {
    v1::GroupRecord record;
    record.mutable_view()->set_group("g");
    record.mutable_view()->set_phase(kEmpty);
    for (int i = 0; i < 3; ++i) {
      const std::optional<int64_t> world = is_static ? std::optional<int64_t>(3) : std::nullopt;
      if (AddMember(&record, Spec(absl::StrCat("w", i), i, world)).ok()) {
        seeds.push_back(record.SerializeAsString());
      }
    }
  }
  return seeds;
}

std::string Mutate(std::string bytes, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 5) {
      case 0:  // flip a byte
        if (!bytes.empty()) bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
        break;
      case 1:  // truncate
        if (!bytes.empty()) bytes.resize(rng() % bytes.size());
        break;
      case 2:  // insert random bytes
        bytes.insert(bytes.empty() ? 0 : rng() % bytes.size(),
                     std::string(1 + rng() % 8, static_cast<char>(rng())));
        break;
      case 3:  // set a varint-looking byte to a large value
        if (!bytes.empty()) bytes[rng() % bytes.size()] = static_cast<char>(0xff);
        break;
      default:  // duplicate a slice (repeated fields, map entries)
        if (bytes.size() > 2) {
          const size_t from = rng() % (bytes.size() - 1);
          const size_t len = 1 + rng() % (bytes.size() - from - 1);
          bytes.append(bytes.substr(from, len));
        }
    }
  }
  return bytes;
}

// Reads version 1 holding `bytes` and, if accepted, exercises the transitions on it.
void Exercise(const std::string& bytes) {
  store::MemoryStore store;
  ASSERT_TRUE(store.Set("v/1", bytes).ok());
  GroupLog log(&store, "g");
  absl::StatusOr<v1::GroupRecord> record = log.Latest();
  if (!record.ok()) {
    ASSERT_EQ(record.status().code(), absl::StatusCode::kDataLoss) << record.status();
    EXPECT_THAT(record.status().message(), HasSubstr("tpd/group/g/v/1"));
    return;
  }
  v1::GroupRecord next = *record;
  (void)AddMember(&next, Spec("newcomer", std::nullopt, std::nullopt));
  next = *record;
  (void)AddMember(&next, Spec("w2", 2, 3));
  next = *record;
  RemoveMembers(
      &next, [](const v1::Member& m) { return m.rank() % 2 == 0; }, "LEFT", "fuzz");
  next = *record;
  RemoveMembers(
      &next, [](const v1::Member&) { return true; }, "EVICTED", "fuzz");
  EXPECT_EQ(next.view().phase(), kEmpty);
}

TEST(RecordFuzzTest, MutatedRecordsAreRefusedOrHandledWithoutCrashing) {
  const std::vector<std::string> seeds = Seeds();
  ASSERT_FALSE(seeds.empty());
  std::mt19937_64 rng(20261126);
  int accepted = 0;
  constexpr int kRounds = 20000;
  for (int round = 0; round < kRounds; ++round) {
    const std::string bytes = Mutate(seeds[rng() % seeds.size()], rng);
    v1::GroupRecord probe;
    Exercise(bytes);
    if (probe.ParseFromString(bytes) && ValidateGroupRecord(probe, "g", 1, "k").ok()) ++accepted;
    if (HasFatalFailure()) return;
  }
  // The driver reaches both sides of the decoder, or it tests little.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, kRounds);
}

TEST(RecordFuzzTest, RandomBytesAreRefused) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 5000; ++round) {
    std::string bytes(rng() % 256, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    Exercise(bytes);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace tpd::group
