// Peer notices: how a client learns the segments of other sessions that the daemon points
// its received tensors into instead of copying them (docs/data_plane.md, "Tensors shared
// between sessions"). Part of the wire contract between a client and its daemon.
//
//   daemon → client   on the session's data connection (silent otherwise after the attach
//                     reply), one notice of exactly kPeerNoticeBytes per peer, with a
//                     read-only fd of the peer's memfd as SCM_RIGHTS: the id completions name
//                     that peer by (TensorEntry::device_handle), the segment's size and where
//                     its tx heap lies. The notice goes before any completion names the id.
//   daemon → client   Op::kPeerGone on the completion ring once that peer's session ended.
//
// The daemon sends them only between sessions whose users may share memory (the same uid and
// gid: docs/security.md); the receiving client maps the fd read-only (ReadOnlyMapping).
//
// Thread safety: stateless functions and plain values.

#ifndef TPD_SHM_PEER_NOTICE_H_
#define TPD_SHM_PEER_NOTICE_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpd::shm {

inline constexpr size_t kPeerNoticeBytes = 64;

struct PeerNotice {
  uint64_t peer = 0;           // non-zero; unique among the daemon's sessions while it runs
  uint64_t segment_bytes = 0;  // the memfd's size
  uint64_t tx_offset = 0;      // the peer's tx heap: where the tensors may lie
  uint64_t tx_bytes = 0;
};

std::array<uint8_t, kPeerNoticeBytes> EncodePeerNotice(const PeerNotice& notice);
// INVALID_ARGUMENT naming what is wrong when `bytes` is not a notice: a wrong magic or size,
// a zero id, a tx heap not inside the segment, reserved bytes not zero.
absl::StatusOr<PeerNotice> DecodePeerNotice(absl::string_view bytes);

}  // namespace tpd::shm

#endif  // TPD_SHM_PEER_NOTICE_H_
