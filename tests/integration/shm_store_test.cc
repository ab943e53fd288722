// The store over shared memory (docs/data_plane.md, "The store over shared memory"), against
// the real daemon: a client attached to shared memory sends its Store calls through its
// session's rings (Op::kStore) and gets what gRPC would answer; one that is not attached still
// uses gRPC; what a session writes into such a call is checked like any request.

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/store.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/one_daemon.h"
#include "tests/testing/raw_session.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::TempDir;

class ShmStoreTest : public testing::OneDaemonTest {
 protected:
  void SetUp() override {
    testing::OneDaemonConfig config;
    config.node_name = "store";
    config.more_sections = "[store]\nmax_key_bytes = 64\n";
    StartDaemon(config);
  }

  // A client attached to shared memory, so its store calls go through its rings.
  std::unique_ptr<Client> Attached() {
    std::unique_ptr<Client> client = Plain();
    if (client == nullptr) return nullptr;
    absl::StatusOr<std::shared_ptr<const shm::Segment>> segment = client->AttachSharedMemory();
    EXPECT_TRUE(segment.ok()) << segment.status();
    return client;
  }

  std::unique_ptr<Client> Plain() { return Connect(); }

  int64_t StoreCallsServed(Client* client, const std::string& method) {
    absl::StatusOr<v1::StatusResponse> status = client->Status();
    if (!status.ok()) return -1;
    auto it = status->store().calls().find(method);
    return it == status->store().calls().end() ? 0 : it->second;
  }
};

TEST_F(ShmStoreTest, AnAttachedClientsStoreCallsGoThroughItsRingsWithGrpcsAnswers) {
  std::unique_ptr<Client> a = Attached();
  std::unique_ptr<Client> plain = Plain();
  ASSERT_TRUE(a && plain);
  const int64_t served_before = StoreCallsServed(plain.get(), "Set");
  ASSERT_TRUE(a->Store().Set("k", "v1").ok());
  EXPECT_EQ(*plain->Store().Get("k"), "v1") << "the same store over gRPC";
  EXPECT_EQ(*a->Store().Get("k"), "v1");
  EXPECT_EQ(*a->Store().Add("n", 5), 5);
  EXPECT_EQ(*a->Store().Add("n", -2), 3);
  EXPECT_EQ(*plain->Store().Add("n", 1), 4);
  EXPECT_TRUE(*a->Store().Check({"k", "n"}));
  EXPECT_FALSE(*a->Store().Check({"k", "missing"}));
  EXPECT_EQ(*a->Store().CompareSet("k", "v1", "v2"), "v2");
  ASSERT_TRUE(a->Store().Append("k", "+").ok());
  EXPECT_EQ(*plain->Store().Get("k"), "v2+");
  ASSERT_TRUE(a->Store().MultiSet({"m1", "m2"}, {"x", "y"}).ok());
  EXPECT_EQ(*a->Store().MultiGet({"m1", "m2"}), (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(*a->Store().DeleteKey("m1"));
  EXPECT_EQ(*a->Store("ns").NumKeys(), 0);
  ASSERT_TRUE(a->Store("ns").Set("k", "in ns").ok());
  EXPECT_EQ(*plain->Store("ns").Get("k"), "in ns") << "namespaces as over gRPC";
  EXPECT_EQ(*a->Store("ns").NumKeys(), 1);

  const CallEngineStats stats = *a->GetCallStats();
  EXPECT_EQ(stats.store_calls, 14u) << "every one of a's calls went through its rings";
  EXPECT_EQ(StoreCallsServed(plain.get(), "Set"), served_before + 2)
      << "Admin.Status counts them with the gRPC ones";
  EXPECT_FALSE(plain->GetCallStats().ok() && plain->GetCallStats()->store_calls > 0)
      << "a client that is not attached stays on gRPC";
}

TEST_F(ShmStoreTest, WaitsEndWhenTheKeysComeOrAtTheirTimeoutWithoutHoldingTheSession) {
  std::unique_ptr<Client> a = Attached();
  std::unique_ptr<Client> b = Attached();
  ASSERT_TRUE(a && b);
  auto waited = std::async(std::launch::async, [&] { return a->Store().Wait({"w1", "w2"}); });
  auto got =
      std::async(std::launch::async, [&] { return a->Store().Get("w2", absl::Seconds(20)); });
  // While a waits, its session serves its other calls (the wait holds no daemon thread).
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(a->Store().Set("other", "x").ok());
  ASSERT_TRUE(b->Store().Set("w1", "1").ok());
  ASSERT_TRUE(b->Store().Set("w2", "2").ok());
  EXPECT_TRUE(waited.get().ok());
  absl::StatusOr<std::string> value = got.get();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "2");

  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> missing = a->Store().Get("never", absl::Milliseconds(200));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("never"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(ShmStoreTest, TheDaemonsErrorsAndLimitsAreTheSameAsOverGrpc) {
  std::unique_ptr<Client> a = Attached();
  std::unique_ptr<Client> plain = Plain();
  ASSERT_TRUE(a && plain);
  const absl::Status reserved = a->Store().Set("tpd/group/g/v/1", "forged");
  const absl::Status reserved_grpc = plain->Store().Set("tpd/group/g/v/1", "forged");
  EXPECT_EQ(reserved.code(), absl::StatusCode::kPermissionDenied) << reserved;
  EXPECT_EQ(reserved.ToString(), reserved_grpc.ToString());
  const std::string long_key(65, 'k');
  const absl::Status too_long = a->Store().Set(long_key, "v");
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument) << too_long;
  EXPECT_THAT(too_long.message(), HasSubstr("store.max_key_bytes"));
  EXPECT_EQ(too_long.ToString(), plain->Store().Set(long_key, "v").ToString());
  const absl::Status group = a->GroupStore("nogroup").Set("k", "v");
  EXPECT_EQ(group.code(), absl::StatusCode::kPermissionDenied) << group;
  EXPECT_EQ(group.ToString(), plain->GroupStore("nogroup").Set("k", "v").ToString());
  EXPECT_EQ(a->GetCallStats()->store_calls, 3u);
}

TEST_F(ShmStoreTest, GarbageInAStoreCallIsAnsweredAndTheSessionGoesOn) {
  std::unique_ptr<Client> client = Plain();
  ASSERT_NE(client, nullptr);
  auto raw = testing::RawSession::Open(std::move(client));
  ASSERT_TRUE(raw.ok()) << raw.status();
  testing::RawSession& session = **raw;
  const uint64_t tx = session.layout.tx_heap.offset;
  v1::SetRequest set;
  set.set_key("raw");
  set.set_value("ok");
  ASSERT_TRUE(session.SubmitStore(tx, "", "Set", "\xff\xff\xff garbage", 1));
  ASSERT_TRUE(session.SubmitStore(tx + 4096, "", "Shutdown", set.SerializeAsString(), 2));
  ASSERT_TRUE(session.SubmitStore(tx + 8192, "g/../x", "Set", set.SerializeAsString(), 3));
  ASSERT_TRUE(session.SubmitStore(tx + 12288, "", "Set", set.SerializeAsString(), 4));
  auto replies = session.Replies(4, absl::Now() + absl::Seconds(10));
  ASSERT_EQ(replies.size(), 4u);
  EXPECT_EQ(replies[1].first, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(replies[1].second, HasSubstr("SetRequest over shared memory that does not parse"));
  EXPECT_EQ(replies[2].first, absl::StatusCode::kUnimplemented);
  EXPECT_THAT(replies[2].second, HasSubstr("no method 'Shutdown'"));
  EXPECT_EQ(replies[3].first, absl::StatusCode::kInvalidArgument) << replies[3].second;
  EXPECT_EQ(replies[4].first, absl::StatusCode::kOk) << replies[4].second;
  std::unique_ptr<Client> other = Plain();
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(*other->Store().Get("raw"), "ok") << "the well-formed call went through";
}

}  // namespace
}  // namespace tpd
