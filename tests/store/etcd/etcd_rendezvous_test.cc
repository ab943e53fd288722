// etcd:// rendezvous through real daemons: three tpd processes on loopback form groups whose
// state lives in a real 3-member etcd cluster (Debian's etcd-server) under the URL's prefix,
// with the same group protocol as over tcp:// (versions by compare_set, followed by waits).
// A static group of 8 forms with any one etcd member dead, and the daemon (and tpctl doctor)
// name that member when asked how the cluster is. Each daemon's liveness is a key
// bound to its own etcd lease: renewing it writes nothing, a SIGKILLed daemon's members are
// evicted when its lease expires, and a daemon stalled past its lease takes a new
// incarnation when it resumes. Skips without etcd.

#include <signal.h>

#include <atomic>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/store/etcd/etcd_cluster.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/group_recorder.h"
#include "tests/testing/group_store_checks.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using store::testing::EtcdBinary;
using store::testing::EtcdCluster;
using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WaitUntil;

constexpr int kNodes = 3;
constexpr char kPrefix[] = "/jobs/etcd-rendezvous-test";

class EtcdRendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdBinary().empty()) GTEST_SKIP() << store::testing::kNoEtcdMessage;
    absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start(3);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    init_method_ = absl::StrCat("etcd://", cluster_->UrlHosts(), kPrefix);
    for (int i = 0; i < kNodes; ++i) StartNode(i);
  }

  void StartNode(int i) {
    const std::string name = absl::StrCat("node-", std::string(1, static_cast<char>('a' + i)));
    socket_[i] = absl::StrCat(dir_.path(), "/", name, ".sock");
    const std::string config = dir_.WriteFile(
        absl::StrCat(name, ".toml"),
        absl::StrCat("[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"secret\"\n",
                     "node_name = \"", name, "\"\nheartbeat_interval_ms = 100\n",
                     "heartbeat_timeout_ms = 1000\n"));
    auto daemon = DaemonProcess::Start(socket_[i], {"--config", config});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_[i] = *std::move(daemon);
  }

  std::unique_ptr<Client> Connect(int node) {
    auto client = Client::Connect(socket_[node]);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Joins ranks 0..world_size-1 of a static group, rank r through node r % kNodes, each from
  // its own client and thread.
  std::vector<absl::StatusOr<v1::JoinResponse>> JoinStatic(const std::string& group,
                                                           int world_size) {
    std::vector<absl::StatusOr<v1::JoinResponse>> results(world_size,
                                                          absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < world_size; ++r) {
      clients_.push_back(Connect(r % kNodes));
      Client* client = clients_.back().get();
      JoinOptions options;
      options.group = group;
      options.name = absl::StrCat("w", r);
      options.rank = r;
      options.world_size = world_size;
      options.init_method = init_method_;
      options.timeout = absl::Seconds(60);
      options.include_members = true;  // ExpectFormed reads who joined from the answers
      threads.emplace_back([&results, r, client, options] { results[r] = client->Join(options); });
    }
    for (std::thread& thread : threads) thread.join();
    return results;
  }

  // A Range read directly from member `member`, beside the daemons.
  etcdserverpb::RangeResponse RawRange(const etcdserverpb::RangeRequest& request, int member) {
    auto channel =
        grpc::CreateChannel(cluster_->ClientAddress(member), grpc::InsecureChannelCredentials());
    auto kv = etcdserverpb::KV::NewStub(channel);
    grpc::ClientContext context;
    etcdserverpb::RangeResponse response;
    grpc::Status status = kv->Range(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  // Keys etcd holds under `prefix`.
  int64_t EtcdKeysUnder(const std::string& prefix, int member) {
    etcdserverpb::RangeRequest request;
    request.set_key(prefix);
    std::string end = prefix;
    end.back() = static_cast<char>(end.back() + 1);
    request.set_range_end(end);
    request.set_count_only(true);
    return RawRange(request, member).count();
  }

  // etcd's revision (it grows with every write).
  int64_t EtcdRevision(int member) {
    etcdserverpb::RangeRequest request;
    request.set_key("/");
    request.set_count_only(true);
    return RawRange(request, member).header().revision();
  }

  TempDir dir_;
  std::unique_ptr<EtcdCluster> cluster_;
  std::string init_method_;
  std::string socket_[kNodes];
  std::unique_ptr<DaemonProcess> daemon_[kNodes];
  std::vector<std::unique_ptr<Client>> clients_;
};

void ExpectFormed(const std::vector<absl::StatusOr<v1::JoinResponse>>& results, int world_size) {
  ASSERT_EQ(results.size(), world_size);
  std::set<std::string> nodes;
  for (int r = 0; r < world_size; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    const v1::GroupView& view = results[r]->group();
    EXPECT_EQ(results[r]->rank(), r);
    EXPECT_EQ(view.phase(), "FORMED");
    EXPECT_EQ(view.members_size(), world_size);
    EXPECT_EQ(view.version(), results[0]->group().version());
    for (const v1::Member& member : view.members()) nodes.insert(member.node());
  }
  EXPECT_EQ(nodes.size(), kNodes) << "members should span every daemon";
}

TEST_F(EtcdRendezvousTest, StaticGroupOfEightFormsOverThreeDaemonsViaEtcd) {
  ExpectFormed(JoinStatic("etcd8", 8), 8);
  // The group's state is in etcd, under the URL's prefix.
  EXPECT_GT(EtcdKeysUnder(absl::StrCat(kPrefix, "/"), 1), 0);
  std::unique_ptr<Client> client = Connect(1);
  absl::StatusOr<v1::GroupView> view = client->GetGroup("etcd8", init_method_);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->members_size(), 8);
}

TEST_F(EtcdRendezvousTest, MembersOnEveryNodeShareTheGroupsStore) {
  ExpectFormed(JoinStatic("kv", 3), 3);
  testing::ExpectOneGroupStore({clients_[0].get(), clients_[1].get(), clients_[2].get()}, "kv");
  // The keys are in etcd, under the URL's prefix, apart from the group's records.
  EXPECT_EQ(EtcdKeysUnder(absl::StrCat(kPrefix, "/tpd/group/kv/store/"), 1), 2) << "k and n";
}

TEST_F(EtcdRendezvousTest, AGroupFormsWithOneEtcdMemberDead) {
  cluster_->Kill(0);  // the first endpoint of the URL
  ExpectFormed(JoinStatic("one-dead", 6), 6);

  // The daemon asks the cluster how its members are (Admin.ProbeStores): the dead one is
  // named, the others answer with the leader they agree on.
  absl::StatusOr<int> leader = cluster_->Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  absl::StatusOr<v1::ProbeStoresResponse> probes = Connect(1)->ProbeStores();
  ASSERT_TRUE(probes.ok()) << probes.status();
  ASSERT_EQ(probes->stores_size(), 1) << probes->DebugString();
  const v1::StoreProbe& store = probes->stores(0);
  EXPECT_EQ(store.name(), init_method_);
  EXPECT_EQ(store.list_error(), "");
  ASSERT_EQ(store.members_size(), 3) << store.DebugString();
  std::string leader_id;
  for (const v1::StoreMember& member : store.members()) {
    if (member.endpoint() == cluster_->ClientAddress(*leader)) leader_id = member.id();
  }
  ASSERT_NE(leader_id, "") << store.DebugString();
  for (const v1::StoreMember& member : store.members()) {
    if (member.endpoint() == cluster_->ClientAddress(0)) {
      EXPECT_NE(member.unanswered(), "") << member.DebugString();
    } else {
      EXPECT_EQ(member.unanswered(), "") << member.DebugString();
      EXPECT_EQ(member.leader_id(), leader_id) << member.DebugString();
      EXPECT_GT(member.round_trip_ms(), 0) << member.DebugString();
    }
  }

  // tpctl doctor says so, a warning with what to do (the store fails over meanwhile).
  const testing::ProcessResult doctor = testing::RunProcess(
      {testing::RunfilePath("client/tpctl"), "--socket", socket_[1], "doctor", "--json"});
  EXPECT_THAT(doctor.output, ::testing::ContainsRegex(
                                 absl::StrCat("\"check\": \"etcd ", init_method_,
                                              "\", \"level\": \"warning\", "
                                              "\"detail\": \"member [^ ]+ at ",
                                              cluster_->ClientAddress(0), " does not answer")))
      << doctor.output;
  EXPECT_THAT(doctor.output, ::testing::ContainsRegex(
                                 absl::StrCat("\"level\": \"ok\", \"detail\": \"member [^ ]+ at ",
                                              cluster_->ClientAddress(1), ": etcd 3\\.")))
      << doctor.output;
}

TEST_F(EtcdRendezvousTest, KilledDaemonsMembersAreEvictedWhenItsLeaseExpires) {
  ExpectFormed(JoinStatic("evict", 3), 3);
  std::unique_ptr<Client> watcher = Connect(0);
  const absl::Time killed = absl::Now();
  daemon_[2]->Signal(SIGKILL);
  absl::StatusOr<v1::GroupView> view;
  ASSERT_TRUE(WaitUntil(
      [&] {
        view = watcher->GetGroup("evict", init_method_);
        return view.ok() && view->phase() == "BROKEN";
      },
      absl::Seconds(20)))
      << (view.ok() ? view->DebugString() : view.status().ToString());
  const absl::Duration took = absl::Now() - killed;
  daemon_[2]->WaitExit(absl::Seconds(10));
  EXPECT_THAT(view->reason(), HasSubstr("node-c's liveness lease expired"));
  // The lease's TTL (1 s) plus etcd's expiry sweep (every 500 ms) and one check (100 ms),
  // with room for a loaded machine; far below the 20 s waited.
  std::cout << "[          ] evicted " << took << " after the SIGKILL (lease TTL 1 s)\n";
  EXPECT_LT(took, absl::Seconds(10));
  for (const v1::Member& member : view->members()) EXPECT_NE(member.node(), "node-c");
}

TEST_F(EtcdRendezvousTest, LivenessWritesNothingWhileTheGroupIsIdle) {
  ExpectFormed(JoinStatic("idle", 3), 3);
  // Every daemon renews its lease each 100 ms; none of that is a write to etcd, so etcd's
  // revision stands still over ten heartbeat intervals.
  absl::SleepFor(absl::Milliseconds(500));  // joins' last writes settle
  const int64_t before = EtcdRevision(1);
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(EtcdRevision(1), before);
  std::unique_ptr<Client> client = Connect(0);
  absl::StatusOr<v1::GroupView> view = client->GetGroup("idle", init_method_);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->phase(), "FORMED");
  // Operators see the lease in Admin.Status (tpctl status).
  absl::StatusOr<v1::StatusResponse> status = client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->rendezvous_stores_size(), 1);
  const v1::RendezvousStoreInfo& store = status->rendezvous_stores(0);
  EXPECT_EQ(store.name(), view->store());
  EXPECT_EQ(store.liveness(), "lease");
  EXPECT_EQ(store.lease_id().size(), 16u) << store.lease_id();
  EXPECT_EQ(store.lease_ttl_ms(), 1000);
  EXPECT_GT(store.last_beat_unix_ms(), absl::ToUnixMillis(absl::Now() - absl::Seconds(5)));
  EXPECT_EQ(store.leases_lost(), 0);
}

TEST_F(EtcdRendezvousTest, ADaemonStalledPastItsLeaseIsEvictedAndResumesUnderANewIncarnation) {
  ExpectFormed(JoinStatic("stall", 3), 3);
  std::unique_ptr<Client> watcher = Connect(0);
  absl::StatusOr<v1::GroupView> view = watcher->GetGroup("stall", init_method_);
  ASSERT_TRUE(view.ok()) << view.status();
  uint64_t old_incarnation = 0;
  for (const v1::Member& member : view->members()) {
    if (member.node() == "node-c") old_incarnation = member.incarnation();
  }
  daemon_[2]->Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntil(
      [&] {
        view = watcher->GetGroup("stall", init_method_);
        return view.ok() && view->phase() == "BROKEN";
      },
      absl::Seconds(20)))
      << (view.ok() ? view->DebugString() : view.status().ToString());
  EXPECT_THAT(view->reason(), HasSubstr("node-c's liveness lease expired"));
  daemon_[2]->Signal(SIGCONT);
  // Resumed, node-c finds its lease gone and rejoins under a new incarnation that its peers
  // keep (its key names it) for well past a lease's TTL.
  std::unique_ptr<Client> a = Connect(0);
  std::unique_ptr<Client> c = Connect(2);
  absl::StatusOr<v1::JoinResponse> joined;
  ASSERT_TRUE(WaitUntil(
      [&] {
        JoinOptions options;
        options.group = "after-stall";
        options.name = "c";
        options.init_method = init_method_;
        joined = c->Join(options);
        return joined.ok();
      },
      absl::Seconds(20), absl::Milliseconds(200)))
      << joined.status();
  JoinOptions options;
  options.group = "after-stall";
  options.name = "a";
  options.init_method = init_method_;
  ASSERT_TRUE(a->Join(options).ok());
  absl::SleepFor(absl::Seconds(3));
  view = watcher->GetGroup("after-stall", init_method_);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->members_size(), 2) << view->DebugString();
  for (const v1::Member& member : view->members()) {
    if (member.node() == "node-c") {
      EXPECT_NE(member.incarnation(), old_incarnation);
    }
  }
  // The node took a new incarnation once: through its own lease's expiry or through seeing its
  // member evicted, whichever it noticed first (both are the same loss).
  EXPECT_THAT(daemon_[2]->Output(),
              ::testing::AnyOf(HasSubstr("its liveness lease expired: taking new incarnation"),
                               HasSubstr("evicted from a group: taking new incarnation")));
  absl::StatusOr<v1::StatusResponse> status = c->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->rendezvous_stores_size(), 1);
  EXPECT_EQ(status->rendezvous_stores(0).leases_lost(), 1);
}

JoinOptions Dynamic(const std::string& group, const std::string& name,
                    const std::string& init_method) {
  JoinOptions options;
  options.group = group;
  options.name = name;
  options.init_method = init_method;
  options.timeout = absl::Seconds(60);
  options.include_members = true;  // the tests check who the answers say is there
  return options;
}

bool HasMember(const v1::GroupView& view, const std::string& name) {
  for (const v1::Member& member : view.members()) {
    if (member.name() == name) return true;
  }
  return false;
}

// What one churning worker saw.
struct Tally {
  int joins = 0;                       // acknowledged
  int leaves = 0;                      // acknowledged
  std::vector<int64_t> join_versions;  // the version each acknowledged join answered with
  std::vector<std::string> errors;
};

// FAULTS S1: the etcd leader is killed while six workers on three daemons join and leave.
// Calls fail briefly (UNAVAILABLE or a deadline, nothing else), then go on; every
// acknowledged join is in the version it answered with, every worker that was acknowledged
// leaving is gone, and every daemon's watcher saw the same versions without a gap.
TEST_F(EtcdRendezvousTest, KillingTheEtcdLeaderUnderChurnLosesNothingAcknowledged) {
  std::unique_ptr<Client> watchers[kNodes];
  std::unique_ptr<testing::GroupRecorder> recorders[kNodes];
  for (int i = 0; i < kNodes; ++i) {
    watchers[i] = Connect(i);
    recorders[i] =
        std::make_unique<testing::GroupRecorder>(watchers[i].get(), "churn", init_method_);
  }
  std::unique_ptr<Client> anchor = Connect(0);
  ASSERT_TRUE(anchor->Join(Dynamic("churn", "w0", init_method_)).ok());
  constexpr int kWorkers = 6;
  std::atomic<bool> stop{false};
  std::atomic<bool> killed{false};
  std::atomic<int> rounds_after_kill{0};
  std::vector<Tally> tallies(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::unique_ptr<Client> client = Connect(w % kNodes);
      const std::string name = absl::StrCat("w", w + 1);
      Tally& tally = tallies[w];
      while (!stop.load()) {
        absl::StatusOr<v1::JoinResponse> joined =
            client->Join(Dynamic("churn", name, init_method_));
        if (!joined.ok()) {
          tally.errors.push_back(joined.status().ToString());
          absl::SleepFor(absl::Milliseconds(50));
          continue;
        }
        ++tally.joins;
        tally.join_versions.push_back(joined->group().version());
        if (!HasMember(joined->group(), name)) tally.errors.push_back("joined view lacks " + name);
        // Leaving is retried until acknowledged: the worker must not stay behind.
        for (int attempt = 0;; ++attempt) {
          absl::Status left = client->Leave("churn", name);
          if (left.ok()) break;
          tally.errors.push_back(left.ToString());
          if (attempt == 100) return;
          absl::SleepFor(absl::Milliseconds(100));
        }
        ++tally.leaves;
        if (killed.load()) ++rounds_after_kill;
      }
    });
  }
  absl::SleepFor(absl::Seconds(1));
  absl::StatusOr<int> leader = cluster_->Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  cluster_->Kill(*leader);
  killed = true;
  // Work goes on under the new leader.
  const bool went_on = WaitUntil([&] { return rounds_after_kill.load() >= 12; }, absl::Seconds(40),
                                 absl::Milliseconds(20));
  stop = true;
  for (std::thread& thread : threads) thread.join();
  EXPECT_TRUE(went_on) << "fewer than 12 join/leave rounds after the leader was killed";
  int errors = 0;
  for (int w = 0; w < kWorkers; ++w) {
    const Tally& tally = tallies[w];
    EXPECT_EQ(tally.joins, tally.leaves) << "w" << w + 1 << " never got its leave acknowledged";
    for (const std::string& error : tally.errors) {
      ++errors;
      EXPECT_TRUE(absl::StartsWith(error, "UNAVAILABLE") ||
                  absl::StartsWith(error, "DEADLINE_EXCEEDED"))
          << "w" << w + 1 << ": " << error;
    }
  }
  std::cout << "[          ] failed calls around the leader's death: " << errors << "\n";
  // Every acknowledged leave took effect: only w0 is left.
  absl::StatusOr<v1::GroupView> view;
  ASSERT_TRUE(WaitUntil(
      [&] {
        view = anchor->GetGroup("churn");
        return view.ok() && view->members_size() == 1;
      },
      absl::Seconds(20)))
      << (view.ok() ? view->DebugString() : view.status().ToString());
  EXPECT_EQ(view->members(0).name(), "w0");
  std::vector<std::vector<v1::GroupEvent>> recordings;
  for (int i = 0; i < kNodes; ++i) {
    ASSERT_TRUE(recorders[i]->WaitForVersion(view->version(), absl::Seconds(20)))
        << "node " << i << "'s watcher never saw version " << view->version();
    recordings.push_back(recorders[i]->events());
  }
  testing::ExpectSameGapFreeVersions(recordings);
  // Every acknowledged join is in the version it answered with, as every watcher saw it.
  std::map<int64_t, v1::GroupView> seen;
  for (const v1::GroupEvent& event : recordings[0]) seen[event.group().version()] = event.group();
  for (int w = 0; w < kWorkers; ++w) {
    for (int64_t version : tallies[w].join_versions) {
      auto it = seen.find(version);
      if (it == seen.end()) continue;  // before the watcher's snapshot
      EXPECT_TRUE(HasMember(it->second, absl::StrCat("w", w + 1)))
          << "w" << w + 1 << "'s acknowledged join is not in version " << version;
    }
  }
}

// FAULTS S2: two of three etcd members stopped. Joins fail fast naming the endpoints; calls
// between members already joined go on; nobody is evicted (no daemon can judge, and etcd
// extends leases when it elects a leader again); once the members are back the same daemons
// take joins again without a restart.
TEST_F(EtcdRendezvousTest, WithoutQuorumJoinsFailFastLocalWorkGoesOnAndAllRecovers) {
  std::unique_ptr<Client> a = Connect(0);
  std::unique_ptr<Client> b = Connect(1);
  std::unique_ptr<Client> c = Connect(2);
  ASSERT_TRUE(b->Handle("echo", [](const Message& request) -> absl::StatusOr<Message> {
                 Message reply = request;
                 reply.payload += "|";
                 return reply;
               }).ok());
  ASSERT_TRUE(a->Join(Dynamic("quorum", "a", init_method_)).ok());
  ASSERT_TRUE(b->Join(Dynamic("quorum", "b", init_method_)).ok());
  ASSERT_TRUE(WaitUntil([&] {
    absl::StatusOr<Message> reply = a->Call("quorum", "b", "echo", "before");
    return reply.ok();
  }));

  cluster_->Kill(0);
  cluster_->Kill(1);
  // The survivor refuses at once ("no leader") once its election timeout (500 ms here) has
  // passed without a majority; before that it holds requests until etcd's own timeout.
  absl::SleepFor(absl::Seconds(2));
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::JoinResponse> refused = c->Join(Dynamic("quorum", "c", init_method_));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  for (int i = 0; i < kNodes; ++i) {
    EXPECT_THAT(refused.status().message(), HasSubstr(cluster_->ClientAddress(i)));
  }
  std::cout << "[          ] a join without quorum failed after " << took << "\n";
  EXPECT_LT(took, absl::Seconds(10)) << "within one store call timeout, not the join's 60 s";
  // The same through a daemon that holds a lease and already follows the group. Its own
  // reads of the group may have reached the survivor before it noticed it had no leader;
  // etcd holds those for its request timeout (about 6 s here), and a join queued behind one
  // waits for it: slower, still within one store call timeout.
  const absl::Time again = absl::Now();
  absl::StatusOr<v1::JoinResponse> refused_on_a = a->Join(Dynamic("quorum", "a2", init_method_));
  const absl::Duration took_on_a = absl::Now() - again;
  EXPECT_EQ(refused_on_a.status().code(), absl::StatusCode::kUnavailable) << refused_on_a.status();
  std::cout << "[          ] and through a daemon with members there after " << took_on_a << "\n";
  EXPECT_LT(took_on_a, absl::Seconds(10));

  // Local work goes on, for longer than a lease's TTL.
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<Message> reply = a->Call("quorum", "b", "echo", absl::StrCat("during ", i));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->payload, absl::StrCat("during ", i, "|"));
    absl::SleepFor(absl::Milliseconds(100));
  }

  ASSERT_TRUE(cluster_->Restart(0).ok());
  ASSERT_TRUE(cluster_->Restart(1).ok());
  absl::StatusOr<v1::JoinResponse> joined;
  ASSERT_TRUE(WaitUntil(
      [&] {
        joined = c->Join(Dynamic("quorum", "c", init_method_));
        return joined.ok();
      },
      absl::Seconds(60), absl::Milliseconds(200)))
      << joined.status();
  EXPECT_TRUE(HasMember(joined->group(), "a") && HasMember(joined->group(), "b"))
      << "a member was lost over the outage: " << joined->group().DebugString();
  absl::StatusOr<Message> reply = c->Call("quorum", "b", "echo", "after");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, "after|");
}

// A group whose record outgrows what etcd takes in one request (--max-request-bytes, 1.5 MiB
// by default; 4 KiB here) refuses the join that would cross it, naming the limit, and keeps
// every member it had; the daemon goes on serving.
TEST(EtcdRecordLimitTest, AJoinPastEtcdsRequestLimitFailsNamingItAndTheGroupStays) {
  if (EtcdBinary().empty()) GTEST_SKIP() << store::testing::kNoEtcdMessage;
  store::testing::EtcdClusterOptions small;
  small.extra_flags = {"--max-request-bytes", "4096"};
  absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster =
      EtcdCluster::Start(1, absl::Seconds(30), small);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TempDir dir;
  const std::string socket = absl::StrCat(dir.path(), "/tpd.sock");
  const std::string config =
      dir.WriteFile("tpd.toml", "[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"secret\"\n");
  absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
      DaemonProcess::Start(socket, {"--config", config});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string init_method = absl::StrCat("etcd://", (*cluster)->UrlHosts(), "/limit");
  std::vector<std::unique_ptr<Client>> clients;
  absl::Status refused;
  int joined = 0;
  for (int i = 0; i < 200 && refused.ok(); ++i) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<v1::JoinResponse> answer =
        (*client)->Join(Dynamic("big", absl::StrCat("worker-with-a-long-name-", i), init_method));
    clients.push_back(*std::move(client));
    if (answer.ok()) {
      ++joined;
    } else {
      refused = answer.status();
    }
  }
  ASSERT_FALSE(refused.ok()) << "200 members never crossed a 4 KiB request limit";
  std::cout << "[          ] member " << joined << " refused: " << refused << "\n";
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("--max-request-bytes"));
  EXPECT_GT(joined, 0);
  absl::StatusOr<v1::GroupView> view = clients.front()->GetGroup("big", init_method);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->members_size(), joined);
  EXPECT_TRUE(clients.front()->Status().ok()) << "the daemon stopped serving";
}

TEST_F(EtcdRendezvousTest, JoinOutsideTheDialNetworksIsPermissionDenied) {
  std::unique_ptr<Client> client = Connect(0);
  JoinOptions options;
  options.group = "far";
  options.name = "w0";
  options.init_method = "etcd://192.0.2.1:2379/x";  // TEST-NET-1, outside the defaults
  absl::StatusOr<v1::JoinResponse> joined = client->Join(options);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kPermissionDenied) << joined.status();
  EXPECT_THAT(joined.status().message(), HasSubstr("192.0.2.1"));
}

}  // namespace
}  // namespace tpd
