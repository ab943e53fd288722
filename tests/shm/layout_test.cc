// Unit tests of the segment layout: what limits are accepted, where regions land, and that a
// client refuses every header that does not describe the segment it mapped.

#include "shm/layout.h"

#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd::shm {
namespace {

using ::testing::HasSubstr;

SegmentLimits SmallLimits() {
  SegmentLimits limits;
  limits.submission_slots = 8;
  limits.completion_slots = 16;
  limits.tx_heap_bytes = 3 * kPageBytes + 1;  // rounded up to 4 pages
  limits.rx_heap_bytes = 2 * kPageBytes;
  return limits;
}

TEST(LayoutTest, RegionsArePageAlignedInOrderAfterTheHeaderPage) {
  absl::StatusOr<Layout> layout = ComputeLayout(SmallLimits());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->submission.region.offset, kPageBytes);
  EXPECT_EQ(layout->submission.slots, 8u);
  EXPECT_GE(layout->submission.region.bytes, RingRegionBytes(8));
  EXPECT_EQ(layout->completion.region.offset, layout->submission.region.end());
  EXPECT_EQ(layout->completion.slots, 16u);
  EXPECT_EQ(layout->tx_heap.offset, layout->completion.region.end());
  EXPECT_EQ(layout->tx_heap.bytes, 4 * kPageBytes);
  EXPECT_EQ(layout->rx_heap.offset, layout->tx_heap.end());
  EXPECT_EQ(layout->rx_heap.bytes, 2 * kPageBytes);
  EXPECT_EQ(layout->total_bytes, layout->rx_heap.end());
  EXPECT_TRUE(ValidateLayout(*layout).ok());
}

TEST(LayoutTest, BadLimitsAreRefusedNamingTheLimit) {
  struct Case {
    SegmentLimits limits;
    const char* message;
  };
  std::vector<Case> cases;
  SegmentLimits l = SmallLimits();
  l.submission_slots = 12;
  cases.push_back({l, "submission_slots is 12: it must be a power of two"});
  l = SmallLimits();
  l.completion_slots = 1;
  cases.push_back({l, "completion_slots is 1"});
  l = SmallLimits();
  l.completion_slots = kMaxRingSlots * 2;
  cases.push_back({l, "completion_slots is 131072"});
  l = SmallLimits();
  l.tx_heap_bytes = 100;
  cases.push_back({l, "tx_heap_bytes is 100: it must be at least 4096"});
  l = SmallLimits();
  l.rx_heap_bytes = 0;
  cases.push_back({l, "rx_heap_bytes is 0"});
  l = SmallLimits();
  l.rx_heap_bytes = ~uint64_t{0};
  cases.push_back({l, "would exceed 1099511627776 bytes"});
  l = SmallLimits();
  l.tx_heap_bytes = kMaxSegmentBytes;
  cases.push_back({l, "would exceed"});
  for (const Case& c : cases) {
    absl::StatusOr<Layout> layout = ComputeLayout(c.limits);
    EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(layout.status().message(), HasSubstr(c.message));
  }
}

TEST(LayoutTest, RegionContainsIsOverflowSafe) {
  const Region region{4096, 4096};
  EXPECT_TRUE(region.Contains(4096, 4096));
  EXPECT_TRUE(region.Contains(8191, 1));
  EXPECT_TRUE(region.Contains(8192, 0));
  EXPECT_FALSE(region.Contains(8191, 2));
  EXPECT_FALSE(region.Contains(4095, 1));
  EXPECT_FALSE(region.Contains(4097, ~uint64_t{0}));
  EXPECT_FALSE(region.Contains(~uint64_t{0}, 2));
}

class HeaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Layout> layout = ComputeLayout(SmallLimits());
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_ = *layout;
    memory_.assign(layout_.total_bytes, 0);
    WriteHeader(layout_, memory_.data());
  }

  SegmentHeader Header() const {
    SegmentHeader header;
    std::memcpy(&header, memory_.data(), sizeof(header));
    return header;
  }
  void Put(const SegmentHeader& header) { std::memcpy(memory_.data(), &header, sizeof(header)); }

  Layout layout_;
  std::vector<uint8_t> memory_;
};

TEST_F(HeaderTest, ReadHeaderReturnsTheDaemonsLayout) {
  absl::StatusOr<Layout> read = ReadHeader(memory_.data(), memory_.size());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->total_bytes, layout_.total_bytes);
  EXPECT_EQ(read->submission.region.offset, layout_.submission.region.offset);
  EXPECT_EQ(read->submission.slots, layout_.submission.slots);
  EXPECT_EQ(read->completion.region.bytes, layout_.completion.region.bytes);
  EXPECT_EQ(read->tx_heap.offset, layout_.tx_heap.offset);
  EXPECT_EQ(read->rx_heap.bytes, layout_.rx_heap.bytes);
}

TEST_F(HeaderTest, EveryBadFieldIsRefusedByName) {
  struct Case {
    void (*mutate)(SegmentHeader*);
    const char* message;
  };
  const Case cases[] = {
      {[](SegmentHeader* h) { h->magic ^= 1; }, "magic is"},
      {[](SegmentHeader* h) { h->version = 2; }, "layout version is 2, expected 1"},
      {[](SegmentHeader* h) { h->header_bytes = 96; }, "header_bytes is 96"},
      {[](SegmentHeader* h) { h->descriptor_bytes = 32; }, "descriptor_bytes is 32"},
      {[](SegmentHeader* h) { h->tensor_entry_bytes = 88; }, "tensor_entry_bytes is 88"},
      {[](SegmentHeader* h) { h->total_bytes += kPageBytes; }, "total_bytes is"},
      {[](SegmentHeader* h) { h->submission_slots = 6; }, "submission ring is 6"},
      {[](SegmentHeader* h) { h->completion_slots = 1u << 20; }, "completion ring is 1048576"},
      {[](SegmentHeader* h) { h->submission_offset = 0; }, "overlaps the region before it"},
      {[](SegmentHeader* h) { h->submission_offset += 8; }, "is not page-aligned"},
      {[](SegmentHeader* h) { h->completion_bytes = 0; }, "fewer than the"},
      {[](SegmentHeader* h) { h->tx_heap_offset -= kPageBytes; }, "tx heap"},
      {[](SegmentHeader* h) { h->rx_heap_bytes += kPageBytes; }, "ends past the segment's"},
      {[](SegmentHeader* h) { h->rx_heap_offset = ~uint64_t{0} - 4095; }, "rx heap"},
      {[](SegmentHeader* h) { h->tx_heap_bytes = ~uint64_t{0} - 4095; }, "tx heap"},
  };
  for (const Case& c : cases) {
    SetUp();
    SegmentHeader header = Header();
    c.mutate(&header);
    Put(header);
    absl::StatusOr<Layout> read = ReadHeader(memory_.data(), memory_.size());
    EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << c.message;
    EXPECT_THAT(read.status().message(), HasSubstr(c.message));
  }
}

TEST_F(HeaderTest, AMappingSmallerThanAPageIsRefused) {
  absl::StatusOr<Layout> read = ReadHeader(memory_.data(), 100);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read.status().message(), HasSubstr("smaller than its header page"));
}

}  // namespace
}  // namespace tpd::shm
