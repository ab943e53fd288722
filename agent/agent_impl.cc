#include "agent/agent_impl.h"

#include <signal.h>
#include <tensorpipe/tensorpipe.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/address.h"
#include "agent/log.h"
#include "agent/wire.h"
#include "base/status.h"

namespace tpd::agent {

namespace {

std::string DeadlineText(absl::Time time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3S%Ez", time, absl::LocalTimeZone());
}

// TensorPipe's uv and shm transports write to sockets without MSG_NOSIGNAL: a peer that
// vanishes mid-write would kill the process with SIGPIPE instead of failing the pipe with
// EPIPE. PyTorch's agent lives in Python, which ignores SIGPIPE; a daemon must do the same.
// Only the default disposition is changed: an owner's own handler is left alone.
void IgnoreSigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
  }
}

// The lowest-priority URL of `peer` that this agent's transports can dial ("" if none).
std::string UrlToDial(const PeerId& peer, const std::vector<std::string>& bootstrap_order) {
  const std::vector<std::string> peer_urls = absl::StrSplit(peer.address, ',', absl::SkipEmpty());
  for (const std::string& transport : bootstrap_order) {
    for (const std::string& candidate : peer_urls) {
      if (absl::StartsWith(candidate, absl::StrCat(transport, "://"))) return candidate;
    }
  }
  return std::string();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Creation and destruction.

absl::StatusOr<std::unique_ptr<AgentImpl>> AgentImpl::Create(const AgentOptions& options) {
  if (options.id.empty() || options.id.size() > kMaxIdBytes) {
    return absl::InvalidArgumentError("the agent needs an id (the node name, 1..256 bytes)");
  }
  if (options.cluster_token.empty()) {
    return absl::InvalidArgumentError(
        "the agent needs the cluster token ([peer] token): pipes are authenticated with it");
  }
  if (options.handshake_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("handshake_timeout must be positive");
  }
  absl::StatusOr<std::unique_ptr<Listener>> listener = Listener::Create(options);
  if (!listener.ok()) return listener.status();
  RegistryOptions registry_options;
  registry_options.transports = options.transports;
  registry_options.channels = options.channels;
  registry_options.host = (*listener)->host();
  registry_options.mpt_lanes = options.mpt_lanes;
  // The transport's refusals (junk, strangers, silent connections on the agent's ports) are
  // counted with the pipes' and logged at most once per 10 s.
  auto refusals = std::make_shared<TransportRefusals>();
  refusals->id = options.id;
  registry_options.token = options.cluster_token;
  registry_options.handshake_timeout = options.handshake_timeout;
  registry_options.on_refused = [refusals](const std::string& why) { refusals->Refused(why); };
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Create(registry_options);
  if (!registry.ok()) return registry.status();
  IgnoreSigpipe();
  std::unique_ptr<AgentImpl> agent(
      new AgentImpl(options, *std::move(registry), *std::move(listener)));
  agent->transport_refusals_ = std::move(refusals);
  if (absl::Status s = agent->Start(); !s.ok()) return s;
  return agent;
}

AgentImpl::AgentImpl(const AgentOptions& options, std::unique_ptr<Registry> registry,
                     std::unique_ptr<Listener> listener)
    : registry_(std::move(registry)), listener_(std::move(listener)) {
  config_.options = options;
  config_.registry = registry_.get();
  config_.self.id = options.id;
}

absl::Status AgentImpl::Start() {
  context_ = std::make_shared<tensorpipe::Context>(tensorpipe::ContextOptions().name(id()));
  registry_->RegisterWith(*context_);
  Listener::Hooks hooks;
  hooks.accepted = [this](std::shared_ptr<tensorpipe::Pipe> pipe) { OnAccepted(std::move(pipe)); };
  hooks.relisten_at = [this](absl::Time when) { RelistenAt(when); };
  if (absl::Status s = listener_->Listen(context_, *registry_, std::move(hooks)); !s.ok()) {
    return s;
  }
  // Fixed from here on: no pipe exists before Accept.
  config_.self.urls = listener_->urls();
  config_.self.transport_domains = registry_->TransportDomains();
  config_.self.channel_cpu_descriptors = registry_->ChannelCpuDescriptors();
  timer_ = std::thread([this] { TimerLoop(); });
  listener_->Accept();
  std::vector<std::string> channels;
  for (const Candidate& channel : registry_->channels()) {
    if (channel.registered) channels.push_back(channel.name);
  }
  AgentLog().info("[agent {}] listening on {} (channels {})", id(), address(),
                  absl::StrJoin(channels, ", "));
  AgentLog().debug("[agent {}] {}", id(), registry_->Describe());
  return absl::OkStatus();
}

AgentImpl::~AgentImpl() {
  std::vector<std::shared_ptr<Pipe>> pipes;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    for (auto& [serial, pipe] : pipes_) pipes.push_back(pipe);
  }
  // Waits for a re-listen in progress; none starts once closed.
  listener_->Close();
  const absl::Status closing = absl::UnavailableError(absl::StrCat("agent ", id(), " is closing"));
  for (const auto& pipe : pipes) pipe->Fail(closing);
  // Closing the context aborts every pipe operation; TensorPipe then calls each pending
  // callback (with an error), and join() returns once all of them have run.
  if (context_ != nullptr) {
    context_->close();
    context_->join();
  }
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock lock(&mu_);
    timer_stop_ = true;
    timer_cv_.Signal();
    // Nothing should be left; whatever is (a call no pipe ever took) ends here.
    for (auto& [id, call] : calls_) {
      if (!call->outcome.has_value()) call->outcome = closing;
      call->write = CallWrite::kWritten;
    }
    std::vector<uint64_t> ids;
    for (auto& [id, call] : calls_) ids.push_back(id);
    for (uint64_t id : ids) TakeDoneIfFinished(*calls_.at(id), &run);
  }
  if (timer_.joinable()) timer_.join();
  for (auto& fn : run) fn();
}

void AgentImpl::SetHandler(Handler handler) {
  absl::MutexLock lock(&mu_);
  handler_ = std::make_shared<const Handler>(std::move(handler));
}

// ---------------------------------------------------------------------------------------------
// The timer: call deadlines, handshake deadlines, chunk timeouts, listening again.

void AgentImpl::TimerLoop() {
  mu_.Lock();
  while (!timer_stop_) {
    const absl::Time now = absl::Now();
    if (relisten_at_ <= now) {
      relisten_at_ = absl::InfiniteFuture();
      mu_.Unlock();
      listener_->Relisten();
      mu_.Lock();
      continue;
    }
    const std::optional<absl::Time> earliest = deadlines_.Earliest();
    if (!earliest.has_value() || *earliest > now) {
      timer_wake_at_ = std::min(earliest.value_or(absl::InfiniteFuture()), relisten_at_);
      timer_cv_.WaitWithDeadline(&mu_, timer_wake_at_);
      timer_wake_at_ = absl::InfinitePast();  // awake: it looks at the queue before sleeping
      continue;
    }
    Due due;
    for (uint64_t id : deadlines_.PopDue(now)) TakeDue(id, now, due);
    if (due.run.empty() && due.late_handshakes.empty() && due.stalled.empty()) continue;
    mu_.Unlock();
    for (auto& fn : due.run) fn();
    for (auto& [pipe, why] : due.stalled) pipe->Close(why);
    for (auto& [pipe, status] : due.late_handshakes) {
      if (!pipe->outbound()) LogAuthFailure("unknown peer", std::string(status.message()));
      pipe->Fail(status);
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

void AgentImpl::TakeDue(uint64_t id, absl::Time now, Due& due) {
  if (auto it = calls_.find(id); it != calls_.end()) {
    ExpireCall(*it->second, due);
  } else if (auto timer = chunk_timers_.find(id); timer != chunk_timers_.end()) {
    std::shared_ptr<Pipe> pipe = timer->second.first.lock();
    const uint64_t call_id = timer->second.second;
    chunk_timers_.erase(timer);
    if (pipe == nullptr) return;
    if (std::optional<std::string> why = pipe->ChunksLate(call_id, now); why.has_value()) {
      due.stalled.emplace_back(std::move(pipe), *std::move(why));
    }
  } else if (auto pipe = pipes_.find(id); pipe != pipes_.end()) {
    std::optional<absl::Status> late = pipe->second->HandshakeLate();
    if (!late.has_value()) return;
    if (!pipe->second->outbound()) ++auth_failures_;
    due.late_handshakes.emplace_back(pipe->second, *std::move(late));
  }
}

void AgentImpl::ExpireCall(Call& call, Due& due) {
  if (call.outcome.has_value()) return;
  call.outcome = absl::DeadlineExceededError(absl::StrCat(
      "method \"", call.method, "\" to ", call.peer.ToString(), ": deadline ",
      DeadlineText(call.deadline), " passed (timeout ",
      absl::FormatDuration(absl::Ceil(call.deadline - call.start, absl::Milliseconds(1))),
      ", call ", call.id, ")"));
  CountCallError(call.peer, call.outcome->status().message());
  if (call.pipe != nullptr) call.pipe->ForgetCall(call.id);
  TakeDoneIfFinished(call, &due.run);
}

void AgentImpl::RelistenAt(absl::Time when) {
  absl::MutexLock lock(&mu_);
  if (closing_) return;
  relisten_at_ = std::min(relisten_at_, when);
  timer_cv_.Signal();
}

// ---------------------------------------------------------------------------------------------
// Pipes.

void AgentImpl::OnAccepted(std::shared_ptr<tensorpipe::Pipe> accepted) {
  std::shared_ptr<Pipe> pipe;
  {
    absl::MutexLock lock(&mu_);
    if (!closing_) {
      pipe = Pipe::Inbound(*this, config_, NextId(), accepted);
      pipes_.emplace(pipe->serial(), pipe);
      AddDeadline(pipe->serial(), absl::Now() + config_.options.handshake_timeout);
    }
  }
  if (pipe == nullptr) {
    accepted->close();
    return;
  }
  pipe->Challenge();
}

std::shared_ptr<Pipe> AgentImpl::NewOutbound(const PeerId& peer, absl::Status* error) {
  const std::string url = UrlToDial(peer, registry_->BootstrapOrder());
  if (url.empty()) {
    *error = absl::UnavailableError(absl::StrCat("no transport in common with ", peer.ToString(),
                                                 ": this agent has ",
                                                 absl::StrJoin(registry_->BootstrapOrder(), ", ")));
    return nullptr;
  }
  if (!UrlIsSafe(url)) {
    *error = absl::InvalidArgumentError(
        absl::StrCat("the address of ", peer.ToString(),
                     " is not a TensorPipe URL with an IP address (uv://10.0.0.2:29501)"));
    return nullptr;
  }
  std::shared_ptr<Pipe> pipe = Pipe::Outbound(*this, config_, NextId(), peer, url);
  pipes_.emplace(pipe->serial(), pipe);
  outbound_[peer] = pipe;
  AddDeadline(pipe->serial(), absl::Now() + config_.options.handshake_timeout);
  PeerCounters& counters = Counters(CountersKey(peer));
  counters.address = peer.address;
  counters.state = PipeState::kConnecting;
  return pipe;
}

void AgentImpl::Forget(const Pipe& pipe, const PeerId& peer, const std::vector<uint64_t>& pending,
                       const absl::Status& status, std::vector<std::function<void()>>* run) {
  pipes_.erase(pipe.serial());
  deadlines_.Remove(pipe.serial());
  if (pipe.outbound()) {
    auto it = outbound_.find(peer);
    if (it != outbound_.end() && it->second.get() == &pipe) outbound_.erase(it);
  }
  for (uint64_t id : pending) {
    auto it = calls_.find(id);
    if (it == calls_.end()) continue;
    Call& call = *it->second;
    if (!call.outcome.has_value()) {
      call.outcome = Prefixed(status, "method \"", call.method, "\": ");
      deadlines_.Remove(id);
    }
    TakeDoneIfFinished(call, run);
  }
}

void AgentImpl::FailPeer(const PeerId& peer, const absl::Status& status) {
  std::vector<std::shared_ptr<Pipe>> matching;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [serial, pipe] : pipes_) {
      if (pipe->Reaches(peer)) matching.push_back(pipe);
    }
  }
  for (const auto& pipe : matching) pipe->Fail(status);
}

void AgentImpl::AddChunkTimer(uint64_t timer_id, std::weak_ptr<Pipe> pipe, uint64_t call_id,
                              absl::Time deadline) {
  chunk_timers_[timer_id] = {std::move(pipe), call_id};
  AddDeadline(timer_id, deadline);
}

void AgentImpl::RemoveChunkTimer(uint64_t timer_id) {
  deadlines_.Remove(timer_id);
  chunk_timers_.erase(timer_id);
}

// ---------------------------------------------------------------------------------------------
// Calls.

void AgentImpl::Send(const PeerId& peer, Message msg, absl::Time deadline, Callback done,
                     Allocator reply_allocator) {
  msg.header.set_kind(v1::AgentMessage::REQUEST);
  if (absl::Status s = PrepareHeader(msg, config_.options.max_message_bytes); !s.ok()) {
    done(Prefixed(s, "method \"", msg.header.method(), "\" to ", peer.ToString(), ": "));
    return;
  }
  auto call = std::make_unique<Call>();
  call->peer = peer;
  call->method = msg.header.method();
  call->start = absl::Now();
  call->deadline = deadline;
  call->bytes = MessageBytes(msg);
  call->msg = std::move(msg);
  call->done = std::move(done);
  call->reply_allocator = std::move(reply_allocator);
  std::shared_ptr<Pipe> pipe;
  bool connect = false;
  bool write_now = false;
  uint64_t call_id = 0;
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (closing_) {
      refused = absl::UnavailableError(absl::StrCat("agent ", id(), " is closing"));
    } else if (deadline <= call->start) {
      refused = absl::DeadlineExceededError(
          absl::StrCat("method \"", call->method, "\" to ", peer.ToString(), ": deadline ",
                       DeadlineText(deadline), " passed before the call was sent"));
    } else if (auto it = outbound_.find(peer); it != outbound_.end()) {
      pipe = it->second;
    } else {
      pipe = NewOutbound(peer, &refused);
      connect = pipe != nullptr;
    }
    if (pipe != nullptr) {
      call_id = call->id = NextId();
      call->msg.header.set_call_id(call_id);
      call->pipe = pipe;
      write_now = pipe->AddCall(call_id);
      calls_.emplace(call_id, std::move(call));
      AddDeadline(call_id, deadline);
      ++Counters(CountersKey(peer)).calls_sent;
    } else {
      CountCallError(peer, refused.message());
    }
  }
  if (pipe == nullptr) {
    call->done(std::move(refused));
    return;
  }
  if (connect) pipe->Connect(*context_);
  if (write_now) WriteCall(pipe, call_id);
}

void AgentImpl::WriteCall(const std::shared_ptr<Pipe>& pipe, uint64_t call_id) {
  Outgoing out;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(call_id);
    if (it == calls_.end()) return;
    Call& call = *it->second;
    if (call.outcome.has_value() || call.write != CallWrite::kNotStarted) return;
    call.write = CallWrite::kWriting;
    if (call.deadline != absl::InfiniteFuture()) {
      call.msg.header.set_timeout_us(
          std::max<int64_t>(1, absl::ToInt64Microseconds(call.deadline - absl::Now())));
    }
    out.message = ToTensorPipe(call.msg);
    out.call_id = call_id;
    out.keepalive = call.msg.keepalive;
    out.node = CountersKey(call.peer);
    out.bytes = call.bytes;
    out.chunk_count = ChunksOf(call.msg).size();
    if (out.chunk_count > 0) {
      out.chunked.header = call.msg.header;
      out.chunked.tensors = call.msg.tensors;
      out.chunked.when_chunk_ready = call.msg.when_chunk_ready;
    }
  }
  Write(pipe, std::move(out),
        [this, call_id](absl::Status status) { OnCallWritten(call_id, status); });
}

void AgentImpl::Write(const std::shared_ptr<Pipe>& pipe, Outgoing out,
                      absl::AnyInvocable<void(absl::Status)> then) {
  auto writes = std::make_shared<Writes>(
      1 + out.chunk_count, [this, node = out.node, bytes = out.bytes, then = std::move(then)](
                               absl::Status status, uint64_t unsent) mutable {
        if (status.ok()) {
          // Counted here, not when the call ends: a call may have its answer (and be gone)
          // before its last write ends.
          absl::MutexLock lock(&mu_);
          Counters(node).bytes_sent += bytes - unsent;
        }
        then(std::move(status));
      });
  pipe->Write(std::move(out.message), std::move(out.reply_node), out.keepalive, writes);
  if (out.chunk_count > 0) {
    pipe->WriteChunks(out.call_id, out.chunked, std::move(out.keepalive), std::move(writes));
  }
}

void AgentImpl::OnCallWritten(uint64_t call_id, const absl::Status& status) {
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(call_id);
    if (it == calls_.end()) return;  // `done` ran already (the message had a keepalive)
    Call& call = *it->second;
    call.write = CallWrite::kWritten;
    if (!status.ok() && !call.outcome.has_value()) {
      Settle(call, Prefixed(status, "method \"", call.method, "\": "));
    }
    TakeDoneIfFinished(call, &run);
  }
  for (auto& fn : run) fn();
}

void AgentImpl::CompleteCall(uint64_t call_id, absl::StatusOr<Message> outcome) {
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(call_id);
    if (it == calls_.end()) return;
    Call& call = *it->second;
    if (call.outcome.has_value()) return;  // late: already failed (deadline); dropped
    if (!outcome.ok()) CountCallError(call.peer, outcome.status().message());
    Settle(call, std::move(outcome));
    TakeDoneIfFinished(call, &run);
  }
  for (auto& fn : run) fn();
}

void AgentImpl::Settle(Call& call, absl::StatusOr<Message> outcome) {
  call.outcome = std::move(outcome);
  if (call.pipe != nullptr) call.pipe->DropPending(call.id);
  deadlines_.Remove(call.id);
}

void AgentImpl::TakeDoneIfFinished(Call& call, std::vector<std::function<void()>>* run) {
  if (!call.outcome.has_value()) return;
  const bool buffers_free = call.write != CallWrite::kWriting;
  if (!buffers_free && call.msg.keepalive == nullptr) return;
  // std::function needs a copyable callable: the move-only pieces travel in a shared_ptr.
  struct Pending {
    Callback done;
    absl::StatusOr<Message> outcome;
  };
  auto pending = std::make_shared<Pending>(Pending{std::move(call.done), *std::move(call.outcome)});
  const uint64_t id = call.id;
  deadlines_.Remove(id);
  calls_.erase(id);  // `call` is gone from here on
  run->push_back([pending] {
    if (pending->done) pending->done(std::move(pending->outcome));
  });
}

std::optional<Allocator> AgentImpl::ReplyAllocator(uint64_t call_id, const Pipe& pipe) {
  auto it = calls_.find(call_id);
  if (it == calls_.end() || it->second->outcome.has_value() || it->second->pipe.get() != &pipe) {
    return std::nullopt;
  }
  return it->second->reply_allocator;
}

void AgentImpl::Respond(const ReplyTo& to, Message response, SentCallback sent) {
  auto finish = [&sent](absl::Status status) {
    if (sent) sent(std::move(status));
  };
  std::shared_ptr<Pipe> pipe = std::static_pointer_cast<Pipe>(to.conn_.lock());
  if (pipe == nullptr) {
    finish(absl::UnavailableError(
        absl::StrCat("the pipe from ", to.node_, " that carried call ", to.call_id_, " is gone")));
    return;
  }
  response.header.set_call_id(to.call_id_);
  if (response.header.kind() != v1::AgentMessage::ERROR) {
    response.header.set_kind(v1::AgentMessage::RESPONSE);
  }
  if (response.header.method().empty()) response.header.set_method(to.method_);
  // What a failure names; only built for one.
  auto what = [&to] {
    return absl::StrCat("response to ", to.node_, " for method \"", to.method_, "\": ");
  };
  if (absl::Status s = PrepareHeader(response, config_.options.max_message_bytes); !s.ok()) {
    finish(Prefixed(s, what()));
    return;
  }
  if (absl::Status pipe_error = pipe->ErrorUnlessReady(); !pipe_error.ok()) {
    finish(absl::UnavailableError(absl::StrCat(what(), pipe_error.message())));
    return;
  }
  if (to.deadline_ != absl::InfiniteFuture() && absl::Now() > to.deadline_) {
    finish(absl::DeadlineExceededError(
        absl::StrCat(what(), "deadline ", DeadlineText(to.deadline_), " passed; not sent")));
    return;
  }
  Outgoing out;
  out.message = ToTensorPipe(response);
  out.reply_node = to.node_;
  out.call_id = to.call_id_;
  out.keepalive = response.keepalive;
  out.node = to.node_;
  out.bytes = MessageBytes(response);
  out.chunk_count = ChunksOf(response).size();
  out.chunked = std::move(response);
  Write(pipe, std::move(out), [sent = std::move(sent)](absl::Status status) mutable {
    if (sent) sent(std::move(status));
  });
}

// ---------------------------------------------------------------------------------------------
// Bookkeeping.

void AgentImpl::AddDeadline(uint64_t id, absl::Time deadline) {
  deadlines_.Add(id, deadline);
  if (deadline < timer_wake_at_) timer_cv_.Signal();
}

void AgentImpl::CountCallError(const PeerId& peer, absl::string_view error) {
  PeerCounters& counters = Counters(CountersKey(peer));
  ++counters.errors;
  counters.last_error = std::string(error);
}

void AgentImpl::TransportRefusals::Refused(const std::string& why) {
  ++count;
  int64_t held = 0;
  if (!log.Admit("transport", &held)) return;
  AgentLog().warn("[agent {}] {}{}", id, why, HeldBack(held, log.interval()));
}

void AgentImpl::LogAuthFailure(const std::string& claimed, const std::string& why) {
  int64_t held = 0;
  if (!auth_log_.Admit(claimed, &held)) return;
  AgentLog().warn("[agent {}] [pipe from/to {}] handshake refused: {}{}", id(), claimed, why,
                  HeldBack(held, auth_log_.interval()));
}

AgentStats AgentImpl::Stats() const {
  AgentStats stats;
  stats.id = id();
  stats.address = address();
  stats.listener_failures = listener_->failures();
  absl::MutexLock lock(&mu_);
  stats.auth_failures = auth_failures_ + transport_refusals_->count.load();
  std::map<std::string, uint64_t> pending;
  for (const auto& [id, call] : calls_) {
    if (!call->outcome.has_value()) ++pending[CountersKey(call->peer)];
  }
  for (const auto& [node, counters] : counters_) {
    PeerStats peer = counters;
    peer.node = node;
    peer.calls_pending = pending[node];
    stats.calls_pending += peer.calls_pending;
    stats.peers.push_back(std::move(peer));
  }
  return stats;
}

}  // namespace tpd::agent
