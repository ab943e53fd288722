#include "daemon/session_limits.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr uint64_t kSegment = uint64_t{129} << 20;  // two 64 MiB heaps and the rings

TEST(SessionLimitsTest, AGpuNodeServesAJobOf256WorkersOfOneUser) {
  // The GPU machines of docs/BENCHMARKS.md: 128 GiB, 16 cores, systemd's LimitNOFILE.
  std::string how;
  const DataConfig data =
      ResolveSessionLimits(DataConfig{}, kSegment, {128 * kGiB, 16, 65536}, &how);
  EXPECT_EQ(data.max_shared_memory_bytes, 64 * kGiB);
  EXPECT_EQ(data.max_sessions, 64 * kGiB / static_cast<int64_t>(kSegment));
  // One user alone may attach all but the places kept for others: 256 workers and more.
  EXPECT_GE(data.max_sessions - data.sessions_kept_free, 256);
  EXPECT_EQ(data.max_sessions_per_uid, data.max_sessions);
  EXPECT_EQ(data.sessions_kept_free, 32);
  EXPECT_THAT(how, HasSubstr("data.max_sessions 508 (segments of 129 MiB that fit)"));
  EXPECT_THAT(how, HasSubstr("half of 128.0 GiB of memory"));
}

TEST(SessionLimitsTest, CoresAndOpenFilesBoundTheDerivedNumberToo) {
  // Much memory, few cores: a thread per session, at most kSessionsPerCore per core.
  DataConfig data = ResolveSessionLimits(DataConfig{}, kSegment, {1024 * kGiB, 2, 0});
  EXPECT_EQ(data.max_sessions, 2 * kSessionsPerCore);
  // A low open-file limit: what the descriptors allow after those kept for the rest.
  std::string how;
  data = ResolveSessionLimits(DataConfig{}, kSegment, {1024 * kGiB, 64, 4096 + 8 * 40}, &how);
  EXPECT_EQ(data.max_sessions, 424);  // (4416 - 1024 kept) / 8
  // Below 4096, a quarter of the limit is kept for the rest.
  data = ResolveSessionLimits(DataConfig{}, kSegment, {1024 * kGiB, 64, 1024});
  EXPECT_EQ(data.max_sessions, 96);
  EXPECT_THAT(how, HasSubstr("the open-file limit"));
  // Nothing fits: still one session, and places kept for others never exceed half.
  data = ResolveSessionLimits(DataConfig{}, kSegment, {kGiB / 4, 1, 0});
  EXPECT_EQ(data.max_sessions, 1);
  EXPECT_EQ(data.sessions_kept_free, 0);
}

TEST(SessionLimitsTest, WhatTheConfigSetsIsKept) {
  DataConfig set;
  set.max_sessions = 10;
  set.max_shared_memory_bytes = 2 * kGiB;
  set.max_sessions_per_uid = 4;
  set.sessions_kept_free = 3;
  std::string how;
  const DataConfig data = ResolveSessionLimits(set, kSegment, {128 * kGiB, 16, 65536}, &how);
  EXPECT_EQ(data.max_sessions, 10);
  EXPECT_EQ(data.max_shared_memory_bytes, 2 * kGiB);
  EXPECT_EQ(data.max_sessions_per_uid, 4);
  EXPECT_EQ(data.sessions_kept_free, 3);
  EXPECT_EQ(how, "");  // nothing was derived
  // A per-uid cap above the total is the total.
  set.max_sessions_per_uid = 100;
  EXPECT_EQ(ResolveSessionLimits(set, kSegment, {128 * kGiB, 16, 65536}).max_sessions_per_uid, 10);
}

TEST(SessionLimitsTest, ThisMachineYieldsWorkableNumbers) {
  const MachineFacts machine = ReadMachineFacts();
  EXPECT_GT(machine.memory_bytes, 0);
  EXPECT_GE(machine.cores, 1);
  const DataConfig data = ResolveSessionLimits(DataConfig{}, kSegment, machine);
  EXPECT_GE(data.max_sessions, 1);
  EXPECT_LE(data.sessions_kept_free, data.max_sessions / 2);
}

}  // namespace
}  // namespace tpd
