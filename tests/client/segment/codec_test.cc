#include "client/segment/codec.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/message.h"
#include "tests/client/segment/segment_fixture.h"

namespace tpd::calls_internal {
namespace {

using ::testing::HasSubstr;

using CodecTest = SegmentFixture;

const shm::MessageNames kNames = {"g", "w1", "echo", "w0"};

Tensor Floats(std::vector<float> values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return Tensor(shm::DType::kFloat32, {static_cast<int64_t>(values.size())}, std::move(bytes));
}

TEST_F(CodecTest, AMessageIsWrittenAsTheDaemonReadsIt) {
  absl::StatusOr<uint64_t> arena_block = link_->Allocate(64, "a tensor");
  ASSERT_TRUE(arena_block.ok());
  Tensor arena =
      TensorParts::Arena(shm::DType::kInt64, {8}, std::make_shared<ArenaBlock>(link_, *arena_block),
                         reinterpret_cast<char*>(link_->base() + *arena_block), 64);
  const char borrowed[3] = {'a', 'b', 'c'};
  std::vector<Tensor> tensors = {Floats({1, 2, 3}), arena,
                                 Tensor::Borrow(shm::DType::kUInt8, {3}, borrowed, 3),
                                 Tensor(shm::DType::kUInt8, {0}, "")};
  OutgoingHeader header{shm::Op::kCall, 42, 123456789, shm::kFlagReverseMap, 0, kNames};

  absl::StatusOr<EncodedMessage> message = EncodeMessage(*link_, header, "payload", tensors);
  ASSERT_TRUE(message.ok()) << message.status();
  const shm::Descriptor& d = message->descriptor;
  ASSERT_TRUE(shm::ValidateDescriptor(d, segment_->layout(), shm::Direction::kSubmission).ok());
  EXPECT_EQ(d.call_id, 42u);
  EXPECT_EQ(d.deadline_unix_ns, 123456789);
  EXPECT_EQ(d.flags, shm::kFlagReverseMap);
  EXPECT_EQ(d.payload_offset, message->block);
  absl::StatusOr<shm::ParsedMessage> parsed =
      shm::ParseMessage(segment_->base(), d.payload_offset, d.payload_length);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->names, kNames);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(segment_->base() + parsed->body_offset),
                        parsed->body_length),
            "payload");
  absl::StatusOr<std::vector<shm::TensorEntry>> entries =
      shm::ReadTensorTable(d, segment_->base(), segment_->layout(), shm::Direction::kSubmission);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 4u);
  // Copied into the message's block.
  EXPECT_EQ(std::memcmp(segment_->base() + (*entries)[0].offset, tensors[0].data().data(), 12), 0);
  EXPECT_EQ(std::memcmp(segment_->base() + (*entries)[2].offset, "abc", 3), 0);
  // Sent where it lies, pinned until the daemon releases the message.
  EXPECT_EQ((*entries)[1].offset, *arena_block);
  EXPECT_EQ((*entries)[1].shape[0], 8);
  EXPECT_EQ((*entries)[3].length, 0u);
  EXPECT_EQ(message->bytes_copied, 7u + 12u + 3u);
  EXPECT_EQ(message->tensors_copied, 3u);
  EXPECT_EQ(message->tensors_in_place, 1u);
  ASSERT_EQ(message->pins.size(), 1u);
  EXPECT_TRUE(arena.in_flight());
  message->pins.clear();
  EXPECT_FALSE(arena.in_flight());
}

TEST_F(CodecTest, AMessageThatCannotBeWrittenSaysWhyAndAllocatesNothing) {
  const uint64_t live = link_->ArenaStats().live_blocks;
  auto encode = [&](const shm::MessageNames& names, std::vector<Tensor> tensors) {
    return EncodeMessage(*link_, {shm::Op::kCall, 1, 0, 0, 0, names}, "", tensors).status();
  };
  absl::Status long_name = encode({"g", std::string(shm::kMaxMessageName + 1, 'w'), "m", ""}, {});
  EXPECT_EQ(long_name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_name.message(), HasSubstr("at most 4096 bytes"));

  absl::Status short_data =
      encode(kNames, {Floats({1}), Tensor(shm::DType::kFloat32, {2}, "four")});
  EXPECT_EQ(short_data.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_data.message(), HasSubstr("tensor 1: shape and dtype need 8 bytes"));

  absl::Status bad_dtype = encode(kNames, {Tensor(static_cast<shm::DType>(200), {1}, "x")});
  EXPECT_THAT(bad_dtype.message(), HasSubstr("tensor 0: dtype 200 is not a dtype"));

  absl::Status no_device = encode(kNames, {Tensor::Cuda(shm::DType::kUInt8, {4}, 0x1000, 99)});
  EXPECT_EQ(no_device.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_device.message(), HasSubstr("device cuda:99 does not exist"));

  absl::Status too_big =
      encode(kNames, {Tensor(shm::DType::kUInt8, {kHeapBytes}, std::string(kHeapBytes, 'x'))});
  EXPECT_EQ(too_big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_big.message(), HasSubstr("cannot hold a message of"));

  // Exporting device memory this process does not own fails (no driver here, or a pointer
  // the driver does not know): the block already taken goes back.
  absl::Status foreign = encode(kNames, {Tensor::Cuda(shm::DType::kUInt8, {4}, 0x1000, 0)});
  EXPECT_FALSE(foreign.ok());
  EXPECT_THAT(foreign.message(), HasSubstr("tensor 0 (cuda:0): "));

  EXPECT_EQ(link_->ArenaStats().live_blocks, live);
}

TEST_F(CodecTest, AnArenaTensorOfAnotherLinkIsCopied) {
  std::shared_ptr<shm::Segment> daemon_side;
  std::shared_ptr<shm::Segment> client_side;
  std::shared_ptr<Link> other = LinkOverNewSegment(&daemon_side, &client_side);
  ASSERT_NE(other, nullptr);
  absl::StatusOr<uint64_t> block = other->Allocate(4, "a tensor");
  ASSERT_TRUE(block.ok());
  char* bytes = reinterpret_cast<char*>(other->base() + *block);
  std::memcpy(bytes, "wxyz", 4);
  Tensor foreign = TensorParts::Arena(shm::DType::kUInt8, {4},
                                      std::make_shared<ArenaBlock>(other, *block), bytes, 4);
  absl::StatusOr<EncodedMessage> message =
      EncodeMessage(*link_, {shm::Op::kReply, 3}, "", {foreign});
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(message->tensors_in_place, 0u);
  EXPECT_TRUE(message->pins.empty());
  EXPECT_FALSE(foreign.in_flight());
}

TEST_F(CodecTest, AReceivedMessageIsReadInPlaceAndItsBlockReleasedWithItsLastView) {
  shm::Descriptor d = Post(shm::Op::kCall, 9, 0, kNames, "hello",
                           {{shm::DType::kUInt8, {5}, "bytes"}, {shm::DType::kUInt8, {0}, ""}});
  ASSERT_TRUE(shm::ValidateDescriptor(d, segment_->layout(), shm::Direction::kCompletion).ok());
  PeerSegments peers(-1);
  Tensor kept;
  {
    DecodedMessage call = DecodeMessage(d, link_, peers);
    ASSERT_TRUE(call.message.ok()) << call.message.status();
    EXPECT_EQ(call.names, kNames);
    EXPECT_EQ(call.message->payload, "hello");
    ASSERT_EQ(call.message->tensors.size(), 2u);
    kept = call.message->tensors[0];
    EXPECT_EQ(kept.storage(), TensorStorage::kReceived);
    EXPECT_EQ(kept.data(), "bytes");
    EXPECT_EQ(kept.mutable_data(), nullptr);
    // A view into the rx heap, not a copy.
    EXPECT_GE(reinterpret_cast<const uint8_t*>(kept.data().data()), segment_->base() + Rx(0));
    EXPECT_TRUE(call.copies.empty());
  }
  EXPECT_TRUE(Submitted().empty());  // the tensor still holds the block
  EXPECT_EQ(link_->counters.rx_blocks_held.load(), 1u);
  kept = Tensor();
  std::vector<shm::Descriptor> released = Submitted();
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].op, static_cast<uint8_t>(shm::Op::kRelease));
  EXPECT_EQ(released[0].payload_offset, d.payload_offset);
  EXPECT_EQ(link_->counters.bytes_copied_out.load(), 5u);
}

TEST_F(CodecTest, AnErrorReplyIsItsStatus) {
  PeerSegments peers(-1);
  shm::Descriptor d = Post(shm::Op::kReply, 4, 0, {"", "", "no such worker", ""}, "", {},
                           shm::kFlagError, static_cast<uint32_t>(absl::StatusCode::kNotFound));
  EXPECT_EQ(DecodeMessage(d, link_, peers).message.status(), absl::NotFoundError("no such worker"));

  // The daemon could not place the answer at all: a reply with no block.
  shm::Descriptor empty{};
  empty.op = static_cast<uint8_t>(shm::Op::kReply);
  empty.call_id = 5;
  empty.flags = shm::kFlagError;
  DecodedMessage unplaced = DecodeMessage(empty, link_, peers);
  EXPECT_EQ(unplaced.message.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(unplaced.message.status().message(), HasSubstr("receive heap"));
  EXPECT_EQ(Submitted().size(), 1u);  // the first reply's block; the second had none
}

TEST_F(CodecTest, ATensorOutsideWhatTheClientMapsFailsTheMessageAndReleasesEverything) {
  PeerSegments peers(-1);
  shm::Descriptor d = Post(shm::Op::kReply, 4, 0, kNames, "",
                           {{shm::DType::kUInt8, {4}, "abcd"}, {shm::DType::kUInt8, {4}, "efgh"}});
  // The first in a peer session this client never heard of, the second on a device where it
  // lent no receive pool.
  Entry(d, 0)->device_handle = 77;
  Entry(d, 1)->device_type = static_cast<uint8_t>(shm::DeviceType::kCuda);
  Entry(d, 1)->offset = 0;
  ASSERT_TRUE(shm::ValidateDescriptor(d, segment_->layout(), shm::Direction::kCompletion).ok());

  DecodedMessage reply = DecodeMessage(d, link_, peers);
  EXPECT_EQ(reply.message.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(reply.message.status().message(), HasSubstr("77"));
  reply = DecodedMessage{};
  std::vector<shm::Descriptor> released = Submitted();
  ASSERT_EQ(released.size(), 2u);  // the pool block the daemon named, and the rx block
  EXPECT_EQ(released[0].device_pool, 1u);
  EXPECT_EQ(released[1].payload_offset, d.payload_offset);
  EXPECT_EQ(link_->counters.rx_blocks_held.load(), 0u);
}

TEST_F(CodecTest, ACallMarkedAsAnErrorIsRefused) {
  PeerSegments peers(-1);
  shm::Descriptor d = Post(shm::Op::kCall, 4, 0, kNames, "", {}, shm::kFlagError);
  EXPECT_EQ(DecodeMessage(d, link_, peers).message.status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tpd::calls_internal
