// Which of a member's agent URLs this daemon may dial. The URLs come from a group record in
// a rendezvous store, which anyone able to write that store controls, so they pass the same
// rule as every address the daemon dials on someone's behalf: [peer] dial_networks.
//
//   uv://10.0.0.2:41234      dialed only when 10.0.0.2 lies in dial_networks
//   ibv://10.0.0.2:41234     likewise
//   shm://<name>             kept: it names an abstract socket on this machine, and the pipe
//                            handshake proves the peer holds the token before anything flows
//
// Host names are refused: agents advertise the addresses they bound, never names, and a
// name would be resolved by whoever controls DNS.
//
// Thread safety: stateless.

#ifndef TPD_DAEMON_AGENT_ADDRESS_H_
#define TPD_DAEMON_AGENT_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "base/dial_networks.h"

namespace tpd {

// The URLs of `address` (comma-separated, as Member.agent_address) that may be dialed, in
// their order. PERMISSION_DENIED naming the address and dial_networks when none may;
// INVALID_ARGUMENT for an empty or malformed address.
absl::StatusOr<std::string> DialableAgentUrls(const std::string& address,
                                              const NetworkList& allowed);

}  // namespace tpd

#endif  // TPD_DAEMON_AGENT_ADDRESS_H_
