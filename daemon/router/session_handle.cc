#include "daemon/router/session_handle.h"

#include <openssl/sha.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tpd {

std::string SessionHandle(absl::string_view session_id) {
  const std::string input = absl::StrCat("tpd-session-handle-v1", session_id);
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(input.data()), input.size(), digest);
  return absl::StrCat(
      "s-", absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), 6)));
}

}  // namespace tpd
