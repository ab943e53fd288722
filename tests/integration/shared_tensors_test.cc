// Host tensors between two sessions of one uid and gid, against the real daemon: the daemon
// copies none of 64 KiB or more, the receiver reads them in the sender's memory, mapped
// read-only (docs/data_plane.md, "Tensors shared between sessions"), and the sender's block
// stays allocated while the receiver holds them. What another uid gets is in trust_test
// (`AnotherUsersSessionsNeverMapEachOthersMemory`).

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/descriptor.h"
#include "shm/segment.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/test_bytes.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using testing::Checksum;
using testing::DaemonProcess;
using testing::Pattern;
using testing::TempDir;
using testing::WaitUntil;

constexpr int64_t kArenaBytes = 16 << 20;
constexpr int64_t kLarge = 1 << 20;  // above Delivery's kShareMinBytes (64 KiB)

// The permissions of the mapping of this process holding `at` ("r--s"), or "" when none.
std::string MappingOf(const void* at) {
  const auto address = reinterpret_cast<uintptr_t>(at);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms;
    fields >> range >> perms;
    const size_t dash = range.find('-');
    const uintptr_t begin = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (address >= begin && address < end) return perms;
  }
  return "";
}

class SharedTensorsTest : public ::testing::Test {
 protected:
  void Start(bool share_memory = true) {
    socket_ = absl::StrCat(dir_.path(), "/tpd.sock");
    const std::string config = dir_.WriteFile(
        "tpd.toml", absl::StrCat("[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"secret\"\n",
                                 "node_name = \"shared\"\n[data]\narena_bytes = ", kArenaBytes,
                                 "\nshare_memory = ", share_memory ? "true" : "false", "\n"));
    auto daemon = DaemonProcess::Start(socket_, {"--config", config});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    a_ = Connect();
    b_ = Connect();
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    ASSERT_TRUE(Join(a_.get(), "a").ok());
    ASSERT_TRUE(Join(b_.get(), "b").ok());
    // b keeps every request's tensors (until the test drops them) and answers with checksums.
    ASSERT_TRUE(b_->Handle("keep", [this](const Message& request) -> absl::StatusOr<Message> {
                    absl::MutexLock lock(&mu_);
                    std::string sums;
                    for (const Tensor& t : request.tensors) {
                      absl::StrAppend(&sums, Checksum(t.data()), ",");
                      kept_.push_back(t);
                    }
                    return Message{sums, {}, ""};
                  }).ok());
  }

  std::unique_ptr<Client> Connect() {
    auto client = Client::Connect(socket_);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  absl::Status Join(Client* client, const std::string& name) {
    if (init_method_.empty()) {
      init_method_ = absl::StrCat("tcp://", client->Status()->peer_address());
    }
    JoinOptions options;
    options.group = "g";
    options.name = name;
    options.init_method = init_method_;
    options.timeout = absl::Seconds(20);
    return client->Join(options).status();
  }

  // An arena tensor of a_ holding Pattern(bytes, seed).
  Tensor ArenaTensor(int64_t bytes, int seed) {
    absl::StatusOr<Tensor> tensor = a_->AllocateTensor(shm::DType::kUInt8, {bytes});
    EXPECT_TRUE(tensor.ok()) << tensor.status();
    if (!tensor.ok()) return Tensor();
    const std::string pattern = Pattern(bytes, seed);
    std::memcpy(tensor->mutable_data(), pattern.data(), pattern.size());
    return *std::move(tensor);
  }

  std::vector<Tensor> Kept() {
    absl::MutexLock lock(&mu_);
    return kept_;
  }
  void DropKept() {
    absl::MutexLock lock(&mu_);
    kept_.clear();
  }

  uint64_t BytesShared(Client* client) {
    absl::StatusOr<v1::StatusResponse> status = client->Status();
    uint64_t bytes = 0;
    if (status.ok()) {
      for (const auto& session : status->attached_sessions()) bytes += session.bytes_shared();
    }
    return bytes;
  }

  TempDir dir_;
  std::string socket_;
  std::string init_method_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> a_;
  std::unique_ptr<Client> b_;
  absl::Mutex mu_;
  std::vector<Tensor> kept_ ABSL_GUARDED_BY(mu_);
};

TEST_F(SharedTensorsTest, LargeTensorsAreReadInTheSendersMemoryMappedReadOnly) {
  Start();
  absl::StatusOr<std::shared_ptr<const shm::Segment>> b_segment = b_->AttachSharedMemory();
  ASSERT_TRUE(b_segment.ok()) << b_segment.status();
  Tensor large = ArenaTensor(kLarge, 3);
  Tensor small = ArenaTensor(4 << 10, 4);
  const std::string large_sum = std::to_string(Checksum(large.data()));
  const std::string small_sum = std::to_string(Checksum(small.data()));
  absl::StatusOr<Message> reply = a_->Call("g", "b", "keep", "", {large, small}, absl::Seconds(30));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, absl::StrCat(large_sum, ",", small_sum, ","));

  std::vector<Tensor> kept = Kept();
  ASSERT_EQ(kept.size(), 2u);
  // The large one lies outside b's own segment, in a mapping b cannot write; the small one was
  // copied into b's rx heap as before.
  const auto* b_base = (*b_segment)->base();
  const auto* large_at = reinterpret_cast<const uint8_t*>(kept[0].data().data());
  EXPECT_TRUE(kept[0].in_sender_memory());
  EXPECT_TRUE(large_at < b_base || large_at >= b_base + (*b_segment)->size());
  EXPECT_EQ(MappingOf(large_at), "r--s");
  EXPECT_EQ(std::to_string(Checksum(kept[0].data())), large_sum);
  EXPECT_FALSE(kept[1].in_sender_memory());
  EXPECT_TRUE(
      (*b_segment)
          ->layout()
          .rx_heap.Contains(reinterpret_cast<const uint8_t*>(kept[1].data().data()) - b_base,
                            kept[1].size()));
  EXPECT_EQ(b_->GetCallStats()->tensors_received_shared, 1u);
  EXPECT_EQ(b_->GetCallStats()->peer_segments_mapped, 1u);
  EXPECT_EQ(BytesShared(b_.get()), static_cast<uint64_t>(kLarge)) << "Admin.Status counts it";
  EXPECT_TRUE(b_->Status()->config().data_share_memory());

  // a's block stays allocated while b holds the view, though a dropped its tensors: the
  // daemon gives it back only when b's client releases the message.
  large = Tensor();
  small = Tensor();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_GE(a_->GetCallStats()->arena_live_blocks, 1u);
  EXPECT_EQ(std::to_string(Checksum(kept[0].data())), large_sum) << "still intact";
  kept.clear();
  DropKept();
  EXPECT_TRUE(WaitUntil([&] { return a_->GetCallStats()->arena_live_blocks == 0; }))
      << a_->GetCallStats()->arena_live_blocks << " blocks of a's arena still live";
}

TEST_F(SharedTensorsTest, AnArenaTensorIsInFlightUntilTheReceiverLetsGoOfIt) {
  Start();
  Tensor large = ArenaTensor(kLarge, 8);
  ASSERT_TRUE(a_->Call("g", "b", "keep", "", {large}, absl::Seconds(30)).ok());
  // The call returned, but b still reads a's tensor in place: a must not write into it yet.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(large.in_flight());
  DropKept();
  EXPECT_TRUE(WaitUntil([&] { return !large.in_flight(); })) << "b let go: a may write again";
  EXPECT_FALSE(Tensor(shm::DType::kUInt8, {4}, "abcd").in_flight()) << "owned: copied when sent";
}

TEST_F(SharedTensorsTest, RepliesAreSharedTooAndTheReceivedViewHoldsTheRepliersBlock) {
  Start();
  absl::StatusOr<Tensor> answer = b_->AllocateTensor(shm::DType::kFloat32, {kLarge / 4});
  ASSERT_TRUE(answer.ok()) << answer.status();
  const std::string pattern = Pattern(kLarge, 9);
  std::memcpy(answer->mutable_data(), pattern.data(), pattern.size());
  ASSERT_TRUE(b_->Handle("give", [&](const Message&) -> absl::StatusOr<Message> {
                  return Message{"", {*answer}, ""};
                }).ok());
  absl::StatusOr<Message> reply = a_->Call("g", "b", "give", "", {}, absl::Seconds(30));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->tensors.size(), 1u);
  EXPECT_TRUE(reply->tensors[0].in_sender_memory());
  EXPECT_EQ(reply->tensors[0].dtype(), shm::DType::kFloat32);
  EXPECT_EQ(Checksum(reply->tensors[0].data()), Checksum(pattern));
  EXPECT_EQ(a_->GetCallStats()->tensors_received_shared, 1u);
  *answer = Tensor();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_GE(b_->GetCallStats()->arena_live_blocks, 1u) << "a's view holds b's block";
  reply = absl::CancelledError("dropped");
  EXPECT_TRUE(WaitUntil([&] { return b_->GetCallStats()->arena_live_blocks == 0; }));
}

TEST_F(SharedTensorsTest, ViewsOutliveTheSenderAndItsMappingGoesWithTheLastOne) {
  Start();
  Tensor large = ArenaTensor(kLarge, 5);
  const uint64_t sum = Checksum(large.data());
  ASSERT_TRUE(a_->Call("g", "b", "keep", "", {large}, absl::Seconds(30)).ok());
  large = Tensor();
  std::vector<Tensor> kept = Kept();  // the test's own views
  ASSERT_EQ(kept.size(), 1u);
  const void* at = kept[0].data().data();
  // The sender goes: its session ends and b hears so (kPeerGone), but b's view still reads
  // what was sent (b's mapping keeps the memory).
  a_.reset();
  EXPECT_TRUE(WaitUntil([&] { return b_->GetCallStats()->peer_segments_mapped == 0; }))
      << "b was told the sender's session ended";
  EXPECT_EQ(Checksum(kept[0].data()), sum);
  EXPECT_EQ(MappingOf(at), "r--s");
  DropKept();
  EXPECT_EQ(MappingOf(at), "r--s") << "the test's view holds it";
  kept.clear();
  EXPECT_EQ(MappingOf(at), "") << "unmapped with its last view";
}

TEST_F(SharedTensorsTest, AClientThatTakesNoTensorsInSendersMemoryGetsCopiesOthersStillShare) {
  Start();
  ClientOptions options;
  options.tensors_in_sender_memory = false;
  absl::StatusOr<std::unique_ptr<Client>> copying = Client::Connect(socket_, options);
  ASSERT_TRUE(copying.ok()) << copying.status();
  ASSERT_TRUE(Join(copying->get(), "c").ok());
  ASSERT_TRUE((*copying)
                  ->Handle("sum",
                           [](const Message& request) -> absl::StatusOr<Message> {
                             return Message{std::to_string(Checksum(request.tensors.at(0).data())) +
                                                (request.tensors[0].in_sender_memory() ? " shared"
                                                                                       : " copied"),
                                            {},
                                            ""};
                           })
                  .ok());
  Tensor large = ArenaTensor(kLarge, 7);
  const std::string sum = std::to_string(Checksum(large.data()));
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Message> reply = a_->Call("g", "c", "sum", "", {large}, absl::Seconds(30));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->payload, sum + " copied") << "call " << i;
  }
  EXPECT_EQ((*copying)->GetCallStats()->peer_segments_mapped, 0u);
  // b, which takes them, still reads a's memory.
  ASSERT_TRUE(a_->Call("g", "b", "keep", "", {large}, absl::Seconds(30)).ok());
  ASSERT_EQ(Kept().size(), 1u);
  EXPECT_TRUE(Kept()[0].in_sender_memory());
  DropKept();
}

TEST_F(SharedTensorsTest, ShareMemoryOffCopiesEveryTensor) {
  Start(/*share_memory=*/false);
  Tensor large = ArenaTensor(kLarge, 6);
  const std::string sum = std::to_string(Checksum(large.data()));
  absl::StatusOr<Message> reply = a_->Call("g", "b", "keep", "", {large}, absl::Seconds(30));
  ASSERT_TRUE(reply.ok()) << reply.status();
  // Copied by the daemon: once it has read it, a may write, whatever b keeps.
  EXPECT_TRUE(WaitUntil([&] { return !large.in_flight(); }));
  EXPECT_EQ(reply->payload, absl::StrCat(sum, ","));
  ASSERT_EQ(Kept().size(), 1u);
  EXPECT_FALSE(Kept()[0].in_sender_memory());
  EXPECT_EQ(b_->GetCallStats()->peer_segments_mapped, 0u);
  EXPECT_EQ(BytesShared(b_.get()), 0u);
  EXPECT_FALSE(b_->Status()->config().data_share_memory()) << "Admin.Status shows the setting";
  DropKept();
}

}  // namespace
}  // namespace tpd
