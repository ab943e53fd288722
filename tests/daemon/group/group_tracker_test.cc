// Trackers of several "daemons" (nodes) over one in-memory rendezvous store, in one process:
// the group rules end to end without sockets or sleeps. Each test waits on the callbacks'
// answers, bounded by a deadline.

#include "daemon/group/group_tracker.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/group/heartbeat.h"
#include "daemon/group/membership.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/group_record.pb.h"
#include "store/memory/memory_store.h"

namespace tpd::group {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(20);

// A clock the test moves by hand.
class FakeClock : public Clock {
 public:
  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration by) {
    absl::MutexLock lock(&mu_);
    now_ += by;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::Now();
};

// One daemon's identity and its tracker of group "g".
struct FakeDaemon {
  FakeDaemon(const std::string& name, uint64_t incarnation, store::Store* store,
             Clock* clock = Clock::Real(), std::function<void(uint64_t)> on_evicted = nullptr) {
    node.name = name;
    node.incarnation = incarnation;
    node.device_count = 2;
    TrackerOptions options;
    options.heartbeat_interval = absl::Milliseconds(20);
    options.heartbeat_timeout = absl::Seconds(1);
    options.clock = clock;
    worker = *GroupWorker::Start(name, clock);
    liveness = std::make_unique<NodeLiveness>(
        store, "memory", name, &node.incarnation, options.heartbeat_timeout,
        /*peer_reads_fresh_for=*/absl::ZeroDuration(), nullptr);
    tracker = std::make_unique<GroupTracker>("g", "memory", store, liveness.get(), worker.get(),
                                             &node, options, std::move(on_evicted));
  }
  Node node;
  std::unique_ptr<NodeLiveness> liveness;
  std::unique_ptr<GroupWorker> worker;
  std::unique_ptr<GroupTracker> tracker;  // declared after the worker: destroyed first
};

// The answer of one Join, awaited.
class JoinResult {
 public:
  GroupTracker::JoinDone Callback() {
    return [this](absl::StatusOr<v1::JoinResponse> response) {
      absl::MutexLock lock(&mu_);
      result_ = std::move(response);
    };
  }
  absl::StatusOr<v1::JoinResponse> Await() {
    absl::MutexLock lock(&mu_);
    auto has = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return result_.has_value(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&has), kWait)) {
      return absl::DeadlineExceededError("the test gave up waiting for the join's answer");
    }
    return *result_;
  }

 private:
  absl::Mutex mu_;
  std::optional<absl::StatusOr<v1::JoinResponse>> result_ ABSL_GUARDED_BY(mu_);
};

// The view once the tracker has read the store.
v1::GroupView AwaitView(GroupTracker& tracker) {
  absl::Mutex mu;
  std::optional<absl::StatusOr<v1::GroupView>> view;
  tracker.GetView([&](absl::StatusOr<v1::GroupView> answer) {
    absl::MutexLock lock(&mu);
    view = std::move(answer);
  });
  absl::MutexLock lock(&mu);
  auto has = [&view]() { return view.has_value(); };
  EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&has), kWait)) << "GetView never answered";
  EXPECT_TRUE(view.has_value() && view->ok());
  return view.has_value() && view->ok() ? **view : v1::GroupView();
}

// Waits (bounded) until `tracker` has recorded `members` members.
bool AwaitMembers(GroupTracker& tracker, int members) {
  const absl::Time deadline = absl::Now() + kWait;
  while (tracker.View().members_size() != members) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Waits (bounded) until `tracker` took a step after `before` steps.
bool AwaitStep(GroupTracker& tracker, int64_t before) {
  const absl::Time deadline = absl::Now() + kWait;
  while (tracker.steps() <= before) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Microseconds(100));
  }
  return true;
}

JoinSpec Spec(const std::string& name, std::optional<int64_t> rank,
              std::optional<int64_t> world_size, int64_t uid = 0) {
  JoinSpec spec;
  spec.name = name;
  spec.rank = rank;
  spec.world_size = world_size;
  spec.uid = uid;
  return spec;
}

// The newest version `tracker` has read, as its store holds it.
v1::GroupRecord Latest(store::Store& store, GroupTracker& tracker) {
  v1::GroupRecord record;
  absl::StatusOr<std::vector<std::string>> bytes = store.MultiGet(
      {absl::StrCat("tpd/group/g/v/", tracker.View().version())}, absl::Now() + kWait);
  EXPECT_TRUE(bytes.ok() && record.ParseFromString((*bytes)[0])) << bytes.status();
  return record;
}

// Writes `record` as the group's next version, as any writer of its store could.
void Forge(store::Store& store, v1::GroupRecord record) {
  const int64_t version = record.view().version() + 1;
  record.mutable_view()->set_version(version);
  record.set_change("UPDATED");
  record.set_change_detail("forged");
  ASSERT_TRUE(store.Set(absl::StrCat("tpd/group/g/v/", version), record.SerializeAsString()).ok());
}

// Waits (bounded) until `tracker` has read version `version`.
bool AwaitVersion(GroupTracker& tracker, int64_t version) {
  const absl::Time deadline = absl::Now() + kWait;
  while (tracker.View().version() < version) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

void Join(FakeDaemon& daemon, JoinSpec spec, JoinResult* result) {
  daemon.tracker->Join(std::move(spec), "session-" + daemon.node.name, absl::Now() + kWait,
                       result->Callback());
}

TEST(GroupTrackerTest, StaticGroupFormsAcrossTwoDaemons) {
  store::MemoryStore store;
  FakeDaemon a("node-a", 1, &store);
  FakeDaemon b("node-b", 2, &store);
  JoinResult r0, r1;
  Join(a, Spec("w0", 0, 2), &r0);
  Join(b, Spec("w1", 1, 2), &r1);
  absl::StatusOr<v1::JoinResponse> j0 = r0.Await();
  absl::StatusOr<v1::JoinResponse> j1 = r1.Await();
  ASSERT_TRUE(j0.ok()) << j0.status();
  ASSERT_TRUE(j1.ok()) << j1.status();
  EXPECT_EQ(j0->group().phase(), kFormed);
  EXPECT_EQ(j1->rank(), 1);
  EXPECT_EQ(j0->group().version(), j1->group().version());
}

TEST(GroupTrackerTest, InvalidOptionsOfOneRankEndEveryRanksWaitWithTheReason) {
  store::MemoryStore store;
  FakeDaemon a("node-a", 1, &store);
  FakeDaemon b("node-b", 2, &store);
  JoinResult healthy, offending;
  Join(a, Spec("w0", 0, 2), &healthy);
  // w0 is recorded and waiting for the group before the offender comes.
  ASSERT_TRUE(AwaitMembers(*a.tracker, 1));
  JoinSpec bad = Spec("w1", 1, 2);
  bad.options.add_transports("tcp");
  Join(b, bad, &offending);
  // The offender completes the group: its options are checked, as PyTorch checks the gathered
  // ones. Both answered long before the 20 s join deadline, with the offender's error.
  for (JoinResult* result : {&healthy, &offending}) {
    absl::StatusOr<v1::JoinResponse> answer = result->Await();
    EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument) << answer.status();
    EXPECT_THAT(answer.status().message(), HasSubstr("Unknown transport: tcp"));
  }
}

TEST(GroupTrackerTest, ACorruptRecordFailsTheGroupWithDataLossInsteadOfCrashing) {
  store::MemoryStore store;
  FakeDaemon a("node-a", 1, &store);
  JoinResult r0;
  Join(a, Spec("d0", std::nullopt, std::nullopt), &r0);
  ASSERT_TRUE(r0.Await().ok());
  // Version 2, as any writer of the store could leave it: a member without options (this
  // aborted every daemon following the group).
  v1::GroupRecord forged;
  forged.mutable_view()->set_group("g");
  forged.mutable_view()->set_version(2);
  forged.mutable_view()->set_phase(kDynamic);
  v1::Member* ghost = forged.mutable_view()->add_members();
  ghost->set_name("ghost");
  ghost->set_node("node-x");
  ASSERT_TRUE(store.Set("tpd/group/g/v/2", forged.SerializeAsString()).ok());

  JoinResult r1;
  Join(a, Spec("d1", std::nullopt, std::nullopt), &r1);
  absl::StatusOr<v1::JoinResponse> refused = r1.Await();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("tpd/group/g/v/2"));
  v1::GroupView view = a.tracker->View();
  EXPECT_EQ(view.phase(), kFailed);
  EXPECT_THAT(view.reason(), HasSubstr("tpd/group/g/v/2"));
  // A daemon that starts following the group now survives it too.
  FakeDaemon b("node-b", 2, &store);
  EXPECT_EQ(AwaitView(*b.tracker).phase(), kFailed);
}

// docs/security.md, "Who may join a group": who owns a group on a node is what that node's
// daemon knows of its own sessions. A record claiming the node for another uid admits no join
// of that uid there, and keeps none of the owner's out.
TEST(GroupTrackerTest, TheOwnerOnThisNodeIsWhatItsOwnSessionsSayNotWhatTheRecordSays) {
  store::MemoryStore store;
  FakeDaemon a("node-a", 1, &store);
  JoinResult owner;
  Join(a, Spec("w0", std::nullopt, std::nullopt, /*uid=*/0), &owner);
  ASSERT_TRUE(owner.Await().ok());
  v1::GroupRecord claimed = Latest(store, *a.tracker);
  (*claimed.mutable_node_owner_uids())["node-a"] = 65534;
  ASSERT_NO_FATAL_FAILURE(Forge(store, claimed));
  ASSERT_TRUE(AwaitVersion(*a.tracker, claimed.view().version() + 1));

  JoinResult other;
  Join(a, Spec("x", std::nullopt, std::nullopt, /*uid=*/65534), &other);
  absl::StatusOr<v1::JoinResponse> refused = other.Await();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("belongs to uid 0 on node node-a"));
  JoinResult again;
  Join(a, Spec("w1", std::nullopt, std::nullopt, /*uid=*/0), &again);
  absl::StatusOr<v1::JoinResponse> admitted = again.Await();
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(admitted->group().members_size(), 2);
}

// A record that drops a member this node kept alive (its heartbeat never late) disagrees with
// what the node knows of itself: the group loses the member, the node keeps its incarnation
// (a new one would make every peer evict its members of every group). Peers that found it
// silent still make it take a new one.
TEST(GroupTrackerTest, AnEvictionThisNodeKnowsToBeFalseDoesNotReincarnateIt) {
  store::MemoryStore store;
  std::vector<uint64_t> reincarnated;
  absl::Mutex mu;
  auto on_evicted = [&](uint64_t lost) {
    absl::MutexLock lock(&mu);
    reincarnated.push_back(lost);
  };
  FakeDaemon a("node-a", 1, &store, Clock::Real(), on_evicted);
  JoinResult joined;
  Join(a, Spec("w0", std::nullopt, std::nullopt), &joined);
  ASSERT_TRUE(joined.Await().ok());
  a.liveness->Beat();  // fresh: peers cannot have found node-a silent
  v1::GroupRecord dropped = Latest(store, *a.tracker);
  RemoveMembers(
      &dropped, [](const v1::Member&) { return true; }, "EVICTED", "forged");
  dropped.mutable_view()->set_version(dropped.view().version() - 1);
  ASSERT_NO_FATAL_FAILURE(Forge(store, dropped));
  ASSERT_TRUE(AwaitVersion(*a.tracker, dropped.view().version() + 1));
  EXPECT_EQ(a.tracker->View().members_size(), 0);
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(reincarnated.empty()) << "the node took a new incarnation";
  }

  // The control: a member evicted while the node was silent for more than half the window.
  JoinResult rejoined;
  Join(a, Spec("w1", std::nullopt, std::nullopt), &rejoined);
  ASSERT_TRUE(rejoined.Await().ok());
  absl::SleepFor(absl::Milliseconds(600));  // no beat: node-a looks silent (window 1 s)
  dropped = Latest(store, *a.tracker);
  RemoveMembers(
      &dropped, [](const v1::Member&) { return true; }, "EVICTED", "silent");
  dropped.mutable_view()->set_version(dropped.view().version() - 1);
  ASSERT_NO_FATAL_FAILURE(Forge(store, dropped));
  ASSERT_TRUE(AwaitVersion(*a.tracker, dropped.view().version() + 1));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(reincarnated, std::vector<uint64_t>({1}));
}

TEST(GroupTrackerTest, ARestartedDaemonsEarlierMembersMakeRoomForItsNewOnes) {
  store::MemoryStore store;
  {
    // Killed: its tracker stops without its members leaving.
    FakeDaemon first("node-a", 1, &store);
    JoinResult r0;
    Join(first, Spec("w0", std::nullopt, std::nullopt), &r0);
    ASSERT_TRUE(r0.Await().ok());
  }
  FakeDaemon again("node-a", 2, &store);
  JoinResult r0;
  Join(again, Spec("w0", std::nullopt, std::nullopt), &r0);
  absl::StatusOr<v1::JoinResponse> rejoined = r0.Await();
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  ASSERT_EQ(rejoined->group().members_size(), 1);
  EXPECT_EQ(rejoined->group().members(0).incarnation(), 2u);
}

TEST(GroupTrackerTest, ANodeSilentForTheHeartbeatWindowIsEvictedOnTheTrackersClock) {
  store::MemoryStore store;
  FakeClock clock;
  FakeDaemon a("node-a", 1, &store, &clock);
  FakeDaemon b("node-b", 2, &store);
  JoinResult ra, rb;
  Join(a, Spec("d0", std::nullopt, std::nullopt), &ra);
  ASSERT_TRUE(ra.Await().ok());
  Join(b, Spec("d1", std::nullopt, std::nullopt), &rb);
  ASSERT_TRUE(rb.Await().ok());
  // node-b beat once, then fell silent (nobody writes its key again).
  ASSERT_TRUE(store.Set("tpd/node/node-b", "2:1").ok());
  // node-a's clock moves a tick at a time (never a jump that would look like node-a itself
  // stalled); each tick, node-a takes one step. No real time needs to pass.
  bool evicted = false;
  for (int tick = 0; tick < 200 && !evicted; ++tick) {
    const int64_t before = a.tracker->steps();
    clock.Advance(absl::Milliseconds(20));
    a.worker->Wake(a.tracker.get());
    ASSERT_TRUE(AwaitStep(*a.tracker, before));
    evicted = a.tracker->View().members_size() == 1;
  }
  ASSERT_TRUE(evicted) << "node-b was never evicted";
  const v1::GroupView view = a.tracker->View();
  EXPECT_EQ(view.members(0).name(), "d0");
}

TEST(GroupTrackerTest, ADaemonRestartedUnderItsNameIsNotEvictedForItsPredecessorsHeartbeat) {
  store::MemoryStore store;
  FakeClock clock;
  FakeDaemon a("node-a", 1, &store, &clock);
  JoinResult ra;
  Join(a, Spec("d0", std::nullopt, std::nullopt), &ra);
  ASSERT_TRUE(ra.Await().ok());
  // node-b's previous life (incarnation 2) left its last beat; the new one (3) joins before
  // its heartbeat thread first beats (nothing beats in this test but the trackers).
  ASSERT_TRUE(store.Set("tpd/node/node-b", "2:57").ok());
  FakeDaemon b("node-b", 3, &store);
  JoinResult rb;
  Join(b, Spec("d1", std::nullopt, std::nullopt), &rb);
  ASSERT_TRUE(rb.Await().ok());
  ASSERT_TRUE(AwaitMembers(*a.tracker, 2));
  // node-a judges node-b's heartbeat for a while, well inside the 1 s window.
  for (int tick = 0; tick < 20; ++tick) {
    const int64_t before = a.tracker->steps();
    clock.Advance(absl::Milliseconds(20));
    a.worker->Wake(a.tracker.get());
    ASSERT_TRUE(AwaitStep(*a.tracker, before));
  }
  EXPECT_EQ(a.tracker->View().members_size(), 2) << a.tracker->View().reason();
  absl::StatusOr<std::string> beat = store.Get("tpd/node/node-b", absl::Now());
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(IncarnationOf(*beat), 3u);
}

}  // namespace
}  // namespace tpd::group

namespace tpd::group {
namespace {

// A WhenVersion answer, awaited.
class VersionResult {
 public:
  GroupTracker::VersionDone Callback() {
    return [this](bool reached) {
      absl::MutexLock lock(&mu_);
      reached_ = reached;
    };
  }
  std::optional<bool> Await(absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    auto has = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reached_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&has), timeout);
    return reached_;
  }

 private:
  absl::Mutex mu_;
  std::optional<bool> reached_ ABSL_GUARDED_BY(mu_);
};

TEST(GroupTrackerTest, WhenVersionAnswersOnceAnotherDaemonsVersionIsReadHere) {
  store::MemoryStore store;
  FakeDaemon a("node-a", 1, &store);
  FakeDaemon b("node-b", 2, &store);
  JoinResult joined;
  Join(a, Spec("w0", std::nullopt, std::nullopt), &joined);
  ASSERT_TRUE(joined.Await().ok());
  AwaitView(*b.tracker);
  const int64_t have = b.tracker->View().version();
  // Already read: at once.
  VersionResult now;
  b.tracker->WhenVersion(have, absl::Now() + kWait, now.Callback());
  EXPECT_EQ(now.Await(absl::ZeroDuration()), std::optional<bool>(true));
  // The next version, written through the other daemon: once b has read it.
  VersionResult next;
  b.tracker->WhenVersion(have + 1, absl::Now() + kWait, next.Callback());
  JoinResult second;
  Join(a, Spec("w1", std::nullopt, std::nullopt), &second);
  ASSERT_TRUE(second.Await().ok());
  EXPECT_EQ(next.Await(), std::optional<bool>(true));
  EXPECT_GE(b.tracker->View().version(), have + 1);
}

TEST(GroupTrackerTest, WhenVersionGivesUpAtItsDeadlineOnTheTrackersClock) {
  store::MemoryStore store;
  FakeClock clock;
  FakeDaemon a("node-a", 1, &store, &clock);
  AwaitView(*a.tracker);
  VersionResult never;
  a.tracker->WhenVersion(1000, clock.Now() + absl::Seconds(5), never.Callback());
  EXPECT_EQ(never.Await(absl::Milliseconds(100)), std::nullopt) << "answered before its deadline";
  // Ticks of the tracker's clock (a jump would look like a stall of the node itself); each
  // tick, one step: the waiter is answered false once its deadline passed.
  for (int tick = 0; tick < 40 && !never.Await(absl::ZeroDuration()).has_value(); ++tick) {
    const int64_t before = a.tracker->steps();
    clock.Advance(absl::Milliseconds(200));
    a.worker->Wake(a.tracker.get());
    ASSERT_TRUE(AwaitStep(*a.tracker, before));
  }
  EXPECT_EQ(never.Await(), std::optional<bool>(false));
}

}  // namespace
}  // namespace tpd::group
