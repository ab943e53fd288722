// This daemon's view of one group in one rendezvous store, and its agent in that group:
// it follows every version of the group's record in order (pushed: a store wait on the next
// version, not polling), applies this daemon's joins and leaves by racing for the next
// version (batched, so a thousand local joins cost a few writes), answers static joins when
// the group forms, fails or times out, keeps the watchers of the group informed, evicts
// nodes whose heartbeat stopped, and notices when this daemon's own members were evicted.
//
// Thread safety: thread-safe. The tracker's steps run on its store's GroupWorker (shared by
// every group of that store): they apply changes and read the store; callers enqueue work and
// get answers through callbacks, which run on the worker (or on the caller's thread for
// immediate errors) without the tracker's lock held.

#ifndef TPD_DAEMON_GROUP_GROUP_TRACKER_H_
#define TPD_DAEMON_GROUP_GROUP_TRACKER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/group/clock.h"
#include "daemon/group/group_log.h"
#include "daemon/group/group_worker.h"
#include "daemon/group/liveness.h"
#include "daemon/group/membership.h"
#include "proto/control.pb.h"
#include "store/prefix_store.h"
#include "store/store.h"

namespace tpd::group {

// Who this daemon is in groups. The incarnation changes when the daemon restarts or learns it
// was evicted, so members it held before can never be mistaken for current ones.
struct Node {
  std::string name;
  std::atomic<uint64_t> incarnation{0};
  int64_t device_count = 0;
  // Its agent's URLs (Member.agent_address) and what the agent registered, highest priority
  // first (MemberOptionsRecord.node_transports/node_channels). Set before the first join.
  std::string agent_address;
  std::vector<std::string> transports;
  std::vector<std::string> channels;
};

// Receives a group's versions in order. Called with the tracker's lock held (that is what
// keeps the order), on the worker thread or, for the first SNAPSHOT, in AddWatcher: it must
// only queue the event, never block or call back into the tracker.
class GroupWatcher {
 public:
  virtual ~GroupWatcher() = default;
  virtual void OnEvent(const v1::GroupEvent& event) = 0;
};

struct TrackerOptions {
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // What heartbeat windows, join deadlines and the tracker's schedule are judged by; must
  // outlive the tracker. Join deadlines given to Join() are on this clock.
  Clock* clock = Clock::Real();
  // Runs (on the worker, no lock held) when the heartbeat check evicts another node that went
  // silent (not one that restarted), with the node and why: the daemon fails calls to it at once
  // instead of at their deadline.
  std::function<void(const std::string& node, const std::string& why)> on_node_lost;
};

class GroupTracker : public WorkerTask {
 public:
  using JoinDone = absl::AnyInvocable<void(absl::StatusOr<v1::JoinResponse>)>;
  using Done = absl::AnyInvocable<void(absl::Status)>;
  // A barrier's end: the names of the members counted as arrived because they were gone.
  using BarrierDone = absl::AnyInvocable<void(absl::StatusOr<std::vector<std::string>>)>;

  // `root` is the rendezvous store (nodes' liveness keys live there); the group's own keys
  // are under "tpd/group/<group>/" in it. `store_name` names the store in views ("tcp://h:p").
  // `liveness` writes this node's liveness key in `root`. `root`, `liveness` and `node` must
  // outlive the tracker. `on_evicted` runs (on the worker) with the incarnation whose members
  // this daemon finds evicted, so the daemon can leave it for a new one. `worker` runs the
  // tracker's steps (see GroupWorker); it must outlive the tracker.
  GroupTracker(std::string group, std::string store_name, store::Store* root,
               NodeLiveness* liveness, GroupWorker* worker, Node* node, TrackerOptions options,
               std::function<void(uint64_t incarnation)> on_evicted);
  // Stops; pending joins end with UNAVAILABLE.
  ~GroupTracker() override;

  // One round of work, on the worker: see WorkerTask.
  absl::Time Step() override;

  // Adds a member held by `session_id`. Dynamic groups answer once the member is recorded;
  // static groups once the group is FORMED (or FAILED: INVALID_ARGUMENT, or `deadline`:
  // DEADLINE_EXCEEDED naming the missing ranks; the member is then removed again).
  void Join(JoinSpec spec, std::string session_id, absl::Time deadline, JoinDone done);
  // The client of a Join went away or cancelled it: answers it CANCELLED if still unanswered
  // and withdraws the member, now or as soon as its recording lands. No-op once answered.
  void CancelJoin(const std::string& session_id, const std::string& name);
  // Removes a member this daemon holds for `session_id`; answers the version that recorded it.
  void Leave(const std::string& session_id, const std::string& name,
             absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done);
  // Removes every member of a session that ended.
  void EndSession(const std::string& session_id);
  // Waits until every current member entered the same barrier round. In a static group, members
  // gone since it formed count as arrived: `done` gets their names.
  void Barrier(const std::string& session_id, const std::string& name, absl::Time deadline,
               BarrierDone done);
  // Leaves with every local member (daemon shutdown), then Stop().
  void Shutdown();
  // Stops this group's steps and ends everything pending here with UNAVAILABLE: queued ops, joins
  // waiting for formation, barrier waits. Later calls are answered UNAVAILABLE at once.
  // Idempotent; the destructor calls it.
  void Stop();

  // The group as this daemon knows it now, without waiting (before the first read of the
  // store it is EMPTY at version 0). Views of a damaged group show it FAILED with the reason.
  v1::GroupView View();
  // The group once this daemon has read it from its store: `done` runs at once, or on the
  // worker after the first read; UNAVAILABLE naming the store when that read failed.
  using ViewDone = absl::AnyInvocable<void(absl::StatusOr<v1::GroupView>)>;
  void GetView(ViewDone done);
  // Steps taken so far (tests wait for a step instead of sleeping).
  int64_t steps() const { return steps_.load(); }
  // Nothing here needs the tracker: no local member, watcher, queued or pending operation.
  bool Idle();
  // The session holding local member `name`, if this daemon holds it.
  std::optional<std::string> SessionOf(const std::string& name);
  // Member `name` in the newest version this daemon has seen, if it is one, with that
  // version's number in `*version` (when not null).
  std::optional<v1::Member> MemberNamed(const std::string& name, int64_t* version = nullptr);
  // Runs `done(true)` once this daemon has read version `version` of the group (at once when
  // it has), or `done(false)` at `deadline` (checked every heartbeat interval), when the
  // tracker stops, or at once when kMaxVersionWaiters wait already. Never under the
  // tracker's lock.
  using VersionDone = absl::AnyInvocable<void(bool reached)>;
  void WhenVersion(int64_t version, absl::Time deadline, VersionDone done);
  static constexpr size_t kMaxVersionWaiters = 4096;
  // In the newest version: member `from`'s negotiated device map toward member `to` (its
  // reverse map when `reverse`: the one its replies to `to` follow), if it has one.
  std::optional<v1::DeviceMap> DeviceMapOf(const std::string& from, const std::string& to,
                                           bool reverse);
  // `session_id` holds a member here, or has a join on its way.
  bool Holds(const std::string& session_id);
  // The group's keys in its rendezvous store ("tpd/group/<group>/...") as the calls of
  // `user`, a local user, reach them: a store another daemon serves charges them to that
  // user's share there (store::Store::OnBehalfOf). For the user keys GroupManager::GroupStore
  // serves under them; valid while the tracker lives.
  std::unique_ptr<store::Store> KeysFor(const store::StoreUser& user);
  // Other nodes of the group and when this daemon last saw their heartbeat change.
  std::map<std::string, absl::Time> PeerHeartbeats();
  // Sends `watcher` a SNAPSHOT (now, or after the first read of the store), then every
  // later version until RemoveWatcher. Never waits.
  void AddWatcher(std::shared_ptr<GroupWatcher> watcher);
  void RemoveWatcher(const std::shared_ptr<GroupWatcher>& watcher);

 private:
  struct LocalMember {
    std::string session_id;
    uint64_t incarnation = 0;  // this node's, when the member joined
    int64_t uid = -1;          // the user its session is bound to (JoinSpec::uid)
    absl::Time recorded;       // when this daemon recorded it
    // Barrier rounds count within a generation (see Barrier()).
    int64_t barrier_generation = -1;
    int64_t barrier_round = 0;
  };
  struct PendingJoin {
    std::string name;
    std::string session_id;
    absl::Time deadline;
    JoinDone done;
    bool omit_members = false;
  };
  // A barrier entry waiting for the worker to do its store calls.
  struct BarrierOp {
    std::string key;   // "barrier/<generation>/<round>"
    std::string name;  // the member entering
    int64_t generation = 0;
    int64_t round = 0;
    int64_t expected = 0;
    // A static group's barrier: members gone count as arrived (CompleteWithoutTheGone).
    bool counts_gone = false;
    absl::Time deadline;
    BarrierDone done;
  };
  // A change this daemon wants recorded.
  struct Op {
    std::optional<JoinSpec> join;  // else a removal
    std::string session_id;
    absl::Time deadline;
    JoinDone join_done;
    std::function<bool(const v1::Member&)> remove;
    std::string change;  // "LEFT" or "EVICTED"
    std::string why;
    absl::AnyInvocable<void(absl::StatusOr<int64_t>)> remove_done;
  };

  void Enqueue(Op op);
  // Forgets the in-flight count of the joins among `ops`, now answered or recorded.
  void SettledJoins(const std::vector<Op>& ops);
  // The first read of the group: observes it and answers views and watchers waiting for it.
  void Load();
  void ArmVersionWait() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies queued ops as the next version, retrying when another daemon wins the race.
  void ApplyOps(std::vector<Op> ops);
  // Reads versions after the newest seen, in order, and observes each.
  void CatchUp();
  // Takes a new version: updates state, tells watchers, settles joins, detects eviction.
  void Observe(v1::GroupRecord record, bool snapshot);
  void CheckDeadlines();
  // Answers the version waiters whose version was read or whose deadline passed (all of them
  // once stopping).
  void SettleVersionWaiters();
  // Counts this member into its barrier round and waits (without a thread) for the round.
  void EnterBarrier(BarrierOp op);
  // A static group's barrier `key` whose live members have all arrived while others are gone
  // (left, died, evicted) is done, with the names of the gone: they never arrive, and waiting
  // for them would hold a graceful shutdown until its timeout. Runs on the worker.
  void CompleteWithoutTheGone(const std::string& key, int64_t generation);
  // One wait in barrier `key` ended (open_barriers_).
  void CloseOpenBarrier(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::GroupView ViewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ViewLocked, built once per version and shared: every local rank of a big group fetches the
  // member list (GetGroup), and copying it happens outside the lock.
  std::shared_ptr<const v1::GroupView> SharedViewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Members of `record` on this node from an earlier incarnation that no local session holds.
  // The uid whose sessions hold this group's members on this node, as this daemon's own
  // sessions say (nullopt: none here). Never read from a record: ApplyOps sets the record's
  // entry for this node from it before it applies joins.
  std::optional<int64_t> LocalOwnerUid() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::set<std::string> StaleOwnMembers(const v1::GroupRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs a failure to read the group (rate-limited); DATA_LOSS marks the group damaged.
  void NoteStoreError(const absl::Status& status);
  void CheckHeartbeats();
  // CheckHeartbeats in a store with leases: `nodes` (other nodes -> their members'
  // incarnations) are judged by whether their liveness keys exist and what they name.
  void CheckLeases(const std::map<std::string, std::set<uint64_t>>& nodes);
  // Whether `node`'s liveness key, read again bypassing the shared reads, still reads
  // `judged`: the condition of every eviction.
  bool FreshReadAgrees(const std::string& node, const std::optional<std::string>& judged);
  // Queues the eviction of the members of `node` that `remove` selects.
  void Evict(const std::string& node, const std::string& why,
             std::function<bool(const v1::Member&)> remove);

  const std::string group_;
  const std::string store_name_;
  NodeLiveness* const liveness_;
  store::Store* const root_;
  store::PrefixStore group_store_;
  GroupLog log_;
  Node* const node_;
  const TrackerOptions options_;
  const std::function<void(uint64_t incarnation)> on_evicted_;

  absl::Mutex mu_;
  v1::GroupRecord latest_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const v1::GroupView> view_cache_ ABSL_GUARDED_BY(mu_);  // SharedViewLocked
  // Index of latest_'s members by name (calls look their target up here).
  absl::flat_hash_map<std::string, int> member_index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> negotiated_index_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, LocalMember> local_ ABSL_GUARDED_BY(mu_);
  // Sessions that ended while a join of theirs was in flight: that join is undone once it
  // lands. An entry goes when the session's last in-flight join is settled.
  std::set<std::string> ended_sessions_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingJoin> pending_joins_ ABSL_GUARDED_BY(mu_);
  std::set<std::shared_ptr<GroupWatcher>> watchers_ ABSL_GUARDED_BY(mu_);
  std::deque<Op> ops_ ABSL_GUARDED_BY(mu_);
  std::deque<BarrierOp> barriers_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::StatusOr<v1::GroupRecord>> arrived_ ABSL_GUARDED_BY(mu_);
  bool wait_armed_ ABSL_GUARDED_BY(mu_) = false;
  store::WaitId wait_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // After the store refused a version wait, no new one before this time (no busy loop).
  absl::Time rearm_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Joins queued or being recorded, by session: a session ending meanwhile must undo them.
  std::map<std::string, int> joins_in_flight_ ABSL_GUARDED_BY(mu_);
  // Joins cancelled while being recorded, as (session, name): undone when they land.
  std::set<std::pair<std::string, std::string>> cancelled_joins_ ABSL_GUARDED_BY(mu_);
  // Barrier waits in the store, cancelled by Stop().
  std::set<store::WaitId> barrier_waits_ ABSL_GUARDED_BY(mu_);
  // Static groups' barriers this daemon's members wait in (key -> generation, waits), checked
  // again when a version removes members; and the members of the formed group, by generation.
  struct OpenBarrier {
    int64_t generation = 0;
    int waits = 0;
  };
  std::map<std::string, OpenBarrier> open_barriers_ ABSL_GUARDED_BY(mu_);
  bool recheck_barriers_ ABSL_GUARDED_BY(mu_) = false;
  int64_t formed_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> formed_names_ ABSL_GUARDED_BY(mu_);
  // The worker has read the group's newest version once; views and snapshots wait for it.
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  // The first read's failure (not DATA_LOSS, which damaged_ holds): GetView answers it.
  absl::Status load_error_ ABSL_GUARDED_BY(mu_);
  std::vector<ViewDone> view_waiters_ ABSL_GUARDED_BY(mu_);
  struct VersionWaiter {
    absl::Time deadline;
    VersionDone done;
  };
  // WhenVersion's waiters, by the version they wait for.
  std::multimap<int64_t, VersionWaiter> version_waiters_ ABSL_GUARDED_BY(mu_);
  // Watchers have been sent a SNAPSHOT (the first successful read sends it to those waiting).
  bool snapshot_sent_ ABSL_GUARDED_BY(mu_) = false;
  // Set while the group's newest record in the store is not a valid one (DATA_LOSS naming
  // the key): changes are refused with it and views show the group FAILED with it.
  absl::Status damaged_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  absl::Time last_error_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t errors_suppressed_ ABSL_GUARDED_BY(mu_) = 0;
  // Other nodes' last heartbeat values and when this daemon saw them change.
  std::map<std::string, std::pair<std::string, absl::Time>> heartbeats_ ABSL_GUARDED_BY(mu_);
  absl::Time last_heartbeat_check_ = absl::InfinitePast();  // worker only

  GroupWorker* const worker_;
  absl::Time next_tick_ = absl::InfinitePast();      // worker only
  absl::Time next_catch_up_ = absl::InfinitePast();  // worker only
  std::atomic<int64_t> steps_{0};
};

}  // namespace tpd::group

#endif  // TPD_DAEMON_GROUP_GROUP_TRACKER_H_
