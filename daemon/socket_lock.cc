#include "daemon/socket_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "proto/socket_path.h"

namespace tpd {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// "uid 1000 (alice)".
std::string UserName(uid_t uid) {
  struct passwd entry;
  struct passwd* found = nullptr;
  char buffer[1024];
  if (getpwuid_r(uid, &entry, buffer, sizeof(buffer), &found) == 0 && found != nullptr) {
    return absl::StrCat("uid ", uid, " (", found->pw_name, ")");
  }
  return absl::StrCat("uid ", uid);
}

// mkdir -p: `dir` itself with `mode`, missing parents 0755. The umask is bypassed for
// `dir` by a chmod right after a successful mkdir.
absl::Status MakeDirs(const std::string& dir, mode_t mode) {
  if (dir.empty()) return absl::OkStatus();
  struct stat st;
  if (lstat(dir.c_str(), &st) == 0) return absl::OkStatus();  // checked by the caller
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status status = MakeDirs(dir.substr(0, slash), 0755); !status.ok()) return status;
  }
  if (mkdir(dir.c_str(), mode) != 0) {
    if (errno == EEXIST) return absl::OkStatus();
    return ErrnoError("cannot create socket directory", dir);
  }
  if (chmod(dir.c_str(), mode) != 0) return ErrnoError("cannot chmod socket directory", dir);
  return absl::OkStatus();
}

// Opens the socket's directory and checks that it can be trusted; returns its descriptor.
absl::StatusOr<int> OpenTrustedDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP || errno == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("socket directory ", dir,
                       " is a symbolic link or not a directory; refusing to serve through it"));
    }
    return ErrnoError("cannot open socket directory", dir);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const absl::Status status = ErrnoError("cannot stat socket directory", dir);
    close(fd);
    return status;
  }
  const uid_t self = geteuid();
  const bool owner_ok = st.st_uid == self || st.st_uid == 0;
  const bool mode_ok = (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
  if (!owner_ok || !mode_ok) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "socket directory %s is owned by %s with mode %04o: %s; the daemon (%s) refuses it, "
        "since whoever may write it can replace the socket or its lock file. Remove it, or "
        "choose another --socket",
        dir, UserName(st.st_uid), st.st_mode & 07777,
        owner_ok ? "group or others may write it" : "it belongs to another user", UserName(self)));
  }
  // Whoever may write a directory above could rename the socket directory away and put
  // their own in its place; a sticky directory (/tmp) forbids renaming others' entries.
  char real[PATH_MAX];
  if (realpath(dir.c_str(), real) == nullptr) {
    const absl::Status status = ErrnoError("cannot resolve socket directory", dir);
    close(fd);
    return status;
  }
  std::string ancestor = real;
  while (ancestor != "/") {
    const size_t slash = ancestor.rfind('/');
    ancestor = slash == 0 ? "/" : ancestor.substr(0, slash);
    struct stat up;
    if (lstat(ancestor.c_str(), &up) != 0) {
      const absl::Status status = ErrnoError("cannot stat", ancestor);
      close(fd);
      return status;
    }
    const bool others_write = (up.st_mode & (S_IWGRP | S_IWOTH)) != 0;
    if ((up.st_uid != 0 && up.st_uid != self) || (others_write && !(up.st_mode & S_ISVTX))) {
      close(fd);
      return absl::FailedPreconditionError(absl::StrFormat(
          "directory %s above the socket directory %s is owned by %s with mode %04o; whoever "
          "may write it can replace the socket directory, so the daemon (%s) refuses it. "
          "Choose a --socket whose directories belong to root or this user",
          ancestor, dir, UserName(up.st_uid), up.st_mode & 07777, UserName(self)));
    }
  }
  return fd;
}

// True when something accepts connections on the unix socket at `path`.
bool SomeoneListens(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool listening = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return listening;
}

}  // namespace

absl::Status SetSocketOwnership(const std::string& path, mode_t mode, const std::string& group) {
  if (chmod(path.c_str(), mode) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot chmod socket ", path, ": ", std::strerror(errno)));
  }
  if (group.empty()) return absl::OkStatus();
  struct group* entry = getgrnam(group.c_str());
  if (entry == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("daemon.socket_group \"", group, "\" is not a group on this machine"));
  }
  if (chown(path.c_str(), -1, entry->gr_gid) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot give socket ", path, " to group ", group, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string DefaultDaemonSocketPath() {
  if (geteuid() == 0 || access(kSystemSocketDir, W_OK) == 0) return kSystemSocketPath;
  return PerUserSocketPath();
}

absl::StatusOr<std::unique_ptr<SocketLock>> SocketLock::Acquire(const std::string& socket_path) {
  if (socket_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path is ", socket_path.size(), " bytes; unix sockets allow at most ",
                     sizeof(sockaddr_un{}.sun_path) - 1, ": ", socket_path));
  }
  const size_t slash = socket_path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : socket_path.substr(0, slash);
  const std::string base = socket_path.substr(slash == std::string::npos ? 0 : slash + 1);
  if (base.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path ", socket_path, " names a directory, not a socket file"));
  }
  // The per-user directory is this user's alone; a system directory must let the socket's
  // group reach the socket.
  if (absl::Status status = MakeDirs(dir, dir == PerUserSocketDir() ? 0700 : 0755); !status.ok()) {
    return status;
  }
  absl::StatusOr<int> dir_fd = OpenTrustedDir(dir);
  if (!dir_fd.ok()) return dir_fd.status();

  // O_NOFOLLOW: a symbolic link planted as the lock file is refused, never written through.
  // O_NONBLOCK: a FIFO planted there cannot hang the open; only a regular file is kept.
  const std::string lock_path = absl::StrCat(socket_path, ".lock");
  const int fd = openat(*dir_fd, absl::StrCat(base, ".lock").c_str(),
                        O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  const int open_error = errno;
  close(*dir_fd);
  if (fd < 0) {
    errno = open_error;
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat(
          "lock file ", lock_path, " is a symbolic link; refusing to follow it (remove it)"));
    }
    return ErrnoError("cannot open lock file", lock_path);
  }
  struct stat lock_st;
  if (fstat(fd, &lock_st) != 0 || !S_ISREG(lock_st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("lock file ", lock_path, " is not a regular file; remove it"));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    close(fd);
    std::string owner = n > 0 ? std::string(absl::StripAsciiWhitespace(buf)) : "unknown";
    return absl::FailedPreconditionError(
        absl::StrCat("another tpd (pid ", owner, ") is serving ", socket_path,
                     "; stop it first or start this one with a different --socket"));
  }

  // We hold the lock, so no tpd serves this path; a live listener is some other program.
  bool reclaimed = false;
  struct stat st;
  if (lstat(socket_path.c_str(), &st) == 0) {
    if (SomeoneListens(socket_path)) {
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("a process that is not a tpd daemon accepts connections on ", socket_path,
                       "; refusing to replace it"));
    }
    if (unlink(socket_path.c_str()) != 0) {
      const absl::Status status = ErrnoError("cannot remove stale socket", socket_path);
      close(fd);
      return status;
    }
    reclaimed = true;
  }

  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    const absl::Status status = ErrnoError("cannot write lock file", lock_path);
    close(fd);
    return status;
  }
  return std::unique_ptr<SocketLock>(new SocketLock(socket_path, fd, reclaimed));
}

SocketLock::~SocketLock() {
  unlink(socket_path_.c_str());
  close(lock_fd_);
}

}  // namespace tpd
