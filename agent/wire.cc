#include "agent/wire.h"

#include <algorithm>
#include <memory>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/pipe_auth.h"

namespace tpd::agent {

namespace {

char kEmpty[1];

}  // namespace

void* OrEmpty(void* data) { return data != nullptr ? data : kEmpty; }

absl::StatusOr<Destination> HeapDestination(size_t payload_size,
                                            absl::Span<const size_t> tensor_sizes) {
  size_t total = payload_size;
  std::vector<size_t> offsets;
  for (size_t size : tensor_sizes) {
    total = (total + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
    offsets.push_back(total);
    total += size;
  }
  Destination destination;
  if (total == 0) {
    destination.tensors.assign(tensor_sizes.size(), nullptr);
    return destination;
  }
  std::shared_ptr<char> block(new (std::nothrow) char[total], std::default_delete<char[]>());
  if (block == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", total, " bytes for an incoming message"));
  }
  destination.payload = payload_size > 0 ? block.get() : nullptr;
  for (size_t i = 0; i < tensor_sizes.size(); ++i) {
    destination.tensors.push_back(tensor_sizes[i] > 0 ? block.get() + offsets[i] : nullptr);
  }
  destination.keepalive = std::move(block);
  return destination;
}

absl::Status CheckDestination(const Destination& destination, size_t payload_size,
                              absl::Span<const size_t> tensor_sizes) {
  if (destination.tensors.size() != tensor_sizes.size()) {
    return absl::InternalError(absl::StrCat("the allocator returned ", destination.tensors.size(),
                                            " tensor buffers for ", tensor_sizes.size(),
                                            " tensors"));
  }
  if (payload_size > 0 && destination.payload == nullptr) {
    return absl::InternalError("the allocator returned no payload buffer");
  }
  for (size_t i = 0; i < tensor_sizes.size(); ++i) {
    if (tensor_sizes[i] > 0 && destination.tensors[i] == nullptr) {
      return absl::InternalError(absl::StrCat("the allocator returned no buffer for tensor ", i));
    }
  }
  return absl::OkStatus();
}

uint64_t ChunkCount(const v1::TensorDescriptor& descriptor) {
  // Not (n + c - 1) / c: a peer's n and c may be anything, and that sum can wrap.
  return descriptor.nbytes() / descriptor.chunk_bytes() +
         (descriptor.nbytes() % descriptor.chunk_bytes() != 0 ? 1 : 0);
}

std::vector<Chunk> ChunksOf(const Message& msg) {
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < msg.tensors.size(); ++i) {
    const uint64_t step = msg.header.tensors(static_cast<int>(i)).chunk_bytes();
    if (step == 0) continue;
    for (uint64_t offset = 0; offset < msg.tensors[i].size; offset += step) {
      chunks.push_back({i, offset, std::min(step, msg.tensors[i].size - offset),
                        static_cast<char*>(msg.tensors[i].data) + offset});
    }
  }
  return chunks;
}

uint64_t MessageBytes(const Message& msg) {
  uint64_t total = msg.payload.size;
  for (const Buffer& tensor : msg.tensors) total += tensor.size;
  return total;
}

absl::Status PrepareHeader(Message& msg, uint64_t max_bytes) {
  if (msg.header.tensors_size() == 0 && !msg.tensors.empty()) {
    for (size_t i = 0; i < msg.tensors.size(); ++i) msg.header.add_tensors();
  }
  if (static_cast<size_t>(msg.header.tensors_size()) != msg.tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the message has ", msg.tensors.size(),
                                                   " tensors but ", msg.header.tensors_size(),
                                                   " tensor descriptors"));
  }
  if (msg.payload.size > 0 && msg.payload.data == nullptr) {
    return absl::InvalidArgumentError("the payload has a size but no data");
  }
  uint64_t chunks = 0;
  for (size_t i = 0; i < msg.tensors.size(); ++i) {
    if (msg.tensors[i].size > 0 && msg.tensors[i].data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " has a size but no data"));
    }
    v1::TensorDescriptor& descriptor = *msg.header.mutable_tensors(static_cast<int>(i));
    descriptor.set_nbytes(msg.tensors[i].size);
    if (descriptor.chunk_bytes() == 0) continue;
    if (msg.tensors[i].size == 0) {
      descriptor.clear_chunk_bytes();  // nothing to send in chunks
      continue;
    }
    if (descriptor.chunk_bytes() < kMinChunkBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, "'s chunks of ", descriptor.chunk_bytes(),
                       " bytes are below the minimum of ", kMinChunkBytes));
    }
    chunks += ChunkCount(descriptor);
  }
  if (chunks > kMaxChunksPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat("the message's tensors make ", chunks,
                                                   " chunks, more than ", kMaxChunksPerMessage));
  }
  if (chunks > 0 && (!msg.when_chunk_ready || msg.keepalive == nullptr)) {
    return absl::InvalidArgumentError(
        "tensors sent in chunks need when_chunk_ready and a keepalive");
  }
  const uint64_t bytes = MessageBytes(msg);
  if (bytes > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the message holds ", bytes,
                                                   " bytes, more than the agent's limit of ",
                                                   max_bytes, " (max_message_bytes)"));
  }
  msg.header.set_payload_bytes(msg.payload.size);
  return absl::OkStatus();
}

tensorpipe::Message ToTensorPipe(const Message& msg) {
  tensorpipe::Message out;
  out.metadata = msg.header.SerializeAsString();
  if (msg.payload.size > 0) {
    out.payloads.push_back({msg.payload.data, msg.payload.size, ""});
  }
  for (size_t i = 0; i < msg.tensors.size(); ++i) {
    // A chunked tensor's bytes follow in CHUNK messages; an empty tensor holds its place.
    const bool chunked = msg.header.tensors(static_cast<int>(i)).chunk_bytes() > 0;
    tensorpipe::Message::Tensor t;
    t.buffer = tensorpipe::CpuBuffer{chunked ? kEmpty : OrEmpty(msg.tensors[i].data)};
    t.length = chunked ? 0 : msg.tensors[i].size;
    out.tensors.push_back(std::move(t));
  }
  return out;
}

namespace {

absl::Status TooLarge(uint64_t max_bytes, uint64_t total, uint64_t more) {
  return absl::InvalidArgumentError(absl::StrCat("it sent a message of more than ", max_bytes,
                                                 " bytes (max_message_bytes): ", total, " + ",
                                                 more));
}

// A tensor's descriptor checked against its header; adds its bytes and chunks to `sizes`.
absl::Status CheckTensor(const tensorpipe::Descriptor::Tensor& tensor, size_t i,
                         const v1::TensorDescriptor& described, uint64_t max_bytes,
                         IncomingSizes& sizes, uint64_t& total) {
  // Sizes are summed only while the sum stays within max_bytes: a chunked tensor's nbytes is
  // the peer's word alone (no TensorPipe length backs it), and a sum that wrapped would place
  // the message in a block far smaller than its chunks.
  if (described.nbytes() > max_bytes - total) return TooLarge(max_bytes, total, described.nbytes());
  // A chunked tensor's bytes follow in CHUNK messages: an empty tensor holds its place.
  const uint64_t expected = described.chunk_bytes() > 0 ? 0 : described.nbytes();
  if (tensor.length != expected || tensor.sourceDevice.type != tensorpipe::kCpuDeviceType) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " of a message is ", tensor.length,
                                                   " bytes, its header says ", expected));
  }
  if (described.chunk_bytes() > 0) {
    if (described.chunk_bytes() < kMinChunkBytes || described.nbytes() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " of a message comes in chunks of ", described.chunk_bytes(),
                       " bytes (at least ", kMinChunkBytes, ", and only a tensor with bytes)"));
    }
    sizes.chunks += ChunkCount(described);
    sizes.chunked_bytes += described.nbytes();
  }
  sizes.tensors.push_back(described.nbytes());
  sizes.main_bytes += tensor.length;
  total += described.nbytes();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IncomingSizes> CheckIncoming(const tensorpipe::Descriptor& descriptor,
                                            const v1::AgentMessage& header, uint64_t max_bytes) {
  IncomingSizes sizes;
  if (descriptor.payloads.size() > 1) {
    return absl::InvalidArgumentError("it sent a message with more than one payload");
  }
  if (!descriptor.payloads.empty()) sizes.payload = descriptor.payloads[0].length;
  if (sizes.payload != header.payload_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("a message's payload is ", sizes.payload,
                                                   " bytes, its header says ",
                                                   header.payload_bytes()));
  }
  if (descriptor.tensors.size() != static_cast<size_t>(header.tensors_size())) {
    return absl::InvalidArgumentError(absl::StrCat("a message carries ", descriptor.tensors.size(),
                                                   " tensors, its header describes ",
                                                   header.tensors_size()));
  }
  uint64_t total = sizes.payload;
  if (total > max_bytes) return TooLarge(max_bytes, total, 0);
  sizes.main_bytes = sizes.payload;
  for (size_t i = 0; i < descriptor.tensors.size(); ++i) {
    absl::Status checked = CheckTensor(
        descriptor.tensors[i], i, header.tensors(static_cast<int>(i)), max_bytes, sizes, total);
    if (!checked.ok()) return checked;
  }
  if (sizes.chunks > kMaxChunksPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat("it sent a message in ", sizes.chunks,
                                                   " chunks, more than ", kMaxChunksPerMessage));
  }
  return sizes;
}

absl::Status ChunkFailure(const v1::AgentMessage& header) {
  const int code = header.status_code();
  const absl::StatusCode status_code =
      code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
          ? static_cast<absl::StatusCode>(code)
          : absl::StatusCode::kUnknown;
  return absl::Status(status_code,
                      absl::StrCat("the sender could not send tensor ", header.chunk_tensor(), ": ",
                                   header.status_message().substr(0, 1024)));
}

std::string ClaimedPeer(const v1::PipeHello& hello, const std::string& remote_name) {
  std::string claimed = hello.agent_id().empty() ? "?" : hello.agent_id().substr(0, kMaxIdBytes);
  if (hello.urls_size() > 0) {
    absl::StrAppend(&claimed, " (",
                    absl::StrJoin(hello.urls().begin(),
                                  hello.urls().begin() + std::min(hello.urls_size(), 4), ","),
                    ")");
  }
  if (!remote_name.empty() && remote_name != hello.agent_id()) {
    absl::StrAppend(&claimed, " [context ", remote_name.substr(0, kMaxIdBytes), "]");
  }
  return claimed;
}

absl::Status ParseHello(const tensorpipe::Descriptor& descriptor, v1::PipeHello::Step step,
                        v1::PipeHello* hello) {
  if (!descriptor.payloads.empty() || !descriptor.tensors.empty()) {
    return absl::InvalidArgumentError("it sent data before the handshake finished");
  }
  if (descriptor.metadata.size() > kMaxHelloBytes || !hello->ParseFromString(descriptor.metadata)) {
    return absl::InvalidArgumentError("its handshake message is not a PipeHello");
  }
  if (hello->version() != kPipeAuthVersion) {
    return absl::InvalidArgumentError(absl::StrCat("it speaks \"", hello->version().substr(0, 32),
                                                   "\", not \"", kPipeAuthVersion,
                                                   "\" (another release?)"));
  }
  if (hello->step() != step) {
    return absl::InvalidArgumentError(absl::StrCat("expected handshake step ",
                                                   v1::PipeHello::Step_Name(step), ", got ",
                                                   static_cast<int>(hello->step())));
  }
  if (step != v1::PipeHello::PROOF) {
    if (hello->nonce().size() != kPipeNonceBytes || hello->agent_id().empty() ||
        hello->agent_id().size() > kMaxIdBytes || hello->urls_size() > kMaxUrls) {
      return absl::InvalidArgumentError("its handshake message is malformed");
    }
  }
  if (step != v1::PipeHello::CHALLENGE && hello->mac().size() != 32) {
    return absl::InvalidArgumentError("its handshake message carries no MAC");
  }
  return absl::OkStatus();
}

}  // namespace tpd::agent
