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

// Callers build on this list (it is what agent.h offered when it held the agent's state).
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
#include "agent/types.h"
#include "proto/agent.pb.h"

namespace tpd::agent {

class AgentImpl;

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

  // Pings `peer`'s agent, which answers itself (never its handler) with its clock: `done` gets
  // the round trip and the offset of the peer's clock from this one's at the round trip's
  // midpoint (positive: the peer's runs ahead), or the error.
  void Ping(const PeerId& peer, absl::Time deadline,
            absl::AnyInvocable<void(absl::StatusOr<PingResult>)> done);

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
  const std::string& address() const;
  const std::vector<std::string>& urls() const;
  const std::string& id() const;
  const Registry& registry() const;

  AgentStats Stats() const;

 private:
  explicit Agent(std::unique_ptr<AgentImpl> impl);

  // agent/agent_impl.h: the context, the listener, the pipes and the calls.
  const std::unique_ptr<AgentImpl> impl_;
};

}  // namespace tpd::agent

#endif  // TPD_AGENT_AGENT_H_
