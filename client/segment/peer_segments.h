// The segments of other sessions that this client reads received tensors in: the daemon does
// not copy a host tensor between two sessions of one uid and gid, it points the receiver's
// tensor entry into the sender's tx heap (docs/data_plane.md, "Tensors shared between
// sessions"). Each such segment comes once, as a peer notice with a read-only fd on the
// session's data connection (shm/peer_notice.h), before any completion names it; this
// class reads the notices, maps each segment read-only, and lets a mapping go once its
// session ended (Op::kPeerGone) and no received tensor holds it.
//
// Thread safety: thread-safe.

#ifndef TPD_CLIENT_SEGMENT_PEER_SEGMENTS_H_
#define TPD_CLIENT_SEGMENT_PEER_SEGMENTS_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "shm/segment.h"

namespace tpd {

// One peer's segment, mapped read-only, and where its tx heap lies in it.
struct PeerSegment {
  shm::ReadOnlyMapping mapping;
  uint64_t tx_offset = 0;
  uint64_t tx_bytes = 0;

  // Where [offset, offset + length) of the segment is mapped, or null when that range is not
  // inside the tx heap (the only place a sender's tensors may lie).
  const char* Find(uint64_t offset, uint64_t length) const;
};

class PeerSegments {
 public:
  // Reads notices from `notice_fd` (owned; the session's data connection, whose receive
  // timeout bounds each wait); -1: none ever come, and every Get fails.
  explicit PeerSegments(int notice_fd);
  ~PeerSegments();
  PeerSegments(const PeerSegments&) = delete;
  PeerSegments& operator=(const PeerSegments&) = delete;

  // The segment of peer `id`, reading the notices waiting on the connection until its own
  // (the daemon sends it before the completion that names it). INTERNAL naming the peer when
  // the connection has none (it ended, or a notice or fd was malformed).
  absl::StatusOr<std::shared_ptr<const PeerSegment>> Get(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Peer `id` ended: the mapping goes when the last tensor viewing it does. Reads the notices
  // already waiting first, so one for `id` is not mapped after.
  void Forget(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Peers mapped now.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Reads one notice and maps it; false when the connection gave none (`why` says why).
  bool ReadOne(std::string* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int notice_fd_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<const PeerSegment>> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpd

#endif  // TPD_CLIENT_SEGMENT_PEER_SEGMENTS_H_
