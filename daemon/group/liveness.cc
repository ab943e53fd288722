#include "daemon/group/liveness.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/group/heartbeat.h"
#include "daemon/logging.h"

namespace tpd::group {
namespace {

// Past this many remembered peers, stale reads are dropped before a new one is kept.
constexpr size_t kMaxPeersRemembered = 1024;

// Code and message; not ToString(), which would show the store's internal payloads.
std::string Describe(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

}  // namespace

NodeLiveness::NodeLiveness(store::Store* store, std::string store_name, std::string node,
                           const std::atomic<uint64_t>* incarnation, absl::Duration ttl,
                           absl::Duration peer_reads_fresh_for,
                           std::function<void(uint64_t incarnation)> on_lease_lost)
    : store_(store),
      leases_(store->leases()),
      store_name_(std::move(store_name)),
      node_(std::move(node)),
      incarnation_(incarnation),
      ttl_(ttl),
      peer_reads_fresh_for_(peer_reads_fresh_for),
      on_lease_lost_(std::move(on_lease_lost)) {}

absl::Status NodeLiveness::Announce(uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  if (leased() && lease_ != 0 && absl::Now() - last_renewed_ > ttl_ / 4) {
    // Not renewed lately (this daemon was stalled, or its beats fail): the lease may have
    // expired, and members recorded under it would be evicted at once. Find out first.
    (void)RenewLocked();
  }
  if (incarnation != incarnation_->load()) {
    // Writing it would undo a newer incarnation's key, and peers would evict that one's
    // members as restarted.
    return absl::AbortedError(absl::StrCat("node ", node_, " took a new incarnation while ",
                                           "members of the previous one were being recorded"));
  }
  if (written_ == incarnation) return absl::OkStatus();
  absl::Status written = WriteLocked(incarnation);
  NoteBeatLocked(written);
  if (absl::IsNotFound(written) && leased()) {
    LeaseLostLocked(written);
    return absl::AbortedError(absl::StrCat("node ", node_, "'s liveness lease expired while ",
                                           "members were being recorded"));
  }
  return written;
}

void NodeLiveness::Beat() {
  absl::MutexLock lock(&mu_);
  if (leased() && lease_ != 0) {
    absl::Status renewed = RenewLocked();
    // Unreachable: the next beat tries again, within the TTL.
    if (!renewed.ok() && !absl::IsNotFound(renewed)) return;
    if (renewed.ok() && written_ == incarnation_->load()) return;
  }
  // A lost beat is retried at the next tick; peers judge only what outlasts the window.
  absl::Status written = WriteLocked(incarnation_->load());
  NoteBeatLocked(written);
  if (absl::IsNotFound(written) && leased()) LeaseLostLocked(written);
}

void NodeLiveness::Stop() {
  absl::MutexLock lock(&mu_);
  if (!leased() || lease_ == 0) return;
  absl::Status revoked = leases_->RevokeLease(lease_);
  if (!revoked.ok()) {
    DaemonLog().info(
        "[node {}] [store {}] liveness lease {:016x} not revoked ({}); it expires "
        "within {}",
        node_, store_name_, lease_, Describe(revoked), absl::FormatDuration(ttl_));
  }
  lease_ = 0;
  written_ = 0;
  absl::MutexLock stats_lock(&stats_mu_);
  stats_.lease = 0;
}

absl::Status NodeLiveness::RenewLocked() {
  absl::Status renewed = leases_->KeepLeaseAlive(lease_);
  if (absl::IsNotFound(renewed)) {
    LeaseLostLocked(renewed);
    return renewed;
  }
  if (renewed.ok()) last_renewed_ = absl::Now();
  NoteBeatLocked(renewed);
  return renewed;
}

absl::Status NodeLiveness::WriteLocked(uint64_t incarnation) {
  if (!leased()) {
    absl::Status written =
        store_->Set(HeartbeatKey(node_), HeartbeatValue(incarnation, ++counter_));
    if (written.ok()) written_ = incarnation;
    return written;
  }
  if (lease_ == 0) {
    absl::StatusOr<store::Leases::Grant> grant = leases_->GrantLease(ttl_);
    if (!grant.ok()) return grant.status();
    lease_ = grant->id;
    last_renewed_ = absl::Now();
    DaemonLog().info("[node {}] [store {}] liveness bound to lease {:016x} (TTL {})", node_,
                     store_name_, lease_, absl::FormatDuration(grant->ttl));
    absl::MutexLock stats_lock(&stats_mu_);
    stats_.lease_ttl = grant->ttl;
  }
  absl::Status written =
      leases_->SetLeased(HeartbeatKey(node_), HeartbeatValue(incarnation, 0), lease_);
  if (written.ok()) written_ = incarnation;
  return written;
}

void NodeLiveness::LeaseLostLocked(const absl::Status& why) {
  DaemonLog().warn(
      "[node {}] [store {}] liveness lease {:016x} expired ({}): peers may have "
      "evicted this node's members",
      node_, store_name_, lease_, std::string(why.message()));
  // The incarnation the lost key named is the one peers may have evicted: leave it, unless
  // the node already did (its trackers saw the eviction first; GroupManager::Reincarnate
  // takes a new one only from `lost`).
  const uint64_t lost = written_;
  lease_ = 0;
  written_ = 0;
  {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.leases_lost;
    stats_.lease = 0;
  }
  if (lost != 0 && on_lease_lost_) on_lease_lost_(lost);
}

absl::StatusOr<std::optional<std::string>> NodeLiveness::ReadPeer(const std::string& node,
                                                                  bool fresh) {
  const absl::Time now = absl::Now();
  if (!fresh) {
    absl::MutexLock lock(&peers_mu_);
    auto it = peers_.find(node);
    if (it != peers_.end() && now - it->second.at < peer_reads_fresh_for_) {
      return it->second.value;
    }
  }
  const std::string key = HeartbeatKey(node);
  absl::StatusOr<bool> present = store_->Check({key});
  if (!present.ok()) return present.status();
  std::optional<std::string> value;
  if (*present) {
    absl::StatusOr<std::string> got = store_->Get(key, absl::Now() + absl::Seconds(1));
    if (got.ok()) {
      // Untrusted like every store value: a heartbeat is two numbers, never kilobytes kept.
      value = got->size() > kMaxHeartbeatBytes ? std::string() : *std::move(got);
    } else {
      // Gone since the check (an expired lease), or the store stopped answering (a timed
      // out call reads DEADLINE_EXCEEDED too): only a check that answers decides.
      present = store_->Check({key});
      if (!present.ok()) return present.status();
      if (*present) return got.status();
    }
  }
  absl::MutexLock lock(&peers_mu_);
  if (peers_.size() >= kMaxPeersRemembered) {
    // Nodes that left every group of the store: forget what is no longer fresh.
    absl::erase_if(
        peers_, [&](const auto& entry) { return now - entry.second.at >= peer_reads_fresh_for_; });
  }
  peers_[node] = PeerRead{value, now};
  return value;
}

LivenessStats NodeLiveness::Stats() {
  absl::MutexLock lock(&stats_mu_);
  LivenessStats stats = stats_;
  stats.leased = leased();
  return stats;
}

void NodeLiveness::NoteBeatLocked(const absl::Status& status) {
  absl::MutexLock lock(&stats_mu_);
  stats_.lease = lease_;
  if (status.ok()) {
    const absl::Time now = absl::Now();
    if (now - stats_.last_beat > ttl_ / 2) last_silence_ended_ = now;
    stats_.last_beat = now;
  } else {
    ++stats_.failed_beats;
    stats_.last_error = Describe(status);
  }
}

bool NodeLiveness::MayHaveLookedSilentSince(absl::Time since) {
  absl::MutexLock lock(&stats_mu_);
  return absl::Now() - stats_.last_beat > ttl_ / 2 || last_silence_ended_ >= since;
}

}  // namespace tpd::group
