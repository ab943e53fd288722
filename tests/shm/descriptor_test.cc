// Validation of descriptors and tensor entries, which the daemon applies to everything a
// client writes: a table of bad ones, each refused naming the field and value, and a seeded
// mutation driver over descriptor and tensor-table bytes (the C3 fault row) that checks every
// accepted descriptor really lies in bounds.

#include "shm/descriptor.h"

#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/layout.h"

namespace tpd::shm {
namespace {

using ::testing::HasSubstr;

Layout SmallLayout() {
  SegmentLimits limits;
  limits.submission_slots = 8;
  limits.completion_slots = 8;
  limits.tx_heap_bytes = 256 * 1024;
  limits.rx_heap_bytes = 128 * 1024;
  absl::StatusOr<Layout> layout = ComputeLayout(limits);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

Descriptor Call(const Layout& layout) {
  Descriptor d{};
  d.op = static_cast<uint8_t>(Op::kCall);
  d.call_id = 42;
  d.deadline_unix_ns = 1'700'000'000'000'000'000;
  d.payload_offset = layout.tx_heap.offset + 64;
  d.payload_length = 100;
  d.tensor_count = 2;
  d.tensor_table_offset = layout.tx_heap.offset + 1024;
  return d;
}

TensorEntry Tensor(const Layout& layout) {
  TensorEntry e{};
  e.dtype = static_cast<uint8_t>(DType::kFloat32);
  e.ndim = 2;
  e.shape[0] = 3;
  e.shape[1] = 5;
  e.length = 3 * 5 * 4;
  e.offset = layout.tx_heap.offset + 4096;
  return e;
}

TEST(DescriptorTest, GoodDescriptorsOfEveryOpPass) {
  const Layout layout = SmallLayout();
  EXPECT_TRUE(ValidateDescriptor(Call(layout), layout, Direction::kSubmission).ok());

  Descriptor reply = Call(layout);
  reply.op = static_cast<uint8_t>(Op::kReply);
  reply.deadline_unix_ns = 0;
  reply.flags = kFlagError;
  EXPECT_TRUE(ValidateDescriptor(reply, layout, Direction::kSubmission).ok());

  Descriptor empty{};
  empty.op = static_cast<uint8_t>(Op::kCall);
  empty.call_id = 1;
  EXPECT_TRUE(ValidateDescriptor(empty, layout, Direction::kSubmission).ok())
      << "no payload, no tensors, no deadline";

  Descriptor release{};
  release.op = static_cast<uint8_t>(Op::kRelease);
  release.call_id = 7;
  release.payload_offset = layout.rx_heap.offset + 128;
  EXPECT_TRUE(ValidateDescriptor(release, layout, Direction::kSubmission).ok());

  Descriptor cancel{};
  cancel.op = static_cast<uint8_t>(Op::kCancel);
  cancel.call_id = 9;
  EXPECT_TRUE(ValidateDescriptor(cancel, layout, Direction::kSubmission).ok());

  // Completions point into the rx heap and release tx blocks.
  Descriptor completion = Call(layout);
  completion.payload_offset = layout.rx_heap.offset;
  completion.tensor_table_offset = layout.rx_heap.offset + 512;
  EXPECT_TRUE(ValidateDescriptor(completion, layout, Direction::kCompletion).ok());
  release.payload_offset = layout.tx_heap.offset;
  EXPECT_TRUE(ValidateDescriptor(release, layout, Direction::kCompletion).ok());
}

TEST(DescriptorTest, DevicePoolsGoOnlyFromTheClient) {
  const Layout layout = SmallLayout();
  Descriptor lend{};
  lend.op = static_cast<uint8_t>(Op::kDevicePool);
  lend.call_id = 3;
  lend.payload_offset = layout.tx_heap.offset + 64;
  lend.payload_length = sizeof(DevicePoolRecord);
  EXPECT_TRUE(ValidateDescriptor(lend, layout, Direction::kSubmission).ok());
  lend.payload_offset = layout.rx_heap.offset + 64;
  const absl::Status back = ValidateDescriptor(lend, layout, Direction::kCompletion);
  EXPECT_THAT(back.message(), HasSubstr("only goes from the client to the daemon"));

  // A release of a block of the client's pool on cuda:1 names its offset in that pool.
  Descriptor release{};
  release.op = static_cast<uint8_t>(Op::kRelease);
  release.call_id = 1;
  release.device_pool = 2;
  release.payload_offset = 64 * 1000;
  EXPECT_TRUE(ValidateDescriptor(release, layout, Direction::kSubmission).ok());
  release.payload_offset = 65;
  EXPECT_THAT(ValidateDescriptor(release, layout, Direction::kSubmission).message(),
              HasSubstr("is not a block start of a receive pool"));
  release.payload_offset = 64;
  release.device_pool = kMaxCudaDevices + 1;
  EXPECT_THAT(ValidateDescriptor(release, layout, Direction::kSubmission).message(),
              HasSubstr("names no CUDA device"));
  release.device_pool = 1;
  EXPECT_THAT(ValidateDescriptor(release, layout, Direction::kCompletion).message(),
              HasSubstr("device_pool 1 must be 0 except in a client's release"));
}

TEST(DescriptorTest, EveryBadDescriptorIsRefusedNamingTheFieldAndValue) {
  const Layout layout = SmallLayout();
  const uint64_t tx = layout.tx_heap.offset;
  const uint64_t tx_end = layout.tx_heap.end();
  const uint64_t rx = layout.rx_heap.offset;
  struct Case {
    std::function<void(Descriptor*)> mutate;
    std::string message;
  };
  const auto as = [](Op op) { return static_cast<uint8_t>(op); };
  const std::vector<Case> cases = {
      {[](Descriptor* d) { d->op = 0; }, "op 0 is not an op"},
      {[](Descriptor* d) { d->op = 8; }, "op 8 is not an op"},
      {[&](Descriptor* d) {
         d->op = as(Op::kStore);
         d->deadline_unix_ns = 0;
       },
       "tensor_count 2 must be 0: a store call"},
      {[&](Descriptor* d) {
         d->op = as(Op::kStore);
         d->tensor_count = 0;
         d->tensor_table_offset = 0;
       },
       "deadline_unix_ns 1700000000000000000 must be 0: only a call has a deadline"},
      {[&](Descriptor* d) {
         *d = Descriptor{};
         d->op = as(Op::kPeerGone);
         d->call_id = 9;
       },
       "op 6 (peer gone) only goes from the daemon to the client"},
      {[](Descriptor* d) { d->op = 255; }, "op 255"},
      {[](Descriptor* d) { d->reserved0 = 1; }, "reserved0 1 must be 0"},
      {[](Descriptor* d) { d->device_pool = 9; },
       "device_pool 9 must be 0 except in a client's release"},
      {[](Descriptor* d) {
         d->op = static_cast<uint8_t>(Op::kDevicePool);
         d->deadline_unix_ns = 0;
       },
       "payload_length 100 must be 80 (a device pool record)"},
      {[](Descriptor* d) { d->reserved2 = 1; }, "reserved2 1 must be 0"},
      {[](Descriptor* d) { d->flags = 0x8000; }, "flags 32768 has unknown bits"},
      {[](Descriptor* d) { d->flags = kFlagError; }, "flags 1 has the error bit"},
      {[&](Descriptor* d) {
         d->op = as(Op::kReply);
         d->deadline_unix_ns = 0;
         d->flags = kFlagReverseMap;
       },
       "flags 2 has the reverse-map bit, which only a call may carry"},
      {[](Descriptor* d) { d->call_id = 0; }, "call_id 0 must not be 0"},
      {[](Descriptor* d) { d->deadline_unix_ns = -5; }, "deadline_unix_ns -5 is negative"},
      {[&](Descriptor* d) { d->op = as(Op::kReply); },
       "deadline_unix_ns 1700000000000000000 must be 0"},
      {[&](Descriptor* d) { d->payload_offset = 0; }, "payload_offset 0 is outside the tx heap"},
      {[&](Descriptor* d) { d->payload_offset = tx - 1; },
       "payload_offset " + std::to_string(tx - 1) + " is outside the tx heap"},
      {[&](Descriptor* d) { d->payload_offset = tx_end; }, "is outside the tx heap"},
      {[&](Descriptor* d) { d->payload_offset = rx; }, "is outside the tx heap"},
      {[&](Descriptor* d) { d->payload_offset = tx_end - 10; },
       "payload_length 100 at payload_offset " + std::to_string(tx_end - 10) +
           " runs past the end of the tx heap"},
      {[&](Descriptor* d) { d->payload_length = ~uint64_t{0}; },
       "payload_length 18446744073709551615 at payload_offset"},
      {[&](Descriptor* d) { d->payload_length = ~uint64_t{0} - tx; }, "runs past the end"},
      {[](Descriptor* d) {
         d->payload_length = 0;
         d->payload_offset = 5;
       },
       "payload_offset 5 must be 0 when payload_length is 0"},
      {[](Descriptor* d) { d->tensor_count = kMaxTensorsPerMessage + 1; },
       "tensor_count 4097 exceeds the limit of 4096"},
      {[](Descriptor* d) { d->tensor_count = ~uint32_t{0}; }, "tensor_count 4294967295 exceeds"},
      {[&](Descriptor* d) { d->tensor_table_offset = tx + 4; },
       "tensor_table_offset " + std::to_string(tx + 4) + " is not 8-byte aligned"},
      {[&](Descriptor* d) { d->tensor_table_offset = tx_end - 96; },
       "tensor_count × 96 192 at tensor_table_offset"},
      {[&](Descriptor* d) { d->tensor_table_offset = rx; },
       "tensor_table_offset " + std::to_string(rx) + " is outside the tx heap"},
      {[](Descriptor* d) {
         d->tensor_count = 0;
         d->tensor_table_offset = 64;
       },
       "tensor_table_offset 64 must be 0 when tensor_count × 96 is 0"},
      // Releases: one block of the other heap, nothing else.
      {[&](Descriptor* d) {
         *d = Descriptor{};
         d->op = as(Op::kRelease);
         d->call_id = 3;
         d->payload_offset = tx;
       },
       "payload_offset " + std::to_string(tx) + " is outside the rx heap"},
      {[&](Descriptor* d) {
         *d = Descriptor{};
         d->op = as(Op::kRelease);
         d->call_id = 3;
         d->payload_offset = rx + 8;
       },
       "is not a block start"},
      {[&](Descriptor* d) {
         *d = Descriptor{};
         d->op = as(Op::kRelease);
         d->call_id = 3;
         d->payload_offset = rx;
         d->payload_length = 64;
       },
       "payload_length 64 must be 0"},
      {[&](Descriptor* d) {
         *d = Descriptor{};
         d->op = as(Op::kRelease);
         d->call_id = 3;
         d->payload_offset = rx;
         d->tensor_count = 1;
       },
       "tensor_count 1 must be 0"},
      {[&](Descriptor* d) {
         *d = Descriptor{};
         d->op = as(Op::kCancel);
         d->call_id = 3;
         d->payload_offset = rx;
       },
       "payload_offset " + std::to_string(rx) + " must be 0"},
      {[&](Descriptor* d) {
         *d = Descriptor{};
         d->op = as(Op::kCancel);
         d->call_id = 3;
         d->tensor_table_offset = tx;
       },
       "tensor_table_offset " + std::to_string(tx) + " must be 0"},
  };
  for (const Case& c : cases) {
    Descriptor d = Call(layout);
    c.mutate(&d);
    const absl::Status status = ValidateDescriptor(d, layout, Direction::kSubmission);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
    EXPECT_THAT(status.message(), HasSubstr("submission descriptor"));
  }
}

TEST(DescriptorTest, PeerGoneComesOnlyFromTheDaemonNamingThePeer) {
  const Layout layout = SmallLayout();
  Descriptor gone{};
  gone.op = static_cast<uint8_t>(Op::kPeerGone);
  gone.call_id = 7;
  EXPECT_TRUE(ValidateDescriptor(gone, layout, Direction::kCompletion).ok());
  gone.payload_offset = layout.rx_heap.offset;
  EXPECT_THAT(ValidateDescriptor(gone, layout, Direction::kCompletion).message(),
              HasSubstr("payload_offset"));
  gone.payload_offset = 0;
  gone.call_id = 0;
  EXPECT_THAT(ValidateDescriptor(gone, layout, Direction::kCompletion).message(),
              HasSubstr("call_id 0 must not be 0"));
}

TEST(DescriptorTest, CompletionsMustPointIntoTheRxHeap) {
  const Layout layout = SmallLayout();
  const absl::Status status = ValidateDescriptor(Call(layout), layout, Direction::kCompletion);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("completion descriptor (op call, call 42): "
                                          "payload_offset"));
  EXPECT_THAT(status.message(), HasSubstr("is outside the rx heap"));
}

TEST(TensorEntryTest, GoodEntriesPass) {
  const Layout layout = SmallLayout();
  EXPECT_TRUE(ValidateTensorEntry(Tensor(layout), 0, layout, Direction::kSubmission).ok());
  TensorEntry scalar{};
  scalar.dtype = static_cast<uint8_t>(DType::kComplex128);
  scalar.ndim = 0;
  scalar.length = 16;
  scalar.offset = layout.tx_heap.offset + 16;
  EXPECT_TRUE(ValidateTensorEntry(scalar, 1, layout, Direction::kSubmission).ok());
  TensorEntry empty{};
  empty.dtype = static_cast<uint8_t>(DType::kInt64);
  empty.ndim = 3;
  empty.shape[0] = 4;
  empty.shape[1] = 0;
  empty.shape[2] = 1'000'000'000'000;
  EXPECT_TRUE(ValidateTensorEntry(empty, 2, layout, Direction::kSubmission).ok());
  TensorEntry eight_dims{};
  eight_dims.dtype = static_cast<uint8_t>(DType::kBool);
  eight_dims.ndim = 8;
  for (int64_t& dim : eight_dims.shape) dim = 2;
  eight_dims.length = 256;
  eight_dims.offset = layout.tx_heap.end() - 256;
  EXPECT_TRUE(ValidateTensorEntry(eight_dims, 3, layout, Direction::kSubmission).ok());
}

TEST(TensorEntryTest, CudaEntriesPointAtAnExportRecordOrAPoolBlock) {
  const Layout layout = SmallLayout();
  TensorEntry cuda = Tensor(layout);
  cuda.device_type = static_cast<uint8_t>(DeviceType::kCuda);
  cuda.device_index = 1;
  cuda.offset = 1 << 30;  // in the exported allocation: only the driver can check it
  cuda.device_handle = layout.tx_heap.offset + 8192;
  EXPECT_TRUE(ValidateTensorEntry(cuda, 0, layout, Direction::kSubmission).ok());
  // In a completion it lies in the receiver's pool and carries no record: its device_handle is
  // 0 or the copy signal of a call posted while its copies run, in the rx heap.
  EXPECT_THAT(ValidateTensorEntry(cuda, 0, layout, Direction::kCompletion).message(),
              HasSubstr("is not 0 or an aligned copy signal inside the rx heap"));
  cuda.device_handle = layout.rx_heap.offset + 4096;
  EXPECT_TRUE(ValidateTensorEntry(cuda, 0, layout, Direction::kCompletion).ok());
  cuda.device_handle += 8;
  EXPECT_THAT(ValidateTensorEntry(cuda, 0, layout, Direction::kCompletion).message(),
              HasSubstr("device_handle"));
  cuda.device_handle = layout.rx_heap.end() - kCopySignalBytes + kHeapAlignment;
  EXPECT_THAT(ValidateTensorEntry(cuda, 0, layout, Direction::kCompletion).message(),
              HasSubstr("device_handle"));
  cuda.device_handle = 0;
  EXPECT_TRUE(ValidateTensorEntry(cuda, 0, layout, Direction::kCompletion).ok());
  cuda.offset = 2;
  EXPECT_THAT(ValidateTensorEntry(cuda, 0, layout, Direction::kCompletion).message(),
              HasSubstr("is not aligned to the dtype's 4-byte items"));
}

TEST(TensorEntryTest, CpuEntriesOfACompletionMayLieInAPeersSegment) {
  const Layout layout = SmallLayout();
  TensorEntry shared = Tensor(layout);
  // Peer 3's segment: the offset is in that segment, which the receiving client checks.
  shared.device_handle = 3;
  shared.offset = uint64_t{1} << 40;
  EXPECT_TRUE(ValidateTensorEntry(shared, 0, layout, Direction::kCompletion).ok());
  shared.offset += 2;
  EXPECT_THAT(ValidateTensorEntry(shared, 0, layout, Direction::kCompletion).message(),
              HasSubstr("is not aligned to the dtype's 4-byte items"));
  shared.offset -= 2;
  // A client cannot point the daemon anywhere but its own tx or rx heap.
  EXPECT_THAT(ValidateTensorEntry(shared, 0, layout, Direction::kSubmission).message(),
              HasSubstr("device_handle 3 must be 0 (tx heap) or 1 (rx heap) for cpu in a "
                        "submission"));
}

TEST(TensorEntryTest, CpuEntriesOfASubmissionMayLieInTheSendersOwnRxHeapAndNowhereElse) {
  const Layout layout = SmallLayout();
  TensorEntry back = Tensor(layout);  // 60 bytes
  back.device_handle = kInRxHeap;
  back.offset = layout.rx_heap.offset + 4096;
  EXPECT_TRUE(ValidateTensorEntry(back, 0, layout, Direction::kSubmission).ok());
  back.offset = layout.rx_heap.end() - 60;
  EXPECT_TRUE(ValidateTensorEntry(back, 0, layout, Direction::kSubmission).ok());
  // Past the rx heap's end, in the tx heap, or at the segment's start: refused, naming it.
  back.offset = layout.rx_heap.end() - 56;
  EXPECT_THAT(ValidateTensorEntry(back, 0, layout, Direction::kSubmission).message(),
              HasSubstr("runs past the end of the rx heap"));
  back.offset = layout.tx_heap.offset + 4096;
  EXPECT_THAT(ValidateTensorEntry(back, 0, layout, Direction::kSubmission).message(),
              HasSubstr("is outside the rx heap"));
  back.offset = 0;
  EXPECT_THAT(ValidateTensorEntry(back, 0, layout, Direction::kSubmission).message(),
              HasSubstr("offset 0 is outside the rx heap"));
  back.offset = layout.rx_heap.offset + 4098;
  EXPECT_THAT(ValidateTensorEntry(back, 0, layout, Direction::kSubmission).message(),
              HasSubstr("is not aligned to the dtype's 4-byte items"));
}

TEST(TensorEntryTest, EveryBadEntryIsRefusedNamingTheFieldAndValue) {
  const Layout layout = SmallLayout();
  const uint64_t tx = layout.tx_heap.offset;
  struct Case {
    std::function<void(TensorEntry*)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](TensorEntry* e) { e->dtype = 0; }, "dtype 0 is not a dtype code"},
      {[](TensorEntry* e) { e->dtype = 13; }, "dtype 13 is not a dtype code"},
      {[](TensorEntry* e) { e->ndim = 9; }, "ndim 9 exceeds 8"},
      {[](TensorEntry* e) { e->reserved0 = 2; }, "reserved0 2 must be 0"},
      {[](TensorEntry* e) { e->device_type = 7; }, "device_type 7 is not a device type"},
      {[](TensorEntry* e) {
         e->device_type = 1;
         e->device_index = 64;
       },
       "device_index 64 is not below 64"},
      {[](TensorEntry* e) { e->device_type = 1; },
       "device_handle 0 is not an aligned CUDA export record inside the tx heap"},
      {[&](TensorEntry* e) {
         e->device_type = 1;
         e->device_handle = layout.tx_heap.end() - 8;
       },
       "is not an aligned CUDA export record"},
      {[&](TensorEntry* e) {
         e->device_type = 1;
         e->device_handle = tx + 4;
       },
       "is not an aligned CUDA export record"},
      {[](TensorEntry* e) { e->device_index = 1; }, "device_index 1 must be 0 for cpu"},
      {[](TensorEntry* e) { e->device_handle = 2; },
       "device_handle 2 must be 0 (tx heap) or 1 (rx heap) for cpu in a submission"},
      {[](TensorEntry* e) { e->shape[1] = -5; }, "shape[1] -5 is negative"},
      {[](TensorEntry* e) { e->shape[2] = 1; }, "shape[2] 1 must be 0 past ndim 2"},
      {[](TensorEntry* e) { e->shape[7] = 3; }, "shape[7] 3 must be 0 past ndim 2"},
      {[](TensorEntry* e) {
         e->shape[0] = int64_t{1} << 40;
         e->shape[1] = int64_t{1} << 40;
       },
       "shape[1] 1099511627776 makes the tensor's byte size overflow"},
      {[](TensorEntry* e) { e->length = 61; }, "length 61 differs from shape × item size (4) = 60"},
      {[](TensorEntry* e) { e->ndim = 1; }, "shape[1] 5 must be 0 past ndim 1"},
      {[](TensorEntry* e) { e->offset = 0; }, "offset 0 is outside the tx heap"},
      {[&](TensorEntry* e) { e->offset = tx + 2; },
       "offset " + std::to_string(tx + 2) + " is not aligned to the dtype's 4-byte items"},
      {[&](TensorEntry* e) { e->offset = layout.tx_heap.end() - 4; },
       "length 60 at offset " + std::to_string(layout.tx_heap.end() - 4) +
           " runs past the end of the tx heap"},
      {[&](TensorEntry* e) { e->offset = layout.rx_heap.offset; }, "is outside the tx heap"},
      {[](TensorEntry* e) {
         e->shape[0] = 0;
         e->length = 0;
       },
       "must be 0 when length is 0"},
  };
  for (const Case& c : cases) {
    TensorEntry e = Tensor(layout);
    c.mutate(&e);
    const absl::Status status = ValidateTensorEntry(e, 5, layout, Direction::kSubmission);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr("submission tensor 5: "));
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

// A segment in private memory with a valid call: its descriptor, and a table of
// `tensor_count` entries at tensor_table_offset.
struct FakeSegment {
  explicit FakeSegment(const Layout& l) : layout(l), memory(l.total_bytes, 0) {
    descriptor = Call(layout);
    for (uint32_t i = 0; i < descriptor.tensor_count; ++i) {
      TensorEntry e = Tensor(layout);
      e.offset += i * 64;
      std::memcpy(&memory[descriptor.tensor_table_offset + i * sizeof(TensorEntry)], &e, sizeof(e));
    }
  }
  Layout layout;
  std::vector<uint8_t> memory;
  Descriptor descriptor;
};

TEST(TensorTableTest, ReadTensorTableCopiesAndValidatesEveryEntry) {
  FakeSegment segment(SmallLayout());
  absl::StatusOr<std::vector<TensorEntry>> table = ReadTensorTable(
      segment.descriptor, segment.memory.data(), segment.layout, Direction::kSubmission);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 2u);
  EXPECT_EQ((*table)[1].offset, segment.layout.tx_heap.offset + 4096 + 64);

  // The second entry turns bad: refused, naming it.
  segment.memory[segment.descriptor.tensor_table_offset + sizeof(TensorEntry)] = 99;  // dtype
  table = ReadTensorTable(segment.descriptor, segment.memory.data(), segment.layout,
                          Direction::kSubmission);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(table.status().message(), HasSubstr("tensor 1: dtype 99"));

  // A descriptor that was never validated is checked again, not trusted.
  Descriptor bad = segment.descriptor;
  bad.tensor_table_offset = segment.layout.total_bytes;
  table = ReadTensorTable(bad, segment.memory.data(), segment.layout, Direction::kSubmission);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
}

// Every accepted descriptor must lie in bounds: its ranges inside the heap of its direction.
void ExpectInBounds(const Descriptor& d, const Layout& layout, Direction direction) {
  const Region& send = direction == Direction::kSubmission ? layout.tx_heap : layout.rx_heap;
  const Region& other = direction == Direction::kSubmission ? layout.rx_heap : layout.tx_heap;
  ASSERT_GE(d.op, 1);
  ASSERT_LE(d.op, 4);
  ASSERT_NE(d.call_id, 0u);
  ASSERT_LE(d.tensor_count, kMaxTensorsPerMessage);
  if (d.op == static_cast<uint8_t>(Op::kRelease)) {
    ASSERT_TRUE(other.Contains(d.payload_offset, 1));
    ASSERT_EQ(d.payload_length, 0u);
    ASSERT_EQ(d.tensor_count, 0u);
    return;
  }
  if (d.payload_length > 0) {
    ASSERT_TRUE(send.Contains(d.payload_offset, d.payload_length));
  }
  if (d.tensor_count > 0) {
    ASSERT_TRUE(send.Contains(d.tensor_table_offset, d.tensor_count * sizeof(TensorEntry)));
  }
}

void ExpectInBounds(const TensorEntry& e, const Layout& layout) {
  ASSERT_NE(ItemBytes(e.dtype), 0u);
  ASSERT_LE(e.ndim, kMaxTensorDims);
  uint64_t bytes = ItemBytes(e.dtype);
  for (int i = 0; i < e.ndim; ++i) {
    ASSERT_GE(e.shape[i], 0);
    bytes *= static_cast<uint64_t>(e.shape[i]);  // cannot overflow for an accepted entry
  }
  ASSERT_EQ(bytes, e.length);
  if (e.length > 0) {
    ASSERT_TRUE(layout.tx_heap.Contains(e.offset, e.length));
    ASSERT_EQ(e.offset % ItemBytes(e.dtype), 0u);
  }
}

// Flips bits, writes random or boundary values into random fields' bytes, for a fixed number
// of rounds with a fixed seed, so a failure reproduces.
TEST(DescriptorFuzzTest, MutatedDescriptorsNeverCrashAndAcceptedOnesAreInBounds) {
  const Layout layout = SmallLayout();
  std::mt19937_64 rng(20261127);
  const uint64_t interesting[] = {0,
                                  1,
                                  63,
                                  64,
                                  4096,
                                  layout.tx_heap.offset,
                                  layout.tx_heap.end(),
                                  layout.tx_heap.end() - 1,
                                  layout.rx_heap.offset,
                                  layout.rx_heap.end(),
                                  layout.total_bytes,
                                  ~uint64_t{0},
                                  ~uint64_t{0} - layout.tx_heap.offset + 1,
                                  uint64_t{1} << 63,
                                  kMaxTensorsPerMessage,
                                  kMaxTensorsPerMessage + 1};
  int accepted = 0;
  constexpr int kRounds = 200'000;
  for (int round = 0; round < kRounds; ++round) {
    Descriptor d = Call(layout);
    const Direction direction = round % 2 ? Direction::kSubmission : Direction::kCompletion;
    if (direction == Direction::kCompletion) {
      d.payload_offset = layout.rx_heap.offset;
      d.tensor_table_offset = layout.rx_heap.offset + 512;
    }
    if (round % 7 == 0) d.op = static_cast<uint8_t>(1 + rng() % 4);
    uint8_t bytes[sizeof(Descriptor)];
    std::memcpy(bytes, &d, sizeof(d));
    const int mutations = 1 + rng() % 3;
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 3) {
        case 0:
          bytes[rng() % sizeof(bytes)] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1:
          bytes[rng() % sizeof(bytes)] = static_cast<uint8_t>(rng());
          break;
        default: {
          const uint64_t value = interesting[rng() % std::size(interesting)];
          const size_t at = 8 * (rng() % (sizeof(bytes) / 8));
          std::memcpy(&bytes[at], &value, 8);
          break;
        }
      }
    }
    std::memcpy(&d, bytes, sizeof(d));
    const absl::Status status = ValidateDescriptor(d, layout, direction);
    if (status.ok()) {
      ++accepted;
      ExpectInBounds(d, layout, direction);
      if (::testing::Test::HasFatalFailure()) {
        FAIL() << "round " << round << " accepted an out-of-bounds descriptor";
      }
    } else {
      ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      ASSERT_FALSE(status.message().empty());
    }
  }
  // The driver must reach both sides of the checks, or it tests nothing.
  EXPECT_GT(accepted, kRounds / 50);
  EXPECT_LT(accepted, kRounds / 2);
}

TEST(DescriptorFuzzTest, MutatedTensorTablesNeverCrashAndAcceptedEntriesAreInBounds) {
  FakeSegment segment(SmallLayout());
  std::mt19937_64 rng(7);
  const uint64_t table = segment.descriptor.tensor_table_offset;
  const std::vector<uint8_t> pristine(segment.memory.begin() + table,
                                      segment.memory.begin() + table + 2 * sizeof(TensorEntry));
  int accepted = 0;
  constexpr int kRounds = 100'000;
  for (int round = 0; round < kRounds; ++round) {
    std::memcpy(&segment.memory[table], pristine.data(), pristine.size());
    const int mutations = 1 + rng() % 3;
    for (int m = 0; m < mutations; ++m) {
      const size_t at = table + rng() % pristine.size();
      if (rng() % 2) {
        segment.memory[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
      } else {
        segment.memory[at] = static_cast<uint8_t>(rng());
      }
    }
    absl::StatusOr<std::vector<TensorEntry>> entries = ReadTensorTable(
        segment.descriptor, segment.memory.data(), segment.layout, Direction::kSubmission);
    if (entries.ok()) {
      ++accepted;
      for (const TensorEntry& e : *entries) ExpectInBounds(e, segment.layout);
      if (::testing::Test::HasFatalFailure()) FAIL() << "round " << round;
    } else {
      ASSERT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
  EXPECT_GT(accepted, kRounds / 200);
  EXPECT_LT(accepted, kRounds / 2);
}

}  // namespace
}  // namespace tpd::shm
