// The daemon's TensorPipe agent: one tensorpipe::Context, a listener, and one authenticated
// pipe per peer daemon, carrying calls (a header, payload bytes and tensors) both ways.
//
//   auto agent = Agent::Create({.id = "node-a", .cluster_token = token});
//   (*agent)->SetHandler({.allocate = ..., .deliver = ...});      // incoming requests
//   (*agent)->Send(peer, std::move(request), deadline, [](absl::StatusOr<Message> reply) {...});
//
// Pipes. The first Send to a peer opens a pipe (TensorPipe dials the peer's lowest-priority
// common URL and moves to the best transport both offer); every later call to that peer shares
// it, concurrently (TensorPipe orders writes). A pipe that fails fails every call pending on it
// at once, UNAVAILABLE naming the peer; the next Send opens a new one. Requests a peer sends us
// arrive on the pipe *it* opened, and their responses go back on that pipe.
//
// Authentication. No pipe carries anything before its handshake (agent/pipe_auth.h): the
// acceptor sends a challenge, the connector answers with an HMAC under the cluster token, the
// acceptor proves itself in return. Until then nothing from the pipe reaches the handler and
// nothing queued for it is written; a wrong answer or proof closes the pipe, counts in
// AgentStats::auth_failures and is logged (at most once per 10 s per claimed peer).
//
// Who may connect. Only hosts inside AgentOptions::accept_networks can open a TCP connection
// to the agent's listening ports: a socket filter on each listener (agent/listen_guard.h),
// attached right after TensorPipe listens and again after every re-listen. Between TensorPipe's
// listen() and the attach (well under a millisecond, on the agent's own thread) a connection
// from anywhere can still form: docs/security.md, "Agent pipes".
//
// Deadlines. Every call has one (absl::InfiniteFuture() for none); one timer thread, sleeping
// until the earliest deadline of a B-tree (base/deadline_queue.h), fails late calls with
// DEADLINE_EXCEEDED naming the peer, the method and the deadline, and closes pipes whose
// handshake is late. No thread per call. The same thread listens again when TensorPipe's
// listener fails (which one connection closing before its first packet does).
//
// Buffers. A Message's payload and tensors are plain pointers: TensorPipe reads them in place
// (no copy) and the agent never frees them. See Message::keepalive for how long they must live.
// Incoming bytes go where the handler's (or the call's reply) allocator says, so the daemon can
// receive a tensor straight into a client's shared-memory arena. A tensor whose bytes are not
// final yet can follow its message in chunks (TensorDescriptor.chunk_bytes): each is written
// once Message::when_chunk_ready says it is ready, and the receiver sees each land
// (Destination::on_chunk) before the message is delivered; docs/data_plane.md, "Tensors in
// chunks".
//
// Thread safety: every public method is thread-safe. Callbacks (done, the handler, allocators)
// run on TensorPipe's threads, on the agent's timer thread, or on a thread inside a call to
// Send/Respond/FailPeer (TensorPipe runs its loop on whichever thread enters it, and an
// immediate failure completes inline): they must not block, and a caller must not hold a lock
// those callbacks take while calling in. No agent lock is held while any callback runs, so
// callbacks may call the agent again. See docs/threading.md ("The agent").

#ifndef TPD_AGENT_AGENT_H_
#define TPD_AGENT_AGENT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "agent/listen_guard.h"
#include "agent/registry.h"
#include "base/deadline_queue.h"
#include "base/log_limiter.h"
#include "proto/agent.pb.h"

namespace tensorpipe {
class Context;
class Descriptor;
class Error;
class Listener;
class Pipe;
}  // namespace tensorpipe

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
  friend class Agent;
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
// A response's fate: OK once written; UNAVAILABLE if its pipe failed; DEADLINE_EXCEEDED if
// the request's deadline had passed (nothing is written then).
using SentCallback = absl::AnyInvocable<void(absl::Status status)>;

enum class PipeState {
  kNone,            // never opened, or forgotten after a failure
  kConnecting,      // opened; handshake under way
  kReady,           // authenticated; carrying calls
  kFailed,          // failed; the next Send opens a new one
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
  uint64_t calls_sent = 0;       // our requests to it
  uint64_t calls_received = 0;   // its requests to us
  uint64_t calls_pending = 0;    // our requests awaiting its answer
  uint64_t bytes_sent = 0;       // payload + tensor bytes we wrote to it (all kinds)
  uint64_t bytes_received = 0;   // payload + tensor bytes we read from it
  uint64_t errors = 0;           // our calls that failed locally, and pipe failures
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

class Agent {
 public:
  // Probes transports and channels, creates the context and listens. INVALID_ARGUMENT for
  // bad options (no id, no token, a bad address, unknown names, bad accept_networks),
  // FAILED_PRECONDITION when nothing usable is left or the accept_networks filter cannot be
  // attached to the listeners, UNAVAILABLE when the listener cannot bind.
  static absl::StatusOr<std::unique_ptr<Agent>> Create(const AgentOptions& options);

  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Closes the listener and every pipe, fails every pending call with UNAVAILABLE ("agent
  // closing"), and waits for TensorPipe's threads: when it returns, no callback of this
  // agent runs any more and every `done` has run. REQUIRES: not called from a callback, and
  // no other thread is inside a method of this agent (the owner stops calling first).
  ~Agent();

  // Installs the handler for incoming requests (replacing any). Until one is installed,
  // requests are answered UNAVAILABLE. A message already being received keeps the handler it
  // started with, so a replaced handler may run once more: what it uses must outlive it (after
  // ~Agent, none runs).
  void SetHandler(Handler handler);

  // Sends msg as a request to `peer` and calls `done` exactly once with its outcome.
  // `reply_allocator` places the response's bytes (null: a heap block).
  void Send(const PeerId& peer, Message msg, absl::Time deadline, Callback done,
            Allocator reply_allocator = nullptr);

  // Answers a request delivered to the handler, on the pipe it came from. `response`'s
  // kind is RESPONSE unless the owner set ERROR. `sent` (optional) runs once TensorPipe no
  // longer reads its buffers, with the outcome.
  void Respond(const ReplyTo& to, Message response, SentCallback sent = nullptr);

  // Fails every call pending toward `peer`'s node (or address, if it has no node name) with
  // `status` and closes the pipes to and from it: for a node the heartbeat evicted. The next
  // Send to it opens a new pipe.
  void FailPeer(const PeerId& peer, const absl::Status& status);

  // The TensorPipe URLs this agent listens on, lowest priority first, comma-separated:
  // "uv://127.0.0.1:41234,shm://tpd-agent-...". What peers put in PeerId::address.
  const std::string& address() const { return address_; }
  const std::vector<std::string>& urls() const { return urls_; }
  const std::string& id() const { return options_.id; }
  const Registry& registry() const { return *registry_; }

  AgentStats Stats() const;

 private:
  struct Call;
  struct Conn;
  struct Incoming;
  class Writes;
  // What Stats() reports per node, kept while the agent lives.
  struct PeerCounters {
    std::string address;
    PipeState state = PipeState::kNone;
    int inbound_pipes = 0;
    std::string transport;
    std::string channel;
    std::vector<std::string> peer_transports;
    std::vector<std::string> peer_channels;
    uint64_t calls_sent = 0;
    uint64_t calls_received = 0;
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
    uint64_t errors = 0;
    std::string last_error;
  };

  Agent(const AgentOptions& options, std::unique_ptr<Registry> registry);

  absl::Status Start();
  void TimerLoop();

  // Listener side. Accept arms `listener` for one pipe (and re-arms from its callback).
  void Accept(std::shared_ptr<tensorpipe::Listener> listener);
  // TensorPipe's listener fails for good when one connection closes before its first packet
  // (a port scan is enough: docs/security.md, "Agent pipes"); the timer thread then listens
  // again on the same URLs, once the old sockets are gone.
  void OnListenerFailed(const std::string& what);
  void Relisten();
  // Attaches guard_ to every listening socket of ours (listen_host_ and a port in
  // guarded_ports_), at start or after a re-listen. FAILED_PRECONDITION when the uv listener
  // was not among them.
  absl::Status GuardListeners(bool at_start);
  void OnAccepted(std::shared_ptr<tensorpipe::Pipe> pipe);
  void OnAnswer(const std::shared_ptr<Conn>& conn, const tensorpipe::Descriptor& descriptor);
  // Connector side.
  // Registers a new pipe to `peer` (no TensorPipe call: that is Connect's, outside mu_);
  // null with *error set when the peer's address does not fit this agent.
  std::shared_ptr<Conn> NewOutbound(const PeerId& peer, absl::Status* error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Connect(const std::shared_ptr<Conn>& conn);
  void OnChallenge(const std::shared_ptr<Conn>& conn, const tensorpipe::Descriptor& descriptor);
  void OnProof(const std::shared_ptr<Conn>& conn, const tensorpipe::Descriptor& descriptor);
  // Both: the handshake's end, a refused handshake, a handshake message read.
  void BecomeReady(const std::shared_ptr<Conn>& conn);
  void RejectHandshake(const std::shared_ptr<Conn>& conn, const std::string& claimed,
                       const std::string& why);
  void ReadHello(const std::shared_ptr<Conn>& conn,
                 void (Agent::*next)(const std::shared_ptr<Conn>&, const tensorpipe::Descriptor&));
  void WriteHello(const std::shared_ptr<Conn>& conn, const v1::PipeHello& hello);

  // Authenticated pipes.
  void ReadNext(const std::shared_ptr<Conn>& conn);
  void OnDescriptor(const std::shared_ptr<Conn>& conn, const tensorpipe::Descriptor& descriptor);
  void WriteCall(const std::shared_ptr<Conn>& conn, uint64_t call_id);
  // Asks for each chunk of `msg`, written on `conn` as `call_id`, (Message::when_chunk_ready)
  // and writes it once ready; each write ends in `writes`.
  void WriteChunks(const std::shared_ptr<Conn>& conn, uint64_t call_id, const Message& msg,
                   std::shared_ptr<const void> keepalive, std::shared_ptr<Writes> writes);
  // A CHUNK message's descriptor: checked against the message it belongs to, then read.
  void OnChunk(const std::shared_ptr<Conn>& conn, const PeerId& peer,
               const v1::AgentMessage& header, const tensorpipe::Descriptor& descriptor);
  // A read of one part of `in` (the message itself, or a chunk of `bytes`) ended: fails the
  // pipe on `error`, else counts it (with the error of a chunk its sender could not produce)
  // and hands the message on if it was the last part.
  void OnPartRead(const std::shared_ptr<Conn>& conn, const PeerId& peer, Incoming& in,
                  const tensorpipe::Error& error, uint64_t bytes, bool main,
                  const absl::Status& chunk_error = absl::OkStatus());
  // Marks one part of `in` (the message itself, or a chunk) read; true when it was the last,
  // and then `in` is no longer registered on its pipe.
  bool PartRead(const std::shared_ptr<Conn>& conn, Incoming& in, bool main)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands on a message read whole: a response to its call, a request to the handler (or its
  // refusal to the caller).
  void Finish(const std::shared_ptr<Conn>& conn, const PeerId& peer, Incoming& in);
  // Closes a pipe whose peer broke the protocol, logging why.
  void ClosePipe(const std::shared_ptr<Conn>& conn, const PeerId& peer, const std::string& why);
  void WriteMessage(const std::shared_ptr<Conn>& conn, Message msg,
                    std::function<void(const tensorpipe::Error&)> on_written);
  void OnCallWritten(uint64_t call_id, const absl::Status& status);
  void CompleteCall(uint64_t call_id, absl::StatusOr<Message> outcome);
  void FailConn(const std::shared_ptr<Conn>& conn, const absl::Status& status);

  // Collects the done callback of `call` if it may run now. REQUIRES: mu_ held.
  void TakeDoneIfFinished(Call& call, std::vector<std::function<void()>>* run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PeerCounters& Counters(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a deadline and wakes the timer if it is the new earliest.
  void AddDeadline(uint64_t id, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogAuthFailure(const std::string& claimed, const std::string& why);

  const AgentOptions options_;
  const std::unique_ptr<Registry> registry_;
  std::string address_;
  std::vector<std::string> urls_;
  std::string listen_port_;
  std::string listen_host_;
  int listen_family_ = 0;
  // listen_host_'s bytes, as ListeningSocket::address.
  std::array<unsigned char, 16> listen_host_bytes_{};
  // The filter for accept_networks; set by Create.
  std::optional<ListenGuard> guard_;
  // This process's listening sockets (inodes) before Create made any of ours: the rest of
  // those bound to listen_host_ are the agent's. Set by Create, read by Start.
  absl::flat_hash_set<uint64_t> sockets_before_;
  // The ports of our listening sockets (uv, ibv, the mpt_uv lanes). Set by Start before the
  // timer thread starts, then const.
  absl::flat_hash_set<int> guarded_ports_;
  int uv_port_ = -1;  // -1: uv not registered

  std::shared_ptr<tensorpipe::Context> context_;
  // Replaced by Relisten (timer thread) until closing_.
  std::shared_ptr<tensorpipe::Listener> listener_ ABSL_GUARDED_BY(mu_);
  // Held across a whole Relisten, so that ~Agent never closes the context under a listen().
  absl::Mutex relisten_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // Replaced whole by SetHandler; a message in flight keeps the one it started with.
  std::shared_ptr<const Handler> handler_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Our pipe to each peer (the newest; failed ones are removed).
  absl::flat_hash_map<PeerId, std::shared_ptr<Conn>> outbound_ ABSL_GUARDED_BY(mu_);
  // Every live pipe by serial, both directions (handshaking ones included).
  absl::flat_hash_map<uint64_t, std::shared_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  // Calls from Send until `done` is taken.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  // Deadlines of calls, handshakes and chunk timeouts (ids share one counter, next_id_).
  DeadlineQueue deadlines_ ABSL_GUARDED_BY(mu_);
  // Chunk timeouts: the pipe and the call id of the message waiting for chunks.
  absl::flat_hash_map<uint64_t, std::pair<std::weak_ptr<Conn>, uint64_t>> chunk_timers_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, PeerCounters> counters_ ABSL_GUARDED_BY(mu_);
  uint64_t auth_failures_ ABSL_GUARDED_BY(mu_) = 0;
  bool timer_stop_ ABSL_GUARDED_BY(mu_) = false;
  // Wakes the timer thread: a deadline earlier than the one it sleeps until, or stop.
  absl::CondVar timer_cv_;
  // What the timer thread sleeps until; InfinitePast() while it is awake.
  absl::Time timer_wake_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // When the timer thread should listen again (InfiniteFuture(): no need), and how the
  // listener failures are logged (the first, then at most one line per 10 s with a count).
  absl::Time relisten_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  uint64_t listener_failures_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t listener_failures_unlogged_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time listener_failure_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  // Rate limit of handshake-failure lines, per claimed peer.
  LogLimiter auth_log_{absl::Seconds(10), 1024};
  // Connections the transport refused before TensorPipe saw them (agent/auth_tcp.h): counted
  // in AgentStats::auth_failures, logged at most once per 10 s. Shared with the transport's
  // thread, which reports them.
  struct TransportRefusals {
    void Refused(const std::string& why);
    std::string id;
    std::atomic<int64_t> count{0};
    LogLimiter log{absl::Seconds(10)};
  };
  std::shared_ptr<TransportRefusals> transport_refusals_;

  std::thread timer_;
};

}  // namespace tpd::agent

#endif  // TPD_AGENT_AGENT_H_
