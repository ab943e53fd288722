// Which files a file:// rendezvous may open: the policy that keeps a local client, who names
// the path in its Join or GetGroup, from making the daemon (root under systemd) open, create
// or append to a file of its choosing.
//
// The rules:
//  - The path lies strictly under one of the directories the operator allows (the daemon's
//    [group] file_rendezvous_dirs). Paths are compared as written, component by component;
//    "." and ".." components, empty components ("a//b") and a trailing '/' are refused
//    (INVALID_ARGUMENT), so one file has one spelling.
//  - No symbolic link is followed anywhere below the allowed directory: openat2() with
//    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS from the allowed directory's descriptor, or, on a
//    kernel without openat2 (ENOSYS), a walk that opens each directory component with
//    O_NOFOLLOW | O_DIRECTORY and the file with O_NOFOLLOW. The allowed directory itself is
//    the operator's choice and may sit behind symbolic links (e.g. /shared -> /mnt/nfs).
//  - Only a regular file with one link: no device, FIFO, socket or directory, and no hard
//    link to a file elsewhere (checked with fstat on the opened descriptor, not the name).
//  - kMustExist never creates anything: a missing file is NOT_FOUND. kCreate creates the
//    file (0600, never its parent directories).
//
// Errors name the path and the setting group.file_rendezvous_dirs: PERMISSION_DENIED for a
// path outside the allowed directories, a symbolic link or a file that is not a plain regular
// file; INVALID_ARGUMENT for a path that is not in canonical form; NOT_FOUND for a missing
// file (kMustExist) or parent directory; other errno values as in the file store.
//
// Thread safety: stateless functions; call them from any thread.

#ifndef TPD_STORE_FILE_PATH_POLICY_H_
#define TPD_STORE_FILE_PATH_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpd::store {

// The daemon setting that lists the allowed directories, as messages name it.
inline constexpr char kFileRendezvousDirsSetting[] = "group.file_rendezvous_dirs";

// Its default: the systemd unit's StateDirectory=tpd/rendezvous.
inline constexpr char kDefaultFileRendezvousDir[] = "/var/lib/tpd/rendezvous";

enum class FileCreation {
  kMustExist,  // GetGroup, WatchGroup: look at a store that is there, never make one
  kCreate,     // Join: create the file when missing
};

// Checks one directory of the allowed list as the operator wrote it: absolute, canonical
// (no ".", "..", empty components or trailing '/'), not "/" and not under /proc, /sys or
// /dev. INVALID_ARGUMENT naming the directory. Does not touch the file system.
absl::Status ValidateRendezvousDir(absl::string_view dir);

// Creates `dir` with mode 0700 (its missing parents 0755) when it does not exist; OK when
// it exists as a directory. For the daemon's start with the default directory.
absl::Status CreateRendezvousDir(const std::string& dir);

// Opens `path` read-write for a file store under the rules above. Returns the descriptor
// (O_CLOEXEC), which the caller owns.
absl::StatusOr<int> OpenRendezvousFile(const std::vector<std::string>& allowed_dirs,
                                       const std::string& path, FileCreation creation);

namespace path_policy_internal {

// Opens `relative` (canonical, no leading '/') beneath the directory `dir_fd` with `flags`
// (O_CREAT allowed, with mode 0600), following no symbolic link. `use_openat2` false forces
// the component walk (the fallback for kernels without openat2), so tests cover both. -1
// with errno set on failure; ELOOP (or ENOTDIR for an intermediate component) for a link.
int OpenBeneath(int dir_fd, const std::string& relative, int flags, bool use_openat2);

}  // namespace path_policy_internal

}  // namespace tpd::store

#endif  // TPD_STORE_FILE_PATH_POLICY_H_
