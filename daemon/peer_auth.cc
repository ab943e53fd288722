#include "daemon/peer_auth.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/hmac.h"
#include "daemon/logging.h"
#include "store/peer_mac.h"

namespace tpd {
namespace {

// "ipv4:10.0.0.2:53412" -> "ipv4:10.0.0.2": a caller's connections share one log limit.
std::string PeerHost(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  const size_t scheme = peer.find(':');
  if (colon == std::string::npos || colon == scheme) return peer;
  return peer.substr(0, colon);
}

// The port of "host:port" or "[v6]:port"; -1 when there is none.
int AudiencePort(absl::string_view audience) {
  const size_t colon = audience.rfind(':');
  int port = -1;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(audience.substr(colon + 1), &port)) {
    return -1;
  }
  return port;
}

absl::Status Refuse(absl::string_view method, absl::string_view problem, absl::string_view hint) {
  return absl::UnauthenticatedError(
      absl::StrCat("peer call ", method, " refused: ", problem, hint.empty() ? "" : "; ", hint));
}

constexpr absl::string_view kTokenHint = "every daemon of the cluster needs the same [peer] token";

}  // namespace

PeerAuth::PeerAuth(PeerAuthOptions options, absl::Time start)
    : options_(std::move(options)),
      port_(options_.port),
      replays_(options_.max_senders, start),
      log_(options_.log_interval, options_.max_log_hosts) {}

absl::Status PeerAuth::Check(std::optional<absl::string_view> header, absl::string_view method,
                             const google::protobuf::Message& request, absl::Time now,
                             std::optional<store::StoreUser>* on_behalf) {
  if (!header.has_value()) {
    return Refuse(method, absl::StrCat("no MAC (no ", store::kPeerAuthHeader, " header)"),
                  "only tpd daemons of this release may call the peer port");
  }
  absl::StatusOr<store::ParsedPeerAuth> parsed = store::ParsePeerAuthHeader(*header);
  if (!parsed.ok()) return Refuse(method, absl::StrCat("no MAC: ", parsed.status().message()), "");
  store::PeerMacFields& fields = parsed->fields;
  fields.method = std::string(method);
  fields.body_digest = store::RequestDigest(request);
  if (!ConstantTimeEquals(store::ComputePeerMac(options_.token, fields), parsed->mac)) {
    return Refuse(method, "bad MAC (another token, or the call was changed on the way)",
                  kTokenHint);
  }
  const int64_t skew_ms = fields.timestamp_ms - absl::ToUnixMillis(now);
  if (std::llabs(skew_ms) > absl::ToInt64Milliseconds(options_.max_skew)) {
    return Refuse(method,
                  absl::StrCat("stale timestamp (", skew_ms, " ms from this daemon's clock)"),
                  absl::StrCat("keep clocks in sync (NTP) within [peer] auth_max_skew_ms = ",
                               absl::ToInt64Milliseconds(options_.max_skew)));
  }
  const int port = port_.load();
  if (AudiencePort(fields.audience) != port) {
    return Refuse(method,
                  absl::StrCat("wrong audience (signed for ", fields.audience,
                               ", this daemon's peer port is ", port, ")"),
                  "a call signed for one daemon is not accepted by another");
  }
  if (absl::Status fresh = replays_.Accept(fields.sender_id, fields.sequence, fields.timestamp_ms);
      !fresh.ok()) {
    return Refuse(method, fresh.message(), "a recorded call is accepted only once");
  }
  if (on_behalf != nullptr) *on_behalf = std::move(fields.on_behalf);
  return absl::OkStatus();
}

absl::Status PeerAuth::Admit(const grpc::CallbackServerContext& context, absl::string_view method,
                             const google::protobuf::Message& request,
                             std::optional<store::StoreUser>* on_behalf) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(store::kPeerAuthHeader);
  std::optional<absl::string_view> header;
  if (it != metadata.end()) header = absl::string_view(it->second.data(), it->second.size());
  const absl::Time now = absl::Now();
  absl::Status status = Check(header, method, request, now, on_behalf);
  if (!status.ok()) LogRejection(context.peer(), status, now);
  return status;
}

void PeerAuth::SignReply(grpc::CallbackServerContext* context,
                         const google::protobuf::Message& response) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(store::kPeerAuthHeader);
  if (it == metadata.end()) return;  // not admitted: nothing to answer
  absl::StatusOr<store::ParsedPeerAuth> call =
      store::ParsePeerAuthHeader(absl::string_view(it->second.data(), it->second.size()));
  if (!call.ok()) return;
  context->AddTrailingMetadata(
      store::kPeerReplyHeader,
      store::FormatPeerReplyHeader(store::ComputeReplyMac(options_.token, call->mac, response)));
}

void PeerAuth::LogRejection(const std::string& peer, const absl::Status& status, absl::Time now) {
  int64_t held = 0;
  if (!log_.Admit(PeerHost(peer), &held, now)) return;
  DaemonLog().warn("[peer {}] {}{}", peer, std::string(status.message()),
                   HeldBack(held, log_.interval()));
}

}  // namespace tpd
