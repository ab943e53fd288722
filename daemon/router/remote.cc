#include "daemon/router/remote.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status.h"
#include "daemon/router/tensor_wire.h"

namespace tpd::router {
namespace {

// How long a request from another daemon may wait for this daemon to read the version of its
// group in which its caller joined, before it is refused.
constexpr absl::Duration kCatchUpWait = absl::Seconds(5);

// Points `out`'s payload and tensors at `submitted`'s bytes in the segment at `base`, with
// their wire descriptors: TensorPipe reads them in place.
void ReferInPlace(uint8_t* base, const Submitted& submitted, agent::Message* out) {
  out->payload = {base + submitted.message.body_offset, submitted.message.body_length};
  for (const shm::TensorEntry& entry : submitted.tensors) {
    *out->header.add_tensors() = ToWire(entry);
    out->tensors.push_back({entry.length == 0 ? nullptr : base + entry.offset, entry.length});
  }
}

absl::Status CheckCounts(const Arrival& arrival) {
  const size_t n = arrival.tensor_sizes.size();
  if (static_cast<size_t>(arrival.header.tensors_size()) != n || n > shm::kMaxTensorsPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat("the message has ", n, " tensors (at most ",
                                                   shm::kMaxTensorsPerMessage, ") and ",
                                                   arrival.header.tensors_size(), " descriptors"));
  }
  for (const std::string& name : arrival.names) {
    if (name.size() > shm::kMaxMessageName) {
      return absl::InvalidArgumentError(
          absl::StrCat("a name of ", name.size(), " bytes exceeds ", shm::kMaxMessageName));
    }
  }
  return absl::OkStatus();
}

// Writes the names and tensor table of `block` into its session's rx heap at `out`, pointing
// `destination` at where the body and each tensor are to be received.
void FillIncoming(RxBlock& block, uint32_t code, const shm::MessageNames& names, uint8_t* out,
                  agent::Destination* destination) {
  shm::WriteMessagePrefix(out, code, names);
  for (size_t i = 0; i < block.tensors.size(); ++i) {
    shm::TensorEntry& entry = block.tensors[i];
    const uint64_t staging = block.staged == nullptr ? 0 : block.staged->staging(i);
    const bool on_device = entry.device_type == static_cast<uint8_t>(shm::DeviceType::kCuda);
    if (!on_device) entry.offset = entry.length == 0 ? 0 : block.offset + block.plan.at[i];
    std::memcpy(out + block.plan.table + i * sizeof(entry), &entry, sizeof(entry));
    void* at = on_device ? reinterpret_cast<void*>(staging) : out + block.plan.at[i];
    destination->tensors.push_back(entry.length == 0 ? nullptr : at);
  }
}

}  // namespace

void Ship(const CudaStaging& staging, const Shipment& what, agent::Message message,
          std::function<void(agent::Message)> send, std::function<void(absl::Status)> failed) {
  if (what.places.empty()) {
    ReferInPlace(what.session->segment->base(), what.submitted, &message);
    message.keepalive = std::make_shared<TxBlock>(what.session, what.tx_offset);
    send(std::move(message));
    return;
  }
  absl::StatusOr<Staged> staged =
      staging.StageOut(what.session, what.tx_offset, what.submitted, what.places, &message);
  if (!staged.ok()) {
    failed(staged.status());
    return;
  }
  // Sent once the unchunked CUDA tensors are in pinned staging; chunks follow as their copies,
  // issued after those, complete.
  if (staged->copies.empty()) {
    send(std::move(message));
  } else {
    auto held = std::make_shared<agent::Message>(std::move(message));
    staging.cuda()->Run(std::move(staged->copies), {what.session->cuda},
                        [send, failed, held](absl::Status copied) {
                          if (copied.ok()) {
                            send(std::move(*held));
                          } else {
                            failed(copied);
                          }
                        });
  }
  StagedOut::StartChunks(staged->chunked);
}

RxBlock::~RxBlock() {
  if (posted || offset == 0) return;
  // A block this router allocated and never posted: freeing it cannot fail.
  TPD_CHECK_OK(session->FreeRx(offset));
}

void RxBlock::Land(const std::shared_ptr<const RxBlock>& self,
                   std::function<void(absl::Status)> then) {
  if (self->staged == nullptr) {
    then(absl::OkStatus());
    return;
  }
  self->staged->Land(self, std::move(then));
}

absl::Status RxBlock::Post(const shm::Descriptor& d) const {
  absl::Status status = session->PostLocking(d);
  if (status.ok()) {
    posted = true;
    if (staged != nullptr) staged->MarkPosted();
  }
  return status;
}

absl::StatusOr<agent::Destination> PlaceIncoming(const CudaStaging& staging,
                                                 const std::shared_ptr<Session>& to,
                                                 const Arrival& arrival) {
  if (absl::Status counted = CheckCounts(arrival); !counted.ok()) return counted;
  const size_t n = arrival.tensor_sizes.size();
  auto block = std::make_shared<RxBlock>();
  block->session = to;
  std::vector<uint64_t> bytes(arrival.tensor_sizes.begin(), arrival.tensor_sizes.end());
  std::vector<int> targets(n, -1);
  std::vector<bool> chunked(n, false);
  bool on_device = false;
  for (size_t i = 0; i < n; ++i) {
    const v1::TensorDescriptor& wire = arrival.header.tensors(static_cast<int>(i));
    absl::StatusOr<shm::TensorEntry> entry =
        FromWire(wire, arrival.tensor_sizes[i], static_cast<int>(i), &targets[i]);
    if (!entry.ok()) return entry.status();
    // An error's tensors are never read: no pool block for them.
    if (arrival.code != 0) targets[i] = -1;
    block->tensors.push_back(*entry);
    chunked[i] = wire.chunk_bytes() > 0;
    if (targets[i] >= 0) {
      bytes[i] = 0;  // in the session's receive pool, not its rx heap
      on_device = true;
    }
  }
  if (on_device) {
    if (staging.cuda() == nullptr || to->cuda == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CUDA tensors for worker '", arrival.header.target_worker(), "': ", staging.no_cuda()));
    }
    // Pool blocks and staging first, outside the session's lock; freed with the block if
    // anything below fails.
    absl::StatusOr<std::unique_ptr<StagedIn>> staged =
        StagedIn::Reserve(staging.cuda(), to->cuda, arrival.header.target_worker(), targets,
                          chunked, &block->tensors);
    if (!staged.ok()) return staged.status();
    block->staged = *std::move(staged);
  }
  block->plan = shm::PlanBlock(shm::MessagePrefixBytes(arrival.names), arrival.payload_size, bytes);
  agent::Destination destination;
  absl::StatusOr<uint64_t> offset = to->WriteRx(block->plan.total, [&](uint64_t at, uint8_t* out) {
    block->offset = at;
    FillIncoming(*block, arrival.code, arrival.names, out, &destination);
    destination.payload = arrival.payload_size == 0 ? nullptr : out + block->plan.prefix;
    return absl::OkStatus();
  });
  if (!offset.ok()) return offset.status();
  if (on_device) {
    // Each chunk bound for a device goes on into the pool as soon as it is in staging.
    std::shared_ptr<const RxBlock> landing = block;
    destination.on_chunk = [landing](size_t tensor, uint64_t at, uint64_t length) {
      landing->staged->OnChunk(tensor, at, length, landing);
    };
  }
  destination.keepalive = std::move(block);
  return destination;
}

void Remote::Call(const std::shared_ptr<Session>& session, const shm::Descriptor& d,
                  const Submitted& call, const std::vector<Place>& places, const v1::Member& member,
                  int64_t read_ns) {
  const std::string& worker = call.message.names[1];
  const std::string& method = call.message.names[2];
  absl::StatusOr<std::string> address =
      options_.agent == nullptr ? absl::UnavailableError(absl::StrCat(
                                      "worker '", worker, "' is on node ", member.node(),
                                      " and this daemon has no agent for calls to other nodes (set "
                                      "peer.listen_address and peer.token)"))
                                : options_.check_address(member.agent_address());
  if (!address.ok()) {
    session->Release(d.payload_offset);
    hooks_.fail(
        session, d.call_id,
        Prefixed(address.status(), CallName(worker, method), " on node ", member.node(), ": "));
    return;
  }
  agent::Message request;
  request.header = RequestHeader(call.message.names);
  calls_.Add({session->id, d.call_id}, Outgoing{member.node(), worker, method});
  const absl::Time deadline =
      d.deadline_unix_ns == 0 ? absl::InfiniteFuture() : absl::FromUnixNanos(d.deadline_unix_ns);
  const uint64_t call_id = d.call_id;
  // Weak: a caller that went away must not keep its segment mapped while a reply that has
  // nowhere to go is awaited.
  std::weak_ptr<Session> weak = session;
  agent::Allocator place_reply =
      [this, weak](const v1::AgentMessage& reply, size_t payload_size,
                   absl::Span<const size_t> sizes) -> absl::StatusOr<agent::Destination> {
    std::shared_ptr<Session> caller = weak.lock();
    if (caller == nullptr) return absl::UnavailableError("the caller's session ended");
    const bool error = reply.kind() == v1::AgentMessage::ERROR;
    return PlaceIncoming(
        staging_, caller,
        {reply, error ? static_cast<uint32_t>(reply.status_code()) : 0,
         shm::MessageNames{"", "", error ? reply.status_message() : "", ""}, payload_size, sizes});
  };
  auto send = [this, weak, call_id, peer = agent::PeerId{member.node(), *address}, deadline,
               place_reply, read_ns](agent::Message request) {
    const int64_t sent_ns = MonotonicNanos();
    timings_.Record(CallStage::kRemoteSend, read_ns, sent_ns);
    options_.agent->Send(
        peer, std::move(request), deadline,
        [this, weak, call_id, read_ns, sent_ns](absl::StatusOr<agent::Message> reply) {
          const int64_t received_ns = MonotonicNanos();
          if (reply.ok()) timings_.Record(CallStage::kRemoteWait, sent_ns, received_ns);
          if (std::shared_ptr<Session> caller = weak.lock()) {
            OnReply(caller, call_id, std::move(reply), read_ns, received_ns);
          }
        },
        place_reply);
  };
  Ship(staging_, {session, d.payload_offset, call, places}, std::move(request), send,
       [this, weak, call_id](absl::Status failed) {
         if (std::shared_ptr<Session> caller = weak.lock()) {
           FailCall(caller, call_id, failed);
         }
       });
}

v1::AgentMessage Remote::RequestHeader(const shm::MessageNames& names) {
  const auto& [group, worker, method, from] = names;
  v1::AgentMessage header;
  header.set_group(group);
  header.set_target_worker(worker);
  header.set_method(method);
  header.set_source_worker(from);
  // Who calls, as this daemon knows it (HandleCall checked the caller holds this member): the
  // callee's daemon serves the call only if its own view agrees.
  int64_t version = 0;
  if (std::optional<v1::Member> source = options_.member(group, from, &version)) {
    header.set_source_incarnation(source->incarnation());
  }
  header.set_group_version(version);
  return header;
}

void Remote::FailCall(const std::shared_ptr<Session>& caller, uint64_t call_id,
                      const absl::Status& status) {
  std::optional<Outgoing> call = calls_.Take({caller->id, call_id});
  if (!call) return;  // cancelled, or its node was lost: answered already
  hooks_.fail(
      caller, call_id,
      Prefixed(status, CallName(call->worker, call->method), " on node ", call->node, ": "));
}

void Remote::OnReply(const std::shared_ptr<Session>& caller, uint64_t call_id,
                     absl::StatusOr<agent::Message> reply, int64_t read_ns, int64_t received_ns) {
  if (!reply.ok()) {
    FailCall(caller, call_id, reply.status());
    return;
  }
  std::optional<Outgoing> call = calls_.Take({caller->id, call_id});
  if (!call) return;  // cancelled, or its node was lost: answered already
  auto block = std::static_pointer_cast<const RxBlock>(reply->keepalive);
  const bool error = reply->header.kind() == v1::AgentMessage::ERROR;
  const shm::Descriptor posted = shm::MessageDescriptor(shm::Op::kReply, call_id, block->Placed(),
                                                        error ? shm::kFlagError : 0);
  RxBlock::Land(block, [this, block, caller, posted, call_id, call = *std::move(call), read_ns,
                        received_ns](absl::Status status) {
    if (status.ok()) status = block->Post(posted);
    if (!status.ok()) {
      hooks_.fail(caller, call_id, ReplyFailed(call.worker, call.method, status));
      return;
    }
    const int64_t posted_ns = MonotonicNanos();
    timings_.Record(CallStage::kRemotePost, received_ns, posted_ns);
    timings_.Record(CallStage::kRemoteTotal, read_ns, posted_ns);
  });
}

agent::Handler Remote::Handler() {
  agent::Handler handler;
  handler.allocate = [this](const v1::AgentMessage& header, size_t payload_size,
                            absl::Span<const size_t> sizes) {
    return PlaceRequest(header, payload_size, sizes);
  };
  handler.deliver = [this](agent::InboundRequest request) {
    OnRequest(std::move(request), MonotonicNanos());
  };
  return handler;
}

absl::StatusOr<agent::Destination> Remote::PlaceRequest(const v1::AgentMessage& header,
                                                        size_t payload_size,
                                                        absl::Span<const size_t> sizes) {
  if (absl::Status admitted = hooks_.admit(); !admitted.ok()) return admitted;
  std::optional<std::string> target = options_.lookup(header.group(), header.target_worker());
  std::shared_ptr<Session> callee = target ? hooks_.find(*target) : nullptr;
  if (callee == nullptr) {
    return target ? absl::UnavailableError(absl::StrCat(
                        "worker '", header.target_worker(), "' of group '", header.group(),
                        "' is held by a session not attached to shared memory on node ",
                        options_.node))
                  : absl::NotFoundError(absl::StrCat("worker '", header.target_worker(),
                                                     "' is not a member of group '", header.group(),
                                                     "' on node ", options_.node));
  }
  return PlaceIncoming(staging_, callee,
                       {header, 0,
                        shm::MessageNames{header.group(), header.target_worker(), header.method(),
                                          header.source_worker()},
                        payload_size, sizes});
}

absl::Status Remote::CheckCaller(const v1::AgentMessage& header, const std::string& node,
                                 int64_t* version_read) {
  int64_t version = 0;
  std::optional<v1::Member> source =
      options_.member(header.group(), header.source_worker(), &version);
  if (version_read != nullptr) *version_read = version;
  if (source && source->node() == node && source->incarnation() == header.source_incarnation()) {
    return absl::OkStatus();
  }
  std::string known;
  if (!source) {
    known = absl::StrCat("its version ", version, " has no such member");
  } else if (source->node() != node) {
    known = absl::StrCat("it has that worker on node ", source->node());
  } else {
    known = absl::StrCat("it has that worker in incarnation ", source->incarnation(), ", not ",
                         header.source_incarnation());
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "worker '", header.source_worker(), "' of node ", node, " is not a member of group '",
      header.group(), "' as node ", options_.node, " knows the group (", known,
      "): a worker serves only members of its own group"));
}

void Remote::OnRequest(agent::InboundRequest request, int64_t received_ns) {
  // The peer is an authenticated daemon, but what it says of the group comes from the store
  // it reads, which a client may have chosen: only this daemon's own view of the group admits
  // the caller (docs/security.md, "Who may call a worker").
  const v1::AgentMessage& header = request.message.header;
  int64_t have = 0;
  absl::Status admitted = CheckCaller(header, request.node, &have);
  if (admitted.ok() || header.group_version() <= have || !options_.when_version) {
    ServeRequest(std::move(request), admitted, received_ns);
    return;
  }
  // The caller's daemon has read a version this one has not (the caller may have just
  // joined): decide once this daemon has read it too, or when the wait ends.
  auto held = std::make_shared<agent::InboundRequest>(std::move(request));
  const absl::Time until = std::min(held->deadline, absl::Now() + kCatchUpWait);
  const std::string group = held->message.header.group();
  const int64_t version = held->message.header.group_version();
  options_.when_version(group, version, until, [this, held, received_ns](bool) {
    const absl::Status checked = CheckCaller(held->message.header, held->node, nullptr);
    ServeRequest(std::move(*held), checked, received_ns);
  });
}

void Remote::ServeRequest(agent::InboundRequest request, const absl::Status& admitted,
                          int64_t received_ns) {
  const v1::AgentMessage& header = request.message.header;
  auto block = std::static_pointer_cast<const RxBlock>(request.message.keepalive);
  if (!admitted.ok()) {
    RespondError(request.reply_to, admitted);
    return;
  }
  const std::shared_ptr<Session>& callee = block->session;
  PendingCall pending;
  pending.remote = request.reply_to;
  pending.callee = callee->id;
  pending.group = header.group();
  pending.from = header.source_worker();
  pending.worker = header.target_worker();
  pending.method = header.method();
  pending.deadline = request.deadline;
  pending.read_ns = received_ns;
  const uint64_t id = pending_.Add(pending);
  const shm::Descriptor posted = shm::MessageDescriptor(
      shm::Op::kCall, id, block->Placed(), 0,
      request.deadline == absl::InfiniteFuture() ? 0 : absl::ToUnixNanos(request.deadline));
  const agent::ReplyTo reply_to = request.reply_to;
  RxBlock::Land(block, [this, block, posted, id, reply_to, pending](absl::Status status) {
    if (status.ok()) status = block->Post(posted);
    if (status.ok()) {
      block->session->CallPosted();
      const int64_t posted_ns = MonotonicNanos();
      timings_.Record(CallStage::kInboundDeliver, pending.read_ns, posted_ns);
      pending_.MarkPosted(id, posted_ns);
      return;
    }
    if (pending_.Take(id)) {
      RespondError(reply_to, Prefixed(status, CallName(pending.worker, pending.method), " on node ",
                                      options_.node, ": "));
    }
  });
}

void Remote::RespondError(const agent::ReplyTo& to, const absl::Status& status) {
  agent::Message response;
  response.header.set_kind(v1::AgentMessage::ERROR);
  response.header.set_status_code(static_cast<int32_t>(status.code()));
  response.header.set_status_message(std::string(status.message()));
  options_.agent->Respond(to, std::move(response));
}

void Remote::Respond(const std::shared_ptr<Session>& session, const shm::Descriptor& d,
                     const PendingCall& pending, int64_t read_ns) {
  timings_.Record(CallStage::kInboundCallee, pending.CalleeSince(), read_ns);
  absl::StatusOr<Submitted> reply = ReadSubmitted(*session->segment, d, session->cuda_allowed);
  if (!reply.ok()) {
    session->Release(d.payload_offset);
    RespondError(*pending.remote, MalformedReply(pending.worker, pending.method, reply.status()));
    return;
  }
  session->bytes_sent.fetch_add(MessageBytes(*reply), std::memory_order_relaxed);
  // An error reply's tensors go nowhere: the caller reads only its message.
  if ((d.flags & shm::kFlagError) != 0) reply->tensors.clear();
  absl::StatusOr<std::vector<Place>> places =
      hooks_.place({pending.group, pending.worker, pending.from}, /*reply=*/true, reply->tensors);
  if (!places.ok()) {
    session->Release(d.payload_offset);
    RespondError(*pending.remote, places.status());
    return;
  }
  agent::Message response;
  if ((d.flags & shm::kFlagError) != 0) {
    response.header.set_kind(v1::AgentMessage::ERROR);
    response.header.set_status_code(static_cast<int32_t>(reply->message.code));
    response.header.set_status_message(reply->message.names[2]);
  }
  const agent::ReplyTo to = *pending.remote;
  Ship(
      staging_, {session, d.payload_offset, *reply, *places}, std::move(response),
      [this, to, read_ns](agent::Message ready) {
        timings_.Record(CallStage::kInboundRespond, read_ns, MonotonicNanos());
        options_.agent->Respond(to, std::move(ready));
      },
      [this, to, worker = pending.worker, method = pending.method](absl::Status failed) {
        RespondError(to, ReplyFailed(worker, method, failed));
      });
}

void RemoteCalls::Add(const Key& key, Outgoing call) {
  absl::MutexLock lock(&mu_);
  calls_[key] = std::move(call);
}

std::optional<Outgoing> RemoteCalls::Take(const Key& key) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(key);
  if (it == calls_.end()) return std::nullopt;
  Outgoing call = std::move(it->second);
  calls_.erase(it);
  return call;
}

std::vector<std::pair<RemoteCalls::Key, Outgoing>> RemoteCalls::TakeNode(const std::string& node) {
  std::vector<std::pair<Key, Outgoing>> taken;
  absl::MutexLock lock(&mu_);
  for (auto it = calls_.begin(); it != calls_.end();) {
    if (it->second.node == node) {
      taken.emplace_back(it->first, std::move(it->second));
      it = calls_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

void RemoteCalls::DropSession(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  for (auto it = calls_.lower_bound({session_id, 0});
       it != calls_.end() && it->first.first == session_id;) {
    it = calls_.erase(it);
  }
}

size_t RemoteCalls::AwaitNone(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.empty(); };
  mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  return calls_.size();
}

size_t RemoteCalls::size() {
  absl::MutexLock lock(&mu_);
  return calls_.size();
}

}  // namespace tpd::router
