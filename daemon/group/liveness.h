// How this node shows the other daemons of a rendezvous store that it lives: its key
// "tpd/node/<node>" (heartbeat.h) names its current incarnation.
//
//  - In a store with leases (etcd): the key is bound to a lease of the heartbeat timeout,
//    renewed every heartbeat interval and written again only when the incarnation changes,
//    so liveness costs no writes. When the daemon stops renewing (killed, stalled, cut off),
//    the store's server deletes the key: its absence is the verdict, the same for every
//    reader. A lease found expired means peers may have evicted this node's members, so the
//    node leaves the incarnation the key named (`on_lease_lost`) before it writes its key
//    again.
//  - Otherwise: the value also carries a counter written every interval; peers judge a
//    counter that stops changing (GroupTracker::CheckHeartbeats).
//
// Thread safety: thread-safe. One mutex orders every write of the key, and the key is only
// ever written with the node's current incarnation, read under that mutex: a beat or an
// announcement never puts back an incarnation the node has left.

#ifndef TPD_DAEMON_GROUP_LIVENESS_H_
#define TPD_DAEMON_GROUP_LIVENESS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "store/store.h"

namespace tpd::group {

// What Admin.Status shows of a node's liveness in one store.
struct LivenessStats {
  bool leased = false;
  int64_t lease = 0;  // 0: none held (not yet granted, or expired and not yet replaced)
  absl::Duration lease_ttl;
  absl::Time last_beat = absl::InfinitePast();  // last write or renewal that succeeded
  int64_t failed_beats = 0;
  std::string last_error;
  int64_t leases_lost = 0;
};

class NodeLiveness {
 public:
  // `store` and `incarnation` (the node's, changed by whoever reincarnates it) must outlive
  // this object. `store_name` names the store in logs. `ttl`: the lease's, in a store with
  // leases (the heartbeat timeout).
  // `on_lease_lost` gets the incarnation the expired lease's key named. Other nodes' keys
  // read less than `peer_reads_fresh_for` ago are not read again (ReadPeer).
  NodeLiveness(store::Store* store, std::string store_name, std::string node,
               const std::atomic<uint64_t>* incarnation, absl::Duration ttl,
               absl::Duration peer_reads_fresh_for,
               std::function<void(uint64_t incarnation)> on_lease_lost);

  // Makes the key name `incarnation` now, unless it already does: called before members of
  // that incarnation are recorded, so no peer reads a previous life's key beside them and
  // evicts them as restarted. A lease not renewed for a quarter of its TTL is renewed first.
  // ABORTED when `incarnation` is no longer the node's (it took a new one meanwhile, maybe
  // because the lease had expired): record the members under the new one instead.
  absl::Status Announce(uint64_t incarnation) ABSL_LOCKS_EXCLUDED(mu_);

  // One heartbeat: renews the lease (taking a new one, and a new incarnation, when it
  // expired), or writes the next counter.
  void Beat() ABSL_LOCKS_EXCLUDED(mu_);

  // Revokes the lease, so peers see the node gone at once instead of after its TTL.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Another node's liveness key in this store: its value ("" for one longer than
  // kMaxHeartbeatBytes: not a heartbeat), nullopt when it is absent, an error when the store
  // did not answer (no verdict). Every group of the store judges the same nodes each
  // heartbeat interval; they share one read per key and half interval, unless `fresh`.
  absl::StatusOr<std::optional<std::string>> ReadPeer(const std::string& node, bool fresh = false)
      ABSL_LOCKS_EXCLUDED(peers_mu_);

  // Whether peers may have found this node silent in this store at some time after `since`:
  // its key went more than half the heartbeat timeout without a successful write or renewal
  // (it was stalled, cut off, or the store failed it), then or now. A group record that
  // evicts this node's members when this says no disagrees with what the node knows of
  // itself (GroupTracker::Observe).
  bool MayHaveLookedSilentSince(absl::Time since) ABSL_LOCKS_EXCLUDED(stats_mu_);

  bool leased() const { return leases_ != nullptr; }
  LivenessStats Stats() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Writes the key with `incarnation` (under the current lease, granting one if needed).
  absl::Status WriteLocked(uint64_t incarnation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Renews the lease held; NOT_FOUND (after LeaseLostLocked) when it had expired.
  absl::Status RenewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lease expired: forget it and leave the incarnation its key named.
  void LeaseLostLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a beat's outcome for Stats.
  void NoteBeatLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  store::Store* const store_;
  store::Leases* const leases_;  // nullptr: a store without leases
  const std::string store_name_;
  const std::string node_;
  const std::atomic<uint64_t>* const incarnation_;
  const absl::Duration ttl_;
  const absl::Duration peer_reads_fresh_for_;
  const std::function<void(uint64_t incarnation)> on_lease_lost_;

  absl::Mutex mu_;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;     // 0: none granted (yet, or since one expired)
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;  // the incarnation the key names
  absl::Time last_renewed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // or granted
  int64_t counter_ ABSL_GUARDED_BY(mu_) = 0;
  // Apart from mu_, which store calls hold for up to their timeout: Admin.Status must answer
  // while the store does not. Order: mu_ before stats_mu_.
  absl::Mutex stats_mu_ ABSL_ACQUIRED_AFTER(mu_);
  LivenessStats stats_ ABSL_GUARDED_BY(stats_mu_);
  // When the last success ended a silence longer than half the timeout.
  absl::Time last_silence_ended_ ABSL_GUARDED_BY(stats_mu_) = absl::InfinitePast();

  struct PeerRead {
    std::optional<std::string> value;
    absl::Time at;
  };
  absl::Mutex peers_mu_;  // never held across a store call
  absl::flat_hash_map<std::string, PeerRead> peers_ ABSL_GUARDED_BY(peers_mu_);
};

}  // namespace tpd::group

#endif  // TPD_DAEMON_GROUP_LIVENESS_H_
