#include "daemon/socket_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tpd {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// mkdir -p with mode 0755 for each directory created.
absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
  }
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status status = MakeDirs(dir.substr(0, slash)); !status.ok()) return status;
  }
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoError("cannot create socket directory", dir);
  }
  return absl::OkStatus();
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

absl::StatusOr<std::unique_ptr<SocketLock>> SocketLock::Acquire(const std::string& socket_path) {
  if (socket_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path is ", socket_path.size(), " bytes; unix sockets allow at most ",
                     sizeof(sockaddr_un{}.sun_path) - 1, ": ", socket_path));
  }
  const size_t slash = socket_path.rfind('/');
  if (slash != std::string::npos) {
    if (absl::Status status = MakeDirs(socket_path.substr(0, slash)); !status.ok()) {
      return status;
    }
  }

  const std::string lock_path = absl::StrCat(socket_path, ".lock");
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot open lock file", lock_path);
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
