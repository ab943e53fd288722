#include "daemon/router/delivery.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/fd_message.h"
#include "shm/layout.h"
#include "shm/message.h"
#include "shm/peer_notice.h"
#include "shm/segment.h"

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
    // Room for a tensor of kShareMinBytes (SharingTest).
    limits.tx_heap_bytes = 2 * kShareMinBytes;
    limits.rx_heap_bytes = 2 * kShareMinBytes;
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

// Large host tensors between sessions that may share memory (docs/security.md): lent, not
// copied, and only when both are of one uid and one gid.
class SharingTest : public DeliveryTest {
 protected:
  void SetUp() override {
    DeliveryTest::SetUp();
    from_->peer_id = 1;
    to_->peer_id = 2;
    absl::StatusOr<int> share_fd = from_->segment->OpenReadOnly();
    ASSERT_TRUE(share_fd.ok()) << share_fd.status();
    from_->share_fd = *share_fd;
    int pair[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    to_->notice_fd = pair[0];  // the session's end of its data connection
    client_end_ = pair[1];
    from_ring_ = std::make_unique<shm::RingConsumer>(
        from_->segment->base(), from_->segment->layout().completion, "sender's client");
  }

  void TearDown() override {
    if (client_end_ >= 0) close(client_end_);
    DeliveryTest::TearDown();
  }

  // A call whose message block starts at the tx heap and holds one float32 tensor of 64 KiB.
  Letter LargeCall() {
    Letter letter = CallInTxHeap();
    const uint64_t tx = from_->segment->layout().tx_heap.offset;
    float* data = reinterpret_cast<float*>(client_view_ + tx + 64);
    for (int i = 0; i < 16384; ++i) data[i] = static_cast<float>(i);
    letter.tx_block = tx;
    letter.tensors[0].shape[0] = 16384;
    letter.tensors[0].length = kShareMinBytes;
    return letter;
  }

  // The one descriptor waiting on `ring`, if any.
  std::optional<shm::Descriptor> Next(shm::RingConsumer& ring) {
    shm::Descriptor d{};
    if (!ring.TryPop(&d).value_or(false)) return std::nullopt;
    return d;
  }

  shm::TensorEntry EntryOf(const shm::Descriptor& d) {
    shm::TensorEntry entry;
    std::memcpy(&entry, to_->segment->base() + d.tensor_table_offset, sizeof(entry));
    return entry;
  }

  bool NoticeWaiting() {
    pollfd waiting{client_end_, POLLIN, 0};
    return poll(&waiting, 1, 0) == 1;
  }

  int client_end_ = -1;
  std::unique_ptr<shm::RingConsumer> from_ring_;
};

TEST_F(SharingTest, SessionsOfAnotherUidOrGidGetACopyAndNoNotice) {
  Delivery delivery(nullptr, "no CUDA here");
  for (auto [uid, gid] : {std::pair<uid_t, gid_t>{65534, 0}, {0, 65534}}) {
    to_->uid = uid;
    to_->gid = gid;
    ASSERT_TRUE(DeliverNow(delivery, LargeCall()).ok());
    std::optional<shm::Descriptor> d = Next(*ring_);
    ASSERT_TRUE(d.has_value());
    const shm::TensorEntry entry = EntryOf(*d);
    EXPECT_EQ(entry.device_handle, 0u) << "uid " << uid << " gid " << gid;
    EXPECT_TRUE(to_->segment->layout().rx_heap.Contains(entry.offset, entry.length));
    EXPECT_EQ(reinterpret_cast<const float*>(to_->segment->base() + entry.offset)[16383], 16383.0f);
    EXPECT_FALSE(NoticeWaiting()) << "no fd of the sender's memory went to uid " << uid << " gid "
                                  << gid;
    // Copied: the sender's block goes back at once.
    std::optional<shm::Descriptor> release = Next(*from_ring_);
    ASSERT_TRUE(release.has_value());
    EXPECT_EQ(release->op, static_cast<uint8_t>(shm::Op::kRelease));
    EXPECT_EQ(release->payload_offset, from_->segment->layout().tx_heap.offset);
    ASSERT_TRUE(to_->FreeRx(d->payload_offset).ok());
  }
  EXPECT_EQ(to_->bytes_shared.load(), 0u);
}

TEST_F(SharingTest, OneUidAndGidReadTheSendersBlockLentUntilTheReceiverReleasesIt) {
  Delivery delivery(nullptr, "no CUDA here");
  ASSERT_TRUE(DeliverNow(delivery, LargeCall()).ok());
  std::optional<shm::Descriptor> d = Next(*ring_);
  ASSERT_TRUE(d.has_value());
  const shm::TensorEntry entry = EntryOf(*d);
  const uint64_t tx = from_->segment->layout().tx_heap.offset;
  EXPECT_EQ(entry.device_handle, 1u) << "the sender's peer id";
  EXPECT_EQ(entry.offset, tx + 64) << "where it lies in the sender's segment";
  EXPECT_EQ(to_->bytes_shared.load(), kShareMinBytes);

  // The notice came first, with an fd that maps the sender's segment but cannot write it.
  ASSERT_TRUE(NoticeWaiting());
  char bytes[shm::kPeerNoticeBytes];
  absl::StatusOr<int> fd = shm::ReceiveWithFd(client_end_, bytes, sizeof(bytes));
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_GE(*fd, 0);
  absl::StatusOr<shm::PeerNotice> notice =
      shm::DecodePeerNotice(absl::string_view(bytes, sizeof(bytes)));
  ASSERT_TRUE(notice.ok()) << notice.status();
  EXPECT_EQ(notice->peer, 1u);
  EXPECT_EQ(notice->tx_offset, tx);
  EXPECT_EQ(fcntl(*fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  EXPECT_EQ(mmap(nullptr, notice->segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0),
            MAP_FAILED);
  absl::StatusOr<shm::ReadOnlyMapping> mapped =
      shm::ReadOnlyMapping::Map(*fd, notice->segment_bytes);
  close(*fd);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(reinterpret_cast<const float*>(mapped->base() + entry.offset)[16383], 16383.0f);

  // Lent: the sender's block stays out until the receiver releases the message.
  EXPECT_FALSE(Next(*from_ring_).has_value());
  ASSERT_TRUE(to_->FreeRx(d->payload_offset).ok());
  std::optional<shm::Descriptor> release = Next(*from_ring_);
  ASSERT_TRUE(release.has_value());
  EXPECT_EQ(release->op, static_cast<uint8_t>(shm::Op::kRelease));
  EXPECT_EQ(release->payload_offset, tx);

  // Told once per pair; the sender's end tells the receiver.
  ASSERT_TRUE(DeliverNow(delivery, LargeCall()).ok());
  ASSERT_TRUE(Next(*ring_).has_value());
  EXPECT_FALSE(NoticeWaiting()) << "one notice per pair";
  from_->End();
  std::optional<shm::Descriptor> gone = Next(*ring_);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->op, static_cast<uint8_t>(shm::Op::kPeerGone));
  EXPECT_EQ(gone->call_id, 1u);
}

TEST_F(SharingTest, SmallTensorsAreCopiedAndAnEndedSenderLendsNothing) {
  Delivery delivery(nullptr, "no CUDA here");
  ASSERT_TRUE(DeliverNow(delivery, CallInTxHeap()).ok());  // 400 bytes
  std::optional<shm::Descriptor> d = Next(*ring_);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(EntryOf(*d).device_handle, 0u);
  EXPECT_FALSE(NoticeWaiting());

  from_->End();
  ASSERT_TRUE(DeliverNow(delivery, LargeCall()).ok());
  d = Next(*ring_);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(EntryOf(*d).device_handle, 0u) << "copied: the sender's memory is not lent";
  EXPECT_FALSE(NoticeWaiting());
}

TEST_F(SharingTest, AReceiverThatShutItsReadingSideGetsCopies) {
  Delivery delivery(nullptr, "no CUDA here");
  ASSERT_EQ(shutdown(client_end_, SHUT_RD), 0);  // ClientOptions::tensors_in_sender_memory false
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(DeliverNow(delivery, LargeCall()).ok());
    std::optional<shm::Descriptor> d = Next(*ring_);
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(EntryOf(*d).device_handle, 0u) << "delivery " << i;
    ASSERT_TRUE(to_->FreeRx(d->payload_offset).ok());
  }
  EXPECT_EQ(to_->bytes_shared.load(), 0u);
}

}  // namespace
}  // namespace tpd::router
