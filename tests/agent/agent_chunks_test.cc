// Tensors sent in chunks after their message (TensorDescriptor.chunk_bytes), between two real
// agents: each chunk is written only once its sender says its bytes are final, in whatever
// order that happens; the receiver sees each chunk land once (Destination::on_chunk) before
// the message is delivered; requests and responses both; a chunk its sender cannot produce
// fails the message (and only it); chunks that stop coming close the pipe at chunk_timeout,
// and the next call opens a new one. What a peer may not send in chunks (bad offsets, chunks
// of unknown messages) is checked in agent.cc's OnChunk and covered by its error wording here
// through what a sender can produce.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/agent.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_testing.h"
#include "tests/testing/wait_until.h"

namespace tpd::agent {
namespace {

using testing::CallAndWait;
using testing::Checksum;
using ::testing::HasSubstr;
using testing::MakeMessage;
using testing::PeerOf;
using testing::TestOptions;

constexpr uint64_t kChunk = kMinChunkBytes;

// Holds every ChunkReady the agent hands out until the test releases them, so chunks become
// ready late and in an order the test picks. Before releasing a chunk it copies the chunk's
// real bytes into the buffer the agent will write from: a chunk written before its `ready`
// would carry zeroes.
class ChunkGate {
 public:
  struct Pending {
    size_t tensor;
    uint64_t offset;
    uint64_t length;
    ChunkReady ready;
  };

  std::function<void(size_t, uint64_t, uint64_t, ChunkReady)> Hook() {
    return [this](size_t tensor, uint64_t offset, uint64_t length, ChunkReady ready) {
      absl::MutexLock lock(&mu_);
      pending_.push_back({tensor, offset, length, std::move(ready)});
      cv_.SignalAll();
    };
  }

  // Waits (up to 30 s) until `count` chunks were asked for and takes them.
  std::vector<Pending> Take(size_t count) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    absl::MutexLock lock(&mu_);
    while (pending_.size() < count && absl::Now() < deadline) {
      cv_.WaitWithDeadline(&mu_, deadline);
    }
    std::vector<Pending> out = std::move(pending_);
    pending_.clear();
    return out;
  }

 private:
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
};

// A message whose tensors `chunked` go in chunks of kChunk; their buffers start zeroed, and
// `truth` holds what they must carry once each chunk is released.
struct ChunkedMessage {
  Message message;
  std::vector<std::vector<char>> truth;
};

ChunkedMessage MakeChunked(const std::vector<size_t>& sizes, const std::set<size_t>& chunked,
                           uint64_t seed) {
  ChunkedMessage out;
  out.message = MakeMessage("chunks", 100, sizes, seed);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const Buffer& tensor = out.message.tensors[i];
    const char* bytes = static_cast<const char*>(tensor.data);
    out.truth.emplace_back(bytes, bytes + tensor.size);
    if (chunked.count(i) > 0) {
      out.message.header.mutable_tensors(static_cast<int>(i))->set_chunk_bytes(kChunk);
      std::memset(tensor.data, 0, tensor.size);
    }
  }
  return out;
}

void Release(ChunkGate::Pending& chunk, const ChunkedMessage& source) {
  std::memcpy(static_cast<char*>(source.message.tensors[chunk.tensor].data) + chunk.offset,
              source.truth[chunk.tensor].data() + chunk.offset, chunk.length);
  chunk.ready(absl::OkStatus());
}

std::vector<uint64_t> TruthSums(const ChunkedMessage& source) {
  std::vector<uint64_t> sums;
  for (const auto& bytes : source.truth) sums.push_back(Checksum(bytes.data(), bytes.size()));
  return sums;
}

std::vector<uint64_t> TensorSums(const Message& message) {
  std::vector<uint64_t> sums;
  for (const Buffer& tensor : message.tensors) sums.push_back(Checksum(tensor.data, tensor.size));
  return sums;
}

// The callee: records the chunks that landed (on_chunk) per request, checks at delivery that
// every chunk landed once, and answers with the same tensors, sent in chunks again (each
// ready at once).
class ChunkEcho {
 public:
  explicit ChunkEcho(Agent& agent) : agent_(agent) {
    Handler handler;
    handler.allocate = [this](const v1::AgentMessage& header, size_t payload_size,
                              absl::Span<const size_t> sizes) -> absl::StatusOr<Destination> {
      auto storage = std::make_shared<std::vector<std::vector<char>>>();
      storage->emplace_back(payload_size);
      Destination destination;
      destination.payload = storage->back().data();
      for (size_t size : sizes) {
        storage->emplace_back(size);
        destination.tensors.push_back(storage->back().data());
      }
      auto landed = std::make_shared<Landed>();
      destination.on_chunk = [landed](size_t tensor, uint64_t offset, uint64_t length) {
        absl::MutexLock lock(&landed->mu);
        landed->chunks.push_back({tensor, offset, length});
      };
      {
        absl::MutexLock lock(&mu_);
        landed_by_buffer_[destination.payload] = landed;
      }
      destination.keepalive = std::move(storage);
      (void)header;
      return destination;
    };
    handler.deliver = [this](InboundRequest request) { Answer(std::move(request)); };
    agent.SetHandler(std::move(handler));
  }

  // The chunks that landed for each delivered request, (tensor, offset, length), sorted.
  std::vector<std::vector<std::tuple<size_t, uint64_t, uint64_t>>> delivered() {
    absl::MutexLock lock(&mu_);
    return delivered_;
  }

 private:
  struct Landed {
    absl::Mutex mu;
    std::vector<std::tuple<size_t, uint64_t, uint64_t>> chunks ABSL_GUARDED_BY(mu);
  };

  void Answer(InboundRequest request) {
    std::shared_ptr<Landed> landed;
    {
      absl::MutexLock lock(&mu_);
      auto it = landed_by_buffer_.find(request.message.payload.data);
      if (it != landed_by_buffer_.end()) {
        landed = it->second;
        landed_by_buffer_.erase(it);
      }
    }
    std::vector<std::tuple<size_t, uint64_t, uint64_t>> chunks;
    if (landed != nullptr) {
      absl::MutexLock lock(&landed->mu);
      chunks = landed->chunks;
    }
    std::sort(chunks.begin(), chunks.end());
    {
      absl::MutexLock lock(&mu_);
      delivered_.push_back(chunks);
    }
    Message response;
    response.header.set_method(request.message.header.method());
    *response.header.mutable_tensors() = request.message.header.tensors();
    response.payload = request.message.payload;
    response.tensors = request.message.tensors;
    response.keepalive = request.message.keepalive;
    response.when_chunk_ready = [](size_t, uint64_t, uint64_t, ChunkReady ready) {
      ready(absl::OkStatus());
    };
    agent_.Respond(request.reply_to, std::move(response));
  }

  Agent& agent_;
  absl::Mutex mu_;
  absl::flat_hash_map<const void*, std::shared_ptr<Landed>> landed_by_buffer_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<std::tuple<size_t, uint64_t, uint64_t>>> delivered_ ABSL_GUARDED_BY(mu_);
};

class AgentChunksTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(absl::Seconds(30)); }

  // Agents go before the handler they call into (~Agent joins their threads).
  void TearDown() override {
    a_.reset();
    b_.reset();
    echo_.reset();
  }

  void Start(absl::Duration chunk_timeout,
             uint64_t min_chunk_rate = AgentOptions().min_chunk_rate) {
    TearDown();
    auto a = Agent::Create(TestOptions("node-a"));
    ASSERT_TRUE(a.ok()) << a.status();
    AgentOptions options = TestOptions("node-b");
    options.chunk_timeout = chunk_timeout;
    options.min_chunk_rate = min_chunk_rate;
    auto b = Agent::Create(options);
    ASSERT_TRUE(b.ok()) << b.status();
    a_ = *std::move(a);
    b_ = *std::move(b);
    echo_ = std::make_unique<ChunkEcho>(*b_);
  }

  // Sends `source` from a to b and returns the outcome, releasing its chunks in reverse order
  // of the agent's asking (the last chunk first) from another thread.
  absl::StatusOr<Message> SendReleasingInReverse(ChunkedMessage& source, size_t chunks) {
    ChunkGate gate;
    source.message.when_chunk_ready = gate.Hook();
    std::thread releaser([&] {
      std::vector<ChunkGate::Pending> pending = gate.Take(chunks);
      EXPECT_EQ(pending.size(), chunks);
      std::reverse(pending.begin(), pending.end());
      for (ChunkGate::Pending& chunk : pending) {
        absl::SleepFor(absl::Milliseconds(2));
        Release(chunk, source);
      }
    });
    absl::StatusOr<Message> reply = CallAndWait(*a_, PeerOf(*b_), source.message);
    releaser.join();
    return reply;
  }

  std::unique_ptr<Agent> a_;
  std::unique_ptr<Agent> b_;
  std::unique_ptr<ChunkEcho> echo_;
};

TEST_F(AgentChunksTest, ChunksReadyOutOfOrderArriveWholeEachLandingOnceBeforeDelivery) {
  // 5 MiB in 5 chunks, an unchunked 100 B tensor, 3 MiB + 1 B in 4 chunks (the last 1 B).
  const std::vector<size_t> sizes = {5 * kChunk, 100, 3 * kChunk + 1};
  ChunkedMessage source = MakeChunked(sizes, {0, 2}, 7);
  absl::StatusOr<Message> reply = SendReleasingInReverse(source, 9);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header.kind(), v1::AgentMessage::RESPONSE);
  // The response came back in chunks too, and carries exactly the released bytes.
  EXPECT_EQ(reply->header.tensors(0).chunk_bytes(), kChunk);
  EXPECT_EQ(TensorSums(*reply), TruthSums(source));

  auto delivered = echo_->delivered();
  ASSERT_EQ(delivered.size(), 1u);
  std::vector<std::tuple<size_t, uint64_t, uint64_t>> expected;
  for (uint64_t k = 0; k < 5; ++k) expected.emplace_back(0, k * kChunk, kChunk);
  for (uint64_t k = 0; k < 3; ++k) expected.emplace_back(2, k * kChunk, kChunk);
  expected.emplace_back(2, 3 * kChunk, 1);
  EXPECT_EQ(delivered[0], expected);

  // Chunks count in the peer's bytes both ways (the request's last write may end just after
  // the reply came).
  const uint64_t message_bytes = 100 + 5 * kChunk + 100 + 3 * kChunk + 1;
  EXPECT_TRUE(tpd::testing::WaitUntil([&] {
    AgentStats stats = a_->Stats();
    return stats.peers.size() == 1 && stats.peers[0].bytes_sent == message_bytes;
  })) << a_->Stats().peers[0].bytes_sent;
  EXPECT_EQ(a_->Stats().peers[0].bytes_received, message_bytes);
}

TEST_F(AgentChunksTest, ManyChunkedCallsAtOnceEachGetTheirOwnBytes) {
  constexpr int kCalls = 8;
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int c = 0; c < kCalls; ++c) {
    threads.emplace_back([&, c] {
      ChunkedMessage source = MakeChunked({2 * kChunk + 17, 3 * kChunk}, {0, 1}, 100 + c);
      source.message.when_chunk_ready = [&source](size_t tensor, uint64_t offset, uint64_t length,
                                                  ChunkReady ready) {
        ChunkGate::Pending chunk{tensor, offset, length, std::move(ready)};
        Release(chunk, source);
      };
      absl::StatusOr<Message> reply = CallAndWait(*a_, PeerOf(*b_), source.message);
      if (reply.ok() && TensorSums(*reply) == TruthSums(source)) good.fetch_add(1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(good.load(), kCalls);
}

TEST_F(AgentChunksTest, AChunkItsSenderCannotProduceFailsOnlyThatMessage) {
  ChunkedMessage source = MakeChunked({3 * kChunk}, {0}, 11);
  source.message.when_chunk_ready = [&source](size_t tensor, uint64_t offset, uint64_t length,
                                              ChunkReady ready) {
    if (offset == kChunk) {
      ready(absl::DataLossError("cuMemcpyAsync failed: an illegal memory access"));
      return;
    }
    ChunkGate::Pending chunk{tensor, offset, length, std::move(ready)};
    Release(chunk, source);
  };
  absl::StatusOr<Message> reply = CallAndWait(*a_, PeerOf(*b_), source.message);
  // The receiver refused the request with the sender's reason: an ERROR answer, never
  // delivered to the handler.
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header.kind(), v1::AgentMessage::ERROR);
  EXPECT_EQ(reply->header.status_code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_THAT(reply->header.status_message(),
              HasSubstr("the sender could not send tensor 0: cuMemcpyAsync failed"));
  EXPECT_TRUE(echo_->delivered().empty());

  // The pipe carries on.
  ChunkedMessage next = MakeChunked({2 * kChunk}, {0}, 12);
  absl::StatusOr<Message> good = SendReleasingInReverse(next, 2);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(TensorSums(*good), TruthSums(next));
  EXPECT_EQ(a_->Stats().peers[0].state, PipeState::kReady);
  // The chunk sent as an error counts in no peer's bytes: (100 + 2 MiB) each call.
  EXPECT_TRUE(tpd::testing::WaitUntil([&] {
    return a_->Stats().peers[0].bytes_sent == 2 * (100 + 2 * kChunk);
  })) << a_->Stats().peers[0].bytes_sent;
}

TEST_F(AgentChunksTest, ChunksThatStopComingCloseThePipeAtChunkTimeoutAndTheNextCallWorks) {
  Start(absl::Milliseconds(300));
  ChunkedMessage source = MakeChunked({2 * kChunk}, {0}, 13);
  ChunkGate gate;  // never releases: the chunks stay unwritten
  source.message.when_chunk_ready = gate.Hook();
  const absl::Time start = absl::Now();
  absl::StatusOr<Message> reply = CallAndWait(*a_, PeerOf(*b_), source.message, absl::Seconds(20));
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << "closed by the receiver, not the deadline";
  EXPECT_TRUE(echo_->delivered().empty());
  // The chunks asked for are released late, into a closed pipe: nothing breaks.
  for (ChunkGate::Pending& chunk : gate.Take(2)) Release(chunk, source);

  ChunkedMessage next = MakeChunked({2 * kChunk}, {0}, 14);
  absl::StatusOr<Message> good = SendReleasingInReverse(next, 2);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(TensorSums(*good), TruthSums(next));
}

TEST_F(AgentChunksTest, ChunksDrippedWithinChunkTimeoutStillMustAllComeByTheRateBound) {
  // Each gap (500 ms) is far inside chunk_timeout (2 s), but 6 MiB at 1 GB/s plus 2 s is
  // about 2 s in all, and the drip takes 3 s: the receiver closes the pipe.
  Start(absl::Seconds(2), uint64_t{1} << 30);
  ChunkedMessage source = MakeChunked({6 * kChunk}, {0}, 17);
  ChunkGate gate;
  source.message.when_chunk_ready = gate.Hook();
  std::thread dripper([&] {
    for (ChunkGate::Pending& chunk : gate.Take(6)) {
      absl::SleepFor(absl::Milliseconds(500));
      Release(chunk, source);
    }
  });
  absl::StatusOr<Message> reply = CallAndWait(*a_, PeerOf(*b_), source.message, absl::Seconds(20));
  dripper.join();
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_TRUE(echo_->delivered().empty());
}

TEST_F(AgentChunksTest, ASenderMustGiveChunksOfAtLeastTheMinimumAndAWayToKnowTheyAreReady) {
  ChunkedMessage small = MakeChunked({3 * kChunk}, {0}, 15);
  small.message.header.mutable_tensors(0)->set_chunk_bytes(kChunk - 1);
  small.message.when_chunk_ready = [](size_t, uint64_t, uint64_t, ChunkReady ready) {
    ready(absl::OkStatus());
  };
  absl::StatusOr<Message> reply = CallAndWait(*a_, PeerOf(*b_), small.message);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reply.status().message(), HasSubstr("below the minimum"));

  ChunkedMessage no_hook = MakeChunked({3 * kChunk}, {0}, 16);
  reply = CallAndWait(*a_, PeerOf(*b_), no_hook.message);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reply.status().message(), HasSubstr("need when_chunk_ready"));
  EXPECT_TRUE(echo_->delivered().empty());
}

}  // namespace
}  // namespace tpd::agent
