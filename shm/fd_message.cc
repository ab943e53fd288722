#include "shm/fd_message.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tpd::shm {

bool SendWithFd(int socket, const void* bytes, size_t n, int fd) {
  iovec iov{const_cast<void*>(bytes), n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  }
  const ssize_t sent = sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  return sent == static_cast<ssize_t>(n);
}

absl::StatusOr<int> ReceiveWithFd(int socket, char* bytes, size_t n) {
  size_t got = 0;
  int fd = -1;
  while (got < n) {
    iovec iov{bytes + got, n - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t read = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
    if (read < 0 && errno == EINTR) continue;
    if (read <= 0) {
      const int error = errno;
      if (fd >= 0) close(fd);
      return absl::UnavailableError(read < 0 ? std::strerror(error) : "the connection ended");
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (fd < 0) {
          fd = received;
        } else {
          close(received);
        }
      }
    }
    got += static_cast<size_t>(read);
  }
  return fd;
}

}  // namespace tpd::shm
