#include "agent/pipe.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/log.h"
#include "agent/tp_error.h"
#include "base/status.h"

namespace tpd::agent {

namespace {

// Messages one pipe may have waiting for their chunks at once (each holds memory placed for
// its tensors until they came).
constexpr size_t kMaxChunkedMessagesPerPipe = 1024;

// "pipe to node-b (uv://...) failed", for an error TensorPipe reported on a pipe.
std::string PipeFailed(bool outbound, const PeerId& peer) {
  return absl::StrCat("pipe ", outbound ? "to " : "from ", peer.ToString(), " failed");
}

v1::PipeHello::Step StepOf(HandshakeStep step) {
  switch (step) {
    case HandshakeStep::kChallenge:
      return v1::PipeHello::CHALLENGE;
    case HandshakeStep::kAnswer:
      return v1::PipeHello::ANSWER;
    case HandshakeStep::kProof:
      return v1::PipeHello::PROOF;
  }
  return v1::PipeHello::PROOF;
}

}  // namespace

std::string CountersKey(const PeerId& peer) { return peer.node.empty() ? peer.address : peer.node; }

void Writes::End(const absl::Status& status, uint64_t unsent) {
  absl::Status outcome;
  uint64_t total_unsent;
  {
    absl::MutexLock lock(&mu_);
    if (first_error_.ok()) first_error_ = status;
    unsent_ += unsent;
    if (--left_ > 0) return;
    outcome = first_error_;
    total_unsent = unsent_;
  }
  done_(std::move(outcome), total_unsent);
}

// A message being read: from its descriptor until it is delivered (or its pipe failed).
struct Pipe::Incoming {
  enum class Parts { kReading, kMainRead, kFinished };

  std::shared_ptr<v1::AgentMessage> header;
  std::shared_ptr<Message> message;
  // A request that is refused is answered with this (its bytes are read and dropped).
  absl::Status refused;
  std::shared_ptr<const Handler> handler;
  std::function<void(size_t, uint64_t, uint64_t)> on_chunk;  // the destination's
  absl::Time received;
  // Whether chunks follow it: only such a message is registered on its pipe, read in parts and
  // dropped with it. Set before its reads start.
  bool chunked = false;
  // The agents' own ping (kPingMethod): answered here with this agent's clock, never handed on.
  bool ping = false;
  // Chunked messages: every chunk in by then (min_chunk_rate). Set before it is registered.
  absl::Time complete_by;

  absl::Mutex mu;
  uint64_t timer_id ABSL_GUARDED_BY(mu) = 0;  // its chunk_timeout; 0: not chunked
  std::vector<std::vector<bool>> chunk_seen ABSL_GUARDED_BY(mu);  // per tensor; empty: whole
  uint64_t chunks_left ABSL_GUARDED_BY(mu) = 0;
  // kFinished: handed on, or dropped with its pipe.
  Parts parts ABSL_GUARDED_BY(mu) = Parts::kReading;
  absl::Status chunk_error ABSL_GUARDED_BY(mu);  // a chunk its sender could not produce
};

Pipe::Pipe(PipeOwner& owner, const PipeConfig& config, uint64_t serial, PipeDirection direction,
           PeerId peer, std::string dialed_url)
    : owner_(owner),
      config_(config),
      serial_(serial),
      direction_(direction),
      dialed_url_(std::move(dialed_url)),
      peer_(std::move(peer)) {}

std::shared_ptr<Pipe> Pipe::Outbound(PipeOwner& owner, const PipeConfig& config, uint64_t serial,
                                     PeerId peer, std::string dialed_url) {
  return std::shared_ptr<Pipe>(new Pipe(owner, config, serial, PipeDirection::kOutbound,
                                        std::move(peer), std::move(dialed_url)));
}

std::shared_ptr<Pipe> Pipe::Inbound(PipeOwner& owner, const PipeConfig& config, uint64_t serial,
                                    std::shared_ptr<tensorpipe::Pipe> accepted) {
  std::shared_ptr<Pipe> pipe(
      new Pipe(owner, config, serial, PipeDirection::kInbound, PeerId(), std::string()));
  absl::MutexLock lock(&pipe->mu_);
  pipe->tp_ = std::move(accepted);
  return pipe;
}

PeerId Pipe::peer() const {
  absl::MutexLock lock(&mu_);
  return peer_;
}

std::shared_ptr<tensorpipe::Pipe> Pipe::tp() const {
  absl::MutexLock lock(&mu_);
  return tp_;
}

// ---------------------------------------------------------------------------------------------
// The handshake.

void Pipe::Connect(tensorpipe::Context& context) {
  std::shared_ptr<tensorpipe::Pipe> pipe =
      context.connect(dialed_url_, tensorpipe::PipeOptions().remoteName(peer().node));
  bool failed;
  {
    absl::MutexLock lock(&mu_);
    tp_ = pipe;
    failed = state_ == PipeState::kFailed;
  }
  if (failed) {
    // Failed before it had a pipe (FailPeer, the agent closing): Fail could not close it.
    pipe->close();
    return;
  }
  ReadHello(HandshakeStep::kChallenge);
}

void Pipe::Challenge() {
  const std::string nonce = NewPipeNonce();
  {
    absl::MutexLock lock(&mu_);
    challenge_nonce_ = nonce;
  }
  const v1::PipeHello challenge = ChallengeHello(config_.self, nonce);
  WriteHello(challenge);
  ReadHello(HandshakeStep::kAnswer);
}

void Pipe::ReadHello(HandshakeStep step) {
  tp()->readDescriptor([self = shared_from_this(), step](const tensorpipe::Error& error,
                                                         tensorpipe::Descriptor descriptor) {
    if (error) {
      const std::string who = self->outbound()
                                  ? absl::StrCat("pipe to ", self->peer().ToString())
                                  : std::string("a pipe accepted from an unauthenticated peer");
      self->Fail(TensorPipeErrorToStatus(
          error,
          absl::StrCat(who, " closed during the handshake",
                       self->outbound() ? " (does the peer have this cluster token?)" : "")));
      return;
    }
    if (descriptor.payloads.empty() && descriptor.tensors.empty()) {
      // Every descriptor must be followed by a read, even of nothing.
      self->tp()->read(tensorpipe::Allocation{}, [](const tensorpipe::Error&) {});
    }
    self->OnHello(step, descriptor);
  });
}

void Pipe::OnHello(HandshakeStep step, const tensorpipe::Descriptor& descriptor) {
  v1::PipeHello hello;
  if (absl::Status s = ParseHello(descriptor, StepOf(step), &hello); !s.ok()) {
    Reject(step == HandshakeStep::kProof ? peer().ToString()
                                         : ClaimedPeer(hello, tp()->getRemoteName()),
           std::string(s.message()));
    return;
  }
  switch (step) {
    case HandshakeStep::kChallenge:
      OnChallenge(hello);
      return;
    case HandshakeStep::kAnswer:
      OnAnswer(hello);
      return;
    case HandshakeStep::kProof:
      OnProof(hello);
      return;
  }
}

void Pipe::OnChallenge(const v1::PipeHello& challenge) {
  if (absl::Status s = CheckChallenge(challenge, peer().node, dialed_url_); !s.ok()) {
    Reject(ClaimedPeer(challenge, tp()->getRemoteName()), std::string(s.message()));
    return;
  }
  PipeTranscript transcript =
      ConnectorTranscript(challenge, config_.self, dialed_url_, NewPipeNonce());
  const v1::PipeHello answer = AnswerHello(config_.self, transcript, config_.options.cluster_token);
  {
    absl::MutexLock lock(&mu_);
    transcript_ = std::move(transcript);
  }
  TakeOffer(challenge);
  WriteHello(answer);
  ReadHello(HandshakeStep::kProof);
}

void Pipe::OnAnswer(const v1::PipeHello& answer) {
  std::string nonce;
  {
    absl::MutexLock lock(&mu_);
    nonce = challenge_nonce_;
  }
  const PipeTranscript transcript = AcceptorTranscript(answer, config_.self, nonce);
  const absl::string_view token = config_.options.cluster_token;
  if (absl::Status s = CheckAnswer(answer, transcript, config_.self, token); !s.ok()) {
    Reject(ClaimedPeer(answer, tp()->getRemoteName()), std::string(s.message()));
    return;
  }
  WriteHello(ProofHello(transcript, token));
  TakeOffer(answer);
  BecomeReady();
}

void Pipe::OnProof(const v1::PipeHello& proof) {
  absl::Status checked;
  {
    absl::MutexLock lock(&mu_);
    checked = CheckProof(proof, transcript_, config_.options.cluster_token);
  }
  if (!checked.ok()) {
    Reject(peer().ToString(), std::string(checked.message()));
    return;
  }
  BecomeReady();
}

void Pipe::WriteHello(const v1::PipeHello& hello) {
  tensorpipe::Message message;
  message.metadata = hello.SerializeAsString();
  tp()->write(std::move(message), [self = shared_from_this()](const tensorpipe::Error& error) {
    if (error) self->Fail(TensorPipeErrorToStatus(error, "writing a handshake message"));
  });
}

void Pipe::TakeOffer(const v1::PipeHello& hello) {
  std::string transport = config_.registry->PickTransport(ToMap(hello.transport_domains()));
  std::string channel = config_.registry->PickChannel(ToMap(hello.channel_cpu_descriptors()));
  absl::MutexLock lock(&mu_);
  if (!outbound()) {
    // An accepted pipe's peer is whoever its (verified) ANSWER named.
    peer_.node = hello.agent_id();
    peer_.address = absl::StrJoin(hello.urls(), ",");
  }
  transport_ = std::move(transport);
  channel_ = std::move(channel);
  peer_transports_ = OfferedNames(hello.transport_domains());
  peer_channels_ = OfferedNames(hello.channel_cpu_descriptors());
}

void Pipe::Reject(const std::string& claimed, const std::string& why) {
  {
    absl::MutexLock lock(&owner_.mu_);
    owner_.CountAuthFailure();
  }
  owner_.LogAuthFailure(claimed, why);
  if (outbound()) {
    Fail(
        absl::UnauthenticatedError(absl::StrCat("pipe to ", peer().ToString(), " refused: ", why)));
  } else {
    Fail(absl::UnauthenticatedError(absl::StrCat("pipe from ", claimed, " refused: ", why)));
  }
}

void Pipe::BecomeReady() {
  std::vector<uint64_t> queued;
  PeerId peer;
  std::string transport;
  std::string channel;
  {
    absl::MutexLock owner_lock(&owner_.mu_);
    absl::MutexLock lock(&mu_);
    if (state_ != PipeState::kConnecting) return;
    state_ = PipeState::kReady;
    owner_.RemoveDeadline(serial_);
    queued = std::move(queued_);
    queued_.clear();
    PeerCounters& counters = owner_.Counters(CountersKey(peer_));
    counters.transport = transport_;
    counters.channel = channel_;
    counters.peer_transports = peer_transports_;
    counters.peer_channels = peer_channels_;
    if (outbound()) {
      counters.state = PipeState::kReady;
    } else {
      ++counters.inbound_pipes;
    }
    peer = peer_;
    transport = transport_;
    channel = channel_;
  }
  AgentLog().debug("[agent {}] [peer {}] pipe {} ready ({} + {})", config_.options.id,
                   peer.ToString(), outbound() ? "to" : "from", transport, channel);
  ReadNext();
  const std::shared_ptr<Pipe> self = shared_from_this();
  for (uint64_t id : queued) owner_.WriteCall(self, id);
}

// ---------------------------------------------------------------------------------------------
// Calls, for the owner's timer and Respond.

bool Pipe::AddCall(uint64_t call_id) {
  absl::MutexLock lock(&mu_);
  pending_.insert(call_id);
  if (state_ == PipeState::kReady) return true;
  queued_.push_back(call_id);
  return false;
}

void Pipe::ForgetCall(uint64_t call_id) {
  absl::MutexLock lock(&mu_);
  pending_.erase(call_id);
  queued_.erase(std::remove(queued_.begin(), queued_.end(), call_id), queued_.end());
}

void Pipe::DropPending(uint64_t call_id) {
  absl::MutexLock lock(&mu_);
  pending_.erase(call_id);
}

std::optional<absl::Status> Pipe::HandshakeLate() const {
  absl::MutexLock lock(&mu_);
  if (state_ != PipeState::kConnecting) return std::nullopt;
  return absl::UnavailableError(
      absl::StrCat(outbound() ? absl::StrCat("pipe to ", peer_.ToString())
                              : std::string("a pipe accepted from an unknown peer"),
                   ": the handshake did not finish within ",
                   absl::FormatDuration(config_.options.handshake_timeout)));
}

std::optional<std::string> Pipe::ChunksLate(uint64_t call_id, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  if (state_ == PipeState::kFailed) return std::nullopt;
  auto waiting = incoming_.find(call_id);
  if (waiting == incoming_.end() || now < waiting->second->complete_by) {
    return absl::StrCat("the chunks of message ", call_id, " stopped coming: none for ",
                        absl::FormatDuration(config_.options.chunk_timeout));
  }
  const Incoming& in = *waiting->second;
  return absl::StrCat(
      "the chunks of message ", call_id, " did not all come within ",
      absl::FormatDuration(absl::Trunc(in.complete_by - in.received, absl::Milliseconds(1))),
      " (chunk_timeout plus their bytes at min_chunk_rate, ", config_.options.min_chunk_rate,
      " B/s)");
}

bool Pipe::Reaches(const PeerId& peer) const {
  absl::MutexLock lock(&mu_);
  return peer.node.empty() ? peer_.address == peer.address : peer_.node == peer.node;
}

absl::Status Pipe::ErrorUnlessReady() const {
  absl::MutexLock lock(&mu_);
  return state_ == PipeState::kReady ? absl::OkStatus() : error_;
}

// ---------------------------------------------------------------------------------------------
// Writes.

void Pipe::Write(tensorpipe::Message message, std::optional<std::string> reply_node,
                 std::shared_ptr<const void> keepalive, std::shared_ptr<Writes> writes) {
  tp()->write(std::move(message), [self = shared_from_this(), reply_node = std::move(reply_node),
                                   keepalive = std::move(keepalive),
                                   writes = std::move(writes)](const tensorpipe::Error& error) {
    self->EndWrite(error, reply_node, *writes, 0);
  });
}

void Pipe::WriteChunks(uint64_t call_id, const Message& chunked,
                       std::shared_ptr<const void> keepalive, std::shared_ptr<Writes> writes) {
  for (const Chunk& chunk : ChunksOf(chunked)) {
    chunked.when_chunk_ready(
        chunk.tensor, chunk.offset, chunk.length,
        [self = shared_from_this(), call_id, chunk, keepalive, writes](absl::Status ready) {
          self->WriteChunk(call_id, chunk, ready, keepalive, writes);
        });
  }
}

void Pipe::WriteChunk(uint64_t call_id, const Chunk& chunk, const absl::Status& ready,
                      std::shared_ptr<const void> keepalive, std::shared_ptr<Writes> writes) {
  v1::AgentMessage header;
  header.set_kind(v1::AgentMessage::CHUNK);
  header.set_call_id(call_id);
  header.set_chunk_tensor(static_cast<uint32_t>(chunk.tensor));
  header.set_chunk_offset(chunk.offset);
  tensorpipe::Message message;
  if (ready.ok()) {
    tensorpipe::Message::Tensor t;
    t.buffer = tensorpipe::CpuBuffer{chunk.data};
    t.length = chunk.length;
    message.tensors.push_back(std::move(t));
  } else {
    header.set_status_code(static_cast<int32_t>(ready.code()));
    header.set_status_message(std::string(ready.message()));
  }
  message.metadata = header.SerializeAsString();
  const uint64_t unsent = ready.ok() ? 0 : chunk.length;
  tp()->write(std::move(message),
              [self = shared_from_this(), keepalive = std::move(keepalive),
               writes = std::move(writes), unsent](const tensorpipe::Error& error) {
                self->EndWrite(error, std::nullopt, *writes, unsent);
              });
}

void Pipe::EndWrite(const tensorpipe::Error& error, const std::optional<std::string>& reply_node,
                    Writes& writes, uint64_t unsent) {
  absl::Status status;
  if (error) {
    // A request goes on an outbound pipe: PipeFailed names it "pipe to <peer>".
    status = TensorPipeErrorToStatus(error, reply_node.has_value()
                                                ? absl::StrCat("pipe from ", *reply_node, " failed")
                                                : PipeFailed(outbound(), peer()));
    Fail(status);
  }
  writes.End(status, unsent);
}

// ---------------------------------------------------------------------------------------------
// Reads.

void Pipe::ReadNext() {
  tp()->readDescriptor([self = shared_from_this()](const tensorpipe::Error& error,
                                                   tensorpipe::Descriptor descriptor) {
    if (error) {
      self->Fail(TensorPipeErrorToStatus(error, PipeFailed(self->outbound(), self->peer())));
      return;
    }
    self->OnDescriptor(descriptor);
  });
}

void Pipe::OnDescriptor(const tensorpipe::Descriptor& descriptor) {
  const PeerId peer = this->peer();
  auto header = std::make_shared<v1::AgentMessage>();
  if (!header->ParseFromString(descriptor.metadata)) {
    Close("it sent a message whose header is not an AgentMessage");
    return;
  }
  if (header->kind() == v1::AgentMessage::CHUNK) {
    OnChunk(peer, *header, descriptor);
    return;
  }
  absl::StatusOr<IncomingSizes> sizes =
      CheckIncoming(descriptor, *header, config_.options.max_message_bytes);
  if (!sizes.ok()) {
    Close(std::string(sizes.status().message()));
    return;
  }
  const v1::AgentMessage::Kind kind = header->kind();
  if (kind != v1::AgentMessage::REQUEST && kind != v1::AgentMessage::RESPONSE &&
      kind != v1::AgentMessage::ERROR) {
    Close(absl::StrCat("it sent a message of kind ", static_cast<int>(kind)));
    return;
  }
  auto in = std::make_shared<Incoming>();
  in->header = header;
  in->chunked = sizes->chunks > 0;
  absl::StatusOr<Destination> destination = Place(*in, *sizes, peer);
  // Bytes that nobody takes are still read (a pipe cannot skip them), into a block dropped
  // right after.
  if (!destination.ok() || !in->refused.ok()) {
    destination = HeapDestination(sizes->payload, sizes->tensors);
    if (!destination.ok()) {
      Close(std::string(destination.status().message()));
      return;
    }
  }
  tensorpipe::Allocation allocation = Receive(*in, *std::move(destination), descriptor, *sizes);
  // Registered before the read starts: the first chunk's descriptor may come before this
  // message's read completes.
  if (in->chunked && !AwaitChunks(in, *sizes)) return;
  tp()->read(std::move(allocation), [self = shared_from_this(), in, main_bytes = sizes->main_bytes,
                                     peer](const tensorpipe::Error& error) {
    self->OnPartRead(peer, *in, error, main_bytes, /*main=*/true);
  });
  ReadNext();
}

absl::StatusOr<Destination> Pipe::Place(Incoming& in, const IncomingSizes& sizes,
                                        const PeerId& peer) {
  const v1::AgentMessage& header = *in.header;
  if (header.kind() != v1::AgentMessage::REQUEST) return PlaceReply(header, sizes, peer);
  if (header.method() == kPingMethod && header.group().empty()) {
    in.ping = true;
    if (sizes.payload != 0 || !sizes.tensors.empty()) {
      in.refused = absl::InvalidArgumentError("a ping carries no payload and no tensors");
    }
    return HeapDestination(sizes.payload, sizes.tensors);
  }
  {
    absl::MutexLock lock(&owner_.mu_);
    in.handler = owner_.handler();
    ++owner_.Counters(CountersKey(peer)).calls_received;
  }
  if (in.handler == nullptr || !in.handler->deliver) {
    in.refused = absl::UnavailableError(
        absl::StrCat("agent ", config_.options.id, " serves no requests yet (no handler)"));
    return in.refused;
  }
  absl::StatusOr<Destination> destination =
      in.handler->allocate ? in.handler->allocate(header, sizes.payload, sizes.tensors)
                           : HeapDestination(sizes.payload, sizes.tensors);
  in.refused = destination.ok() ? CheckDestination(*destination, sizes.payload, sizes.tensors)
                                : destination.status();
  return destination;
}

absl::StatusOr<Destination> Pipe::PlaceReply(const v1::AgentMessage& header,
                                             const IncomingSizes& sizes, const PeerId& peer) {
  std::optional<Allocator> allocate;
  {
    absl::MutexLock lock(&owner_.mu_);
    allocate = owner_.ReplyAllocator(header.call_id(), *this);
  }
  if (!allocate.has_value() || !*allocate) return HeapDestination(sizes.payload, sizes.tensors);
  absl::StatusOr<Destination> destination = (*allocate)(header, sizes.payload, sizes.tensors);
  const absl::Status bad = destination.ok()
                               ? CheckDestination(*destination, sizes.payload, sizes.tensors)
                               : destination.status();
  if (bad.ok()) return destination;
  owner_.CompleteCall(header.call_id(),
                      Prefixed(bad, "the reply to method \"", header.method(), "\" from ",
                               peer.ToString(), " could not be placed: "));
  return bad;
}

tensorpipe::Allocation Pipe::Receive(Incoming& in, Destination destination,
                                     const tensorpipe::Descriptor& descriptor,
                                     const IncomingSizes& sizes) {
  tensorpipe::Allocation allocation;
  if (!descriptor.payloads.empty()) allocation.payloads.push_back({OrEmpty(destination.payload)});
  for (size_t i = 0; i < sizes.tensors.size(); ++i) {
    const bool chunked = in.header->tensors(static_cast<int>(i)).chunk_bytes() > 0;
    allocation.tensors.push_back(
        {tensorpipe::CpuBuffer{OrEmpty(chunked ? nullptr : destination.tensors[i])}});
  }
  in.message = std::make_shared<Message>();
  in.message->payload = Buffer{destination.payload, sizes.payload};
  for (size_t i = 0; i < sizes.tensors.size(); ++i) {
    in.message->tensors.push_back(Buffer{destination.tensors[i], sizes.tensors[i]});
  }
  in.message->keepalive = std::move(destination.keepalive);
  in.on_chunk = std::move(destination.on_chunk);
  in.received = absl::Now();
  return allocation;
}

bool Pipe::AwaitChunks(const std::shared_ptr<Incoming>& in, const IncomingSizes& sizes) {
  const AgentOptions& options = config_.options;
  in->complete_by =
      in->received + options.chunk_timeout +
      absl::Seconds(static_cast<double>(sizes.chunked_bytes) /
                    static_cast<double>(std::max<uint64_t>(options.min_chunk_rate, 1)));
  const uint64_t call_id = in->header->call_id();
  bool duplicate;
  bool too_many;
  {
    absl::MutexLock owner_lock(&owner_.mu_);
    absl::MutexLock lock(&mu_);
    if (state_ == PipeState::kFailed) return false;
    absl::MutexLock in_lock(&in->mu);
    for (int i = 0; i < in->header->tensors_size(); ++i) {
      const v1::TensorDescriptor& described = in->header->tensors(i);
      in->chunk_seen.emplace_back(described.chunk_bytes() > 0 ? ChunkCount(described) : 0, false);
    }
    too_many = incoming_.size() >= kMaxChunkedMessagesPerPipe;
    duplicate = !too_many && !incoming_.emplace(call_id, in).second;
    if (!duplicate && !too_many) {
      in->chunks_left = sizes.chunks;
      in->timer_id = owner_.NextId();
      owner_.AddChunkTimer(in->timer_id, weak_from_this(), call_id,
                           std::min(in->received + options.chunk_timeout, in->complete_by));
    }
  }
  if (duplicate || too_many) {
    Close(too_many ? absl::StrCat("it has ", kMaxChunkedMessagesPerPipe,
                                  " messages waiting for their chunks on this pipe")
                   : absl::StrCat("it sent message ", call_id,
                                  " again before all chunks of the first came"));
    return false;
  }
  return true;
}

void Pipe::OnChunk(const PeerId& peer, const v1::AgentMessage& header,
                   const tensorpipe::Descriptor& descriptor) {
  const bool failed = header.status_code() != 0;
  if (!descriptor.payloads.empty() || descriptor.tensors.size() != (failed ? 0u : 1u)) {
    Close(absl::StrCat("a chunk of message ", header.call_id(), " carries ",
                       descriptor.payloads.size(), " payloads and ", descriptor.tensors.size(),
                       " tensors"));
    return;
  }
  std::shared_ptr<Incoming> in;
  uint64_t length = 0;
  if (const std::string bad = TakeChunk(header, descriptor, &in, &length); !bad.empty()) {
    Close(bad);
    return;
  }
  if (failed) {
    // The sender could not produce these bytes: the message fails with its reason. Even a
    // message with nothing to read must be read before the pipe gives the next one.
    tp()->read(tensorpipe::Allocation{},
               [self = shared_from_this(), in, error = ChunkFailure(header),
                peer](const tensorpipe::Error& read_error) {
                 self->OnPartRead(peer, *in, read_error, 0, /*main=*/false, error);
               });
    ReadNext();
    return;
  }
  const size_t tensor = header.chunk_tensor();
  const uint64_t offset = header.chunk_offset();
  tensorpipe::Allocation allocation;
  allocation.tensors.push_back(
      {tensorpipe::CpuBuffer{static_cast<char*>(in->message->tensors[tensor].data) + offset}});
  tp()->read(std::move(allocation), [self = shared_from_this(), in, tensor, offset, length,
                                     peer](const tensorpipe::Error& error) {
    if (!error && in->on_chunk) in->on_chunk(tensor, offset, length);
    self->OnPartRead(peer, *in, error, length, /*main=*/false);
  });
  ReadNext();
}

std::string Pipe::TakeChunk(const v1::AgentMessage& header,
                            const tensorpipe::Descriptor& descriptor, std::shared_ptr<Incoming>* in,
                            uint64_t* length) {
  const uint64_t call_id = header.call_id();
  const size_t tensor = header.chunk_tensor();
  const uint64_t offset = header.chunk_offset();
  absl::MutexLock owner_lock(&owner_.mu_);
  absl::MutexLock lock(&mu_);
  auto it = incoming_.find(call_id);
  if (it == incoming_.end()) {
    return absl::StrCat("it sent a chunk of message ", call_id,
                        ", which is not waiting for chunks on this pipe");
  }
  Incoming& waiting = *it->second;
  absl::MutexLock in_lock(&waiting.mu);
  if (tensor >= waiting.chunk_seen.size() || waiting.chunk_seen[tensor].empty()) {
    return absl::StrCat("it sent a chunk of tensor ", tensor, " of message ", call_id,
                        ", which is not sent in chunks");
  }
  const v1::TensorDescriptor& described = waiting.header->tensors(static_cast<int>(tensor));
  const uint64_t index = offset / described.chunk_bytes();
  *length =
      std::min(described.chunk_bytes(), described.nbytes() - std::min(offset, described.nbytes()));
  if (offset % described.chunk_bytes() != 0 || offset >= described.nbytes()) {
    return absl::StrCat("it sent a chunk of tensor ", tensor, " of message ", call_id,
                        " at offset ", offset, ", not a chunk boundary inside its ",
                        described.nbytes(), " bytes");
  }
  if (waiting.chunk_seen[tensor][index]) {
    return absl::StrCat("it sent chunk ", index, " of tensor ", tensor, " of message ", call_id,
                        " twice");
  }
  const bool failed = header.status_code() != 0;
  if (!failed && (descriptor.tensors[0].length != *length ||
                  descriptor.tensors[0].sourceDevice.type != tensorpipe::kCpuDeviceType)) {
    return absl::StrCat("chunk ", index, " of tensor ", tensor, " of message ", call_id, " is ",
                        descriptor.tensors[0].length, " bytes, not ", *length);
  }
  waiting.chunk_seen[tensor][index] = true;
  owner_.RemoveDeadline(waiting.timer_id);
  owner_.AddDeadline(waiting.timer_id,
                     std::min(absl::Now() + config_.options.chunk_timeout, waiting.complete_by));
  *in = it->second;
  return std::string();
}

void Pipe::OnPartRead(const PeerId& peer, Incoming& in, const tensorpipe::Error& error,
                      uint64_t bytes, bool main, const absl::Status& chunk_error) {
  if (error) {
    Fail(TensorPipeErrorToStatus(error, PipeFailed(outbound(), peer)));
    return;
  }
  bool last = !in.chunked;  // a message without chunks is read in one part
  {
    absl::MutexLock owner_lock(&owner_.mu_);
    owner_.Counters(CountersKey(peer)).bytes_received += bytes;
    if (in.chunked) last = ChunkedPartRead(in, main, chunk_error);
  }
  if (last) Finish(peer, in);
}

bool Pipe::ChunkedPartRead(Incoming& in, bool main, const absl::Status& chunk_error) {
  absl::MutexLock lock(&mu_);
  absl::MutexLock in_lock(&in.mu);
  if (in.chunk_error.ok()) in.chunk_error = chunk_error;
  if (!main) {
    --in.chunks_left;
  } else if (in.parts == Incoming::Parts::kReading) {
    in.parts = Incoming::Parts::kMainRead;
  }
  if (in.parts != Incoming::Parts::kMainRead || in.chunks_left > 0) return false;
  in.parts = Incoming::Parts::kFinished;
  owner_.RemoveChunkTimer(in.timer_id);
  auto it = incoming_.find(in.header->call_id());
  if (it != incoming_.end() && it->second.get() == &in) incoming_.erase(it);
  return true;
}

void Pipe::Finish(const PeerId& peer, Incoming& in) {
  Message& message = *in.message;
  message.header = std::move(*in.header);
  absl::Status chunk_error;
  if (in.chunked) {
    absl::MutexLock lock(&in.mu);
    chunk_error = in.chunk_error;
  }
  if (message.header.kind() != v1::AgentMessage::REQUEST) {
    const uint64_t call_id = message.header.call_id();
    if (!chunk_error.ok()) {
      owner_.CompleteCall(call_id,
                          Prefixed(chunk_error, "the reply to method \"", message.header.method(),
                                   "\" from ", peer.ToString(), " failed: "));
      return;
    }
    owner_.CompleteCall(call_id, std::move(message));
    return;
  }
  ReplyTo reply_to;
  reply_to.conn_ = shared_from_this();
  reply_to.call_id_ = message.header.call_id();
  reply_to.node_ = peer.node;
  reply_to.method_ = message.header.method();
  if (message.header.timeout_us() > 0) {
    reply_to.deadline_ = in.received + absl::Microseconds(message.header.timeout_us());
  }
  const absl::Status refused = in.refused.ok() ? chunk_error : in.refused;
  if (in.ping && refused.ok()) {
    Message answer;
    answer.header.set_unix_time_ns(absl::ToUnixNanos(absl::Now()));
    owner_.Respond(reply_to, std::move(answer));
    return;
  }
  if (!refused.ok()) {
    Message answer;
    answer.header.set_kind(v1::AgentMessage::ERROR);
    answer.header.set_status_code(static_cast<int>(refused.code()));
    answer.header.set_status_message(std::string(refused.message()));
    owner_.Respond(reply_to, std::move(answer));
    return;
  }
  InboundRequest request;
  request.node = peer.node;
  request.deadline = reply_to.deadline_;
  request.message = std::move(message);
  request.reply_to = std::move(reply_to);
  in.handler->deliver(std::move(request));
}

// ---------------------------------------------------------------------------------------------
// Failures.

void Pipe::Fail(const absl::Status& status) {
  std::vector<std::function<void()>> run;
  // Messages whose chunks will never come: their memory is let go after the locks.
  std::vector<std::shared_ptr<Incoming>> dropped;
  std::shared_ptr<tensorpipe::Pipe> pipe;
  bool log;
  {
    absl::MutexLock owner_lock(&owner_.mu_);
    absl::MutexLock lock(&mu_);
    if (state_ == PipeState::kFailed) return;
    const bool was_ready = state_ == PipeState::kReady;
    log = !owner_.closing() && (outbound() || was_ready);
    state_ = PipeState::kFailed;
    error_ = status;
    pipe = tp_;
    if (outbound() || was_ready) CountFailure(status, log);
    owner_.Forget(*this, peer_, std::vector<uint64_t>(pending_.begin(), pending_.end()), status,
                  &run);
    pending_.clear();
    queued_.clear();
    for (auto& [call_id, in] : incoming_) {
      absl::MutexLock in_lock(&in->mu);
      owner_.RemoveChunkTimer(in->timer_id);
      in->parts = Incoming::Parts::kFinished;
      dropped.push_back(std::move(in));
    }
    incoming_.clear();
  }
  if (log) AgentLog().info("[agent {}] {}", config_.options.id, std::string(status.message()));
  if (pipe != nullptr) pipe->close();
  for (auto& fn : run) fn();
}

void Pipe::CountFailure(const absl::Status& status, bool count_error) {
  PeerCounters& counters = owner_.Counters(CountersKey(peer_));
  if (count_error) {
    ++counters.errors;
    counters.last_error = std::string(status.message());
  }
  if (outbound()) {
    counters.state = PipeState::kFailed;
  } else {
    --counters.inbound_pipes;
  }
}

void Pipe::Close(const std::string& why) {
  const PeerId peer = this->peer();
  AgentLog().error("[agent {}] [peer {}] closing the pipe: {}", config_.options.id, peer.ToString(),
                   why);
  Fail(absl::UnavailableError(
      absl::StrCat("pipe ", outbound() ? "to " : "from ", peer.ToString(), " closed: ", why)));
}

}  // namespace tpd::agent
