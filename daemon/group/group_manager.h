// All groups of this daemon: client sessions, the rendezvous stores that init_method URLs
// name (a daemon's store reached through its peer port, or a shared file), one GroupTracker
// per (store, group), and the heartbeat this daemon writes into every store it uses.
//
// A tcp:// URL naming this very daemon is reached through its own peer port like any other:
// whether an address is "self" is never guessed from host names (0.0.0.0, 127.0.0.2, ...),
// so every daemon of a group sees one store.
//
// Thread safety: thread-safe. One heartbeat thread per store (a slow or unreachable store
// must not delay the heartbeats written to the others); trackers own their workers; the
// rest runs on the callers' (gRPC) threads.

#ifndef TPD_DAEMON_GROUP_GROUP_MANAGER_H_
#define TPD_DAEMON_GROUP_GROUP_MANAGER_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/group/group_tracker.h"
#include "proto/control.pb.h"
#include "store/rendezvous/init_method.h"
#include "store/rendezvous/store_factory.h"
#include "store/store.h"

namespace tpd::group {

struct GroupManagerOptions {
  std::string node_name;
  int64_t device_count = 0;
  // How rendezvous stores are opened (token, TLS, dial networks, ...).
  store::RendezvousOptions rendezvous;
  absl::Duration default_join_timeout = absl::Seconds(300);
  TrackerOptions tracker;
};

class GroupManager {
 public:
  explicit GroupManager(GroupManagerOptions options);
  ~GroupManager();

  // Sessions: one per connected client process.
  std::string OpenSession(const std::string& client);
  // Removes every member the session held, at once.
  void EndSession(const std::string& session_id);

  void Join(const v1::JoinRequest& request, GroupTracker::JoinDone done);
  // The Join `request` was cancelled by its client (gone, or past its deadline).
  void CancelJoin(const v1::JoinRequest& request);
  void Leave(const v1::LeaveRequest& request,
             absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done);
  void Barrier(const v1::BarrierRequest& request, GroupTracker::Done done);
  absl::StatusOr<v1::GroupView> GetGroup(const std::string& group, const std::string& init_method);
  // The tracker of `group`, created from `init_method` when this daemon has none yet.
  absl::StatusOr<GroupTracker*> Tracker(const std::string& group, const std::string& init_method);
  std::vector<v1::GroupView> ListGroups();
  // Other nodes seen in this daemon's groups, with when their heartbeat last changed.
  std::map<std::string, absl::Time> PeerHeartbeats();

  // Members leave explicitly, trackers stop, the heartbeat stops. Idempotent.
  void Shutdown();

  const Node& node() const { return node_; }

 private:
  struct Rendezvous {
    std::string store_name;
    store::Store* store;
  };
  // `creation`: only a Join may create a file:// store's file.
  absl::StatusOr<Rendezvous> StoreFor(const store::InitMethod& method,
                                      store::FileCreation creation);
  absl::StatusOr<GroupTracker*> TrackerFor(const std::string& group, const Rendezvous& rdzv)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckSession(const std::string& session_id);
  // Writes this node's heartbeat into `store` until Shutdown.
  void HeartbeatTo(store::Store* store);
  void Reincarnate();

  const GroupManagerOptions options_;
  Node node_;

  absl::Mutex mu_;
  std::map<std::string, std::string> sessions_ ABSL_GUARDED_BY(mu_);  // id -> client
  std::map<std::string, std::unique_ptr<store::Store>> stores_ ABSL_GUARDED_BY(mu_);
  // By store name, then group name.
  std::map<std::string, std::unique_ptr<GroupTracker>> trackers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> tracker_store_ ABSL_GUARDED_BY(mu_);  // group -> store
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;

  absl::Notification stop_heartbeat_;
  std::vector<std::thread> heartbeats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpd::group

#endif  // TPD_DAEMON_GROUP_GROUP_MANAGER_H_
