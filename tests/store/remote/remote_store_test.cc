// RemoteStore against a real daemon's peer port: c10d semantics carry over the wire (the
// conformance suite, tests/store/store_conformance.cc, runs over it), waits hold no thread and
// can be cancelled, and the peer port admits only calls whose MAC the cluster token signed.

#include "store/remote/remote_store.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/prefix_store.h"
#include "tests/store/store_conformance.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/impostor_store.h"

namespace tpd::store {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "cluster-secret";

// A RemoteStore over the peer port of a fresh daemon of its own, whose store allows
// `max_waiters` pending waits; the suite counts them through a local client's Status.
class ServedRemoteStore : public StoreUnderTest {
 public:
  static std::unique_ptr<StoreUnderTest> Make(int64_t max_waiters) {
    auto served = std::unique_ptr<ServedRemoteStore>(new ServedRemoteStore());
    const std::string socket = absl::StrCat(served->dir_.path(), "/tpd.sock");
    const std::string config = served->dir_.WriteFile(
        "tpd.toml",
        absl::StrCat("[store]\nmax_waiters = ", max_waiters,
                     "\n[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"", kToken, "\"\n"));
    auto daemon = testing::DaemonProcess::Start(socket, {"--config", config});
    if (!daemon.ok()) {
      ADD_FAILURE() << daemon.status();
      return nullptr;
    }
    served->daemon_ = *std::move(daemon);
    auto client = Client::Connect(socket);
    if (!client.ok()) {
      ADD_FAILURE() << client.status();
      return nullptr;
    }
    served->local_ = *std::move(client);
    auto status = served->local_->Status();
    if (!status.ok()) {
      ADD_FAILURE() << status.status();
      return nullptr;
    }
    RemoteStoreOptions options;
    options.token = kToken;
    auto remote = RemoteStore::Create(status->peer_address(), options);
    if (!remote.ok()) {
      ADD_FAILURE() << remote.status();
      return nullptr;
    }
    served->remote_ = *std::move(remote);
    return served;
  }

  Store& store() override { return *remote_; }
  int64_t waiters() override {
    absl::StatusOr<v1::StatusResponse> status = local_->Status();
    return status.ok() ? status->store().waiters() : -1;
  }
  // A wait is a call to the daemon, answered after the call that started, woke or
  // cancelled it has returned.
  bool CompletesBeforeReturning() const override { return false; }

 private:
  ServedRemoteStore() = default;

  // Destroyed in reverse: the RemoteStore (ending its waits) before its daemon.
  testing::TempDir dir_;
  std::unique_ptr<testing::DaemonProcess> daemon_;
  std::unique_ptr<Client> local_;
  std::unique_ptr<RemoteStore> remote_;
};

INSTANTIATE_TEST_SUITE_P(RemoteStore, StoreConformanceTest,
                         ::testing::Values(StoreFactory(ServedRemoteStore::Make)));

class RemoteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = absl::StrCat(dir_.path(), "/tpd.sock");
    const std::string config = dir_.WriteFile(
        "tpd.toml",
        absl::StrCat("[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"", kToken, "\"\n"));
    auto daemon = testing::DaemonProcess::Start(socket_, {"--config", config});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    auto client = Client::Connect(socket_);
    ASSERT_TRUE(client.ok()) << client.status();
    local_ = *std::move(client);
    address_ = local_->Status()->peer_address();
    ASSERT_THAT(address_, HasSubstr("127.0.0.1:"));
  }

  std::unique_ptr<RemoteStore> Remote(std::string token = kToken) {
    RemoteStoreOptions options;
    options.token = std::move(token);
    auto remote = RemoteStore::Create(address_, options);
    EXPECT_TRUE(remote.ok()) << remote.status();
    return remote.ok() ? *std::move(remote) : nullptr;
  }

  testing::TempDir dir_;
  std::string socket_;
  std::string address_;
  std::unique_ptr<testing::DaemonProcess> daemon_;
  std::unique_ptr<Client> local_;
};

TEST_F(RemoteStoreTest, WritesThroughThePeerPortAreSeenByLocalClients) {
  std::unique_ptr<RemoteStore> remote_owner = Remote();
  ASSERT_NE(remote_owner, nullptr);
  RemoteStore& remote = *remote_owner;
  ASSERT_TRUE(remote.Set("k", "v").ok());
  EXPECT_EQ(*local_->Store().Get("k"), "v");
  EXPECT_EQ(*remote.Add("n", 3), 3);
  EXPECT_EQ(*local_->Store().Add("n", 4), 7);
  EXPECT_EQ(*remote.CompareSet("k", "v", "w"), "w");
  EXPECT_EQ(*remote.CompareSet("missing", "x", "y"), "x");
  ASSERT_TRUE(remote.Append("k", "+").ok());
  ASSERT_TRUE(remote.MultiSet({"a", "b"}, {"1", "2"}).ok());
  EXPECT_THAT(*remote.MultiGet({"k", "b"}, absl::Now() + absl::Seconds(5)),
              ::testing::ElementsAre("w+", "2"));
  EXPECT_TRUE(*remote.Check({"a", "b"}));
  EXPECT_TRUE(*remote.DeleteKey("a"));
  EXPECT_FALSE(*remote.DeleteKey("a"));
  EXPECT_EQ(*remote.NumKeys(""), 3);
}

TEST_F(RemoteStoreTest, PrefixStoreOverRemoteMatchesTheDaemonsNamespaces) {
  std::unique_ptr<RemoteStore> remote_owner = Remote();
  ASSERT_NE(remote_owner, nullptr);
  RemoteStore& remote = *remote_owner;
  PrefixStore group("group-7", &remote);
  ASSERT_TRUE(group.Set("rank0", "addr").ok());
  ClientOptions options;
  options.name_space = "group-7";
  auto in_group = Client::Connect(socket_, options);
  ASSERT_TRUE(in_group.ok());
  EXPECT_EQ(*(*in_group)->Store().Get("rank0"), "addr");
  EXPECT_EQ(*group.NumKeys(""), 1);
}

TEST_F(RemoteStoreTest, NumKeysCountsKeysByPrefixNotByNamespace) {
  // The prefix used to be sent as a namespace: "a" counted only "a/..." keys, "/" every key.
  std::unique_ptr<RemoteStore> remote_owner = Remote();
  ASSERT_NE(remote_owner, nullptr);
  RemoteStore& remote = *remote_owner;
  for (const char* key : {"a/1", "ab", "/x", "b"}) ASSERT_TRUE(remote.Set(key, "v").ok());
  EXPECT_EQ(*remote.NumKeys("a"), 2);
  EXPECT_EQ(*remote.NumKeys("a/"), 1);
  EXPECT_EQ(*remote.NumKeys("/"), 1);
  EXPECT_EQ(*remote.NumKeys(""), 4);
}

TEST_F(RemoteStoreTest, NumKeysPrefixLongerThanAnyKeyIsInvalidArgumentNamingTheLimit) {
  std::unique_ptr<RemoteStore> remote_owner = Remote();
  ASSERT_NE(remote_owner, nullptr);
  RemoteStore& remote = *remote_owner;
  absl::StatusOr<int64_t> count = remote.NumKeys(std::string(1 << 20, 'k'));
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument) << count.status();
  EXPECT_THAT(count.status().message(), HasSubstr("store.max_key_bytes"));
}

TEST_F(RemoteStoreTest, WaitCompletesWhenALocalClientSetsTheKey) {
  std::unique_ptr<RemoteStore> remote_owner = Remote();
  ASSERT_NE(remote_owner, nullptr);
  RemoteStore& remote = *remote_owner;
  absl::Notification done;
  absl::StatusOr<std::vector<std::string>> result;
  ASSERT_TRUE(remote
                  .WaitAsync({"late"}, absl::Now() + absl::Seconds(30),
                             [&](absl::StatusOr<std::vector<std::string>> values) {
                               result = std::move(values);
                               done.Notify();
                             })
                  .ok());
  while (local_->Status()->store().waiters() == 0) absl::SleepFor(absl::Milliseconds(2));
  ASSERT_TRUE(local_->Store().Set("late", "now").ok());
  done.WaitForNotification();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(*result, ::testing::ElementsAre("now"));
}

TEST_F(RemoteStoreTest, WaitTimeoutIsDeadlineExceededNamingKeyAndPeer) {
  std::unique_ptr<RemoteStore> remote_owner = Remote();
  ASSERT_NE(remote_owner, nullptr);
  RemoteStore& remote = *remote_owner;
  absl::Status status = remote.Wait({"never"}, absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("\"never\""));
  EXPECT_THAT(status.message(), HasSubstr(address_));
}

TEST_F(RemoteStoreTest, CancelWaitEndsTheWaitAndFreesTheDaemonsWaiter) {
  std::unique_ptr<RemoteStore> remote_owner = Remote();
  ASSERT_NE(remote_owner, nullptr);
  RemoteStore& remote = *remote_owner;
  absl::Notification done;
  absl::Status status;
  absl::StatusOr<WaitId> id =
      remote.WaitAsync({"never"}, absl::Now() + absl::Seconds(60),
                       [&](absl::StatusOr<std::vector<std::string>> values) {
                         status = values.status();
                         done.Notify();
                       });
  ASSERT_TRUE(id.ok());
  while (local_->Status()->store().waiters() == 0) absl::SleepFor(absl::Milliseconds(2));
  remote.CancelWait(*id);
  done.WaitForNotification();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (local_->Status()->store().waiters() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(local_->Status()->store().waiters(), 0);
}

TEST_F(RemoteStoreTest, WrongTokenIsUnauthenticatedAndChangesNothing) {
  std::unique_ptr<RemoteStore> intruder_owner = Remote("guess");
  ASSERT_NE(intruder_owner, nullptr);
  RemoteStore& intruder = *intruder_owner;
  absl::Status status = intruder.Set("k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(status.message(), HasSubstr("bad MAC"));
  EXPECT_FALSE(*local_->Store().Check({"k"}));
  EXPECT_THAT(daemon_->Output(), HasSubstr("/tpd.v1.Store/Set refused: bad MAC"));
}

TEST_F(RemoteStoreTest, MissingTokenIsUnauthenticatedForWaitsToo) {
  std::unique_ptr<RemoteStore> intruder_owner = Remote("");
  ASSERT_NE(intruder_owner, nullptr);
  RemoteStore& intruder = *intruder_owner;
  absl::Status status = intruder.Wait({"k"}, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(status.message(), HasSubstr("no MAC"));
}

// A daemon follows only a store that proves the cluster token in its answers
// (docs/security.md, "Answers are authenticated too"): an impostor's answers, unsigned or
// signed under another token, are UNAUTHENTICATED and their values never returned.
TEST(RemoteStoreImpostorTest, AnswersThatDoNotProveTheTokenAreRefused) {
  for (const std::string& reply_key : {std::string(), std::string("another-token")}) {
    SCOPED_TRACE(reply_key.empty() ? "unsigned answers" : "answers signed under another token");
    testing::ImpostorStore impostor(reply_key);
    RemoteStoreOptions options;
    options.token = kToken;
    options.call_timeout = absl::Seconds(5);
    auto remote = RemoteStore::Create(impostor.address(), options);
    ASSERT_TRUE(remote.ok()) << remote.status();
    absl::Status set = (*remote)->Set("k", "v");
    EXPECT_EQ(set.code(), absl::StatusCode::kUnauthenticated) << set;
    EXPECT_THAT(set.message(), HasSubstr("did not prove the cluster token"));
    EXPECT_THAT(set.message(), HasSubstr(impostor.address()));
    absl::StatusOr<std::string> swapped = (*remote)->CompareSet("k", "", "mine");
    EXPECT_EQ(swapped.status().code(), absl::StatusCode::kUnauthenticated);
    absl::StatusOr<std::vector<std::string>> values =
        (*remote)->MultiGet({"k"}, absl::Now() + absl::Seconds(5));
    EXPECT_EQ(values.status().code(), absl::StatusCode::kUnauthenticated) << values.status();
  }
}

// The control: the same impostor signing with the cluster's token is believed, so the
// refusals above are the reply MAC's doing (and a real daemon's answers pass: the
// conformance suite runs over one).
TEST(RemoteStoreImpostorTest, AnswersSignedWithTheClusterTokenAreAccepted) {
  testing::ImpostorStore holder(kToken);
  RemoteStoreOptions options;
  options.token = kToken;
  auto remote = RemoteStore::Create(holder.address(), options);
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_TRUE((*remote)->Set("k", "v").ok());
  absl::StatusOr<std::string> swapped = (*remote)->CompareSet("k", "", "mine");
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_EQ(*swapped, "forged");
}

TEST(RemoteStoreUnreachableTest, UnreachableDaemonIsUnavailableNamingTheAddress) {
  RemoteStoreOptions options;
  options.token = kToken;
  options.call_timeout = absl::Seconds(5);
  auto remote = RemoteStore::Create("127.0.0.1:1", options);  // nothing listens on port 1
  ASSERT_TRUE(remote.ok()) << remote.status();
  absl::Status status = (*remote)->Set("k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("127.0.0.1:1"));
}

}  // namespace
}  // namespace tpd::store
