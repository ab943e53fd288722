// Which hosts may open a TCP connection to the agent's listening ports ([agent]
// accept_networks): a classic BPF socket filter on each listening socket, so that the kernel
// drops a SYN (and any other packet) whose source lies outside the allowed networks before a
// connection exists. Debian's TensorPipe aborts the whole process on some garbage bytes sent
// to its listeners before any handshake of ours runs (docs/security.md, "Agent pipes"); we
// cannot patch it, so the bytes must not arrive from hosts outside the cluster.
//
//   absl::StatusOr<ListenGuard> guard = ListenGuard::Create({"10.1.0.0/16", "127.0.0.1"});
//   GuardListeningSockets(*guard, AF_INET, address, {uv_port, lane_port, ...});
//
// Semantics, checked by tests/agent/listen_guard_test.cc against the kernel and against
// NetworkList::Contains: an IPv4 packet passes when its source lies inside one of the
// IPv4 networks; an IPv6 packet when its source lies inside one of the IPv6 networks, or is
// v4-mapped (::ffff:a.b.c.d) with a.b.c.d inside one of the IPv4 networks. An IPv6 listener
// receives IPv4 peers as IPv4 packets (their v4-mapped address is only what accept()
// reports), so IPv4 networks cover them there too. A v4-mapped network
// ("::ffff:10.0.0.0/104") matches nothing, in both.
//
// For a listening TCP socket the kernel runs the listener's filter on every packet that
// reaches it, the SYN first: a dropped SYN leaves the peer retrying until its connect times
// out, and no connection exists for TensorPipe to accept. An accepted socket inherits the
// filter.
//
// TensorPipe does not expose its sockets, so they are found among this process's fds
// (/proc/self/fd): a socket that is SOCK_STREAM, TCP, listening (SO_ACCEPTCONN) and bound to
// the given address and one of the given ports. Each fd is dup()ed before it is inspected and
// the filter is attached through the duplicate, so an fd number that another thread closes
// and reuses meanwhile is judged and filtered as the socket it now is, never half one and half
// the other.
//
// Thread safety: ListenGuard is immutable; the functions may be called from any thread.

#ifndef TPD_AGENT_LISTEN_GUARD_H_
#define TPD_AGENT_LISTEN_GUARD_H_

#include <linux/filter.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tpd::agent {

// The networks that may connect when none are configured: loopback and the private networks,
// as [peer] dial_networks' default.
const std::vector<std::string>& DefaultAcceptNetworks();

// Most networks one guard takes. An IPv6 network costs up to 13 instructions (an IPv4 one 8),
// so 256 of them stay within the kernel's BPF_MAXINSNS (4096). daemon/config.cc enforces the same
// number.
inline constexpr size_t kMaxAcceptNetworks = 256;

class ListenGuard {
 public:
  // Builds the filter for `networks` (CIDRs as in [peer] dial_networks: "10.0.0.0/8",
  // "fe80::/10", or a single address). INVALID_ARGUMENT naming the entry for a bad one, for an
  // empty list (it would admit no peer: admit every host explicitly with "0.0.0.0/0" and
  // "::/0"), and for more than kMaxAcceptNetworks networks.
  static absl::StatusOr<ListenGuard> Create(const std::vector<std::string>& networks);

  // Attaches the filter to socket `fd` (SO_ATTACH_FILTER, replacing any filter it had).
  absl::Status Attach(int fd) const;

  // The classic BPF program: its input is a packet whose network header starts at
  // SKF_NET_OFF; it returns 0 (drop) or 0xffffffff (keep all of it).
  const std::vector<sock_filter>& program() const { return program_; }

  // The networks as configured, for logs ("10.0.0.0/8, 127.0.0.1/32").
  const std::string& ToString() const { return text_; }

 private:
  ListenGuard() = default;

  std::vector<sock_filter> program_;
  std::string text_;
};

// A TCP socket of this process in the listening state.
struct ListeningSocket {
  int fd = -1;                              // a duplicate, valid only during the callback
  uint64_t inode = 0;                       // the socket's identity, stable across dup()s
  int family = 0;                           // AF_INET or AF_INET6
  std::array<unsigned char, 16> address{};  // the bound address (4 bytes used for AF_INET)
  int port = 0;
};

// Calls `fn` for every listening TCP socket (AF_INET or AF_INET6) of this process.
// UNAVAILABLE when /proc/self/fd cannot be read.
absl::Status ForEachListeningTcpSocket(const std::function<void(const ListeningSocket&)>& fn);

// Attaches `guard` to every listening TCP socket of this process that is bound to `address`
// of `family` (as ListeningSocket::address) on one of `ports`. Returns the ports it guarded
// (one entry per socket); UNAVAILABLE when /proc/self/fd cannot be read or an attach fails.
absl::StatusOr<std::vector<int>> GuardListeningSockets(const ListenGuard& guard, int family,
                                                       const std::array<unsigned char, 16>& address,
                                                       const absl::flat_hash_set<int>& ports);

}  // namespace tpd::agent

#endif  // TPD_AGENT_LISTEN_GUARD_H_
