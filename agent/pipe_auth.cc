#include "agent/pipe_auth.h"

#include <openssl/rand.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "base/hmac.h"

namespace tpd::agent {
namespace {

void AppendU64(uint64_t value, std::string* out) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>(value >> shift));
}

void AppendField(absl::string_view field, std::string* out) {
  AppendU64(field.size(), out);
  out->append(field.data(), field.size());
}

void AppendList(const std::vector<std::string>& list, std::string* out) {
  AppendU64(list.size(), out);
  for (const std::string& item : list) AppendField(item, out);
}

// "uv://host:port" -> {"uv", "host", "port"}; host without IPv6 brackets. Empty scheme when
// the URL has none.
struct UrlParts {
  absl::string_view scheme;
  absl::string_view host;
  absl::string_view port;
};

UrlParts SplitUrl(absl::string_view url) {
  UrlParts parts;
  const size_t sep = url.find("://");
  if (sep == absl::string_view::npos) return parts;
  parts.scheme = url.substr(0, sep);
  absl::string_view rest = url.substr(sep + 3);
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos) {
    parts.host = rest;
    return parts;
  }
  parts.host = rest.substr(0, colon);
  parts.port = rest.substr(colon + 1);
  if (parts.host.size() >= 2 && parts.host.front() == '[' && parts.host.back() == ']') {
    parts.host = parts.host.substr(1, parts.host.size() - 2);
  }
  return parts;
}

}  // namespace

std::string ComputePipeMac(absl::string_view token, PipeMacRole role,
                           const PipeTranscript& transcript) {
  std::string input;
  AppendField(kPipeAuthVersion, &input);
  AppendField(role == PipeMacRole::kAnswer ? "answer" : "proof", &input);
  AppendField(transcript.challenge_nonce, &input);
  AppendField(transcript.answer_nonce, &input);
  AppendField(transcript.acceptor_id, &input);
  AppendList(transcript.acceptor_urls, &input);
  AppendField(transcript.dialed_url, &input);
  AppendField(transcript.connector_id, &input);
  AppendList(transcript.connector_urls, &input);
  return HmacSha256(token, input);
}

bool VerifyPipeMac(absl::string_view token, PipeMacRole role, const PipeTranscript& transcript,
                   absl::string_view mac) {
  return ConstantTimeEquals(ComputePipeMac(token, role, transcript), mac);
}

std::string NewPipeNonce() {
  std::string nonce(kPipeNonceBytes, '\0');
  const int ok =
      RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size()));
  // OpenSSL's CSPRNG fails only when it cannot seed (no getrandom, no /dev/urandom): a
  // handshake without fresh nonces would be replayable, so that is fatal, not ignorable.
  if (ok != 1) {
    std::fprintf(stderr, "tpd agent: RAND_bytes failed: no source of random numbers\n");
    std::abort();
  }
  return nonce;
}

bool DialedUrlIsOurs(absl::string_view dialed, absl::Span<const std::string> own_urls) {
  const UrlParts want = SplitUrl(dialed);
  for (const std::string& own : own_urls) {
    if (own == dialed) return true;
    const UrlParts have = SplitUrl(own);
    const bool wildcard = have.host == "0.0.0.0" || have.host == "::";
    if (wildcard && !want.scheme.empty() && want.scheme == have.scheme && !want.port.empty() &&
        want.port == have.port) {
      return true;
    }
  }
  return false;
}

}  // namespace tpd::agent
