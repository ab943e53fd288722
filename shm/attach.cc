#include "shm/attach.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tpd::shm {
namespace {

constexpr char kRequestMagic[8] = {'T', 'P', 'D', 'A', 'T', 'T', 'Q', '1'};
constexpr char kIdentifyMagic[8] = {'T', 'P', 'D', 'I', 'D', 'N', 'Q', '1'};
constexpr char kReplyMagic[8] = {'T', 'P', 'D', 'A', 'T', 'T', 'R', '1'};

// Little-endian on every machine tpd runs on; the two sides share one host.
void Put32(uint8_t* at, uint32_t value) { std::memcpy(at, &value, sizeof(value)); }
void Put64(uint8_t* at, uint64_t value) { std::memcpy(at, &value, sizeof(value)); }
uint32_t Get32(const char* at) {
  uint32_t value;
  std::memcpy(&value, at, sizeof(value));
  return value;
}
uint64_t Get64(const char* at) {
  uint64_t value;
  std::memcpy(&value, at, sizeof(value));
  return value;
}

absl::Status CheckSessionId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxSessionIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("attach request: session id of ", id.size(),
                                                   " bytes; 1..", kMaxSessionIdBytes, " expected"));
  }
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return absl::InvalidArgumentError(
          "attach request: the session id holds a byte other than [0-9a-f]");
    }
  }
  return absl::OkStatus();
}

}  // namespace

// Layout of a request: magic[8], version u32, id length u32, id[64].
static_assert(8 + 4 + 4 + kMaxSessionIdBytes == kAttachRequestBytes);
// Layout of a reply: magic[8], code u32, message length u32, segment bytes u64, message[232].
static_assert(8 + 4 + 4 + 8 + kMaxAttachMessageBytes == kAttachReplyBytes);

std::string DataSocketPath(absl::string_view grpc_socket) {
  return absl::StrCat(grpc_socket, ".data");
}

absl::StatusOr<std::array<uint8_t, kAttachRequestBytes>> EncodeRequest(
    const char (&magic)[8], absl::string_view session_id) {
  if (absl::Status status = CheckSessionId(session_id); !status.ok()) return status;
  std::array<uint8_t, kAttachRequestBytes> out{};
  std::memcpy(out.data(), magic, 8);
  Put32(out.data() + 8, kAttachVersion);
  Put32(out.data() + 12, static_cast<uint32_t>(session_id.size()));
  std::memcpy(out.data() + 16, session_id.data(), session_id.size());
  return out;
}

absl::StatusOr<std::array<uint8_t, kAttachRequestBytes>> EncodeAttachRequest(
    absl::string_view session_id) {
  return EncodeRequest(kRequestMagic, session_id);
}

absl::StatusOr<std::array<uint8_t, kAttachRequestBytes>> EncodeIdentifyRequest(
    absl::string_view session_id) {
  return EncodeRequest(kIdentifyMagic, session_id);
}

absl::StatusOr<std::string> DecodeAttachRequest(absl::string_view bytes) {
  absl::StatusOr<DataRequest> request = DecodeDataRequest(bytes);
  if (!request.ok()) return request.status();
  if (request->kind != DataRequest::Kind::kAttach) {
    return absl::InvalidArgumentError("attach request: wrong magic (not a tpd client?)");
  }
  return std::move(request->session_id);
}

absl::StatusOr<DataRequest> DecodeDataRequest(absl::string_view bytes) {
  if (bytes.size() != kAttachRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attach request of ", bytes.size(), " bytes; exactly ", kAttachRequestBytes, " expected"));
  }
  DataRequest request;
  if (std::memcmp(bytes.data(), kIdentifyMagic, 8) == 0) {
    request.kind = DataRequest::Kind::kIdentify;
  } else if (std::memcmp(bytes.data(), kRequestMagic, 8) != 0) {
    return absl::InvalidArgumentError("attach request: wrong magic (not a tpd client?)");
  }
  if (const uint32_t version = Get32(bytes.data() + 8); version != kAttachVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach request: version ", version, "; this daemon speaks ", kAttachVersion));
  }
  const uint32_t length = Get32(bytes.data() + 12);
  if (length == 0 || length > kMaxSessionIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("attach request: session id length ", length,
                                                   "; 1..", kMaxSessionIdBytes, " expected"));
  }
  const absl::string_view id = bytes.substr(16, length);
  if (absl::Status status = CheckSessionId(id); !status.ok()) return status;
  for (char c : bytes.substr(16 + length)) {
    if (c != 0) return absl::InvalidArgumentError("attach request: bytes after the session id");
  }
  request.session_id = std::string(id);
  return request;
}

std::array<uint8_t, kAttachReplyBytes> EncodeAttachReply(const AttachReply& reply) {
  std::array<uint8_t, kAttachReplyBytes> out{};
  std::memcpy(out.data(), kReplyMagic, 8);
  const absl::string_view message = reply.status.message().substr(0, kMaxAttachMessageBytes);
  Put32(out.data() + 8, static_cast<uint32_t>(reply.status.code()));
  Put32(out.data() + 12, static_cast<uint32_t>(message.size()));
  Put64(out.data() + 16, reply.segment_bytes);
  std::memcpy(out.data() + 24, message.data(), message.size());
  return out;
}

absl::StatusOr<AttachReply> DecodeAttachReply(absl::string_view bytes) {
  if (bytes.size() != kAttachReplyBytes || std::memcmp(bytes.data(), kReplyMagic, 8) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach reply of ", bytes.size(), " bytes is not a tpd attach reply"));
  }
  const uint32_t code = Get32(bytes.data() + 8);
  const uint32_t length = Get32(bytes.data() + 12);
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated) ||
      length > kMaxAttachMessageBytes) {
    return absl::InvalidArgumentError("attach reply: code or message length out of range");
  }
  AttachReply reply;
  reply.segment_bytes = Get64(bytes.data() + 16);
  if (code != 0) {
    reply.status =
        absl::Status(static_cast<absl::StatusCode>(code), std::string(bytes.substr(24, length)));
  }
  return reply;
}

}  // namespace tpd::shm
