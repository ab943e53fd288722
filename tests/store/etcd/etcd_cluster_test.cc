// EtcdStore over a real 3-member etcd cluster: the conformance suite through every endpoint, a
// wait that outlives the member its watch stream is on, writes that fail over, a store that
// fails promptly, naming every endpoint, while two of three members are down, then recovers
// when one returns without being reopened, a wait whose watch resumes past a compaction, and
// the members probed (store::Cluster) before and after one dies. Skips, saying why, without
// etcd.

#include "tests/store/etcd/etcd_cluster.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "store/etcd/etcd_store.h"
#include "tests/store/etcd/shared_cluster.h"
#include "tests/store/store_conformance.h"
#include "tests/testing/wait_until.h"

namespace tpd::store {
namespace {

using ::testing::AnyOf;
using testing::EtcdBinary;
using testing::EtcdCluster;
using ::testing::HasSubstr;

using testing::FreshPrefix;
using testing::MakeStore;

// One 3-member cluster for the conformance suite; the fault tests start their own.
EtcdCluster* SharedCluster() {
  return testing::SharedCluster([] { return EtcdCluster::Start(3); });
}

class ThreeMemberUnderTest : public StoreUnderTest {
 public:
  static std::unique_ptr<StoreUnderTest> Make(int64_t max_waiters) {
    EtcdCluster* cluster = SharedCluster();
    if (cluster == nullptr) return nullptr;
    EtcdStoreOptions options;
    options.max_waiters = max_waiters;
    auto under_test = std::make_unique<ThreeMemberUnderTest>();
    // Each store starts on another member, so the suite runs through all three.
    static std::atomic<int> rotation{0};
    std::vector<std::string> endpoints = cluster->ClientAddresses();
    std::rotate(endpoints.begin(), endpoints.begin() + (rotation++ % endpoints.size()),
                endpoints.end());
    under_test->store_ = MakeStore(endpoints, FreshPrefix(), options);
    if (under_test->store_ == nullptr) return nullptr;
    return under_test;
  }

  Store& store() override { return *store_; }
  int64_t waiters() override { return store_->Stats().waiters; }

 private:
  std::unique_ptr<EtcdStore> store_;
};

TEST(EtcdInstalledTest, EtcdIsInstalled) {
  if (EtcdBinary().empty()) GTEST_SKIP() << testing::kNoEtcdMessage;
}

std::vector<StoreFactory> Factories() {
  if (EtcdBinary().empty()) return {};
  return {StoreFactory(ThreeMemberUnderTest::Make)};
}

// Without etcd there is no instance, which gtest would report as a failure.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StoreConformanceTest);
INSTANTIATE_TEST_SUITE_P(EtcdThreeMembers, StoreConformanceTest, ::testing::ValuesIn(Factories()));

class EtcdFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdBinary().empty()) GTEST_SKIP() << testing::kNoEtcdMessage;
    absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start(3);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  std::unique_ptr<EtcdCluster> cluster_;
};

TEST_F(EtcdFaultTest, AWaitOutlivesTheMemberItsWatchStreamIsOn) {
  const std::string prefix = FreshPrefix();
  WaitResult result;  // outlives the stores
  // The waiter's calls and stream start on member 0.
  std::unique_ptr<EtcdStore> waiter = MakeStore(cluster_->ClientAddresses(), prefix);
  std::unique_ptr<EtcdStore> writer =
      MakeStore({cluster_->ClientAddress(1), cluster_->ClientAddress(2)}, prefix);
  ASSERT_TRUE(writer->Set("before", "1").ok());

  ASSERT_TRUE(waiter->WaitAsync({"before", "after"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(::tpd::testing::WaitUntil([&] { return waiter->Stats().watch_streams_opened == 1; }))
      << "the watch stream opened";

  cluster_->Kill(0);
  ASSERT_TRUE(writer->Set("after", "2").ok());
  ASSERT_TRUE(result.Await()) << "the wait was never woken";
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ::testing::ElementsAre("1", "2"));
  // The stream moved to another member and resumed from the last revision it had seen.
  EXPECT_GE(waiter->Stats().watch_streams_opened, 2);

  // The waiter's own calls fail over too.
  EXPECT_TRUE(waiter->Set("k", "v").ok());
  EXPECT_EQ(waiter->Add("n", 1).value_or(-1), 1);
}

TEST_F(EtcdFaultTest, TwoOfThreeDownFailsPromptlyNamingEveryEndpointThenRecovers) {
  const std::string prefix = FreshPrefix();
  EtcdStoreOptions options;
  options.call_timeout = absl::Seconds(3);
  options.connect_timeout = absl::Milliseconds(500);
  std::unique_ptr<EtcdStore> store = MakeStore(cluster_->ClientAddresses(), prefix, options);
  ASSERT_TRUE(store->Set("k", "1").ok());

  cluster_->Kill(1);
  cluster_->Kill(2);
  // Once member 0 notices it lost its majority (an election timeout, 500 ms here), it refuses
  // calls at once; until then a call can only wait for its deadline.
  absl::SleepFor(absl::Seconds(1));
  const absl::Time start = absl::Now();
  absl::Status status = store->Set("k", "2");
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << status;
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  for (const std::string& address : cluster_->ClientAddresses()) {
    EXPECT_THAT(status.message(), HasSubstr(address)) << status;
  }
  EXPECT_THAT(status.message(), HasSubstr("no leader")) << status;

  // One member back: a majority again, and the same store works without being reopened.
  ASSERT_TRUE(cluster_->Restart(1).ok());
  absl::Status recovered;
  const absl::Time give_up = absl::Now() + kLongWait;
  do {
    recovered = store->Set("k", "3");
  } while (!recovered.ok() && absl::Now() < give_up);
  ASSERT_TRUE(recovered.ok()) << recovered;
  EXPECT_EQ(store->Get("k", LongDeadline()).value_or(""), "3");
}

// The member whose client URLs name `address`, or nullptr.
const Cluster::Member* MemberAt(const Cluster::Health& health, const std::string& address) {
  for (const Cluster::Member& member : health.members) {
    for (const std::string& url : member.client_urls) {
      if (url == absl::StrCat("http://", address)) return &member;
    }
  }
  return nullptr;
}

TEST_F(EtcdFaultTest, ProbeMembersNamesEveryMemberItsLeaderAndWhoDoesNotAnswer) {
  // Members 0 and 1 are the store's endpoints, and so is a port where nothing listens;
  // member 2 is not.
  const std::string nobody = "127.0.0.1:1";
  std::unique_ptr<EtcdStore> store =
      MakeStore({cluster_->ClientAddress(0), cluster_->ClientAddress(1), nobody}, FreshPrefix());
  ASSERT_NE(store->cluster(), nullptr);
  absl::StatusOr<int> leader = cluster_->Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();

  Cluster::Health health = store->cluster()->ProbeMembers(absl::Now() + absl::Seconds(5));
  EXPECT_EQ(health.list_error, "");
  ASSERT_EQ(health.members.size(), 3u);
  EXPECT_THAT(health.unanswered, ::testing::ElementsAre(HasSubstr(absl::StrCat(nobody, ": "))));
  const Cluster::Member* leading = MemberAt(health, cluster_->ClientAddress(*leader));
  ASSERT_NE(leading, nullptr);
  for (int i : {0, 1}) {
    const Cluster::Member* member = MemberAt(health, cluster_->ClientAddress(i));
    ASSERT_NE(member, nullptr) << "member " << i;
    EXPECT_EQ(member->endpoint, cluster_->ClientAddress(i));
    EXPECT_EQ(member->unanswered, "");
    EXPECT_THAT(member->version, ::testing::StartsWith("3."));
    EXPECT_EQ(member->leader, leading->id) << "member " << i;
    EXPECT_GT(member->raft_term, 0u);
    EXPECT_GT(member->db_size_bytes, 0);
    EXPECT_THAT(member->errors, ::testing::IsEmpty());
  }
  const Cluster::Member* unasked = MemberAt(health, cluster_->ClientAddress(2));
  ASSERT_NE(unasked, nullptr);
  EXPECT_EQ(unasked->endpoint, "");
  EXPECT_EQ(unasked->version, "");

  // A member down: listed still (by the others), its endpoint named with why it is silent.
  cluster_->Kill(1);
  health = store->cluster()->ProbeMembers(absl::Now() + absl::Seconds(5));
  EXPECT_EQ(health.list_error, "");
  const Cluster::Member* down = MemberAt(health, cluster_->ClientAddress(1));
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->endpoint, cluster_->ClientAddress(1));
  EXPECT_NE(down->unanswered, "");
  const Cluster::Member* up = MemberAt(health, cluster_->ClientAddress(0));
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->unanswered, "");
  EXPECT_NE(up->leader, 0u) << "two of three members still make a majority";
}

TEST_F(EtcdFaultTest, AWaitWhoseWatchResumesPastACompactionRereadsItsKey) {
  const std::string prefix = FreshPrefix();
  WaitResult result;  // outlives the stores
  // The waiter knows member 0 only, so its watch stream must wait for it to come back.
  std::unique_ptr<EtcdStore> waiter = MakeStore({cluster_->ClientAddress(0)}, prefix);
  std::unique_ptr<EtcdStore> writer =
      MakeStore({cluster_->ClientAddress(1), cluster_->ClientAddress(2)}, prefix);
  ASSERT_TRUE(waiter->WaitAsync({"k"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(::tpd::testing::WaitUntil([&] { return waiter->Stats().watch_streams_opened == 1; }))
      << "the watch stream opened";

  cluster_->Kill(0);
  ASSERT_TRUE(writer->Set("k", "written while the watcher was away").ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(writer->Set("other", absl::StrCat(i)).ok());
  // Compact everything up to now: the watch's resume revision is gone.
  auto channel =
      grpc::CreateChannel(cluster_->ClientAddress(1), grpc::InsecureChannelCredentials());
  auto kv = etcdserverpb::KV::NewStub(channel);
  etcdserverpb::RangeResponse head;
  {
    grpc::ClientContext context;
    etcdserverpb::RangeRequest request;
    request.set_key(prefix + "/other");
    ASSERT_TRUE(kv->Range(&context, request, &head).ok());
  }
  {
    grpc::ClientContext context;
    etcdserverpb::CompactionRequest request;
    request.set_revision(head.header().revision());
    request.set_physical(true);
    etcdserverpb::CompactionResponse response;
    ASSERT_TRUE(kv->Compact(&context, request, &response).ok());
  }

  ASSERT_TRUE(cluster_->Restart(0).ok());
  ASSERT_TRUE(result.Await()) << "the wait was never woken";
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ::testing::ElementsAre("written while the watcher was away"));
  // The resumed watch found its revision compacted and the key was reread (3 runs of 3 on the
  // 2-core machine). Member 0 could in principle serve the watch before it applies the
  // compaction, and the watch would then deliver the write itself; the wait's value is the
  // same either way, so only that is asserted, and the path taken is recorded.
  const int64_t compactions = waiter->Stats().compactions_seen;
  RecordProperty("compactions_seen", static_cast<int>(compactions));
  EXPECT_LE(compactions, 1);
}

}  // namespace
}  // namespace tpd::store
