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

#ifndef TPD_SHM_MESSAGE_H_
#define TPD_SHM_MESSAGE_H_

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tpd::shm {

inline constexpr uint32_t kMessageMagic = 0x31435054;  // "TPC1"
inline constexpr uint32_t kMaxMessageName = 4096;      // bytes per name

struct MessageHeader {
  uint32_t magic;
  uint32_t code;  // absl::StatusCode of a reply; 0 for a call
  uint32_t name_len[4];
};
static_assert(std::is_trivially_copyable_v<MessageHeader>);
static_assert(sizeof(MessageHeader) == 24);

// The four names after the header, in order: a call's group, target worker, method and calling
// worker; a reply's are "", "", its error message (code != 0) and "".
using MessageNames = std::array<std::string, 4>;

struct ParsedMessage {
  uint32_t code = 0;
  MessageNames names;
  uint64_t body_offset = 0;  // absolute, in the segment
  uint64_t body_length = 0;
};

// Bytes of header and names.
uint64_t MessagePrefixBytes(const MessageNames& names);

// Writes header and names at `out` (room for MessagePrefixBytes).
void WriteMessagePrefix(uint8_t* out, uint32_t code, const MessageNames& names);

// Where a message's parts lie in its heap block, as offsets from the block's start: header and
// names, the body after them, the tensor table at the next alignment, then one aligned slot per
// tensor. The client and the daemon both lay blocks out with PlanBlock, so they cannot disagree.
struct BlockPlan {
  uint64_t prefix = 0;       // header and names
  uint64_t payload = 0;      // prefix + body: the descriptor's payload_length
  uint64_t table = 0;        // the tensor table
  std::vector<uint64_t> at;  // tensor i's slot
  uint64_t total = 0;        // bytes to allocate
};

// `slot_bytes[i]`: the bytes tensor i needs in the block (0: none, as for a tensor that lies
// elsewhere).
BlockPlan PlanBlock(uint64_t prefix_bytes, uint64_t body_bytes,
                    absl::Span<const uint64_t> slot_bytes);

// Reads the message whose payload is [payload_offset, +payload_length) of the segment at
// `base`. REQUIRES: the range lies in the mapping (ValidateDescriptor checked it).
// INVALID_ARGUMENT naming the field on a short payload, wrong magic or names
// longer than kMaxMessageName or than the payload.
absl::StatusOr<ParsedMessage> ParseMessage(const uint8_t* base, uint64_t payload_offset,
                                           uint64_t payload_length);

// Rounds up to kHeapAlignment.
inline uint64_t AlignUp(uint64_t n) { return (n + 63) & ~uint64_t{63}; }

}  // namespace tpd::shm

#endif  // TPD_SHM_MESSAGE_H_
