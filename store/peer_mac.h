// The per-call MAC that authenticates one daemon's calls on another's peer port, shared by
// the caller (RemoteStore) and the callee (the daemon's PeerAuth): the cluster token is the
// HMAC key and never travels.
//
// A call carries one metadata entry, kPeerAuthHeader, whose value is
//
//   tpd-mac-v1 aud=<host:port> ts=<unix ms> sender=<16 hex> seq=<decimal> mac=<64 hex>
//              [for=<uid>@<hex of the node's name>]
//
// where mac = HMAC-SHA256(token, canonical encoding of: the version tag, the full gRPC
// method name ("/tpd.v1.Store/Set"), the audience (the "host:port" the caller dialed), the
// timestamp, the sender id (random per RemoteStore), the sender's sequence number, the
// SHA-256 of the request serialized deterministically, and, for a call made on behalf of a
// local user of the calling node, that uid and node). Every variable-length field is
// length-prefixed and the optional one comes last, so no two field lists encode alike (and a
// call without it is signed as by daemons that never send one).
//
// What it gives: a callee that knows the token can tell that a holder of the token made
// exactly this call (method and request) to a daemon on this port, recently (timestamp),
// once (sender + sequence; the callee keeps the replay window). What it does not give:
// secrecy (requests and answers travel in clear; use mTLS for that). Both sides must
// serialize alike: daemons of one release do; a field one side does not know would change
// the digest (the call is then refused as "bad MAC").
//
// Answers are signed too, so a daemon follows only a store that proves the token (a store
// someone else serves, named in a tcp:// URL or put in the path, is refused): a successful
// answer carries the trailing metadata entry kPeerReplyHeader, "tpd-reply-v1 mac=<64 hex>",
// where mac = HMAC-SHA256(token, the reply tag, the call's own MAC, the SHA-256 of the
// response serialized deterministically). Binding the call's MAC makes an answer good for
// that one call only. Error answers are not signed: they admit nothing.
//
// Thread safety: the functions are pure; PeerCallSigner is thread-safe.

#ifndef TPD_STORE_PEER_MAC_H_
#define TPD_STORE_PEER_MAC_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "store/store.h"

namespace tpd::store {

// The metadata key of the MAC line.
inline constexpr char kPeerAuthHeader[] = "tpd-auth";
// The version tag: first word of the header and first field of the MAC input.
inline constexpr absl::string_view kPeerMacVersion = "tpd-mac-v1";

// What a MAC covers.
struct PeerMacFields {
  std::string method;    // full gRPC method name, "/tpd.v1.Store/Set"
  std::string audience;  // "host:port" the caller dialed
  int64_t timestamp_ms = 0;
  uint64_t sender_id = 0;
  uint64_t sequence = 0;
  std::string body_digest;  // RequestDigest() of the request: 32 bytes
  // The local user of the calling daemon's node the call is made for (a member's use of its
  // group's store), charged to that user's share by the serving daemon; absent: the calling
  // daemon's own call.
  std::optional<StoreUser> on_behalf;
};

// SHA-256 (32 raw bytes) of `request` serialized with deterministic serialization.
std::string RequestDigest(const google::protobuf::Message& request);

// HMAC-SHA256 (32 raw bytes) of `fields` under `key`.
std::string ComputePeerMac(absl::string_view key, const PeerMacFields& fields);

// The header value carrying `fields` (all but method and body_digest, which the callee
// knows) and `mac`.
std::string FormatPeerAuthHeader(const PeerMacFields& fields, absl::string_view mac);

// A header value taken apart: method and body_digest are left empty. INVALID_ARGUMENT saying
// what is malformed.
struct ParsedPeerAuth {
  PeerMacFields fields;
  std::string mac;  // 32 raw bytes
};
absl::StatusOr<ParsedPeerAuth> ParsePeerAuthHeader(absl::string_view value);

// The trailing metadata key of an answer's MAC, and its version tag.
inline constexpr char kPeerReplyHeader[] = "tpd-auth-reply";
inline constexpr absl::string_view kPeerReplyVersion = "tpd-reply-v1";

// HMAC-SHA256 (32 raw bytes) of the answer `response` to the call whose MAC was `call_mac`.
std::string ComputeReplyMac(absl::string_view key, absl::string_view call_mac,
                            const google::protobuf::Message& response);
// The header value carrying `mac`, and the MAC read back from one (INVALID_ARGUMENT when
// malformed).
std::string FormatPeerReplyHeader(absl::string_view mac);
absl::StatusOr<std::string> ParsePeerReplyHeader(absl::string_view value);

// A signed call: the header value to send, and the MAC in it (for checking the answer).
struct SignedCall {
  std::string header;
  std::string mac;  // 32 raw bytes
};

// Signs the calls of one caller to one audience: a random sender id, a sequence number
// counting up from 1.
class PeerCallSigner {
 public:
  PeerCallSigner(std::string key, std::string audience);

  // The header value for a call of `method` with `request`, stamped `now`.
  std::string Sign(absl::string_view method, const google::protobuf::Message& request,
                   absl::Time now = absl::Now()) {
    return SignCall(method, request, std::nullopt, now).header;
  }
  // The same for a call made on behalf of `user` (or the daemon's own: nullopt), with the MAC
  // the answer will be bound to.
  SignedCall SignCall(absl::string_view method, const google::protobuf::Message& request,
                      const std::optional<StoreUser>& on_behalf, absl::Time now = absl::Now());

  uint64_t sender_id() const { return sender_id_; }
  const std::string& audience() const { return audience_; }

 private:
  const std::string key_;
  const std::string audience_;
  const uint64_t sender_id_;
  std::atomic<uint64_t> next_sequence_{1};
};

}  // namespace tpd::store

#endif  // TPD_STORE_PEER_MAC_H_
