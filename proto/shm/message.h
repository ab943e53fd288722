// The payload of a call or reply on the rings (docs/data_plane.md, "Calls on one node").
//
// The descriptor layout is fixed, so what routes a call lies at the start of its payload:
//
//   MessageHeader (24 bytes)  magic "TPC1", status code, four name lengths
//   name bytes               call: group, target worker, method, calling worker
//                            reply: "", "", error message (code != 0), ""
//   body                     the user's payload, to the end of payload_length
//
// A whole message (payload, tensor table, tensor bytes) lies in one heap block starting at
// payload_offset, so one release returns all of it. The payload is never empty (the header).
// Tensors in a block are aligned to kHeapAlignment.
//
// ParseMessage copies the header and names out of shared memory once; the body stays there
// (the reader copies it once more, into the peer's heap or the user's string).
//
// Thread safety: stateless functions.

#ifndef TPD_PROTO_SHM_MESSAGE_H_
#define TPD_PROTO_SHM_MESSAGE_H_

#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/status/statusor.h"

namespace tpd::shm {

inline constexpr uint32_t kMessageMagic = 0x31435054;  // "TPC1"
inline constexpr uint32_t kMaxMessageName = 4096;       // bytes per name

struct MessageHeader {
  uint32_t magic;
  uint32_t code;  // absl::StatusCode of a reply; 0 for a call
  uint32_t name_len[4];
};
static_assert(std::is_trivially_copyable_v<MessageHeader>);
static_assert(sizeof(MessageHeader) == 24);

struct ParsedMessage {
  uint32_t code = 0;
  std::string names[4];
  uint64_t body_offset = 0;  // absolute, in the segment
  uint64_t body_length = 0;
};

// Bytes of header and names.
uint64_t MessagePrefixBytes(uint64_t n0, uint64_t n1, uint64_t n2, uint64_t n3 = 0);

// Writes header and names at `out` (room for MessagePrefixBytes).
void WriteMessagePrefix(uint8_t* out, uint32_t code, const std::string& n0, const std::string& n1,
                        const std::string& n2, const std::string& n3 = "");

// Reads the message whose payload is [payload_offset, +payload_length) of the segment at
// `base`. REQUIRES: the range lies in the mapping (ValidateDescriptor checked it).
// INVALID_ARGUMENT naming the field on a short payload, wrong magic or names
// longer than kMaxMessageName or than the payload.
absl::StatusOr<ParsedMessage> ParseMessage(const uint8_t* base, uint64_t payload_offset,
                                           uint64_t payload_length);

// Rounds up to kHeapAlignment.
inline uint64_t AlignUp(uint64_t n) { return (n + 63) & ~uint64_t{63}; }

}  // namespace tpd::shm

#endif  // TPD_PROTO_SHM_MESSAGE_H_
