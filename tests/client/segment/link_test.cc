#include "client/segment/link.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/segment/segment_fixture.h"

namespace tpd::calls_internal {
namespace {

using ::testing::HasSubstr;

using LinkTest = SegmentFixture;

shm::Descriptor Cancel(uint64_t call_id) {
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(shm::Op::kCancel);
  d.call_id = call_id;
  return d;
}

TEST_F(LinkTest, ARequestTheHeapCannotHoldNamesTheHeapAndTheRequest) {
  absl::StatusOr<uint64_t> block = link_->Allocate(kHeapBytes + 1, "a message");
  ASSERT_EQ(block.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(block.status().message(), HasSubstr("tx heap of 65536 bytes"));
  EXPECT_THAT(block.status().message(), HasSubstr("cannot hold a message of 65537 bytes at all"));

  absl::StatusOr<uint64_t> most = link_->Allocate(kHeapBytes - 4096, "a tensor");
  ASSERT_TRUE(most.ok()) << most.status();
  absl::StatusOr<uint64_t> more = link_->Allocate(8192, "a tensor");
  ASSERT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(more.status().message(), HasSubstr("largest free block"));
  link_->FreeBlock(*most);
  EXPECT_EQ(link_->ArenaStats().live_blocks, 0u);
}

TEST_F(LinkTest, AReleasedMessageFreesItsBlockAndUnpinsItsArenaTensors) {
  absl::StatusOr<uint64_t> arena = link_->Allocate(256, "a tensor");
  absl::StatusOr<uint64_t> message = link_->Allocate(128, "a message");
  ASSERT_TRUE(arena.ok() && message.ok());
  auto block = std::make_shared<ArenaBlock>(link_, *arena);
  shm::Descriptor d = Cancel(7);  // any descriptor: the link does not look inside
  ASSERT_TRUE(link_->PushMessage(d, *message, {Pin(block)}, {}).ok());
  EXPECT_EQ(block->messages.load(), 1);
  ASSERT_EQ(Submitted().size(), 1u);

  link_->OnReleased(*message);
  EXPECT_EQ(block->messages.load(), 0);
  EXPECT_EQ(link_->ArenaStats().live_blocks, 1u);  // the arena tensor's, still held
  block.reset();
  EXPECT_EQ(link_->ArenaStats().live_blocks, 0u);
}

TEST_F(LinkTest, AClosedLinkRefusesPushesFreesTheMessageAndDropsItsHolds) {
  absl::StatusOr<uint64_t> arena = link_->Allocate(256, "a tensor");
  absl::StatusOr<uint64_t> message = link_->Allocate(128, "a message");
  ASSERT_TRUE(arena.ok() && message.ok());
  auto block = std::make_shared<ArenaBlock>(link_, *arena);
  link_->Close();

  absl::Status pushed = link_->PushMessage(Cancel(7), *message, {Pin(block)}, {});
  EXPECT_EQ(pushed.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(pushed.message(), HasSubstr("detached"));
  EXPECT_EQ(block->messages.load(), 0);
  EXPECT_EQ(link_->Push(Cancel(8)).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(link_->Allocate(64, "a tensor").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Submitted().empty());
  link_->SendRelease(Rx(0), 64);  // a view outliving the session: nothing to tell
  EXPECT_TRUE(Submitted().empty());
}

TEST_F(LinkTest, ReleasesOnADeferringThreadRideOnTheNextPush) {
  Link::DeferReleasesOnThisThread(link_.get());
  EXPECT_TRUE(link_->DefersOnThisThread());
  link_->SendRelease(Rx(0), 64);
  link_->SendRelease(Rx(4096), 64);
  EXPECT_TRUE(Submitted().empty());
  EXPECT_NE(link_->DeferredSince(), 0);
  // A large block's release goes at once, with those waiting.
  link_->SendRelease(Rx(8192), kDeferredReleaseMaxBytes + 1);
  Link::DeferReleasesOnThisThread(nullptr);

  std::vector<shm::Descriptor> pushed = Submitted();
  ASSERT_EQ(pushed.size(), 3u);
  EXPECT_EQ(pushed[0].payload_offset, Rx(0));
  EXPECT_EQ(pushed[1].payload_offset, Rx(4096));
  EXPECT_EQ(pushed[2].payload_offset, Rx(8192));
  for (const shm::Descriptor& d : pushed) {
    EXPECT_EQ(d.op, static_cast<uint8_t>(shm::Op::kRelease));
    EXPECT_TRUE(shm::ValidateDescriptor(d, segment_->layout(), shm::Direction::kSubmission).ok());
  }
  EXPECT_EQ(link_->counters.releases_deferred.load(), 2u);
  EXPECT_EQ(link_->DeferredSince(), 0);
}

TEST_F(LinkTest, AThreadThatDoesNotDeferReleasesAtOnceAndFlushSendsWhatWaits) {
  link_->SendRelease(Rx(0), 64);
  EXPECT_EQ(Submitted().size(), 1u);

  Link::DeferReleasesOnThisThread(link_.get());
  link_->SendRelease(Rx(4096), 64);
  Link::DeferReleasesOnThisThread(nullptr);
  link_->FlushReleases(absl::Hours(1));  // not waited that long: stays
  EXPECT_TRUE(Submitted().empty());
  link_->FlushReleases(absl::ZeroDuration());
  std::vector<shm::Descriptor> pushed = Submitted();
  ASSERT_EQ(pushed.size(), 1u);
  EXPECT_EQ(pushed[0].payload_offset, Rx(4096));
  EXPECT_EQ(link_->counters.release_flushes.load(), 1u);
}

TEST_F(LinkTest, ReceivedBlocksAreReleasedWhenTheirLastHolderGoes) {
  auto rx = std::make_shared<RxBlock>(link_, Rx(0), 100);
  auto pool = std::make_shared<PoolBlock>(link_, /*device=*/2, /*offset=*/4096, /*bytes=*/64);
  EXPECT_EQ(link_->counters.rx_blocks_held.load(), 1u);
  EXPECT_EQ(link_->counters.cuda_pool_blocks_held.load(), 1u);
  auto view = rx;
  rx.reset();
  EXPECT_TRUE(Submitted().empty());
  view.reset();
  pool.reset();
  std::vector<shm::Descriptor> pushed = Submitted();
  ASSERT_EQ(pushed.size(), 2u);
  EXPECT_EQ(pushed[0].payload_offset, Rx(0));
  EXPECT_EQ(pushed[0].device_pool, 0u);
  EXPECT_EQ(pushed[1].payload_offset, 4096u);
  EXPECT_EQ(pushed[1].device_pool, 3u);  // 1 + the device
  EXPECT_EQ(link_->counters.rx_blocks_held.load(), 0u);
  EXPECT_EQ(link_->counters.cuda_pool_blocks_held.load(), 0u);
}

TEST_F(LinkTest, AFullSubmissionRingFailsThePushUnavailableAfterItsWait) {
  for (uint32_t i = 0; i < kSlots; ++i) ASSERT_TRUE(link_->Push(Cancel(i + 1)).ok()) << i;
  // Nobody reads: the push waits kRingWait for space, then gives up naming the ring.
  absl::Status full = link_->Push(Cancel(99));
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(full.message(), HasSubstr("submission ring stayed full"));
  EXPECT_EQ(Submitted().size(), kSlots);
}

}  // namespace
}  // namespace tpd::calls_internal
