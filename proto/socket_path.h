// Where a tpd daemon and its clients meet: the default unix socket paths. Part of the
// contract between the two sides, so it lives with the wire contract: the daemon
// (daemon/socket_lock.h, DefaultDaemonSocketPath) and the client library
// (client/socket_path.h, DefaultClientSocketPath) both build on it, and neither includes
// the other.
//
// Thread safety: stateless; reads the environment.

#ifndef TPD_PROTO_SOCKET_PATH_H_
#define TPD_PROTO_SOCKET_PATH_H_

#include <string>

namespace tpd {

// The system-wide socket that the systemd unit serves (its RuntimeDirectory=tpd).
inline constexpr char kSystemSocketPath[] = "/run/tpd/tpd.sock";
// The directory holding it; only root (or systemd for the unit's user) can create it.
inline constexpr char kSystemSocketDir[] = "/run/tpd";

// The directory of a daemon run by an unprivileged user: $XDG_RUNTIME_DIR/tpd, or
// /tmp/tpd-<euid> when XDG_RUNTIME_DIR is unset or empty. The daemon creates it 0700 and
// refuses one that another user owns or that others may write.
std::string PerUserSocketDir();

// PerUserSocketDir() + "/tpd.sock".
std::string PerUserSocketPath();

}  // namespace tpd

#endif  // TPD_PROTO_SOCKET_PATH_H_
