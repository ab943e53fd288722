#include "daemon/agent_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tpd {

namespace {

// Whether the IP literal `host` (IPv6 in brackets) lies in `allowed`; false for a name.
bool HostAllowed(absl::string_view host, const NetworkList& allowed) {
  sockaddr_in v4{};
  sockaddr_in6 v6{};
  const std::string text(host);
  if (inet_pton(AF_INET, text.c_str(), &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
    return allowed.Contains(reinterpret_cast<const sockaddr*>(&v4));
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    const std::string inner(host.substr(1, host.size() - 2));
    if (inet_pton(AF_INET6, inner.c_str(), &v6.sin6_addr) == 1) {
      v6.sin6_family = AF_INET6;
      return allowed.Contains(reinterpret_cast<const sockaddr*>(&v6));
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<std::string> DialableAgentUrls(const std::string& address,
                                              const NetworkList& allowed) {
  const std::string shown = address.substr(0, 256);
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "the member's node recorded no agent address (a tpd daemon without peer.listen_address "
        "cannot take calls from other nodes)");
  }
  std::vector<std::string> dialable;
  std::vector<std::string> refused;
  for (absl::string_view url : absl::StrSplit(address, ',')) {
    const size_t scheme_end = url.find("://");
    if (scheme_end == absl::string_view::npos || scheme_end == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("agent address '", shown, "' has an entry that is not a URL"));
    }
    const absl::string_view scheme = url.substr(0, scheme_end);
    const absl::string_view rest = url.substr(scheme_end + 3);
    if (scheme == "shm") {
      dialable.emplace_back(url);
      continue;
    }
    if (scheme != "uv" && scheme != "ibv") {
      refused.emplace_back(url);
      continue;
    }
    const size_t colon = rest.rfind(':');
    const absl::string_view host = colon == absl::string_view::npos ? rest : rest.substr(0, colon);
    if (HostAllowed(host, allowed)) {
      dialable.emplace_back(url);
    } else {
      refused.emplace_back(url);
    }
  }
  // Without a uv URL TensorPipe has nothing to bootstrap a pipe on.
  const bool has_uv = std::any_of(dialable.begin(), dialable.end(), [](const std::string& url) {
    return absl::StartsWith(url, "uv://");
  });
  if (!has_uv) {
    return absl::PermissionDeniedError(
        absl::StrCat("agent address '", shown, "' has no uv:// URL inside peer.dial_networks (",
                     allowed.ToString(), ")",
                     refused.empty() ? "" : "; refused: ", absl::StrJoin(refused, ", ")));
  }
  return absl::StrJoin(dialable, ",");
}

}  // namespace tpd
