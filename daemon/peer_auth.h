// Admission of calls on the peer port: every call must carry the cluster token in the
// "tpd-token" metadata. Local (unix socket) calls are admitted by file permission instead.

#ifndef TPD_DAEMON_PEER_AUTH_H_
#define TPD_DAEMON_PEER_AUTH_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/server_context.h"

namespace tpd {

// The metadata key peers put the token in.
inline constexpr char kPeerTokenHeader[] = "tpd-token";

// Requires `token` on calls when non-empty (a peer-port service); admits everything when
// empty (a unix-socket service). UNAUTHENTICATED, logged with the caller's address,
// when the token is missing or wrong. Compares in constant time.
class PeerAuth {
 public:
  explicit PeerAuth(std::string token) : token_(std::move(token)) {}
  absl::Status Admit(const grpc::CallbackServerContext& context, const char* method) const;

 private:
  const std::string token_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_PEER_AUTH_H_
