// One pipe between this agent and a peer daemon's, either direction, as TensorPipe's core has
// one object per pipe: its handshake (agent/handshake.h), its reads (messages, their chunks),
// its writes, and its failure, which fails every call pending on it at once. The agent that
// owns it (agent/agent_impl.h) keeps the tables pipes share (calls, deadlines, counters)
// behind PipeOwner.
//
// Thread safety: thread-safe. Lock order: PipeOwner::mu_, then a Pipe's mu_, then an incoming
// message's mu; under a Pipe's mu_ only the last is taken, and nothing is called under either.
// The handshake's steps run one after the other (each started by the callback of the one
// before).

#ifndef TPD_AGENT_PIPE_H_
#define TPD_AGENT_PIPE_H_

#include <tensorpipe/tensorpipe.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/handshake.h"
#include "agent/registry.h"
#include "agent/types.h"
#include "agent/wire.h"
#include "proto/agent.pb.h"

namespace tpd::agent {

class Pipe;

// What Stats() reports per node, kept while the agent lives (node and calls_pending are
// filled in by Stats).
using PeerCounters = PeerStats;

// The key of a peer's counters: its node, or its address when it has none.
std::string CountersKey(const PeerId& peer);

// What every pipe of one agent shares, fixed once the agent listens.
struct PipeConfig {
  AgentOptions options;
  const Registry* registry = nullptr;
  // This agent in its hellos; self.urls joined by commas is its address.
  HelloSelf self;
};

// The agent's side of its pipes: the tables they share, under mu_. A pipe takes mu_ itself
// around every change that touches them and its own state together, so such a change is one
// step for every other pipe and call.
class PipeOwner {
 public:
  mutable absl::Mutex mu_;

  // Ids for pipes, calls and chunk timers (one counter: they share the deadline queue).
  virtual uint64_t NextId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  virtual bool closing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  virtual std::shared_ptr<const Handler> handler() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  virtual PeerCounters& Counters(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  virtual void CountAuthFailure() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // Deadlines of handshakes (by pipe serial) and of chunks (by timer id).
  virtual void AddDeadline(uint64_t id, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  virtual void RemoveDeadline(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // A chunk timer of message `call_id` on `pipe`; removing it removes its deadline too.
  virtual void AddChunkTimer(uint64_t timer_id, std::weak_ptr<Pipe> pipe, uint64_t call_id,
                             absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  virtual void RemoveChunkTimer(uint64_t timer_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // The reply allocator of call `call_id` if it still waits for its answer on `pipe`.
  virtual std::optional<Allocator> ReplyAllocator(uint64_t call_id, const Pipe& pipe)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // A failed pipe: forgets it and fails `pending` with `status`, collecting the callbacks that
  // may run now (after mu_) in `run`.
  virtual void Forget(const Pipe& pipe, const PeerId& peer, const std::vector<uint64_t>& pending,
                      const absl::Status& status, std::vector<std::function<void()>>* run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;

  // Without mu_ held: a handshake refusal's log line, a call's outcome, an answer to a
  // request, the calls that waited for a pipe's handshake.
  virtual void LogAuthFailure(const std::string& claimed, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_) = 0;
  virtual void CompleteCall(uint64_t call_id, absl::StatusOr<Message> outcome)
      ABSL_LOCKS_EXCLUDED(mu_) = 0;
  virtual void Respond(const ReplyTo& to, Message response) ABSL_LOCKS_EXCLUDED(mu_) = 0;
  virtual void WriteCall(const std::shared_ptr<Pipe>& pipe, uint64_t call_id)
      ABSL_LOCKS_EXCLUDED(mu_) = 0;

 protected:
  ~PipeOwner() = default;
};

// The writes of one message (itself and its chunks): `done` runs once, when the last ended,
// with the first error and the bytes of chunks sent as errors instead of their bytes.
class Writes {
 public:
  Writes(size_t count, absl::AnyInvocable<void(absl::Status, uint64_t unsent)> done)
      : left_(count), done_(std::move(done)) {}

  void End(const absl::Status& status, uint64_t unsent = 0);

 private:
  absl::Mutex mu_;
  size_t left_ ABSL_GUARDED_BY(mu_);
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  uint64_t unsent_ ABSL_GUARDED_BY(mu_) = 0;
  absl::AnyInvocable<void(absl::Status, uint64_t)> done_;
};

enum class PipeDirection { kOutbound, kInbound };
// The handshake message a pipe reads next.
enum class HandshakeStep { kChallenge, kAnswer, kProof };

class Pipe : public std::enable_shared_from_this<Pipe> {
 public:
  // A pipe to `peer`, which Connect dials at `dialed_url`.
  static std::shared_ptr<Pipe> Outbound(PipeOwner& owner, const PipeConfig& config, uint64_t serial,
                                        PeerId peer, std::string dialed_url);
  // A pipe the listener accepted, whose peer is unknown until its handshake names it
  // (Challenge starts it).
  static std::shared_ptr<Pipe> Inbound(PipeOwner& owner, const PipeConfig& config, uint64_t serial,
                                       std::shared_ptr<tensorpipe::Pipe> accepted);

  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;

  uint64_t serial() const { return serial_; }
  bool outbound() const { return direction_ == PipeDirection::kOutbound; }
  PeerId peer() const ABSL_LOCKS_EXCLUDED(mu_);

  // Starts the handshake: Connect dials the peer and reads its CHALLENGE; Challenge writes
  // ours on an accepted pipe and reads the ANSWER.
  void Connect(tensorpipe::Context& context) ABSL_LOCKS_EXCLUDED(owner_.mu_, mu_);
  void Challenge() ABSL_LOCKS_EXCLUDED(owner_.mu_, mu_);

  // Calls on an outbound pipe, under the owner's lock. AddCall: true when the call may be
  // written now, false when it waits for the handshake.
  bool AddCall(uint64_t call_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The call ended: no longer pending, nor waiting for the handshake.
  void ForgetCall(uint64_t call_id) ABSL_LOCKS_EXCLUDED(mu_);
  void DropPending(uint64_t call_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Under the owner's lock, for its timer: the refusal of a handshake that is late (nullopt if
  // it ended), and why message `call_id`'s chunks are late (nullopt if no longer awaited).
  std::optional<absl::Status> HandshakeLate() const ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<std::string> ChunksLate(uint64_t call_id, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether it goes to or comes from `peer`'s node (or address, if it has no node name).
  bool Reaches(const PeerId& peer) const ABSL_LOCKS_EXCLUDED(mu_);
  // The error it failed with if it is not ready (OK while it is).
  absl::Status ErrorUnlessReady() const ABSL_LOCKS_EXCLUDED(mu_);

  // Writes `message` (ToTensorPipe of a prepared Message), ending in `writes`: a request when
  // `reply_node` is nullopt, else a response to that node. Then, when `chunked` has chunks,
  // asks for each (Message::when_chunk_ready) and writes it as message `call_id` once ready.
  void Write(tensorpipe::Message message, std::optional<std::string> reply_node,
             std::shared_ptr<const void> keepalive, std::shared_ptr<Writes> writes);
  void WriteChunks(uint64_t call_id, const Message& chunked, std::shared_ptr<const void> keepalive,
                   std::shared_ptr<Writes> writes);

  // Fails the pipe (once): every call pending on it ends with `status`, messages still reading
  // are dropped, and TensorPipe's pipe is closed.
  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(owner_.mu_, mu_);
  // Fails a pipe whose peer broke the protocol, logging why.
  void Close(const std::string& why) ABSL_LOCKS_EXCLUDED(owner_.mu_, mu_);

 private:
  struct Incoming;

  Pipe(PipeOwner& owner, const PipeConfig& config, uint64_t serial, PipeDirection direction,
       PeerId peer, std::string dialed_url);
  std::shared_ptr<tensorpipe::Pipe> tp() const ABSL_LOCKS_EXCLUDED(mu_);

  // Handshake.
  void ReadHello(HandshakeStep step);
  void OnHello(HandshakeStep step, const tensorpipe::Descriptor& descriptor);
  void OnChallenge(const v1::PipeHello& challenge);
  void OnAnswer(const v1::PipeHello& answer);
  void OnProof(const v1::PipeHello& proof);
  void WriteHello(const v1::PipeHello& hello);
  void Reject(const std::string& claimed, const std::string& why);
  // Records what the peer's hello offered (and who it is, for an inbound pipe's ANSWER).
  void TakeOffer(const v1::PipeHello& hello) ABSL_LOCKS_EXCLUDED(mu_);
  void BecomeReady() ABSL_LOCKS_EXCLUDED(owner_.mu_, mu_);

  void WriteChunk(uint64_t call_id, const Chunk& chunk, const absl::Status& ready,
                  std::shared_ptr<const void> keepalive, std::shared_ptr<Writes> writes);
  // A write ended: fails the pipe on `error` (naming `reply_node` for a response, else the
  // pipe's peer), then ends it in `writes`.
  void EndWrite(const tensorpipe::Error& error, const std::optional<std::string>& reply_node,
                Writes& writes, uint64_t unsent) ABSL_LOCKS_EXCLUDED(owner_.mu_, mu_);

  // Reads.
  void ReadNext();
  void OnDescriptor(const tensorpipe::Descriptor& descriptor);
  // Where a message's bytes go (its handler's or its call's allocator, else the heap), and
  // whether it is refused.
  absl::StatusOr<Destination> Place(Incoming& in, const IncomingSizes& sizes, const PeerId& peer);
  absl::StatusOr<Destination> PlaceReply(const v1::AgentMessage& header, const IncomingSizes& sizes,
                                         const PeerId& peer);
  // Moves `destination` into `in` (its message and chunk hook) and says where TensorPipe
  // reads the message itself (chunked tensors read nothing yet).
  tensorpipe::Allocation Receive(Incoming& in, Destination destination,
                                 const tensorpipe::Descriptor& descriptor,
                                 const IncomingSizes& sizes);
  // Registers a message whose chunks follow; false when the pipe failed or closed for it.
  bool AwaitChunks(const std::shared_ptr<Incoming>& in, const IncomingSizes& sizes)
      ABSL_LOCKS_EXCLUDED(owner_.mu_, mu_);
  void OnChunk(const PeerId& peer, const v1::AgentMessage& header,
               const tensorpipe::Descriptor& descriptor);
  // Checks a chunk against its message and marks it seen: its message and length, or why the
  // pipe must close.
  std::string TakeChunk(const v1::AgentMessage& header, const tensorpipe::Descriptor& descriptor,
                        std::shared_ptr<Incoming>* in, uint64_t* length)
      ABSL_LOCKS_EXCLUDED(owner_.mu_, mu_);
  // A read of one part of `in` (the message itself, or a chunk of `bytes`) ended: fails the
  // pipe on `error`, else counts it (with the error of a chunk its sender could not produce)
  // and hands the message on if it was the last part.
  void OnPartRead(const PeerId& peer, Incoming& in, const tensorpipe::Error& error, uint64_t bytes,
                  bool main, const absl::Status& chunk_error = absl::OkStatus())
      ABSL_LOCKS_EXCLUDED(owner_.mu_, mu_);
  // The part of OnPartRead for a message with chunks: true when `in` was its last part, and
  // then it is no longer registered.
  bool ChunkedPartRead(Incoming& in, bool main, const absl::Status& chunk_error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_.mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands on a message read whole: a response to its call, a request to the handler (or its
  // refusal to the caller).
  void Finish(const PeerId& peer, Incoming& in);

  // A failed pipe in its peer's counters: its state, and the error unless the agent closes.
  void CountFailure(const absl::Status& status, bool count_error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_.mu_, mu_);

  PipeOwner& owner_;
  const PipeConfig& config_;
  const uint64_t serial_;
  const PipeDirection direction_;
  // Outbound: the URL passed to connect().
  const std::string dialed_url_;

  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(owner_.mu_);
  // TensorPipe's pipe: set once (outbound: when connect() returned).
  std::shared_ptr<tensorpipe::Pipe> tp_ ABSL_GUARDED_BY(mu_);
  // Outbound: whom we dialed. Inbound: the node its handshake named and its URLs.
  PeerId peer_ ABSL_GUARDED_BY(mu_);
  PipeState state_ ABSL_GUARDED_BY(mu_) = PipeState::kConnecting;
  absl::Status error_ ABSL_GUARDED_BY(mu_);                     // why it failed
  std::vector<uint64_t> queued_ ABSL_GUARDED_BY(mu_);           // calls waiting for the handshake
  absl::flat_hash_set<uint64_t> pending_ ABSL_GUARDED_BY(mu_);  // calls awaiting their answer
  // What TensorPipe picked (derived) and what the peer offered in its hello, for Stats.
  std::string transport_ ABSL_GUARDED_BY(mu_);
  std::string channel_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> peer_transports_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> peer_channels_ ABSL_GUARDED_BY(mu_);
  // Messages read from this pipe whose chunks are still arriving, by call id.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Incoming>> incoming_ ABSL_GUARDED_BY(mu_);
  // The handshake's, touched only by its steps, one after the other.
  std::string challenge_nonce_ ABSL_GUARDED_BY(mu_);
  PipeTranscript transcript_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpd::agent

#endif  // TPD_AGENT_PIPE_H_
