// Where a tpd daemon's unix socket lives by default, shared by the daemon and its clients.
//
// Thread safety: stateless; reads the environment and the file system.

#ifndef TPD_CLIENT_SOCKET_PATH_H_
#define TPD_CLIENT_SOCKET_PATH_H_

#include <string>

namespace tpd {

// The system-wide socket that the systemd unit serves.
inline constexpr char kSystemSocketPath[] = "/run/tpd/tpd.sock";

// The socket a daemon serves when neither --socket nor the config names one: the system
// path when this process may create it (root, or /run/tpd writable), otherwise a per-user
// one: $XDG_RUNTIME_DIR/tpd/tpd.sock, or /tmp/tpd-<uid>/tpd.sock without XDG_RUNTIME_DIR.
std::string DefaultDaemonSocketPath();

// The socket a client connects to when none is given: $TPD_SOCKET if set, else the system
// socket if it exists, else the per-user path a non-root daemon would serve.
std::string DefaultClientSocketPath();

}  // namespace tpd

#endif  // TPD_CLIENT_SOCKET_PATH_H_
