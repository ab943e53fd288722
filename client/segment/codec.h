// The client's messages on the wire of its segment (docs/data_plane.md, "Messages"): what it
// sends, written into a block of its tx heap (names, payload, tensor table, the bytes of
// tensors that are not in the arena already, the export records of CUDA tensors), and what it
// receives, read from a completion into a Message of views (the rx heap, a sender's segment,
// a receive pool), every offset and length checked first.
//
// No thread, ring or lock of its own: it reads and writes blocks through a Link, so it can be
// tested, and fuzzed, over an in-process segment.
//
// Internal to the client library.
//
// Thread safety: the functions are thread-safe (the Link and PeerSegments are).

#ifndef TPD_CLIENT_SEGMENT_CODEC_H_
#define TPD_CLIENT_SEGMENT_CODEC_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/segment/link.h"
#include "client/segment/peer_segments.h"
#include "client/segment/tensor.h"
#include "shm/copy_signal.h"
#include "shm/descriptor.h"
#include "shm/message.h"

namespace tpd::calls_internal {

// What a message sent says besides its payload and tensors.
struct OutgoingHeader {
  shm::Op op = shm::Op::kCall;
  uint64_t call_id = 0;
  int64_t deadline_unix_ns = 0;  // 0: none
  uint16_t flags = 0;            // shm::kFlagError, shm::kFlagReverseMap
  uint32_t code = 0;             // an error reply's status code
  shm::MessageNames names;       // group, worker, method, caller (an error's message: [2])
};

// A message written into its block, not yet pushed.
struct EncodedMessage {
  shm::Descriptor descriptor{};
  uint64_t block = 0;  // the message's block of the tx heap
  // Held until the daemon releases the block (Link::PushMessage).
  std::vector<std::shared_ptr<ArenaBlock>> pins;
  std::vector<std::shared_ptr<void>> leases;
  uint64_t bytes_copied = 0;      // payload and tensor bytes copied into the block
  uint64_t tensors_copied = 0;    // every tensor not sent in place (CUDA ones included)
  uint64_t tensors_in_place = 0;  // arena tensors and rx-heap views of this link, sent where
                                  // they lie
  uint64_t cuda_tensors = 0;
};

// Writes a message into a fresh block of `link`'s tx heap. INVALID_ARGUMENT for a name over
// shm::kMaxMessageName, too many tensors, a bad dtype or shape, bytes that do not match them
// or a CUDA device that does not exist; RESOURCE_EXHAUSTED when the heap cannot hold it; the
// driver's error (prefixed with the tensor) when a CUDA tensor cannot be exported. Nothing is
// allocated after an error.
absl::StatusOr<EncodedMessage> EncodeMessage(Link& link, const OutgoingHeader& header,
                                             std::string_view payload,
                                             absl::Span<const Tensor> tensors);

// A call or reply read off the completion ring.
struct DecodedMessage {
  // The message, its tensors views that keep their blocks; or why there is none: an error
  // reply's status, or what was malformed (the daemon's bug, or memory it lent us corrupted).
  // (Every path of DecodeMessage sets it: the default, UNKNOWN with no message, costs no
  // allocation on the reader's path.)
  absl::StatusOr<Message> message{};
  // group, worker (this client's, the one called), method, caller; empty unless `message`
  // is OK.
  shm::MessageNames names;
  // The daemon posted it before its copies of CUDA tensors completed: the signals to wait
  // on before reading them, and the rx block that holds the signals.
  std::vector<shm::CopySignal*> copies;
  std::shared_ptr<const void> block;
};

// Reads the call or reply `d` (shm::Op::kCall or kReply, validated against the layout). Its rx
// block is released when the last view of it goes, at the latest with the result, so even a
// malformed message gives its memory back.
DecodedMessage DecodeMessage(const shm::Descriptor& d, const std::shared_ptr<Link>& link,
                             PeerSegments& peers);

}  // namespace tpd::calls_internal

#endif  // TPD_CLIENT_SEGMENT_CODEC_H_
