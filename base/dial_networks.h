// Whom a daemon dials: the networks an operator allows peer daemons in ([peer]
// dial_networks), and the resolution of a rendezvous host into one address inside them.
//
// A tcp:// or env:// URL comes from a local client, so its host is untrusted: it could name
// any machine, or a name whose DNS answer changes between the check and the connection. The
// host is therefore resolved once, every address it resolves to must lie inside the allowed
// networks, and the caller dials the resulting IP literal, which no later DNS answer can
// move.
//
// Thread safety: NetworkList is immutable; the functions may be called from any thread
// (ResolveDialAddress blocks in getaddrinfo for host names; IP literals do no I/O).

#ifndef TPD_BASE_DIAL_NETWORKS_H_
#define TPD_BASE_DIAL_NETWORKS_H_

#include <sys/socket.h>

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpd {

class NetworkList {
 public:
  // Parses CIDRs such as "10.0.0.0/8", "fe80::/10", or single addresses ("10.0.0.7", /32 or
  // /128 implied). Host bits set below the prefix are an error (a typo in the prefix
  // length, most likely). INVALID_ARGUMENT naming the entry.
  static absl::StatusOr<NetworkList> Parse(const std::vector<std::string>& cidrs);

  // True when `address` (AF_INET or AF_INET6; an IPv4-mapped IPv6 address counts as IPv4)
  // lies inside one of the networks.
  bool Contains(const sockaddr* address) const;

  // The networks as configured, comma-separated, for messages: at most 10, then "... and N
  // more" (base/summarize.h).
  std::string ToString() const;

  struct Network {
    int family = AF_INET;                   // AF_INET or AF_INET6
    std::array<unsigned char, 16> bytes{};  // 4 used for AF_INET; no bits set past `prefix`
    int prefix = 0;
    std::string text;  // as configured
  };
  // The networks in the order given (the agent's listen guard compiles them into a filter).
  const std::vector<Network>& networks() const { return networks_; }

 private:
  std::vector<Network> networks_;
};

// Resolves `host` (a name or an IP literal) for TCP, and returns its first address with
// `port`, as "ip:port" or "[ip6]:port", when every address it resolves to lies inside
// `allowed`. PERMISSION_DENIED naming
// the host, the address outside and `setting` otherwise; UNAVAILABLE when it does not
// resolve.
absl::StatusOr<std::string> ResolveDialAddress(const std::string& host, int port,
                                               const NetworkList& allowed,
                                               absl::string_view setting);

}  // namespace tpd

#endif  // TPD_BASE_DIAL_NETWORKS_H_
