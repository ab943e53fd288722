// EtcdStore against a real etcd (Debian's etcd-server, started on loopback by the test): c10d
// semantics over etcd (the conformance suite, tests/store/store_conformance.cc), waits woken by
// a Watch when another client writes, keys kept under the store's prefix, failover across
// endpoints and UNAVAILABLE naming every endpoint tried. Skips, saying why, without etcd.

#include "store/etcd/etcd_store.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/store/etcd/etcd_cluster.h"
#include "tests/store/etcd/shared_cluster.h"
#include "tests/store/store_conformance.h"
#include "tests/testing/wait_until.h"

namespace tpd::store {
namespace {

using ::testing::AllOf;
using testing::EtcdBinary;
using testing::EtcdCluster;
using ::testing::HasSubstr;

using testing::FreshPrefix;
using testing::MakeStore;

// One single-member cluster for the whole test binary (tests/store/etcd/shared_cluster.h).
EtcdCluster* SharedCluster() {
  return testing::SharedCluster([] { return EtcdCluster::Start(1); });
}

class EtcdUnderTest : public StoreUnderTest {
 public:
  static std::unique_ptr<StoreUnderTest> Make(int64_t max_waiters) {
    EtcdCluster* cluster = SharedCluster();
    if (cluster == nullptr) return nullptr;
    EtcdStoreOptions options;
    options.max_waiters = max_waiters;
    auto under_test = std::make_unique<EtcdUnderTest>();
    under_test->store_ = MakeStore(cluster->ClientAddresses(), FreshPrefix(), options);
    if (under_test->store_ == nullptr) return nullptr;
    return under_test;
  }

  Store& store() override { return *store_; }
  int64_t waiters() override { return store_->Stats().waiters; }
  // A write through this store completes this store's waits before it returns (the watch
  // brings other clients' writes; see BlockedGetIsWokenByAnotherClientsSetThroughAWatch).

 private:
  std::unique_ptr<EtcdStore> store_;
};

// Without etcd the suite has no instance; this test says why.
TEST(EtcdInstalledTest, EtcdIsInstalled) {
  if (EtcdBinary().empty()) GTEST_SKIP() << testing::kNoEtcdMessage;
}

std::vector<StoreFactory> Factories() {
  if (EtcdBinary().empty()) return {};
  return {StoreFactory(EtcdUnderTest::Make)};
}

// Without etcd there is no instance, which gtest would report as a failure.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StoreConformanceTest);
INSTANTIATE_TEST_SUITE_P(EtcdStore, StoreConformanceTest, ::testing::ValuesIn(Factories()));

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdBinary().empty()) GTEST_SKIP() << testing::kNoEtcdMessage;
    cluster_ = SharedCluster();
    ASSERT_NE(cluster_, nullptr);
  }

  EtcdCluster* cluster_ = nullptr;
};

TEST_F(EtcdStoreTest, BlockedGetIsWokenByAnotherClientsSetThroughAWatch) {
  const std::string prefix = FreshPrefix();
  WaitResult result;  // outlives the stores
  std::unique_ptr<EtcdStore> waiter = MakeStore(cluster_->ClientAddresses(), prefix);
  std::unique_ptr<EtcdStore> writer = MakeStore(cluster_->ClientAddresses(), prefix);
  ASSERT_NE(waiter, nullptr);
  ASSERT_NE(writer, nullptr);

  ASSERT_TRUE(waiter->WaitAsync({"key"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(AwaitWaiters(*waiter, 1));
  EXPECT_FALSE(result.HasRun());
  EXPECT_EQ(waiter->Stats().watch_events, 0);

  ASSERT_TRUE(writer->Set("key", "from the other client").ok());
  ASSERT_TRUE(result.Await());
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ::testing::ElementsAre("from the other client"));
  // Woken by the watch's event, not by reading again.
  const EtcdStoreStats stats = waiter->Stats();
  EXPECT_EQ(stats.watch_events, 1);
  EXPECT_EQ(stats.watch_streams_opened, 1);
  EXPECT_EQ(stats.waiters, 0);
  EXPECT_EQ(stats.watched_keys, 0);  // the watch goes with its last wait
}

TEST_F(EtcdStoreTest, AWaitOnManyKeysEndsWhenAnotherClientSetsTheLast) {
  const std::string prefix = FreshPrefix();
  WaitResult result;  // outlives the stores
  std::unique_ptr<EtcdStore> waiter = MakeStore(cluster_->ClientAddresses(), prefix);
  std::unique_ptr<EtcdStore> writer = MakeStore(cluster_->ClientAddresses(), prefix);
  ASSERT_TRUE(writer->Set("a", "1").ok());
  ASSERT_TRUE(waiter->WaitAsync({"a", "b", "c"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(writer->Set("b", "2").ok());
  EXPECT_FALSE(result.HasRun());
  ASSERT_TRUE(writer->MultiSet({"c", "d"}, {"3", "4"}).ok());
  ASSERT_TRUE(result.Await());
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ::testing::ElementsAre("1", "2", "3"));
}

TEST_F(EtcdStoreTest, AKeyDeletedBeforeTheOthersArriveIsWaitedForAgain) {
  const std::string prefix = FreshPrefix();
  WaitResult result;  // outlives the stores
  std::unique_ptr<EtcdStore> waiter = MakeStore(cluster_->ClientAddresses(), prefix);
  std::unique_ptr<EtcdStore> writer = MakeStore(cluster_->ClientAddresses(), prefix);
  ASSERT_TRUE(waiter->WaitAsync({"a", "b"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(writer->Set("a", "1").ok());
  ASSERT_TRUE(writer->DeleteKey("a").value_or(false));
  ASSERT_TRUE(writer->Set("b", "2").ok());
  // The events arrive in revision order: after b's, the wait still lacks a.
  ASSERT_TRUE(writer->Set("marker", "").ok());
  absl::SleepFor(absl::Milliseconds(300));  // a wrong wake-up would come with b's event
  EXPECT_FALSE(result.HasRun());
  ASSERT_TRUE(writer->Set("a", "again").ok());
  ASSERT_TRUE(result.Await());
  EXPECT_THAT(*result.result(), ::testing::ElementsAre("again", "2"));
}

TEST_F(EtcdStoreTest, KeysLiveUnderThePrefixOnly) {
  const std::string prefix = FreshPrefix();
  std::unique_ptr<EtcdStore> store = MakeStore(cluster_->ClientAddresses(), prefix);
  std::unique_ptr<EtcdStore> other = MakeStore(cluster_->ClientAddresses(), prefix + "x");
  ASSERT_TRUE(store->Set("k", "v").ok());
  EXPECT_EQ(other->NumKeys("").value_or(-1), 0);
  EXPECT_FALSE(other->Check({"k"}).value_or(true));

  auto channel =
      grpc::CreateChannel(cluster_->ClientAddress(0), grpc::InsecureChannelCredentials());
  auto kv = etcdserverpb::KV::NewStub(channel);
  grpc::ClientContext context;
  etcdserverpb::RangeRequest request;
  request.set_key(prefix + "/k");
  etcdserverpb::RangeResponse response;
  ASSERT_TRUE(kv->Range(&context, request, &response).ok());
  ASSERT_EQ(response.kvs_size(), 1);
  EXPECT_EQ(response.kvs(0).value(), "v");
}

TEST_F(EtcdStoreTest, ConcurrentAddsFromTwoClientsAllCount) {
  const std::string prefix = FreshPrefix();
  std::vector<std::unique_ptr<EtcdStore>> stores;
  for (int i = 0; i < 2; ++i) stores.push_back(MakeStore(cluster_->ClientAddresses(), prefix));
  constexpr int kThreadsPerStore = 3;
  constexpr int kAddsPerThread = 30;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (auto& store : stores) {
    for (int t = 0; t < kThreadsPerStore; ++t) {
      threads.emplace_back([&failures, s = store.get()] {
        for (int i = 0; i < kAddsPerThread; ++i) {
          if (!s->Add("counter", 1).ok()) ++failures;
        }
      });
    }
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(stores[0]->Get("counter", LongDeadline()).value_or(""),
            absl::StrCat(2 * kThreadsPerStore * kAddsPerThread));
}

TEST_F(EtcdStoreTest, FailsOverToTheNextEndpoint) {
  std::unique_ptr<EtcdStore> store =
      MakeStore({"127.0.0.1:1", cluster_->ClientAddress(0)}, FreshPrefix());
  ASSERT_TRUE(store->Set("k", "v").ok());
  EXPECT_EQ(store->Get("k", LongDeadline()).value_or(""), "v");
}

TEST_F(EtcdStoreTest, ALeasedKeyLivesWhileRenewedAndGoesWithItsLease) {
  const std::string prefix = FreshPrefix();
  std::unique_ptr<EtcdStore> holder = MakeStore(cluster_->ClientAddresses(), prefix);
  std::unique_ptr<EtcdStore> reader = MakeStore(cluster_->ClientAddresses(), prefix);
  ASSERT_NE(holder->leases(), nullptr);
  absl::StatusOr<Leases::Grant> grant = holder->GrantLease(absl::Milliseconds(1));
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_GE(grant->ttl, absl::Seconds(1));  // whole seconds, at least etcd's minimum
  ASSERT_TRUE(holder->SetLeased("alive", "1", grant->id).ok());
  // Renewed for three TTLs: the key stays.
  const absl::Time until = absl::Now() + 3 * grant->ttl;
  while (absl::Now() < until) {
    ASSERT_TRUE(holder->KeepLeaseAlive(grant->id).ok());
    absl::SleepFor(grant->ttl / 4);
  }
  EXPECT_EQ(reader->Check({"alive"}).value_or(false), true);
  // Revoked: gone at once, for every reader.
  ASSERT_TRUE(holder->RevokeLease(grant->id).ok());
  EXPECT_EQ(reader->Check({"alive"}).value_or(true), false);
  EXPECT_EQ(holder->KeepLeaseAlive(grant->id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(holder->RevokeLease(grant->id).ok()) << "revoking twice is not an error";
}

TEST_F(EtcdStoreTest, ALeaseNotRenewedExpiresWithItsKeyAndSaysSo) {
  const std::string prefix = FreshPrefix();
  std::unique_ptr<EtcdStore> store = MakeStore(cluster_->ClientAddresses(), prefix);
  absl::StatusOr<Leases::Grant> grant = store->GrantLease(absl::Seconds(1));
  ASSERT_TRUE(grant.ok()) << grant.status();
  ASSERT_TRUE(store->SetLeased("alive", "1", grant->id).ok());
  // etcd expires leases on its own checks, a little after the TTL.
  ASSERT_TRUE(tpd::testing::WaitUntil([&] { return !store->Check({"alive"}).value_or(true); },
                                      grant->ttl + absl::Seconds(10), absl::Milliseconds(50)))
      << "the key outlived its lease";
  const absl::Status renewed = store->KeepLeaseAlive(grant->id);
  EXPECT_EQ(renewed.code(), absl::StatusCode::kNotFound) << renewed;
  EXPECT_THAT(renewed.message(), HasSubstr("expired"));
  const absl::Status set = store->SetLeased("alive", "2", grant->id);
  EXPECT_EQ(set.code(), absl::StatusCode::kNotFound) << set;
  EXPECT_EQ(store->Check({"alive"}).value_or(true), false);
}

TEST(EtcdStoreNoServerTest, UnavailableNamesEveryEndpointTried) {
  EtcdStoreOptions options;
  options.connect_timeout = absl::Milliseconds(200);
  std::unique_ptr<EtcdStore> store = MakeStore({"127.0.0.1:1", "127.0.0.1:2"}, "/tpd", options);
  absl::Status status = store->Set("k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("127.0.0.1:1"), HasSubstr("127.0.0.1:2"), HasSubstr("set of key")));
  // A wait cannot start without reading its keys.
  EXPECT_EQ(store->Wait({"k"}, LongDeadline()).code(), absl::StatusCode::kUnavailable);
}

TEST(EtcdStoreNoServerTest, CreateChecksItsArguments) {
  EXPECT_EQ(EtcdStore::Create({}, "/tpd").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdStore::Create({"127.0.0.1:2379"}, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdStore::Create({"127.0.0.1:2379"}, "/tpd/").status().code(),
            absl::StatusCode::kInvalidArgument);
  // A user needs a password (etcd_auth_test has the rest of the credentials' checks).
  EtcdStoreOptions options;
  options.credentials.user = "root";
  EXPECT_EQ(EtcdStore::Create({"127.0.0.1:2379"}, "/tpd", options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.endpoint_hosts = {"a", "b"};
  options.credentials.user.clear();
  EXPECT_EQ(EtcdStore::Create({"127.0.0.1:2379"}, "/tpd", options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tpd::store
