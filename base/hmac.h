// HMAC-SHA256 and a constant-time comparison: the primitives under every MAC tpd makes (the
// store's peer calls, store/peer_mac.h; the agent's connection and pipe handshakes; the
// secrets derived from the cluster token).
//
// Thread safety: pure functions of their arguments.

#ifndef TPD_BASE_HMAC_H_
#define TPD_BASE_HMAC_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tpd {

// HMAC-SHA256 (32 raw bytes) of `data` under `key`.
std::string HmacSha256(absl::string_view key, absl::string_view data);

// Equality that takes the same time wherever the inputs differ (only the lengths may show).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace tpd

#endif  // TPD_BASE_HMAC_H_
