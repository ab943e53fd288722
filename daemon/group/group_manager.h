// All groups of this daemon: client sessions, the rendezvous stores that init_method URLs
// name (a daemon's store reached through its peer port, or a shared file), one GroupTracker
// per (store, group), and the heartbeat this daemon writes into every store it uses.
//
// A tcp:// URL naming this very daemon is reached through its own peer port like any other:
// whether an address is "self" is never guessed from host names (0.0.0.0, 127.0.0.2, ...),
// so every daemon of a group sees one store.
//
// Nothing lives forever: a group with no local member, watcher or call in progress for
// `idle_release` is released (its tracker and worker stop), and a store no group uses any
// more is closed with its heartbeat thread. At most `max_groups` groups are followed at once
// (RESOURCE_EXHAUSTED past that, and when a thread cannot be started).
//
// Thread safety: thread-safe. Per rendezvous store in use: one GroupWorker thread running
// all its groups, and one heartbeat thread (a slow or unreachable store must not delay the
// heartbeats written to the others, nor its groups those of other stores); one reaper
// thread; the rest runs on the callers' (gRPC) threads.

#ifndef TPD_DAEMON_GROUP_GROUP_MANAGER_H_
#define TPD_DAEMON_GROUP_GROUP_MANAGER_H_

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/group/group_tracker.h"
#include "daemon/group/liveness.h"
#include "proto/control.pb.h"
#include "store/rendezvous/init_method.h"
#include "store/rendezvous/store_factory.h"
#include "store/store.h"

namespace tpd::group {

struct GroupManagerOptions {
  std::string node_name;
  int64_t device_count = 0;
  // This node's agent: its URLs and what it registered (see Node).
  std::string agent_address;
  std::vector<std::string> transports;
  std::vector<std::string> channels;
  // How rendezvous stores are opened (token, TLS, dial networks, ...).
  store::RendezvousOptions rendezvous;
  absl::Duration default_join_timeout = absl::Seconds(300);
  TrackerOptions tracker;
  // Groups followed at once, in all; those a lookup or watch made the daemon follow (no
  // session: nobody to count them against) together; those one uid's joins did.
  int64_t max_groups = 1024;
  int64_t max_unattributed_groups = 64;
  int64_t max_groups_per_uid = 512;
  // Groups one client session may hold members in at once.
  int64_t max_groups_per_session = 64;
  // How long a group stays after its last local member, watcher or call.
  absl::Duration idle_release = absl::Seconds(60);
  // Sessions of one uid open at once; BindSessionUid refuses one more.
  int64_t max_sessions_per_uid = 256;
  // A session not bound to a uid by then is ended (set_session_ender).
  absl::Duration identify_timeout = absl::Seconds(10);
  // Sessions not bound to a uid yet, at once: opening one more ends the oldest of them
  // (set_session_ender), so sessions nobody identifies cannot hold the places of sessions
  // that do (a client identifies within milliseconds of opening).
  int64_t max_unidentified_sessions = 1024;
  // The key of UserSecret: derived from the cluster token, so every daemon of the cluster
  // gives a uid the same secret. Must not be empty.
  std::string user_secret_key;
};

class GroupManager {
 public:
  explicit GroupManager(GroupManagerOptions options);
  ~GroupManager();

  // Sessions: one per connected client process.
  std::string OpenSession(const std::string& client);
  // Removes every member the session held, at once.
  void EndSession(const std::string& session_id);
  // Sessions open now.
  int64_t SessionCount();
  // Binds the session to `uid`, the user its data connection came from (docs/security.md, "Who
  // may join a group"): its joins are that uid's. NOT_FOUND for no such session,
  // PERMISSION_DENIED when it is bound to another uid already, RESOURCE_EXHAUSTED when `uid`
  // has max_sessions_per_uid sessions open.
  absl::Status BindSessionUid(const std::string& session_id, int64_t uid);
  // How sessions that did not identify within identify_timeout are ended (their stream closed
  // saying why). Set once, before sessions open.
  void set_session_ender(std::function<void(const std::string& id, const std::string& why)> end) {
    session_ender_ = std::move(end);
  }

  // The uid `session_id` is bound to: FAILED_PRECONDITION for a session not open or not
  // identified yet.
  absl::StatusOr<int64_t> SessionUid(const std::string& session_id);
  // The secret of the uid `session_id` is bound to, for `purpose` (Control.UserSecret):
  // HMAC(user_secret_key, uid, purpose). FAILED_PRECONDITION for a session not open or not
  // identified yet.
  absl::StatusOr<std::string> UserSecret(const std::string& session_id, absl::string_view purpose);

  void Join(const v1::JoinRequest& request, GroupTracker::JoinDone done);
  // The Join `request` was cancelled by its client (gone, or past its deadline).
  void CancelJoin(const v1::JoinRequest& request);
  void Leave(const v1::LeaveRequest& request,
             absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done);
  void Barrier(const v1::BarrierRequest& request, GroupTracker::BarrierDone done);
  // Answers once this daemon has read the group from its store (never blocks the caller).
  void GetGroup(const std::string& group, const std::string& init_method,
                GroupTracker::ViewDone done);
  // The tracker of `group`, created from `init_method` when this daemon has none yet. The
  // caller's reference keeps it alive (a released group's tracker is stopped, not freed).
  absl::StatusOr<std::shared_ptr<GroupTracker>> Tracker(const std::string& group,
                                                        const std::string& init_method);
  std::vector<v1::GroupView> ListGroups();
  // The rendezvous stores in use, by name, with this node's liveness in each.
  std::map<std::string, LivenessStats> RendezvousStores();
  // The members of the cluster behind each rendezvous store in use that runs as one (etcd),
  // by store name, as its endpoints answer by `deadline` (store::Cluster::ProbeMembers).
  std::map<std::string, store::Cluster::Health> ProbeStoreClusters(absl::Time deadline);
  // The store `group`'s members share on every node (its rendezvous store, under
  // "tpd/group/<group>/store/"), for `session_id`, which must hold a member of it here
  // (PERMISSION_DENIED otherwise). The pointer keeps the store open while it is held.
  absl::StatusOr<std::shared_ptr<store::Store>> GroupStore(const std::string& session_id,
                                                           const std::string& group);
  // The session holding worker `name` of `group` on this daemon, if any.
  std::optional<std::string> SessionOf(const std::string& group, const std::string& name);
  // Member `name` of `group` as this daemon last read it, if the group is followed and has it.
  // `*version` (when not null) is the number of the version read, 0 for a group not followed.
  std::optional<v1::Member> MemberNamed(const std::string& group, const std::string& name,
                                        int64_t* version = nullptr);
  // GroupTracker::WhenVersion of a followed group; `done(false)` at once for another.
  void WhenVersion(const std::string& group, int64_t version, absl::Time deadline,
                   GroupTracker::VersionDone done);
  // GroupTracker::DeviceMapOf of a followed group.
  std::optional<v1::DeviceMap> DeviceMapOf(const std::string& group, const std::string& from,
                                           const std::string& to, bool reverse);
  // Other nodes seen in this daemon's groups, with when their heartbeat last changed.
  std::map<std::string, absl::Time> PeerHeartbeats();

  // From now on Join is refused UNAVAILABLE with `why` (a drain: "the tpd daemon on node X
  // is draining"); members already joined stay until Shutdown.
  void StopJoins(std::string why);
  // Members leave explicitly, trackers stop, the heartbeat stops; later calls are refused
  // UNAVAILABLE with `why`. Idempotent: the first reason stays.
  void Shutdown(std::string why = "the tpd daemon is shutting down");

  const Node& node() const { return node_; }

 private:
  // A rendezvous store in use and the heartbeat this node writes into it. The trackers of its
  // groups share it; the last one to go closes it (the destructor stops the heartbeat).
  struct StoreEntry {
    ~StoreEntry();
    std::string name;  // "tcp://h:p", "file:///p"
    std::unique_ptr<store::Store> store;
    // This node's liveness key in `store`, written by `heartbeat` and by the trackers
    // before they record members (declared after `store`: it goes first).
    std::unique_ptr<NodeLiveness> liveness;
    // Runs the steps of every group of this store (declared after `store`: it goes first).
    std::unique_ptr<GroupWorker> worker;
    absl::Notification stop;
    std::thread heartbeat;
  };
  struct TrackerEntry {
    std::shared_ptr<GroupTracker> tracker;
    std::string store_name;
    absl::Time last_used;
    std::optional<int64_t> uid;  // whose join it counts against; nullopt: a lookup's
  };

  // The stores some group still holds open.
  std::vector<std::shared_ptr<StoreEntry>> OpenStores() ABSL_LOCKS_EXCLUDED(mu_);
  // `creation`: only a Join may create a file:// store's file.
  absl::StatusOr<std::shared_ptr<StoreEntry>> StoreFor(const store::InitMethod& method,
                                                       store::FileCreation creation);
  // `uid`: the joiner's, for a join; nullopt for a lookup or watch. A group a lookup made
  // this daemon follow is counted against the first uid that joins it from then on.
  absl::StatusOr<std::shared_ptr<GroupTracker>> TrackerFor(const std::string& group,
                                                           std::shared_ptr<StoreEntry> entry,
                                                           std::optional<int64_t> uid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tracker of a group this daemon already follows, or nullptr.
  std::shared_ptr<GroupTracker> Known(const std::string& group);
  std::vector<std::shared_ptr<GroupTracker>> AllTrackers();
  absl::Status CheckSession(const std::string& session_id);
  // RESOURCE_EXHAUSTED when joining `group` would take the session past
  // max_groups_per_session groups.
  absl::Status CheckSessionGroups(const std::string& session_id, const std::string& group);
  // Writes this node's heartbeat into `entry`'s store until it closes or Shutdown.
  void HeartbeatTo(StoreEntry* entry);
  // Releases idle groups, every idle_release / 4, until Shutdown.
  void ReapLoop();
  // Takes a new incarnation unless the node already left `lost` (two findings of one loss
  // must not disown members that joined under the first new one); `why` says what was lost.
  void Reincarnate(uint64_t lost, absl::string_view why);

  const GroupManagerOptions options_;
  Node node_;

  absl::Mutex mu_;
  struct SessionEntry {
    std::string client;
    std::optional<int64_t> uid;  // bound by the data socket (BindSessionUid)
    absl::Time opened;
  };
  std::function<void(const std::string& id, const std::string& why)> session_ender_;
  std::map<std::string, SessionEntry> sessions_ ABSL_GUARDED_BY(mu_);  // by id
  std::map<std::string, std::weak_ptr<StoreEntry>> stores_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, TrackerEntry> trackers_ ABSL_GUARDED_BY(mu_);  // by group name
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string shut_down_why_ ABSL_GUARDED_BY(mu_);
  std::string joins_refused_why_ ABSL_GUARDED_BY(mu_);  // empty while joins are admitted

  absl::Notification stop_reaper_;
  std::thread reaper_;
};

}  // namespace tpd::group

#endif  // TPD_DAEMON_GROUP_GROUP_MANAGER_H_
