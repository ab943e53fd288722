// Exclusive ownership of a unix socket path, so a second daemon cannot steal a live one.
//
// gRPC unlinks whatever file sits at a unix socket path before it binds, so two daemons
// started on one path would both "succeed" and the first would silently stop receiving
// connections. A SocketLock holds flock() on "<socket>.lock" for the daemon's lifetime:
// whoever holds it owns the socket; a socket file found without a live holder is stale
// (its daemon died) and is removed.
//
// Thread safety: not thread-safe; owned by the daemon's main thread.

#ifndef TPD_DAEMON_SOCKET_LOCK_H_
#define TPD_DAEMON_SOCKET_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tpd {

class SocketLock {
 public:
  // Creates the socket's directory (0755) if missing, takes the lock and clears a stale
  // socket file. FAILED_PRECONDITION naming the owner's pid when another live daemon owns
  // `socket_path`, or when something else still accepts connections there.
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
