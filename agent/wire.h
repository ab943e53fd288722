// The agent's wire, as pure functions with no pipe: how a message is framed for TensorPipe
// (its header's sizes, its chunks), where an incoming one is placed when no allocator does it,
// and the checks on what a peer sends before it is trusted (the pipe handshake's messages,
// an allocator's answer). Fuzzable and unit-tested without pipes (tests/agent/wire_test.cc).
//
// Thread safety: stateless.

#ifndef TPD_AGENT_WIRE_H_
#define TPD_AGENT_WIRE_H_

#include <tensorpipe/tensorpipe.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "agent/types.h"
#include "proto/agent.pb.h"

namespace tpd::agent {

// Bounds on a peer's handshake message: its size, its agent id, the URLs it lists.
inline constexpr size_t kMaxHelloBytes = 64 * 1024;
inline constexpr size_t kMaxIdBytes = 256;
inline constexpr int kMaxUrls = 16;
// Each tensor of a heap-placed message starts at a multiple of this.
inline constexpr size_t kTensorAlignment = 64;

// TensorPipe is given this for empty buffers rather than null.
void* OrEmpty(void* data);

// A heap block holding a message's payload and tensors (each tensor kTensorAlignment-aligned).
absl::StatusOr<Destination> HeapDestination(size_t payload_size,
                                            absl::Span<const size_t> tensor_sizes);
// Checks what an allocator returned against the sizes it was asked for (INTERNAL naming the
// missing buffer).
absl::Status CheckDestination(const Destination& destination, size_t payload_size,
                              absl::Span<const size_t> tensor_sizes);

// How many chunks a chunked tensor travels in (a peer's sizes may be anything: no overflow).
uint64_t ChunkCount(const v1::TensorDescriptor& descriptor);
// One chunk of an outgoing message.
struct Chunk {
  size_t tensor = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  void* data = nullptr;  // the tensor's buffer at offset
};
// The chunks of a prepared message's chunked tensors, tensor by tensor, in order.
std::vector<Chunk> ChunksOf(const Message& msg);
// Payload and tensor bytes of `msg`.
uint64_t MessageBytes(const Message& msg);
// Fills the header's sizes from the buffers; INVALID_ARGUMENT when they do not fit (counts,
// missing data, chunks below kMinChunkBytes or past kMaxChunksPerMessage, chunks without
// when_chunk_ready and a keepalive, more than `max_bytes`).
absl::Status PrepareHeader(Message& msg, uint64_t max_bytes);
// The TensorPipe message of a prepared `msg` (chunked tensors as empty placeholders).
tensorpipe::Message ToTensorPipe(const Message& msg);

// The sizes of an incoming message, from TensorPipe's descriptor and checked against its header.
struct IncomingSizes {
  size_t payload = 0;
  std::vector<size_t> tensors;  // each tensor's nbytes, chunked ones included
  uint64_t chunks = 0;          // chunks that follow the message
  uint64_t chunked_bytes = 0;   // bytes those chunks carry
  uint64_t main_bytes = 0;      // bytes of the message itself (what TensorPipe reads at once)
};
// Checks a message's descriptor against its header (a REQUEST, RESPONSE or ERROR) and
// `max_bytes`; INVALID_ARGUMENT saying what the peer got wrong, for the pipe's log.
absl::StatusOr<IncomingSizes> CheckIncoming(const tensorpipe::Descriptor& descriptor,
                                            const v1::AgentMessage& header, uint64_t max_bytes);
// Why the sender of a CHUNK header with a status could not produce its bytes (a code outside
// absl's range reads as UNKNOWN).
absl::Status ChunkFailure(const v1::AgentMessage& header);

// Who a handshake message says it is, bounded, for logs: "id (url,url) [context name]".
std::string ClaimedPeer(const v1::PipeHello& hello, const std::string& remote_name);
// Validates a handshake message's shape for `step` into `hello`; the caller checks its
// content (the MAC, the nonce's freshness).
absl::Status ParseHello(const tensorpipe::Descriptor& descriptor, v1::PipeHello::Step step,
                        v1::PipeHello* hello);

}  // namespace tpd::agent

#endif  // TPD_AGENT_WIRE_H_
