#include "proto/shm/message.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tpd::shm {

uint64_t MessagePrefixBytes(uint64_t n0, uint64_t n1, uint64_t n2, uint64_t n3) {
  return sizeof(MessageHeader) + n0 + n1 + n2 + n3;
}

void WriteMessagePrefix(uint8_t* out, uint32_t code, const std::string& n0, const std::string& n1,
                        const std::string& n2, const std::string& n3) {
  MessageHeader header{};
  header.magic = kMessageMagic;
  header.code = code;
  header.name_len[0] = static_cast<uint32_t>(n0.size());
  header.name_len[1] = static_cast<uint32_t>(n1.size());
  header.name_len[2] = static_cast<uint32_t>(n2.size());
  header.name_len[3] = static_cast<uint32_t>(n3.size());
  std::memcpy(out, &header, sizeof(header));
  uint8_t* p = out + sizeof(header);
  for (const std::string* name : {&n0, &n1, &n2, &n3}) {
    if (!name->empty()) std::memcpy(p, name->data(), name->size());
    p += name->size();
  }
}

absl::StatusOr<ParsedMessage> ParseMessage(const uint8_t* base, uint64_t payload_offset,
                                           uint64_t payload_length) {
  if (payload_length < sizeof(MessageHeader)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message payload_length ", payload_length, " is shorter than its header (",
        sizeof(MessageHeader), " bytes)"));
  }
  MessageHeader header;
  std::memcpy(&header, base + payload_offset, sizeof(header));  // copied out once
  if (header.magic != kMessageMagic) {
    return absl::InvalidArgumentError(absl::StrCat("message magic ", header.magic, " is not ",
                                                   kMessageMagic));
  }
  uint64_t used = sizeof(header);
  ParsedMessage parsed;
  parsed.code = header.code;
  for (int i = 0; i < 4; ++i) {
    const uint64_t n = header.name_len[i];
    if (n > kMaxMessageName || n > payload_length - used) {
      return absl::InvalidArgumentError(absl::StrCat("message name ", i, " length ", n,
                                                     " exceeds the payload or ", kMaxMessageName));
    }
    parsed.names[i].assign(reinterpret_cast<const char*>(base + payload_offset + used), n);
    used += n;
  }
  parsed.body_offset = payload_offset + used;
  parsed.body_length = payload_length - used;
  return parsed;
}

}  // namespace tpd::shm
