#include "client/socket_path.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tpd {
namespace {

std::string UserName(uid_t uid) {
  struct passwd entry;
  struct passwd* found = nullptr;
  char buffer[1024];
  if (getpwuid_r(uid, &entry, buffer, sizeof(buffer), &found) == 0 && found != nullptr) {
    return absl::StrCat("uid ", uid, " (", found->pw_name, ")");
  }
  return absl::StrCat("uid ", uid);
}

// `dir` is a directory owned by root or `owner` that group and others may not write.
bool DirHeldBy(const char* dir, uid_t owner) {
  struct stat st;
  return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_uid == 0 || st.st_uid == owner) &&
         (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

}  // namespace

std::string DefaultClientSocketPath() {
  const char* env = std::getenv("TPD_SOCKET");
  if (env != nullptr && env[0] != '\0') return env;
  struct stat st;
  if (stat(kSystemSocketPath, &st) == 0) return kSystemSocketPath;
  return PerUserSocketPath();
}

absl::Status CheckSocketOwner(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("no tpd socket at ", path));
  }
  const uid_t self = geteuid();
  if (st.st_uid == 0 || st.st_uid == self) return absl::OkStatus();
  if (path == kSystemSocketPath && DirHeldBy(kSystemSocketDir, st.st_uid) && DirHeldBy("/run", 0)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrFormat(
      "refusing the tpd socket %s: it belongs to %s, neither root nor this user (%s), so "
      "another user's program may be listening there. Connect to a socket root or you own "
      "(--socket, $TPD_SOCKET), or remove this one if you own its directory",
      path, UserName(st.st_uid), UserName(self)));
}

absl::Status CheckDataSocketOwner(const std::string& data_path, const std::string& grpc_path) {
  struct stat st;
  if (stat(data_path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("no tpd data socket at ", data_path));
  }
  const uid_t self = geteuid();
  if (st.st_uid == 0 || st.st_uid == self) return absl::OkStatus();
  struct stat grpc;
  if (CheckSocketOwner(grpc_path).ok() && stat(grpc_path.c_str(), &grpc) == 0 &&
      grpc.st_uid == st.st_uid) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrFormat(
      "refusing the tpd data socket %s: it belongs to %s, neither root, this user (%s) nor the "
      "owner of the daemon's socket %s, so another user's program may be listening there",
      data_path, UserName(st.st_uid), UserName(self), grpc_path));
}

}  // namespace tpd
