#include "store/file/path_policy.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/summarize.h"

namespace tpd::store {
namespace {

std::string Quoted(absl::string_view path) { return absl::StrCat("\"", Echo(path, 512), "\""); }

std::string AllowedList(const std::vector<std::string>& dirs) {
  if (dirs.empty()) return "[] (file:// rendezvous is off)";
  return absl::StrCat(
      "[",
      JoinSummarized(dirs, ", ",
                     [](std::string* out, const std::string& dir) { out->append(Quoted(dir)); }),
      "]");
}

std::string ErrnoText(int error_number) {
  char buffer[256];
  return strerror_r(error_number, buffer, sizeof(buffer));  // the GNU variant
}

// Components of a path written without a leading '/'; INVALID_ARGUMENT unless canonical.
absl::Status CheckCanonical(absl::string_view what, absl::string_view path,
                            absl::string_view relative) {
  if (relative.empty() || absl::EndsWith(relative, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quoted(path), " must name a file, not end in '/'"));
  }
  for (absl::string_view component : absl::StrSplit(relative, '/')) {
    if (component.empty() || component == "." || component == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", Quoted(path),
                       " must be written without \".\", \"..\" or empty components (\"//\")"));
    }
  }
  return absl::OkStatus();
}

// openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS; -1 and errno on failure (ENOSYS on a
// kernel before 5.6).
int OpenAt2(int dir_fd, const std::string& relative, int flags) {
  struct open_how how = {};
  how.flags = static_cast<uint64_t>(flags);
  how.mode = (flags & O_CREAT) != 0 ? 0600 : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  for (int attempt = 0;; ++attempt) {
    const long fd = syscall(SYS_openat2, dir_fd, relative.c_str(), &how, sizeof(how));
    // EAGAIN: a concurrent rename or mount raced the lookup; the kernel asks for a retry.
    if (fd < 0 && (errno == EINTR || (errno == EAGAIN && attempt < 8))) continue;
    return static_cast<int>(fd);
  }
}

// The fallback: each directory opened O_PATH | O_NOFOLLOW and checked to be a directory,
// then the file opened O_NOFOLLOW from the last one.
int OpenByWalk(int dir_fd, const std::string& relative, int flags) {
  std::vector<std::string> components = absl::StrSplit(relative, '/');
  int current = dir_fd;
  auto close_current = [&current, dir_fd] {
    if (current != dir_fd) close(current);
  };
  for (size_t i = 0; i + 1 < components.size(); ++i) {
    const int next = openat(current, components[i].c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      const int error = errno;
      close_current();
      errno = error;
      return -1;
    }
    struct stat st;
    int error = 0;
    if (fstat(next, &st) != 0) {
      error = errno;
    } else if (S_ISLNK(st.st_mode)) {
      error = ELOOP;
    } else if (!S_ISDIR(st.st_mode)) {
      error = ENOTDIR;
    }
    close_current();
    current = next;
    if (error != 0) {
      close_current();
      errno = error;
      return -1;
    }
  }
  int fd;
  do {
    fd = openat(current, components.back().c_str(), flags | O_NOFOLLOW, 0600);
  } while (fd < 0 && errno == EINTR);
  const int error = errno;
  close_current();
  errno = error;
  return fd;
}

absl::Status OpenError(const std::string& path, int error_number,
                       FileCreation creation = FileCreation::kCreate) {
  const std::string where =
      absl::StrCat("file:// rendezvous path ", Quoted(path), " (", kFileRendezvousDirsSetting, ")");
  switch (error_number) {
    case ELOOP:
    case EXDEV:
      return absl::PermissionDeniedError(
          absl::StrCat(where,
                       ": a component below the allowed directory is a symbolic link; "
                       "file rendezvous never follows one, name the real path"));
    case ENOENT:
      return absl::NotFoundError(absl::StrCat(
          where, creation == FileCreation::kCreate
                     ? ": its directory does not exist (Join creates only the file)"
                     : ": no such file (only Join creates one; GetGroup and WatchGroup look "
                       "at a rendezvous file that is already there)"));
    case ENOTDIR:
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": a component of the path is not a directory"));
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(absl::StrCat(where, ": ", ErrnoText(error_number)));
    default:
      return absl::Status(absl::ErrnoToStatusCode(error_number),
                          absl::StrCat(where, ": cannot open: ", ErrnoText(error_number)));
  }
}

}  // namespace

namespace path_policy_internal {

int OpenBeneath(int dir_fd, const std::string& relative, int flags, bool use_openat2) {
  if (use_openat2) {
    const int fd = OpenAt2(dir_fd, relative, flags);
    // ENOSYS: a kernel before 5.6; EPERM: a seccomp filter that does not know openat2 (a
    // genuine permission error shows again in the walk).
    if (fd >= 0 || (errno != ENOSYS && errno != EPERM)) return fd;
  }
  return OpenByWalk(dir_fd, relative, flags);
}

}  // namespace path_policy_internal

absl::Status ValidateRendezvousDir(absl::string_view dir) {
  const std::string what = absl::StrCat(kFileRendezvousDirsSetting, " entry");
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quoted(dir), " must be an absolute directory"));
  }
  if (dir.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Quoted(dir), " contains a NUL"));
  }
  if (dir == "/") {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     " \"/\" would allow every file on the machine; name a directory "
                     "reserved for rendezvous files"));
  }
  if (absl::Status status = CheckCanonical(what, dir, dir.substr(1)); !status.ok()) {
    return status;
  }
  for (absl::string_view system : {"/proc", "/sys", "/dev"}) {
    if (dir == system || absl::StartsWith(dir, absl::StrCat(system, "/"))) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", Quoted(dir), " is under ", system,
                                                     ", which holds no rendezvous files"));
    }
  }
  return absl::OkStatus();
}

absl::Status CreateRendezvousDir(const std::string& dir) {
  if (absl::Status status = ValidateRendezvousDir(dir); !status.ok()) return status;
  std::string prefix;
  const std::vector<std::string> components = absl::StrSplit(dir.substr(1), '/');
  for (size_t i = 0; i < components.size(); ++i) {
    absl::StrAppend(&prefix, "/", components[i]);
    const bool last = i + 1 == components.size();
    if (mkdir(prefix.c_str(), last ? 0700 : 0755) == 0 || errno == EEXIST) continue;
    return absl::Status(absl::ErrnoToStatusCode(errno),
                        absl::StrCat("cannot create ", Quoted(prefix), " for ",
                                     kFileRendezvousDirsSetting, ": ", ErrnoText(errno)));
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        kFileRendezvousDirsSetting, " entry ", Quoted(dir), " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> OpenRendezvousFile(const std::vector<std::string>& allowed_dirs,
                                       const std::string& path, FileCreation creation) {
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("file:// rendezvous path ", Quoted(path), " contains a NUL"));
  }
  // The most specific allowed directory that holds the path.
  const std::string* dir = nullptr;
  for (const std::string& allowed : allowed_dirs) {
    if (!ValidateRendezvousDir(allowed).ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(kFileRendezvousDirsSetting, " holds ", Quoted(allowed),
                       ", which is not a canonical "
                       "absolute directory; the daemon should have refused it at start"));
    }
    if (path.size() > allowed.size() + 1 && absl::StartsWith(path, allowed) &&
        path[allowed.size()] == '/' && (dir == nullptr || allowed.size() > dir->size())) {
      dir = &allowed;
    }
  }
  if (dir == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "file:// rendezvous path ", Quoted(path), " is not under a directory this daemon allows: ",
        kFileRendezvousDirsSetting, " = ", AllowedList(allowed_dirs),
        "; use a path under one of them, or ask the operator to add "
        "its directory"));
  }
  const std::string relative = path.substr(dir->size() + 1);
  if (absl::Status status = CheckCanonical("file:// rendezvous path", path, relative);
      !status.ok()) {
    return status;
  }
  const int dir_fd = open(dir->c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    const int error = errno;
    return absl::Status(
        error == ENOENT ? absl::StatusCode::kNotFound : absl::ErrnoToStatusCode(error),
        absl::StrCat("the directory ", Quoted(*dir), " that ", kFileRendezvousDirsSetting,
                     " allows cannot be opened: ", ErrnoText(error)));
  }
  // O_NONBLOCK so that opening a FIFO or device that slipped in never blocks; it is dropped
  // once the descriptor is known to be a regular file.
  int flags = O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  if (creation == FileCreation::kCreate) flags |= O_CREAT;
  const int fd = path_policy_internal::OpenBeneath(dir_fd, relative, flags, /*use_openat2=*/true);
  const int error = errno;
  close(dir_fd);
  if (fd < 0) return OpenError(path, error, creation);
  struct stat st;
  absl::Status refused;
  if (fstat(fd, &st) != 0) {
    refused = OpenError(path, errno);
  } else if (!S_ISREG(st.st_mode)) {
    refused = absl::PermissionDeniedError(
        absl::StrCat("file:// rendezvous path ", Quoted(path),
                     " is not a regular file (a device, FIFO, socket or directory); name a "
                     "plain file under ",
                     kFileRendezvousDirsSetting));
  } else if (st.st_nlink != 1) {
    refused = absl::PermissionDeniedError(absl::StrCat(
        "file:// rendezvous path ", Quoted(path), " has ", st.st_nlink,
        " hard links; a rendezvous file has exactly one, so it cannot be a file from elsewhere "
        "(",
        kFileRendezvousDirsSetting, ")"));
  } else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    refused = OpenError(path, errno);
  }
  if (!refused.ok()) {
    close(fd);
    return refused;
  }
  return fd;
}

}  // namespace tpd::store
