// Exclusive ownership of a unix socket path, so a second daemon cannot steal a live one.
//
// gRPC unlinks whatever file sits at a unix socket path before it binds, so two daemons
// started on one path would both "succeed" and the first would silently stop receiving
// connections. A SocketLock holds flock() on "<socket>.lock" for the daemon's lifetime:
// whoever holds it owns the socket; a socket file found without a live holder is stale
// (its daemon died) and is removed.
//
// The socket's directory is trusted only if it is a real directory (not a symbolic link)
// owned by the daemon's user or root that neither group nor others may write: whoever may
// write it can swap the socket or plant the lock file. Every directory above it must belong
// to root or the daemon's user too, and be writable by no one else unless sticky (/tmp):
// whoever may write one could move the socket directory away. The lock file is opened with
// O_NOFOLLOW, so a symbolic link planted in its place is refused instead of followed.
//
// Thread safety: not thread-safe; owned by the daemon's main thread.

#ifndef TPD_DAEMON_SOCKET_LOCK_H_
#define TPD_DAEMON_SOCKET_LOCK_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tpd {

// The socket a daemon serves when neither --socket nor the config names one: the system
// path when this process may create it (root, or /run/tpd writable, as for the unit's user),
// otherwise the per-user one (proto/socket_path.h).
std::string DefaultDaemonSocketPath();

// Gives the socket file at `path` the permission bits `mode` and, when `group` is not empty,
// that group, so the group's members may connect. The daemon binds its sockets under umask
// 0177 and widens them with this only afterwards. FAILED_PRECONDITION naming the socket when
// chmod or chown fails; INVALID_ARGUMENT naming daemon.socket_group when it is no group here.
absl::Status SetSocketOwnership(const std::string& path, mode_t mode, const std::string& group);

class SocketLock {
 public:
  // Creates the socket's directory if missing (0700 for the per-user directory, 0755
  // otherwise, with missing parents 0755), checks it (see above), takes the lock and clears
  // a stale socket file. FAILED_PRECONDITION naming the directory, its owner and mode when
  // it is not trusted; naming the owner's pid when another live daemon owns `socket_path`;
  // or when something else still accepts connections there.
  static absl::StatusOr<std::unique_ptr<SocketLock>> Acquire(const std::string& socket_path);

  // Removes the socket file, then releases the lock. The lock file stays: removing it would
  // let two later daemons lock two different files for the same socket.
  ~SocketLock();

  SocketLock(const SocketLock&) = delete;
  SocketLock& operator=(const SocketLock&) = delete;

  // True when Acquire found and removed a socket file left by a dead daemon.
  bool reclaimed_stale_socket() const { return reclaimed_stale_socket_; }

 private:
  SocketLock(std::string socket_path, int lock_fd, bool reclaimed)
      : socket_path_(std::move(socket_path)),
        lock_fd_(lock_fd),
        reclaimed_stale_socket_(reclaimed) {}

  const std::string socket_path_;
  const int lock_fd_;
  const bool reclaimed_stale_socket_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_SOCKET_LOCK_H_
