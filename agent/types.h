// What callers of the agent (agent/agent.h) pass in and get back: options, peers, messages and
// where their bytes go, the handler of incoming requests, and statistics. Apart from agent.h
// so that the agent's own parts (agent/wire.h, agent/pipe.h) can use them below the Agent class.
//
// Thread safety: plain values; ReplyTo may be copied and used from any thread.

#ifndef TPD_AGENT_TYPES_H_
#define TPD_AGENT_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "agent/listen_guard.h"
#include "proto/agent.pb.h"

namespace tpd::agent {

struct AgentOptions {
  // This agent's id in handshakes and logs: the daemon's node name. Required.
  std::string id;
  // host:port for uv (and the host of ibv and mpt_uv's lanes); port 0 picks one. Use an
  // address peers can dial: mpt_uv's lanes advertise this host, so a wildcard (0.0.0.0) leaves
  // them unreachable from other hosts. IPv6 in brackets: "[::1]:0".
  std::string listen_address = "127.0.0.1:0";
  // The cluster secret ([peer] token); required. It never travels.
  std::string cluster_token;
  // Allowed transports and channels (a group's negotiated lists; empty = all known), and
  // mpt_uv's lane count. See agent/registry.h.
  std::vector<std::string> transports;
  std::vector<std::string> channels;
  int mpt_lanes = 4;
  // How long a pipe may take from open/accept to the end of its handshake.
  absl::Duration handshake_timeout = absl::Seconds(10);
  // How long a message's chunks may pause (from its header to the first chunk, and between
  // chunks) before the pipe is closed: the sender promised them and holds the receiver's
  // memory until they come.
  absl::Duration chunk_timeout = absl::Seconds(30);
  // The slowest a message's chunks may come on the whole: all of them must be in within
  // chunk_timeout plus their bytes at this rate, however they are spaced (a peer cannot hold
  // the memory placed for a message by dripping a chunk every chunk_timeout). Bytes/second.
  uint64_t min_chunk_rate = uint64_t{10} << 20;
  // Largest payload plus tensors of one message, either way. Sending more is
  // INVALID_ARGUMENT; a peer that sends more has its pipe closed (the bytes cannot be
  // skipped, only read).
  uint64_t max_message_bytes = uint64_t{2} << 30;
  // Networks (CIDRs, as [peer] dial_networks) whose hosts may open a TCP connection to this
  // agent's listening ports (uv's, ibv's, each mpt_uv lane's): the kernel drops every other
  // host's SYN, so bytes that crash TensorPipe before our handshake never arrive from outside
  // them (agent/listen_guard.h). 1..kMaxAcceptNetworks entries.
  std::vector<std::string> accept_networks = DefaultAcceptNetworks();
};

// A peer daemon's agent.
struct PeerId {
  // Its node name: the id its handshake must present. Empty accepts any (tests).
  std::string node;
  // Its Agent::address(): a comma-separated TensorPipe URL list ("uv://10.0.0.2:29501,...").
  std::string address;

  // "node-b (uv://...)".
  std::string ToString() const;
  bool operator==(const PeerId& other) const {
    return node == other.node && address == other.address;
  }
  template <typename H>
  friend H AbslHashValue(H h, const PeerId& peer) {
    return H::combine(std::move(h), peer.node, peer.address);
  }
};

// A contiguous CPU buffer.
struct Buffer {
  void* data = nullptr;
  size_t size = 0;
};

// Tensors sent in chunks after their message (TensorDescriptor.chunk_bytes). Chunks are for
// bytes that are not final when the message is sent, such as device memory still being copied
// to pinned host memory: each chunk goes on the wire as soon as it is ready, and the receiver
// uses each as it lands (Destination::on_chunk), so copies on both sides overlap the transfer.
inline constexpr uint64_t kMinChunkBytes = uint64_t{1} << 20;
inline constexpr uint64_t kMaxChunksPerMessage = 4096;
// Called once with OK when the chunk's bytes are final, or with why they never will be (the
// receiver then fails the message with that status). Any thread; must not block.
using ChunkReady = absl::AnyInvocable<void(absl::Status)>;

// One message: a header, payload bytes and tensors.
struct Message {
  // The agent sets call_id, kind (REQUEST for Send, RESPONSE for Respond unless ERROR is
  // set), timeout_us and payload_bytes, and each tensor's nbytes; the owner sets the rest
  // (group, workers, method, tensor dtype/shape/device; status for ERROR).
  v1::AgentMessage header;
  Buffer payload;
  // One per header.tensors(i), in order.
  std::vector<Buffer> tensors;
  // Outgoing: if set, the agent holds it until TensorPipe no longer reads the buffers (the
  // buffers' owner frees them when the last reference goes), and `done` runs as soon as the
  // call has an outcome. If null, the buffers are the caller's until `done` runs, so `done`
  // waits for TensorPipe to release them, which a deadline cannot hurry (a write still in
  // progress at the deadline completes `done` when it ends or its pipe fails).
  // Incoming: owns the memory the buffers point into (the allocator's keepalive, or the
  // agent's heap block).
  std::shared_ptr<const void> keepalive;
  // Outgoing, required when a tensor's descriptor sets chunk_bytes (and then so is
  // keepalive): once the message is written, the agent calls this for each chunk of each such
  // tensor, in order, and writes the chunk from tensors[tensor] at `offset` when `ready` runs.
  // Runs on the thread that writes the message (inside Send or Respond, or a TensorPipe
  // thread); must not block.
  std::function<void(size_t tensor, uint64_t offset, uint64_t length, ChunkReady ready)>
      when_chunk_ready;
};

// Where an incoming message's bytes go. `payload` has room for payload_size bytes and
// tensors[i] for tensor_sizes[i]; `keepalive` owns that memory (it ends up in the delivered
// Message::keepalive). Null pointers are allowed only for zero sizes.
struct Destination {
  void* payload = nullptr;
  std::vector<void*> tensors;
  std::shared_ptr<const void> keepalive;
  // Optional: runs after each chunk of a chunked tensor landed in tensors[tensor] at `offset`,
  // before the message is delivered (every chunk's call returns first). A TensorPipe thread;
  // must not block. Not called for a message that is refused or no longer wanted.
  std::function<void(size_t tensor, uint64_t offset, uint64_t length)> on_chunk;
};

// Chooses where an incoming message goes, given its header and sizes. Runs on a TensorPipe
// thread and must not block. An error refuses the message: its bytes are read and dropped,
// and a refused request is answered with that error.
using Allocator = std::function<absl::StatusOr<Destination>(
    const v1::AgentMessage& header, size_t payload_size, absl::Span<const size_t> tensor_sizes)>;

// Where a request came from, for Respond. Copyable; cheap.
class ReplyTo {
 public:
  ReplyTo() = default;
  uint64_t call_id() const { return call_id_; }
  const std::string& node() const { return node_; }

 private:
  // The pipe that reads a request makes its ReplyTo; the agent answers on it.
  friend class AgentImpl;
  friend class Pipe;
  std::weak_ptr<void> conn_;  // the pipe the request arrived on
  uint64_t call_id_ = 0;
  std::string node_;
  std::string method_;
  absl::Time deadline_ = absl::InfiniteFuture();
};

struct InboundRequest {
  // The authenticated node that sent it.
  std::string node;
  Message message;
  // The request's deadline on this node's clock (absl::InfiniteFuture() for none).
  absl::Time deadline = absl::InfiniteFuture();
  ReplyTo reply_to;
};

struct Handler {
  // Where an incoming request's payload and tensors go; null: a heap block per message.
  Allocator allocate;
  // Each request, complete. Runs on a TensorPipe thread; must not block (hand the work to a
  // pool, answer later with Respond from any thread).
  std::function<void(InboundRequest)> deliver;
};

// A call's outcome: the peer's RESPONSE or ERROR message (an ERROR is the remote handler's
// failure: header status_code/status_message), or a local failure: DEADLINE_EXCEEDED,
// UNAVAILABLE (pipe failed, peer unreachable, agent closing), INVALID_ARGUMENT, or whatever
// FailPeer was given.
using Callback = absl::AnyInvocable<void(absl::StatusOr<Message> reply)>;

// The method of the agents' own ping (Agent::Ping), in a request with no group: the receiving
// agent answers it itself.
inline constexpr char kPingMethod[] = "tpd.agent.ping";

// What a ping measured.
struct PingResult {
  absl::Duration round_trip;
  // The peer's clock minus this one's, at the round trip's midpoint: off by at most half the
  // round trip.
  absl::Duration clock_offset;
};
// A response's fate: OK once written; UNAVAILABLE if its pipe failed; DEADLINE_EXCEEDED if
// the request's deadline had passed (nothing is written then).
using SentCallback = absl::AnyInvocable<void(absl::Status status)>;

enum class PipeState {
  kNone,        // never opened, or forgotten after a failure
  kConnecting,  // opened; handshake under way
  kReady,       // authenticated; carrying calls
  kFailed,      // failed; the next Send opens a new one
};
const char* PipeStateName(PipeState state);

// One peer node, both directions (our pipe to it and the pipes it opened to us).
struct PeerStats {
  std::string node;
  // Its address as we dial it (empty if we never did).
  std::string address;
  // Our pipe to it.
  PipeState state = PipeState::kNone;
  // Authenticated pipes it opened to us and still holds.
  int inbound_pipes = 0;
  // What TensorPipe picked for the newest authenticated pipe either way, derived from both
  // ends' offers by TensorPipe's own rule (TensorPipe does not report its choice).
  std::string transport;
  std::string channel;
  // What it offered in the newest handshake (names, sorted): with Registry's reasons for what
  // this node did not register, they say why the others were not chosen.
  std::vector<std::string> peer_transports;
  std::vector<std::string> peer_channels;
  uint64_t calls_sent = 0;      // our requests to it
  uint64_t calls_received = 0;  // its requests to us
  uint64_t calls_pending = 0;   // our requests awaiting its answer
  uint64_t bytes_sent = 0;      // payload + tensor bytes we wrote to it (all kinds)
  uint64_t bytes_received = 0;  // payload + tensor bytes we read from it
  uint64_t errors = 0;          // our calls that failed locally, and pipe failures
  std::string last_error;
};

struct AgentStats {
  std::string id;
  std::string address;
  std::vector<PeerStats> peers;  // by node name
  // Pipes closed because their handshake failed (wrong token, bad message, late).
  uint64_t auth_failures = 0;
  // Times TensorPipe's listener failed (a connection closed before its first packet) and the
  // agent listened again on the same URLs.
  uint64_t listener_failures = 0;
  uint64_t calls_pending = 0;
};

}  // namespace tpd::agent

#endif  // TPD_AGENT_TYPES_H_
