#include "agent/wire.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "agent/pipe_auth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/well_formed_hello.h"

namespace tpd::agent {
namespace {

using ::testing::HasSubstr;

// A message of `sizes` tensors over one buffer, each tensor sent in chunks of `chunk` (0: whole).
struct Outgoing {
  std::vector<char> bytes;
  Message msg;

  Outgoing(const std::vector<size_t>& sizes, uint64_t chunk) {
    size_t total = 0;
    for (size_t size : sizes) total += size;
    bytes.resize(total + 1);
    size_t at = 0;
    for (size_t size : sizes) {
      msg.tensors.push_back({bytes.data() + at, size});
      msg.header.add_tensors()->set_chunk_bytes(chunk);
      at += size;
    }
  }
};

TEST(WireTest, PrepareHeaderFillsSizesAndRefusesWhatDoesNotFit) {
  Outgoing plain({10, 0, 3}, 0);
  char payload[5] = {};
  plain.msg.payload = {payload, sizeof(payload)};
  ASSERT_TRUE(PrepareHeader(plain.msg, 100).ok());
  EXPECT_EQ(plain.msg.header.payload_bytes(), 5u);
  EXPECT_EQ(plain.msg.header.tensors(0).nbytes(), 10u);
  EXPECT_EQ(MessageBytes(plain.msg), 18u);
  absl::Status too_big = PrepareHeader(plain.msg, 17);
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.message(), HasSubstr("holds 18 bytes, more than the agent's limit of 17"));

  Message no_data;
  no_data.tensors.push_back({nullptr, 4});
  EXPECT_THAT(PrepareHeader(no_data, 100).message(), HasSubstr("tensor 0 has a size but no data"));
  Message mismatched;
  mismatched.tensors.push_back({payload, 1});
  mismatched.header.add_tensors();
  mismatched.header.add_tensors();
  EXPECT_THAT(PrepareHeader(mismatched, 100).message(),
              HasSubstr("1 tensors but 2 tensor descriptors"));
}

TEST(WireTest, ChunksNeedTheirMinimumTheirCallbackAndABound) {
  Outgoing small({kMinChunkBytes}, kMinChunkBytes / 2);
  EXPECT_THAT(PrepareHeader(small.msg, UINT64_MAX).message(),
              HasSubstr("below the minimum of 1048576"));
  Outgoing unready({kMinChunkBytes}, kMinChunkBytes);
  EXPECT_THAT(PrepareHeader(unready.msg, UINT64_MAX).message(),
              HasSubstr("need when_chunk_ready and a keepalive"));
  // An empty tensor has nothing to chunk: its chunk size is dropped.
  Outgoing empty({0}, kMinChunkBytes);
  ASSERT_TRUE(PrepareHeader(empty.msg, UINT64_MAX).ok());
  EXPECT_EQ(empty.msg.header.tensors(0).chunk_bytes(), 0u);
}

TEST(WireTest, ChunksCoverEachTensorInOrderAndCountsNeverWrap) {
  Outgoing two({2 * kMinChunkBytes + 5, kMinChunkBytes}, kMinChunkBytes);
  two.msg.keepalive = std::make_shared<int>(0);
  two.msg.when_chunk_ready = [](size_t, uint64_t, uint64_t, ChunkReady) {};
  ASSERT_TRUE(PrepareHeader(two.msg, UINT64_MAX).ok());
  std::vector<Chunk> chunks = ChunksOf(two.msg);
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[2].tensor, 0u);
  EXPECT_EQ(chunks[2].offset, 2 * kMinChunkBytes);
  EXPECT_EQ(chunks[2].length, 5u);
  EXPECT_EQ(chunks[3].tensor, 1u);
  EXPECT_EQ(chunks[3].data, two.msg.tensors[1].data);
  // The TensorPipe message carries chunked tensors as empty placeholders.
  tensorpipe::Message out = ToTensorPipe(two.msg);
  ASSERT_EQ(out.tensors.size(), 2u);
  EXPECT_EQ(out.tensors[0].length, 0u);
  // A peer's sizes may be anything.
  v1::TensorDescriptor huge;
  huge.set_nbytes(std::numeric_limits<uint64_t>::max());
  huge.set_chunk_bytes(kMinChunkBytes);
  EXPECT_EQ(ChunkCount(huge), std::numeric_limits<uint64_t>::max() / kMinChunkBytes + 1);
}

TEST(WireTest, HeapDestinationAlignsEachTensorAndCheckDestinationNamesWhatIsMissing) {
  const std::vector<size_t> sizes = {3, 0, 100};
  absl::StatusOr<Destination> placed = HeapDestination(7, sizes);
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_NE(placed->payload, nullptr);
  EXPECT_EQ(placed->tensors[1], nullptr);
  for (size_t i : {size_t{0}, size_t{2}}) {
    const auto offset =
        static_cast<char*>(placed->tensors[i]) - static_cast<char*>(placed->payload);
    EXPECT_EQ(offset % kTensorAlignment, 0) << i;
    EXPECT_GE(offset, 7) << i;
  }
  EXPECT_TRUE(CheckDestination(*placed, 7, sizes).ok());
  Destination missing = *placed;
  missing.tensors[2] = nullptr;
  EXPECT_THAT(CheckDestination(missing, 7, sizes).message(), HasSubstr("no buffer for tensor 2"));
  EXPECT_THAT(CheckDestination(*placed, 7, {3}).message(), HasSubstr("3 tensor buffers for 1"));
  Destination none;
  EXPECT_THAT(CheckDestination(none, 1, {}).message(), HasSubstr("no payload buffer"));
}

// A well-formed handshake message of `step` as a peer would send it.
tensorpipe::Descriptor Hello(v1::PipeHello::Step step, v1::PipeHello* fill = nullptr) {
  const v1::PipeHello hello = WellFormedHello(step);
  if (fill != nullptr) fill->MergeFrom(hello);
  tensorpipe::Descriptor descriptor;
  descriptor.metadata = hello.SerializeAsString();
  return descriptor;
}

TEST(WireTest, ParseHelloAcceptsEachStepAndRefusesEveryMalformedOne) {
  for (auto step : {v1::PipeHello::CHALLENGE, v1::PipeHello::ANSWER, v1::PipeHello::PROOF}) {
    v1::PipeHello parsed;
    EXPECT_TRUE(ParseHello(Hello(step), step, &parsed).ok()) << step;
  }
  auto refused = [](const tensorpipe::Descriptor& descriptor, v1::PipeHello::Step step) {
    v1::PipeHello parsed;
    return std::string(ParseHello(descriptor, step, &parsed).message());
  };
  EXPECT_THAT(refused(Hello(v1::PipeHello::ANSWER), v1::PipeHello::CHALLENGE),
              HasSubstr("expected handshake step CHALLENGE"));
  tensorpipe::Descriptor with_data = Hello(v1::PipeHello::CHALLENGE);
  with_data.payloads.emplace_back();
  EXPECT_THAT(refused(with_data, v1::PipeHello::CHALLENGE), HasSubstr("sent data before"));
  tensorpipe::Descriptor garbage;
  garbage.metadata = std::string(kMaxHelloBytes + 1, 'x');
  EXPECT_THAT(refused(garbage, v1::PipeHello::CHALLENGE), HasSubstr("not a PipeHello"));
  v1::PipeHello hello;
  Hello(v1::PipeHello::CHALLENGE, &hello);
  hello.set_version("tpd-pipe-v0");
  tensorpipe::Descriptor old;
  old.metadata = hello.SerializeAsString();
  EXPECT_THAT(refused(old, v1::PipeHello::CHALLENGE), HasSubstr("(another release?)"));
  hello.set_version(std::string(kPipeAuthVersion));
  for (int i = 0; i < kMaxUrls; ++i) hello.add_urls("uv://x");
  tensorpipe::Descriptor many;
  many.metadata = hello.SerializeAsString();
  EXPECT_THAT(refused(many, v1::PipeHello::CHALLENGE), HasSubstr("malformed"));
  v1::PipeHello unsigned_answer;
  Hello(v1::PipeHello::ANSWER, &unsigned_answer);
  unsigned_answer.clear_mac();
  tensorpipe::Descriptor no_mac;
  no_mac.metadata = unsigned_answer.SerializeAsString();
  EXPECT_THAT(refused(no_mac, v1::PipeHello::ANSWER), HasSubstr("carries no MAC"));
}

TEST(WireTest, ClaimedPeerIsBoundedForLogs) {
  v1::PipeHello hello;
  hello.set_agent_id(std::string(1000, 'a'));
  for (int i = 0; i < 10; ++i) hello.add_urls("uv://h:1");
  const std::string claimed = ClaimedPeer(hello, "other");
  EXPECT_LT(claimed.size(), kMaxIdBytes * 2 + 100);
  EXPECT_THAT(claimed, HasSubstr("[context other]"));
  EXPECT_EQ(ClaimedPeer(v1::PipeHello(), ""), "?");
}

}  // namespace
}  // namespace tpd::agent
