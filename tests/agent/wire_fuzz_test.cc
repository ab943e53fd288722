// Mutation drivers over what a peer sends before the agent trusts it: the header and
// TensorPipe descriptor of an incoming message (CheckIncoming) and each handshake step
// (ParseHello). Seeded, so a failure replays; every mutant is refused or, when accepted,
// within the bounds the agent relies on.

#include <cstdint>
#include <random>
#include <string>

#include "agent/pipe_auth.h"
#include "agent/wire.h"
#include "gtest/gtest.h"
#include "proto/agent.pb.h"
#include "tests/agent/well_formed_hello.h"

namespace tpd::agent {
namespace {

constexpr uint64_t kMaxBytes = uint64_t{64} << 20;
constexpr int kRounds = 20000;

// Changes 1-3 bytes, cuts the tail or appends junk: protobuf parsing is what the mutants
// exercise first, then the checks on whatever parses.
std::string Mutate(std::string bytes, std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0:
      if (!bytes.empty()) bytes.resize(rng() % bytes.size());
      break;
    case 1:
      for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(rng()));
      break;
    default:
      for (int m = 1 + static_cast<int>(rng() % 3); m > 0 && !bytes.empty(); --m) {
        bytes[rng() % bytes.size()] = static_cast<char>(rng());
      }
  }
  return bytes;
}

// A request with a 100-byte payload and three tensors: empty, 4 KiB, and 3 MiB in 1 MiB chunks.
void SeedMessage(v1::AgentMessage* header, tensorpipe::Descriptor* descriptor) {
  header->set_kind(v1::AgentMessage::REQUEST);
  header->set_method("echo");
  header->set_payload_bytes(100);
  descriptor->payloads.resize(1);
  descriptor->payloads[0].length = 100;
  for (uint64_t nbytes : {uint64_t{0}, uint64_t{4096}, uint64_t{3} << 20}) {
    v1::TensorDescriptor* tensor = header->add_tensors();
    tensor->set_dtype("uint8");
    tensor->add_shape(static_cast<int64_t>(nbytes));
    tensor->set_nbytes(nbytes);
    tensorpipe::Descriptor::Tensor wire;
    wire.length = nbytes > 4096 ? 0 : nbytes;
    wire.sourceDevice = tensorpipe::Device{tensorpipe::kCpuDeviceType, 0};
    descriptor->tensors.push_back(wire);
    if (nbytes > 4096) tensor->set_chunk_bytes(uint64_t{1} << 20);
  }
}

TEST(WireFuzzTest, MutatedIncomingMessagesAreRefusedOrWithinTheirBounds) {
  v1::AgentMessage seed_header;
  tensorpipe::Descriptor seed;
  SeedMessage(&seed_header, &seed);
  ASSERT_TRUE(CheckIncoming(seed, seed_header, kMaxBytes).ok());
  const std::string seed_bytes = seed_header.SerializeAsString();
  const uint64_t lengths[] = {0, 1, 100, 4096, kMaxBytes, ~uint64_t{0}};
  std::mt19937_64 rng(17);
  int accepted = 0, refused = 0;
  for (int round = 0; round < kRounds; ++round) {
    v1::AgentMessage header;
    if (!header.ParseFromString(Mutate(seed_bytes, rng))) continue;
    tensorpipe::Descriptor descriptor = seed;
    if (rng() % 2 == 0) descriptor.payloads[0].length = lengths[rng() % 6];
    if (rng() % 3 == 0) descriptor.tensors[rng() % 3].length = lengths[rng() % 6];
    if (rng() % 8 == 0) descriptor.tensors.pop_back();
    absl::StatusOr<IncomingSizes> sizes = CheckIncoming(descriptor, header, kMaxBytes);
    if (!sizes.ok()) {
      EXPECT_EQ(sizes.status().code(), absl::StatusCode::kInvalidArgument);
      ++refused;
      continue;
    }
    ++accepted;
    // What the agent then allocates and reads must match what TensorPipe will deliver.
    ASSERT_EQ(sizes->tensors.size(), descriptor.tensors.size());
    ASSERT_EQ(static_cast<int>(sizes->tensors.size()), header.tensors_size());
    uint64_t total = sizes->payload;
    uint64_t main = sizes->payload;
    for (size_t i = 0; i < sizes->tensors.size(); ++i) {
      EXPECT_LE(sizes->tensors[i], kMaxBytes);
      total += sizes->tensors[i];
      main += descriptor.tensors[i].length;
    }
    EXPECT_LE(total, kMaxBytes);
    EXPECT_EQ(sizes->main_bytes, main);
    EXPECT_LE(sizes->chunked_bytes, total);
    EXPECT_LE(sizes->chunks, kMaxChunksPerMessage);
  }
  // The driver reached both sides of the checks.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
}

TEST(WireFuzzTest, MutatedHandshakeMessagesAreRefusedOrWellFormed) {
  std::mt19937_64 rng(29);
  int accepted = 0, refused = 0;
  for (v1::PipeHello::Step step :
       {v1::PipeHello::CHALLENGE, v1::PipeHello::ANSWER, v1::PipeHello::PROOF}) {
    const std::string seed_bytes = WellFormedHello(step).SerializeAsString();
    for (int round = 0; round < kRounds / 3; ++round) {
      tensorpipe::Descriptor descriptor;
      descriptor.metadata = Mutate(seed_bytes, rng);
      if (rng() % 16 == 0) descriptor.payloads.resize(1);
      v1::PipeHello hello;
      absl::Status parsed = ParseHello(descriptor, step, &hello);
      // Who it claims to be is logged whatever it sent: bounded by the message it came in.
      EXPECT_LE(ClaimedPeer(hello, "ctx").size(), kMaxHelloBytes + kMaxIdBytes + 16);
      if (!parsed.ok()) {
        EXPECT_EQ(parsed.code(), absl::StatusCode::kInvalidArgument);
        ++refused;
        continue;
      }
      ++accepted;
      EXPECT_TRUE(descriptor.payloads.empty() && descriptor.tensors.empty());
      EXPECT_EQ(hello.version(), kPipeAuthVersion);
      EXPECT_EQ(hello.step(), step);
      if (step != v1::PipeHello::PROOF) {
        EXPECT_EQ(hello.nonce().size(), kPipeNonceBytes);
        EXPECT_FALSE(hello.agent_id().empty());
        EXPECT_LE(hello.agent_id().size(), kMaxIdBytes);
        EXPECT_LE(hello.urls_size(), kMaxUrls);
      }
      if (step != v1::PipeHello::CHALLENGE) EXPECT_EQ(hello.mac().size(), 32u);
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace tpd::agent
