#include "store/peer_mac.h"

#include <openssl/sha.h>

#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/hmac.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace tpd::store {
namespace {

constexpr size_t kDigestBytes = 32;

void AppendU64(uint64_t value, std::string* out) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>(value >> shift));
}

void AppendField(absl::string_view field, std::string* out) {
  AppendU64(field.size(), out);
  out->append(field.data(), field.size());
}

uint64_t RandomSenderId() {
  absl::BitGen gen;
  return absl::Uniform<uint64_t>(gen);
}

}  // namespace

std::string RequestDigest(const google::protobuf::Message& request) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    request.SerializePartialToCodedStream(&coded);
  }
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

std::string ComputePeerMac(absl::string_view key, const PeerMacFields& fields) {
  std::string input;
  AppendField(kPeerMacVersion, &input);
  AppendField(fields.method, &input);
  AppendField(fields.audience, &input);
  AppendU64(static_cast<uint64_t>(fields.timestamp_ms), &input);
  AppendU64(fields.sender_id, &input);
  AppendU64(fields.sequence, &input);
  AppendField(fields.body_digest, &input);
  if (fields.on_behalf.has_value()) {
    AppendU64(static_cast<uint64_t>(fields.on_behalf->uid), &input);
    AppendField(fields.on_behalf->node, &input);
  }
  return HmacSha256(key, input);
}

std::string FormatPeerAuthHeader(const PeerMacFields& fields, absl::string_view mac) {
  return absl::StrCat(kPeerMacVersion, " aud=", fields.audience, " ts=", fields.timestamp_ms,
                      " sender=", absl::Hex(fields.sender_id, absl::kZeroPad16),
                      " seq=", fields.sequence, " mac=", absl::BytesToHexString(mac),
                      fields.on_behalf.has_value()
                          ? absl::StrCat(" for=", fields.on_behalf->uid, "@",
                                         absl::BytesToHexString(fields.on_behalf->node))
                          : "");
}

absl::StatusOr<ParsedPeerAuth> ParsePeerAuthHeader(absl::string_view value) {
  std::vector<absl::string_view> words = absl::StrSplit(value, ' ');
  if ((words.size() != 6 && words.size() != 7) || words[0] != kPeerMacVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", kPeerAuthHeader, " header is not \"", kPeerMacVersion,
                     " aud=.. ts=.. sender=.. seq=.. mac=..\" (a daemon of another release?)"));
  }
  ParsedPeerAuth parsed;
  const char* const kNames[] = {"aud=", "ts=", "sender=", "seq=", "mac="};
  absl::string_view parts[5];
  for (int i = 0; i < 5; ++i) {
    if (!absl::ConsumePrefix(&words[i + 1], kNames[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", kPeerAuthHeader, " header has no ", kNames[i], " in place"));
    }
    parts[i] = words[i + 1];
  }
  parsed.fields.audience = std::string(parts[0]);
  bool ok =
      !parsed.fields.audience.empty() && absl::SimpleAtoi(parts[1], &parsed.fields.timestamp_ms) &&
      parts[2].size() == 16 && absl::SimpleHexAtoi(parts[2], &parsed.fields.sender_id) &&
      absl::SimpleAtoi(parts[3], &parsed.fields.sequence) && parts[4].size() == 2 * kDigestBytes &&
      parts[4].find_first_not_of("0123456789abcdef") == absl::string_view::npos;
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", kPeerAuthHeader, " header has a malformed field"));
  }
  parsed.mac = absl::HexStringToBytes(parts[4]);
  if (words.size() == 7) {
    // for=<uid>@<hex node>: a decimal uid that fits a uid_t, a node name of 1 to 255 bytes.
    absl::string_view user = words[6];
    const bool named = absl::ConsumePrefix(&user, "for=");
    const std::pair<absl::string_view, absl::string_view> uid_node =
        absl::StrSplit(user, absl::MaxSplits('@', 1));
    const absl::string_view node_hex = uid_node.second;
    StoreUser on_behalf;
    const bool well_formed =
        named && absl::SimpleAtoi(uid_node.first, &on_behalf.uid) && on_behalf.uid >= 0 &&
        on_behalf.uid <= 0xffffffffLL && !node_hex.empty() && node_hex.size() <= 2 * 255 &&
        node_hex.size() % 2 == 0 &&
        node_hex.find_first_not_of("0123456789abcdef") == absl::string_view::npos;
    if (!well_formed) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", kPeerAuthHeader, " header has a malformed for= field"));
    }
    on_behalf.node = absl::HexStringToBytes(node_hex);
    parsed.fields.on_behalf = std::move(on_behalf);
  }
  return parsed;
}

PeerCallSigner::PeerCallSigner(std::string key, std::string audience)
    : key_(std::move(key)), audience_(std::move(audience)), sender_id_(RandomSenderId()) {}

std::string ComputeReplyMac(absl::string_view key, absl::string_view call_mac,
                            const google::protobuf::Message& response) {
  std::string input;
  AppendField(kPeerReplyVersion, &input);
  AppendField(call_mac, &input);
  AppendField(RequestDigest(response), &input);
  return HmacSha256(key, input);
}

std::string FormatPeerReplyHeader(absl::string_view mac) {
  return absl::StrCat(kPeerReplyVersion, " mac=", absl::BytesToHexString(mac));
}

absl::StatusOr<std::string> ParsePeerReplyHeader(absl::string_view value) {
  if (!absl::ConsumePrefix(&value, kPeerReplyVersion) || !absl::ConsumePrefix(&value, " mac=") ||
      value.size() != 2 * kDigestBytes ||
      value.find_first_not_of("0123456789abcdef") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("the ", kPeerReplyHeader, " trailer is not \"",
                                                   kPeerReplyVersion, " mac=<64 hex>\""));
  }
  return absl::HexStringToBytes(value);
}

SignedCall PeerCallSigner::SignCall(absl::string_view method,
                                    const google::protobuf::Message& request,
                                    const std::optional<StoreUser>& on_behalf, absl::Time now) {
  PeerMacFields fields;
  fields.method = std::string(method);
  fields.audience = audience_;
  fields.timestamp_ms = absl::ToUnixMillis(now);
  fields.sender_id = sender_id_;
  fields.sequence = next_sequence_.fetch_add(1, std::memory_order_relaxed);
  fields.body_digest = RequestDigest(request);
  fields.on_behalf = on_behalf;
  SignedCall call;
  call.mac = ComputePeerMac(key_, fields);
  call.header = FormatPeerAuthHeader(fields, call.mac);
  return call;
}

}  // namespace tpd::store
