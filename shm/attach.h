// The attach exchange on the daemon's data socket: how a client session receives its shared
// memory segment (docs/data_plane.md, "Attaching a session"). Part of the wire contract
// between a client and its daemon, so both build on this file.
//
//   client → daemon   one AttachRequest, exactly kAttachRequestBytes: magic, version and the
//                     session id that Control.OpenSession sent on the session's stream
//   daemon → client   one AttachReply, exactly kAttachReplyBytes: an absl::StatusCode, a
//                     message, the segment's size; on OK the segment's memfd rides along as
//                     SCM_RIGHTS ancillary data of the same message
//
// Anything else from the client (a wrong magic or version, a malformed id, more bytes than
// one request) makes the daemon close the connection without a reply. After an OK reply the
// connection stays open, silent, for the session's lifetime: its end is the session's end.
//
// The same socket identifies a session's user: an IdentifyRequest (the same layout under
// another magic) binds the session to the connection's SO_PEERCRED uid, which its joins then
// carry (docs/security.md, "Who may join a group"); the reply has no fd and the daemon closes
// the connection. A session is bound once: an identify or attach from another uid is
// PERMISSION_DENIED.
//
// Thread safety: stateless functions and plain values.

#ifndef TPD_SHM_ATTACH_H_
#define TPD_SHM_ATTACH_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpd::shm {

inline constexpr size_t kAttachRequestBytes = 80;
inline constexpr size_t kAttachReplyBytes = 256;
// Longest session id a request carries (the daemon's are 32 hex digits at most).
inline constexpr size_t kMaxSessionIdBytes = 64;
// Longest message a reply carries; longer ones are cut.
inline constexpr size_t kMaxAttachMessageBytes = 232;
inline constexpr uint32_t kAttachVersion = 1;

// The data socket of the daemon serving the gRPC socket `grpc_socket`: "<grpc_socket>.data".
std::string DataSocketPath(absl::string_view grpc_socket);

// INVALID_ARGUMENT for an empty id, one over kMaxSessionIdBytes or one with bytes other than
// [0-9a-f].
absl::StatusOr<std::array<uint8_t, kAttachRequestBytes>> EncodeAttachRequest(
    absl::string_view session_id);
// The session id; INVALID_ARGUMENT naming what is wrong with `bytes` (untrusted).
absl::StatusOr<std::string> DecodeAttachRequest(absl::string_view bytes);

absl::StatusOr<std::array<uint8_t, kAttachRequestBytes>> EncodeIdentifyRequest(
    absl::string_view session_id);

// Either request, as the daemon reads them.
struct DataRequest {
  enum class Kind { kAttach, kIdentify };
  Kind kind = Kind::kAttach;
  std::string session_id;
};
absl::StatusOr<DataRequest> DecodeDataRequest(absl::string_view bytes);

struct AttachReply {
  absl::Status status;         // the daemon's answer
  uint64_t segment_bytes = 0;  // size of the memfd sent with an OK reply
};

std::array<uint8_t, kAttachReplyBytes> EncodeAttachReply(const AttachReply& reply);
// INVALID_ARGUMENT when `bytes` (untrusted) is not a reply; otherwise the reply, whose
// status is the daemon's.
absl::StatusOr<AttachReply> DecodeAttachReply(absl::string_view bytes);

}  // namespace tpd::shm

#endif  // TPD_SHM_ATTACH_H_
