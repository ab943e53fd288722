// Which socket a client connects to by default.
//
// Thread safety: stateless; reads the environment and the file system.

#ifndef TPD_CLIENT_SOCKET_PATH_H_
#define TPD_CLIENT_SOCKET_PATH_H_

#include <string>

#include "absl/status/status.h"
#include "proto/socket_path.h"

namespace tpd {

// The socket a client connects to when none is given: $TPD_SOCKET if set, else the system
// socket if it exists, else the per-user path a non-root daemon would serve.
std::string DefaultClientSocketPath();

// Whether the socket at `path` may be trusted as a tpd daemon's: it must belong to root or
// to this process's user. (Under the per-user default /tmp/tpd-<uid>, another user could
// have created the directory and a socket in it first, and would then read every key and
// join every group this client sends.) The system socket /run/tpd/tpd.sock may belong to
// any user, e.g. the unit's dedicated one, as long as /run/tpd and /run belong to root or
// that user and no one else may write them: only root creates directories in /run.
// PERMISSION_DENIED naming the socket and its owner otherwise; NOT_FOUND when nothing is
// there.
absl::Status CheckSocketOwner(const std::string& path);

// Whether the data socket at `data_path` may be trusted, for a client that trusts the gRPC
// socket at `grpc_path` (CheckSocketOwner): it must belong to root, to this process's user,
// or to the user owning the gRPC socket (the daemon's, e.g. the unit's dedicated user).
// PERMISSION_DENIED naming the data socket and its owner otherwise; NOT_FOUND when nothing is
// there.
absl::Status CheckDataSocketOwner(const std::string& data_path, const std::string& grpc_path);

}  // namespace tpd

#endif  // TPD_CLIENT_SOCKET_PATH_H_
