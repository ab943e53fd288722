#include "shm/message.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/layout.h"

namespace tpd::shm {
namespace {

using ::testing::ElementsAre;

TEST(MessageTest, NamesRoundTripThroughThePrefix) {
  const MessageNames names = {"group", "worker", "method", "caller"};
  std::vector<uint8_t> block(MessagePrefixBytes(names) + 3);
  EXPECT_EQ(MessagePrefixBytes(names), sizeof(MessageHeader) + 5 + 6 + 6 + 6);
  WriteMessagePrefix(block.data(), 5, names);
  std::memcpy(block.data() + MessagePrefixBytes(names), "abc", 3);
  absl::StatusOr<ParsedMessage> parsed = ParseMessage(block.data(), 0, block.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->code, 5u);
  EXPECT_EQ(parsed->names, names);
  EXPECT_EQ(parsed->body_offset, MessagePrefixBytes(names));
  EXPECT_EQ(parsed->body_length, 3u);
}

TEST(MessageTest, APlanAlignsTheTableAndEachTensorSlot) {
  const BlockPlan plan = PlanBlock(/*prefix_bytes=*/30, /*body_bytes=*/5, {100, 0, 64});
  EXPECT_EQ(plan.prefix, 30u);
  EXPECT_EQ(plan.payload, 35u);
  EXPECT_EQ(plan.table, 64u);
  const uint64_t after_table = 64 + AlignUp(3 * kTensorEntryBytes);
  // A slot of no bytes takes no room: the next tensor starts where it does.
  EXPECT_THAT(plan.at, ElementsAre(after_table, after_table + 128, after_table + 128));
  EXPECT_EQ(plan.total, after_table + 128 + 64);
  for (uint64_t at : plan.at) EXPECT_EQ(at % 64, 0u);
}

TEST(MessageTest, APlanWithoutTensorsIsThePayloadAligned) {
  const BlockPlan plan = PlanBlock(24, 0, {});
  EXPECT_EQ(plan.payload, 24u);
  EXPECT_EQ(plan.table, 64u);
  EXPECT_EQ(plan.total, 64u);
  EXPECT_TRUE(plan.at.empty());
}

}  // namespace
}  // namespace tpd::shm
