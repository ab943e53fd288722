// Messages of fixed size with a file descriptor riding along (SCM_RIGHTS) over a unix stream
// socket: how the daemon hands a client its segment (the attach reply) and the segments of
// peers it may map (peer_notice.h).
//
// Thread safety: stateless functions; one reader and one writer per socket at a time.

#ifndef TPD_SHM_FD_MESSAGE_H_
#define TPD_SHM_FD_MESSAGE_H_

#include <cstddef>

#include "absl/status/statusor.h"

namespace tpd::shm {

// Sends `n` bytes with `fd` as SCM_RIGHTS (none when fd < 0), without blocking and without
// SIGPIPE. False when they did not go whole: a send buffer too full for `n` bytes, or a peer
// that is gone.
bool SendWithFd(int socket, const void* bytes, size_t n, int fd);

// Reads exactly `n` bytes into `bytes` (waiting as the socket's options say) and returns the
// first fd that came with them (-1: none; any more are closed). UNAVAILABLE naming errno, or
// the end of the connection, when fewer came; the fd that came is closed then.
absl::StatusOr<int> ReceiveWithFd(int socket, char* bytes, size_t n);

}  // namespace tpd::shm

#endif  // TPD_SHM_FD_MESSAGE_H_
