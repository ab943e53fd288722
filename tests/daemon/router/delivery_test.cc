#include "daemon/router/delivery.h"

#include <sys/mman.h>

#include <cstring>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/shm/layout.h"
#include "proto/shm/message.h"

namespace tpd::router {
namespace {

using ::testing::HasSubstr;

// Two sessions over in-process segments (no daemon, no client): `from_` has a message in its tx
// heap, `to_` receives it; `ring_` is `to_`'s client end of its completion ring.
class DeliveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    from_ = OpenSession("s-from");
    to_ = OpenSession("s-to");
    // The daemon maps a tx heap read-only; the client writes it through its own mapping.
    void* client = mmap(nullptr, from_->segment->size(), PROT_READ | PROT_WRITE, MAP_SHARED,
                        from_->segment->fd(), 0);
    ASSERT_NE(client, MAP_FAILED);
    client_view_ = static_cast<uint8_t*>(client);
    ring_ = std::make_unique<shm::RingConsumer>(to_->segment->base(),
                                                to_->segment->layout().completion, "client");
  }

  void TearDown() override {
    if (client_view_ != nullptr) munmap(client_view_, from_->segment->size());
  }

  static std::shared_ptr<Session> OpenSession(const std::string& id) {
    shm::SegmentLimits limits;
    limits.submission_slots = 16;
    limits.completion_slots = 16;
    limits.tx_heap_bytes = 4 * shm::kMinHeapBytes;
    limits.rx_heap_bytes = 4 * shm::kMinHeapBytes;
    absl::StatusOr<shm::Segment> segment = shm::Segment::Create(limits);
    EXPECT_TRUE(segment.ok()) << segment.status();
    return Session::Open(id, id, {}, std::make_shared<shm::Segment>(*std::move(segment)), {});
  }

  // A call with body "hello" and one float32 tensor of 100 elements (0, 1, 2, ...), laid out in
  // `from_`'s tx heap.
  Letter CallInTxHeap() {
    uint8_t* base = client_view_;
    const uint64_t tx = from_->segment->layout().tx_heap.offset;
    std::memcpy(base + tx, "hello", 5);
    float* data = reinterpret_cast<float*>(base + tx + 64);
    for (int i = 0; i < 100; ++i) data[i] = static_cast<float>(i);
    shm::TensorEntry entry{};
    entry.dtype = 0;
    entry.ndim = 1;
    entry.shape[0] = 100;
    entry.length = 400;
    entry.offset = tx + 64;
    Letter letter;
    letter.op = shm::Op::kCall;
    letter.call_id = 42;
    letter.deadline_ns = 7;
    letter.names = {"g", "b", "echo", "a"};
    letter.body_offset = tx;
    letter.body_length = 5;
    letter.tensors = {entry};
    return letter;
  }

  // Delivers `letter` and returns what `after` was given (the host case runs it inline).
  absl::Status DeliverNow(Delivery& delivery, const Letter& letter) {
    absl::Status outcome = absl::UnknownError("after did not run");
    delivery.Deliver(from_, to_, letter, [&](absl::Status status) { outcome = status; });
    return outcome;
  }

  uint64_t RxUsed() { return to_->RxUsed(); }

  std::shared_ptr<Session> from_;
  std::shared_ptr<Session> to_;
  std::unique_ptr<shm::RingConsumer> ring_;
  uint8_t* client_view_ = nullptr;
};

TEST_F(DeliveryTest, AHostMessageIsCopiedIntoTheReceiversHeapAndPostedAtOnce) {
  Delivery delivery(nullptr, "no CUDA here");
  ASSERT_TRUE(DeliverNow(delivery, CallInTxHeap()).ok());
  shm::Descriptor d{};
  ASSERT_TRUE(ring_->TryPop(&d).value_or(false));
  EXPECT_EQ(d.op, static_cast<uint8_t>(shm::Op::kCall));
  EXPECT_EQ(d.call_id, 42u);
  EXPECT_EQ(d.deadline_unix_ns, 7);
  ASSERT_EQ(d.tensor_count, 1u);
  const uint8_t* base = to_->segment->base();
  absl::StatusOr<shm::ParsedMessage> message =
      shm::ParseMessage(base, d.payload_offset, d.payload_length);
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(message->names, (shm::MessageNames{"g", "b", "echo", "a"}));
  EXPECT_EQ(
      std::string(reinterpret_cast<const char*>(base + message->body_offset), message->body_length),
      "hello");
  shm::TensorEntry entry;
  std::memcpy(&entry, base + d.tensor_table_offset, sizeof(entry));
  EXPECT_EQ(entry.length, 400u);
  EXPECT_EQ(entry.device_type, static_cast<uint8_t>(shm::DeviceType::kCpu));
  // In the same block, after the table, and holding the sender's values.
  EXPECT_GT(entry.offset, d.tensor_table_offset);
  const float* data = reinterpret_cast<const float*>(base + entry.offset);
  EXPECT_EQ(data[0], 0.0f);
  EXPECT_EQ(data[99], 99.0f);
  EXPECT_GT(RxUsed(), 0u);
}

TEST_F(DeliveryTest, AReceiverWhoseHeapIsFullGetsTheHeapsErrorAndKeepsNothing) {
  Delivery delivery(nullptr, "no CUDA here");
  const uint64_t heap = to_->segment->layout().rx_heap.bytes;
  // Most of the heap taken, as by messages its client has not released.
  absl::StatusOr<uint64_t> taken =
      to_->WriteRx(heap - 256, [](uint64_t, uint8_t*) { return absl::OkStatus(); });
  ASSERT_TRUE(taken.ok()) << taken.status();
  const uint64_t used = RxUsed();
  absl::Status delivered = DeliverNow(delivery, CallInTxHeap());
  EXPECT_EQ(delivered.code(), absl::StatusCode::kResourceExhausted) << delivered;
  EXPECT_EQ(RxUsed(), used);
  shm::Descriptor d{};
  EXPECT_FALSE(ring_->TryPop(&d).value_or(true));
}

TEST_F(DeliveryTest, AnEndedReceiverIsUnavailableNamingItsSession) {
  Delivery delivery(nullptr, "no CUDA here");
  to_->End();
  absl::Status delivered = DeliverNow(delivery, CallInTxHeap());
  EXPECT_EQ(delivered.code(), absl::StatusCode::kUnavailable) << delivered;
  EXPECT_THAT(delivered.message(), HasSubstr("s-to"));
}

TEST_F(DeliveryTest, DevicePlacesWithoutCudaAreRefusedBeforeAnythingIsAllocated) {
  Delivery delivery(nullptr, "no usable CUDA driver on this node");
  Letter letter = CallInTxHeap();
  letter.places = {Place{1}};
  const uint64_t used = RxUsed();
  absl::Status delivered = DeliverNow(delivery, letter);
  EXPECT_EQ(delivered.code(), absl::StatusCode::kFailedPrecondition) << delivered;
  EXPECT_THAT(delivered.message(), HasSubstr("no usable CUDA driver on this node"));
  EXPECT_EQ(RxUsed(), used);
}

TEST_F(DeliveryTest, AReplyWithoutTensorsCarriesItsCodeAndMessage) {
  Delivery delivery(nullptr, "no CUDA here");
  Letter letter;
  letter.op = shm::Op::kReply;
  letter.call_id = 9;
  letter.flags = shm::kFlagError;
  letter.code = static_cast<uint32_t>(absl::StatusCode::kNotFound);
  letter.names = {"", "", "no such method", ""};
  ASSERT_TRUE(DeliverNow(delivery, letter).ok());
  shm::Descriptor d{};
  ASSERT_TRUE(ring_->TryPop(&d).value_or(false));
  EXPECT_EQ(d.op, static_cast<uint8_t>(shm::Op::kReply));
  EXPECT_EQ(d.flags, shm::kFlagError);
  absl::StatusOr<shm::ParsedMessage> message =
      shm::ParseMessage(to_->segment->base(), d.payload_offset, d.payload_length);
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(message->code, static_cast<uint32_t>(absl::StatusCode::kNotFound));
  EXPECT_EQ(message->names[2], "no such method");
}

}  // namespace
}  // namespace tpd::router
