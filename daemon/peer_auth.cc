#include "daemon/peer_auth.h"

#include "absl/strings/str_cat.h"
#include "daemon/logging.h"

namespace tpd {
namespace {

// Does not stop at the first differing byte, so timing does not reveal a prefix of the
// token (only its length, which is no secret).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::Status PeerAuth::Admit(const grpc::CallbackServerContext& context, const char* method) const {
  if (token_.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kPeerTokenHeader);
  if (it != metadata.end() &&
      ConstantTimeEquals(absl::string_view(it->second.data(), it->second.size()), token_)) {
    return absl::OkStatus();
  }
  const char* problem = it == metadata.end() ? "no token" : "a wrong token";
  DaemonLog().warn("[peer {}] rejected {}: {}", context.peer(), method, problem);
  return absl::UnauthenticatedError(
      absl::StrCat("peer call ", method, " carried ", problem,
                   ": set the same [peer] token on every daemon of the cluster"));
}

}  // namespace tpd
