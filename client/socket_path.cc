#include "client/socket_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tpd {
namespace {

std::string PerUserSocketPath() {
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  if (runtime_dir != nullptr && runtime_dir[0] != '\0') {
    return absl::StrCat(runtime_dir, "/tpd/tpd.sock");
  }
  return absl::StrCat("/tmp/tpd-", geteuid(), "/tpd.sock");
}

}  // namespace

std::string DefaultDaemonSocketPath() {
  if (geteuid() == 0 || access("/run/tpd", W_OK) == 0) return kSystemSocketPath;
  return PerUserSocketPath();
}

std::string DefaultClientSocketPath() {
  const char* env = std::getenv("TPD_SOCKET");
  if (env != nullptr && env[0] != '\0') return env;
  struct stat st;
  if (stat(kSystemSocketPath, &st) == 0) return kSystemSocketPath;
  return PerUserSocketPath();
}

}  // namespace tpd
