#include "proto/socket_path.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tpd {

std::string PerUserSocketDir() {
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  if (runtime_dir != nullptr && runtime_dir[0] != '\0') return absl::StrCat(runtime_dir, "/tpd");
  return absl::StrCat("/tmp/tpd-", geteuid());
}

std::string PerUserSocketPath() { return absl::StrCat(PerUserSocketDir(), "/tpd.sock"); }

}  // namespace tpd
