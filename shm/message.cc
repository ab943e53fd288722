#include "shm/message.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "shm/layout.h"

namespace tpd::shm {

uint64_t MessagePrefixBytes(const MessageNames& names) {
  uint64_t bytes = sizeof(MessageHeader);
  for (const std::string& name : names) bytes += name.size();
  return bytes;
}

void WriteMessagePrefix(uint8_t* out, uint32_t code, const MessageNames& names) {
  MessageHeader header{};
  header.magic = kMessageMagic;
  header.code = code;
  uint8_t* p = out + sizeof(header);
  for (size_t i = 0; i < names.size(); ++i) {
    header.name_len[i] = static_cast<uint32_t>(names[i].size());
    if (!names[i].empty()) std::memcpy(p, names[i].data(), names[i].size());
    p += names[i].size();
  }
  std::memcpy(out, &header, sizeof(header));
}

BlockPlan PlanBlock(uint64_t prefix_bytes, uint64_t body_bytes,
                    absl::Span<const uint64_t> slot_bytes) {
  BlockPlan plan;
  plan.prefix = prefix_bytes;
  plan.payload = prefix_bytes + body_bytes;
  plan.table = AlignUp(plan.payload);
  plan.total = plan.table + AlignUp(slot_bytes.size() * kTensorEntryBytes);
  plan.at.resize(slot_bytes.size());
  for (size_t i = 0; i < slot_bytes.size(); ++i) {
    plan.at[i] = plan.total;
    plan.total += AlignUp(slot_bytes[i]);
  }
  return plan;
}

absl::StatusOr<ParsedMessage> ParseMessage(const uint8_t* base, uint64_t payload_offset,
                                           uint64_t payload_length) {
  if (payload_length < sizeof(MessageHeader)) {
    return absl::InvalidArgumentError(absl::StrCat("message payload_length ", payload_length,
                                                   " is shorter than its header (",
                                                   sizeof(MessageHeader), " bytes)"));
  }
  MessageHeader header;
  std::memcpy(&header, base + payload_offset, sizeof(header));  // copied out once
  if (header.magic != kMessageMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("message magic ", header.magic, " is not ", kMessageMagic));
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
