// The pipe handshake's MACs: how two agents prove to each other that they hold the cluster
// token before a pipe carries anything, without the token ever travelling.
//
//   acceptor  -> connector  CHALLENGE  nonce_a, acceptor id and URLs
//   connector -> acceptor   ANSWER     nonce_c, connector id and URLs, the URL it dialed,
//                                      mac_c = PipeMac(token, kAnswer, transcript)
//   acceptor  -> connector  PROOF      mac_a = PipeMac(token, kProof, transcript)
//
// The transcript holds both nonces, both ids and URL lists and the dialed URL, each
// length-prefixed after the version tag "tpd-pipe-v1" and the role, so no two transcripts
// encode alike and an ANSWER can never pass for a PROOF. The acceptor checks mac_c (constant
// time) and that the dialed URL is one of its own before it answers, so it is never an oracle
// for someone without the token; the connector checks mac_a before it sends anything else.
// Fresh nonces on both sides make a recorded handshake useless, and the dialed URL stops a
// listener that a client named (holding no token) from relaying a real daemon's challenge:
// the connector signs the address it dialed, which the real daemon does not own.
//
// Thread safety: stateless.

#ifndef TPD_AGENT_PIPE_AUTH_H_
#define TPD_AGENT_PIPE_AUTH_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tpd::agent {

inline constexpr absl::string_view kPipeAuthVersion = "tpd-pipe-v1";
inline constexpr size_t kPipeNonceBytes = 32;

// What both MACs of one handshake cover.
struct PipeTranscript {
  std::string challenge_nonce;  // the acceptor's
  std::string answer_nonce;     // the connector's
  std::string acceptor_id;
  std::vector<std::string> acceptor_urls;
  std::string dialed_url;
  std::string connector_id;
  std::vector<std::string> connector_urls;
};

enum class PipeMacRole { kAnswer, kProof };

// HMAC-SHA256 (32 raw bytes) under `token` of the version tag, `role` and `transcript`.
std::string ComputePipeMac(absl::string_view token, PipeMacRole role,
                           const PipeTranscript& transcript);

// Whether `mac` is ComputePipeMac(token, role, transcript), compared in constant time.
bool VerifyPipeMac(absl::string_view token, PipeMacRole role, const PipeTranscript& transcript,
                   absl::string_view mac);

// kPipeNonceBytes from OpenSSL's CSPRNG.
std::string NewPipeNonce();

// Whether a connector that dialed `dialed` reached a listener on `own_urls`: the same URL, or
// the same transport and port where the listener's host is a wildcard (0.0.0.0, [::]), since a
// listener on every address cannot tell which one was dialed.
bool DialedUrlIsOurs(absl::string_view dialed, absl::Span<const std::string> own_urls);

}  // namespace tpd::agent

#endif  // TPD_AGENT_PIPE_AUTH_H_
