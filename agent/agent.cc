#include "agent/agent.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <tensorpipe/tensorpipe.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/log.h"
#include "agent/pipe_auth.h"
#include "agent/tp_error.h"
#include "agent/wire.h"
#include "base/check.h"
#include "base/status.h"

namespace tpd::agent {

// One pipe, either direction. Fields marked (mu_) are guarded by Agent::mu_; the handshake
// fields are touched only by the handshake's callbacks, which TensorPipe runs one after the
// other for one pipe (each is started by the one before).
struct Agent::Conn {
  uint64_t serial = 0;
  bool outbound = false;
  std::shared_ptr<tensorpipe::Pipe> pipe;  // (mu_) set once; null until connect() returned
  // Outbound: whom we dialed. Inbound: the node its handshake named and its URLs.
  PeerId peer;                        // (mu_)
  std::string dialed_url;             // outbound: the URL passed to connect()
  PipeState state = PipeState::kConnecting;  // (mu_)
  absl::Status error;                 // (mu_) why it failed
  std::vector<uint64_t> queued;       // (mu_) outbound: calls waiting for the handshake
  absl::flat_hash_set<uint64_t> pending;  // (mu_) outbound: calls awaiting their answer
  std::string transport;              // (mu_) what TensorPipe picked (derived)
  std::string channel;                // (mu_)
  // What the peer offered in its hello (transport and channel names), for Stats. (mu_)
  std::vector<std::string> peer_transports;
  std::vector<std::string> peer_channels;
  // Messages read from this pipe whose chunks are still arriving, by call id. (mu_)
  absl::flat_hash_map<uint64_t, std::shared_ptr<Incoming>> incoming;
  // Handshake.
  std::string challenge_nonce;
  PipeTranscript transcript;
};

// A message being read: from its descriptor until it is delivered (or its pipe failed). Set
// up before its reads start; the fields marked (mu_) change as its parts land.
struct Agent::Incoming {
  std::shared_ptr<v1::AgentMessage> header;
  std::shared_ptr<Message> message;
  // A request that is refused is answered with this (its bytes are read and dropped).
  absl::Status refused;
  std::shared_ptr<const Handler> handler;
  std::function<void(size_t, uint64_t, uint64_t)> on_chunk;  // the destination's
  absl::Time received;
  // Chunked messages only.
  uint64_t timer_id = 0;                      // its chunk_timeout, in deadlines_
  absl::Time complete_by;                     // every chunk in by then (min_chunk_rate)
  std::vector<std::vector<bool>> chunk_seen;  // (mu_) per tensor; empty for unchunked ones
  uint64_t chunks_left = 0;                   // (mu_) chunks not read yet
  bool main_read = false;                     // (mu_) the message itself was read
  bool finished = false;                      // (mu_) handed on (or dropped)
  absl::Status chunk_error;                   // (mu_) a chunk its sender could not produce
};

// The writes of one message (itself and its chunks): `done` runs once, when the last ended,
// with the first error and the bytes of chunks sent as errors instead of their bytes.
class Agent::Writes {
 public:
  Writes(size_t count, absl::AnyInvocable<void(absl::Status, uint64_t unsent)> done)
      : left_(count), done_(std::move(done)) {}

  void End(const absl::Status& status, uint64_t unsent = 0) {
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

 private:
  absl::Mutex mu_;
  size_t left_ ABSL_GUARDED_BY(mu_);
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  uint64_t unsent_ ABSL_GUARDED_BY(mu_) = 0;
  absl::AnyInvocable<void(absl::Status, uint64_t)> done_;
};

// One call from Send until its `done` is taken. All fields (mu_).
struct Agent::Call {
  uint64_t id = 0;
  PeerId peer;
  std::string method;
  absl::Time start;
  absl::Time deadline = absl::InfiniteFuture();
  Message msg;
  uint64_t bytes = 0;
  Callback done;
  Allocator reply_allocator;
  std::shared_ptr<Conn> conn;
  bool write_started = false;
  bool write_finished = false;
  std::optional<absl::StatusOr<Message>> outcome;
};

namespace {

// Messages one pipe may have waiting for their chunks at once (each holds memory placed for
// its tensors until they came).
constexpr size_t kMaxChunkedMessagesPerPipe = 1024;
constexpr absl::Duration kAuthLogInterval = absl::Seconds(10);
// How soon after a listener failure the agent tries to listen again, and how often while the
// old listener's port is not free yet.
constexpr absl::Duration kRelistenDelay = absl::Milliseconds(20);

std::string CountersKey(const PeerId& peer) {
  return peer.node.empty() ? peer.address : peer.node;
}

// "host:port" -> host, port; IPv6 hosts in brackets. The host must be an IP literal (TensorPipe
// aborts the process on anything else).
absl::Status SplitHostPort(absl::string_view address, std::string* host, std::string* port,
                           int* family) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("\"", address, "\" is not host:port"));
  }
  absl::string_view h = address.substr(0, colon);
  absl::string_view p = address.substr(colon + 1);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  int port_number = 0;
  if (!absl::SimpleAtoi(p, &port_number) || port_number < 0 || port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", address, "\": the port must be 0..65535"));
  }
  unsigned char buf[sizeof(in6_addr)];
  const std::string host_string(h);
  if (inet_pton(AF_INET, host_string.c_str(), buf) == 1) {
    *family = AF_INET;
  } else if (inet_pton(AF_INET6, host_string.c_str(), buf) == 1) {
    *family = AF_INET6;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", address, "\": the host must be an IP address (TensorPipe resolves no names)"));
  }
  *host = host_string;
  *port = std::string(p);
  return absl::OkStatus();
}

// Whether TensorPipe can be given `url` without aborting: uv:// and ibv:// need an IP literal
// (and optional port); shm:// any non-empty name.
bool UrlIsSafe(absl::string_view url) {
  if (absl::ConsumePrefix(&url, "shm://")) return !url.empty() && url.size() < 100;
  if (!absl::ConsumePrefix(&url, "uv://") && !absl::ConsumePrefix(&url, "ibv://")) return false;
  std::string host, port;
  int family = 0;
  if (SplitHostPort(url, &host, &port, &family).ok()) return true;
  unsigned char buf[sizeof(in6_addr)];
  const std::string bare(url);
  return inet_pton(AF_INET, bare.c_str(), buf) == 1;
}

// Binds a throwaway socket where the uv listener will bind, because TensorPipe aborts the
// process when its own bind fails. A port taken between this check and TensorPipe's bind
// still aborts; a fixed port is the operator's to keep free.
absl::Status CheckBindable(const std::string& host, const std::string& port, int family,
                           const std::string& option_text) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", option_text, ": socket: ", std::strerror(errno)));
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_storage storage{};
  socklen_t length = 0;
  const int port_number = std::stoi(port);
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&storage);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port_number));
    inet_pton(AF_INET, host.c_str(), &in->sin_addr);
    length = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port_number));
    inet_pton(AF_INET6, host.c_str(), &in6->sin6_addr);
    length = sizeof(sockaddr_in6);
  }
  int rc = bind(fd, reinterpret_cast<sockaddr*>(&storage), length);
  if (rc == 0) rc = listen(fd, 1);
  const int saved = errno;
  close(fd);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", option_text, ": ",
                                               std::strerror(saved),
                                               saved == EADDRINUSE ? " (another tpd?)" : ""));
  }
  return absl::OkStatus();
}

// "pipe to node-b (uv://...) failed", for an error TensorPipe reported on a pipe.
std::string PipeFailed(bool outbound, const PeerId& peer) {
  return absl::StrCat("pipe ", outbound ? "to " : "from ", peer.ToString(), " failed");
}

std::vector<std::string> ToVector(const google::protobuf::RepeatedPtrField<std::string>& field) {
  return std::vector<std::string>(field.begin(), field.end());
}

std::map<std::string, std::string> ToMap(
    const google::protobuf::Map<std::string, std::string>& field) {
  return std::map<std::string, std::string>(field.begin(), field.end());
}

// The names a peer offered, sorted (a proto map's order is unspecified), at most 32 of at
// most 64 bytes each: only Stats shows them.
std::vector<std::string> Keys(const google::protobuf::Map<std::string, std::string>& field) {
  std::vector<std::string> keys;
  for (const auto& [name, value] : field) {
    if (keys.size() == 32) break;
    keys.push_back(name.substr(0, 64));
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

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

}  // namespace

const char* PipeStateName(PipeState state) {
  switch (state) {
    case PipeState::kNone:
      return "none";
    case PipeState::kConnecting:
      return "connecting";
    case PipeState::kReady:
      return "ready";
    case PipeState::kFailed:
      return "failed";
  }
  return "?";
}

std::string PeerId::ToString() const {
  if (node.empty()) return absl::StrCat("peer (", address, ")");
  return absl::StrCat(node, " (", address, ")");
}

// ---------------------------------------------------------------------------------------------
// Creation and destruction.

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(const AgentOptions& options) {
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
  std::string host, port;
  int family = 0;
  if (absl::Status s = SplitHostPort(options.listen_address, &host, &port, &family); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent listen_address: ", s.message()));
  }
  absl::StatusOr<ListenGuard> guard = ListenGuard::Create(options.accept_networks);
  if (!guard.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("agent ", guard.status().message()));
  }
  const std::string option_text = absl::StrCat(options.listen_address, " (agent listen_address)");
  if (absl::Status s = CheckBindable(host, port, family, option_text); !s.ok()) return s;
  if (port != "0") {
    // The mpt_uv lanes bind the same host on free ports.
    if (absl::Status s = CheckBindable(host, "0", family, option_text); !s.ok()) return s;
  }
  // The listening sockets this process has now: those bound to `host` that appear from here
  // on are ours (the mpt_uv lanes listen inside Registry::Create, on ports TensorPipe keeps to
  // itself). A listener another thread opens on `host` meanwhile would be guarded too.
  absl::flat_hash_set<uint64_t> sockets_before;
  if (absl::Status s = ForEachListeningTcpSocket(
          [&](const ListeningSocket& socket) { sockets_before.insert(socket.inode); });
      !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot guard the agent's ports with accept_networks: ", s.message()));
  }
  RegistryOptions registry_options;
  registry_options.transports = options.transports;
  registry_options.channels = options.channels;
  registry_options.host = host;
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
  std::unique_ptr<Agent> agent(new Agent(options, *std::move(registry)));
  agent->transport_refusals_ = std::move(refusals);
  agent->listen_port_ = port;
  agent->listen_host_ = host;
  agent->listen_family_ = family;
  const int parsed = inet_pton(family, host.c_str(), agent->listen_host_bytes_.data());
  TPD_DCHECK(parsed == 1);  // SplitHostPort took it
  agent->guard_ = *std::move(guard);
  agent->sockets_before_ = std::move(sockets_before);
  if (absl::Status s = agent->Start(); !s.ok()) return s;
  return agent;
}

Agent::Agent(const AgentOptions& options, std::unique_ptr<Registry> registry)
    : options_(options), registry_(std::move(registry)) {}

absl::Status Agent::Start() {
  context_ = std::make_shared<tensorpipe::Context>(tensorpipe::ContextOptions().name(options_.id));
  registry_->RegisterWith(*context_);
  const std::map<std::string, std::string> listen_urls = registry_->ListenUrls(listen_port_);
  std::vector<std::string> to_listen;
  const std::vector<std::string> order = registry_->BootstrapOrder();
  for (const std::string& transport : order) to_listen.push_back(listen_urls.at(transport));
  std::shared_ptr<tensorpipe::Listener> listener = context_->listen(to_listen);
  // url() waits for TensorPipe's loop, so every transport listens by the time it returns.
  for (const std::string& transport : order) urls_.push_back(listener->url(transport));
  address_ = absl::StrJoin(urls_, ",");
  {
    absl::MutexLock lock(&mu_);
    listener_ = listener;  // ~Agent closes it if the guard below fails
  }
  for (const std::string& url : urls_) {
    if (absl::StartsWith(url, "uv://")) {
      const bool parsed = absl::SimpleAtoi(url.substr(url.rfind(':') + 1), &uv_port_);
      TPD_DCHECK(parsed);
    }
  }
  // Ours: the listening sockets on listen_host_ that Create and listen() made.
  absl::Status listed = ForEachListeningTcpSocket([&](const ListeningSocket& socket) {
    if (!sockets_before_.contains(socket.inode) && socket.family == listen_family_ &&
        socket.address == listen_host_bytes_) {
      guarded_ports_.insert(socket.port);
    }
  });
  if (!listed.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot guard the agent's ports with accept_networks: ", listed.message()));
  }
  if (absl::Status s = GuardListeners(/*at_start=*/true); !s.ok()) return s;
  timer_ = std::thread([this] { TimerLoop(); });
  Accept(listener);
  std::vector<std::string> channels;
  for (const Candidate& channel : registry_->channels()) {
    if (channel.registered) channels.push_back(channel.name);
  }
  AgentLog().info("[agent {}] listening on {} (channels {})", options_.id, address_,
                  absl::StrJoin(channels, ", "));
  AgentLog().debug("[agent {}] {}", options_.id, registry_->Describe());
  return absl::OkStatus();
}

absl::Status Agent::GuardListeners(bool at_start) {
  const char* when = at_start ? "at start" : "after listening again";
  absl::StatusOr<std::vector<int>> guarded =
      GuardListeningSockets(*guard_, listen_family_, listen_host_bytes_, guarded_ports_);
  if (!guarded.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot guard the agent's ports with accept_networks ", when, ": ",
        guarded.status().message()));
  }
  if (uv_port_ >= 0 &&
      std::find(guarded->begin(), guarded->end(), uv_port_) == guarded->end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot guard the agent's ports with accept_networks ", when,
        ": no listening socket of this process on the uv port ", uv_port_));
  }
  std::sort(guarded->begin(), guarded->end());
  // Once at info; re-listens (which anyone inside accept_networks can cause) at debug.
  AgentLog().log(at_start ? spdlog::level::info : spdlog::level::debug,
                 "[agent {}] only hosts in accept_networks ({}) may connect to ports {} ({})",
                 options_.id, guard_->ToString(), absl::StrJoin(*guarded, ", "), when);
  return absl::OkStatus();
}

Agent::~Agent() {
  std::vector<std::shared_ptr<Conn>> conns;
  std::shared_ptr<tensorpipe::Listener> listener;
  {
    // Waits for a Relisten in progress; none starts once closing_ is set.
    absl::MutexLock relisten(&relisten_mu_);
    absl::MutexLock lock(&mu_);
    closing_ = true;
    for (auto& [serial, conn] : conns_) conns.push_back(conn);
    listener = listener_;
  }
  if (listener != nullptr) listener->close();
  const absl::Status closing =
      absl::UnavailableError(absl::StrCat("agent ", options_.id, " is closing"));
  for (const auto& conn : conns) FailConn(conn, closing);
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
      call->write_finished = true;
    }
    std::vector<uint64_t> ids;
    for (auto& [id, call] : calls_) ids.push_back(id);
    for (uint64_t id : ids) TakeDoneIfFinished(*calls_.at(id), &run);
  }
  if (timer_.joinable()) timer_.join();
  for (auto& fn : run) fn();
}

void Agent::SetHandler(Handler handler) {
  absl::MutexLock lock(&mu_);
  handler_ = std::make_shared<const Handler>(std::move(handler));
}

// ---------------------------------------------------------------------------------------------
// The timer: call deadlines and handshake deadlines.

void Agent::TimerLoop() {
  mu_.Lock();
  while (!timer_stop_) {
    const absl::Time now = absl::Now();
    if (relisten_at_ <= now) {
      relisten_at_ = absl::InfiniteFuture();
      mu_.Unlock();
      Relisten();
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
    std::vector<std::function<void()>> run;
    std::vector<std::pair<std::shared_ptr<Conn>, absl::Status>> late_handshakes;
    std::vector<std::tuple<std::shared_ptr<Conn>, PeerId, std::string>> stalled;
    for (uint64_t id : deadlines_.PopDue(now)) {
      if (auto it = calls_.find(id); it != calls_.end()) {
        Call& call = *it->second;
        if (call.outcome.has_value()) continue;
        call.outcome = absl::DeadlineExceededError(absl::StrCat(
            "method \"", call.method, "\" to ", call.peer.ToString(), ": deadline ",
            DeadlineText(call.deadline), " passed (timeout ",
            absl::FormatDuration(absl::Ceil(call.deadline - call.start, absl::Milliseconds(1))),
            ", call ", call.id, ")"));
        PeerCounters& counters = Counters(CountersKey(call.peer));
        ++counters.errors;
        counters.last_error = std::string(call.outcome->status().message());
        if (call.conn != nullptr) {
          call.conn->pending.erase(id);
          auto& queued = call.conn->queued;
          queued.erase(std::remove(queued.begin(), queued.end(), id), queued.end());
        }
        TakeDoneIfFinished(call, &run);
      } else if (auto timer = chunk_timers_.find(id); timer != chunk_timers_.end()) {
        std::shared_ptr<Conn> conn = timer->second.first.lock();
        const uint64_t call_id = timer->second.second;
        chunk_timers_.erase(timer);
        if (conn == nullptr || conn->state == PipeState::kFailed) continue;
        auto waiting = conn->incoming.find(call_id);
        const bool too_slow = waiting != conn->incoming.end() &&
                              now >= waiting->second->complete_by;
        stalled.emplace_back(
            conn, conn->peer,
            too_slow ? absl::StrCat("the chunks of message ", call_id, " did not all come within ",
                                    absl::FormatDuration(absl::Trunc(
                                        waiting->second->complete_by - waiting->second->received,
                                        absl::Milliseconds(1))),
                                    " (chunk_timeout plus their bytes at min_chunk_rate, ",
                                    options_.min_chunk_rate, " B/s)")
                     : absl::StrCat("the chunks of message ", call_id, " stopped coming: none for ",
                                    absl::FormatDuration(options_.chunk_timeout)));
      } else if (auto conn_it = conns_.find(id); conn_it != conns_.end()) {
        const std::shared_ptr<Conn>& conn = conn_it->second;
        if (conn->state != PipeState::kConnecting) continue;
        if (!conn->outbound) ++auth_failures_;
        late_handshakes.emplace_back(
            conn, absl::UnavailableError(absl::StrCat(
                      conn->outbound ? absl::StrCat("pipe to ", conn->peer.ToString())
                                     : std::string("a pipe accepted from an unknown peer"),
                      ": the handshake did not finish within ",
                      absl::FormatDuration(options_.handshake_timeout))));
      }
    }
    if (run.empty() && late_handshakes.empty() && stalled.empty()) continue;
    mu_.Unlock();
    for (auto& fn : run) fn();
    for (auto& [conn, peer, why] : stalled) ClosePipe(conn, peer, why);
    for (auto& [conn, status] : late_handshakes) {
      if (!conn->outbound) LogAuthFailure("unknown peer", std::string(status.message()));
      FailConn(conn, status);
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

// ---------------------------------------------------------------------------------------------
// Listener side of the handshake.

void Agent::Accept(std::shared_ptr<tensorpipe::Listener> listener) {
  std::weak_ptr<tensorpipe::Listener> weak = listener;
  listener->accept(
      [this, weak](const tensorpipe::Error& error, std::shared_ptr<tensorpipe::Pipe> pipe) {
        if (error) {
          OnListenerFailed(error.what());
          return;
        }
        if (std::shared_ptr<tensorpipe::Listener> still = weak.lock()) Accept(std::move(still));
        OnAccepted(std::move(pipe));
      });
}

void Agent::OnListenerFailed(const std::string& what) {
  uint64_t unlogged = 0;
  bool log = false;
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    ++listener_failures_;
    const absl::Time now = absl::Now();
    if (now - listener_failure_logged_ >= kAuthLogInterval) {
      log = true;
      unlogged = listener_failures_unlogged_;
      listener_failures_unlogged_ = 0;
      listener_failure_logged_ = now;
    } else {
      ++listener_failures_unlogged_;
    }
    relisten_at_ = std::min(relisten_at_, now + kRelistenDelay);
    timer_cv_.Signal();
  }
  if (log) {
    AgentLog().warn(
        "[agent {}] TensorPipe's listener failed: {}{}; listening again on {} (a "
        "connection that closes before its first packet does this: a port scan, "
        "a peer gone mid-connect)",
        options_.id, what,
        unlogged > 0 ? absl::StrCat(" (and ", unlogged, " more times in the last ",
                                    absl::FormatDuration(kAuthLogInterval), ")")
                     : std::string(),
        address_);
  }
}

void Agent::Relisten() {
  absl::MutexLock relisten(&relisten_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
  }
  // TensorPipe aborts the process when the uv listener's bind fails, and the failed listener
  // closes its socket on TensorPipe's loop, some time after it reported the failure: listen
  // only once the port is free (the shm listener's name is no risk: its bind failing is an
  // error, which brings us back here).
  for (const std::string& url : urls_) {
    if (!absl::StartsWith(url, "uv://")) continue;
    const std::string port = url.substr(url.rfind(':') + 1);
    if (!CheckBindable(listen_host_, port, listen_family_, url).ok()) {
      absl::MutexLock lock(&mu_);
      relisten_at_ = std::min(relisten_at_, absl::Now() + kRelistenDelay);
      return;
    }
  }
  std::shared_ptr<tensorpipe::Listener> listener = context_->listen(urls_);
  const std::vector<std::string> order = registry_->BootstrapOrder();
  for (size_t i = 0; i < order.size() && i < urls_.size(); ++i) {
    if (listener->url(order[i]) != urls_[i]) {
      AgentLog().error(
          "[agent {}] listening again on {} gave {}; peers that have the old URL "
          "cannot reach this agent",
          options_.id, urls_[i], listener->url(order[i]));
    }
  }
  if (absl::Status s = GuardListeners(/*at_start=*/false); !s.ok()) {
    // Fail closed: an unguarded listener never accepts. Closing it fails no pipe (accepted
    // pipes do not depend on it); the next attempt comes in a second.
    AgentLog().error("[agent {}] {}; not accepting pipes until it can, retrying in 1s",
                     options_.id, std::string(s.message()));
    listener->close();
    absl::MutexLock lock(&mu_);
    relisten_at_ = std::min(relisten_at_, absl::Now() + absl::Seconds(1));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    listener_ = listener;  // not closing_: ~Agent waits for relisten_mu_ before it sets it
  }
  Accept(std::move(listener));
}

void Agent::OnAccepted(std::shared_ptr<tensorpipe::Pipe> pipe) {
  auto conn = std::make_shared<Conn>();
  conn->outbound = false;
  conn->challenge_nonce = NewPipeNonce();
  bool closing;
  {
    absl::MutexLock lock(&mu_);
    closing = closing_;
    if (!closing) {
      conn->pipe = pipe;
      conn->serial = next_id_++;
      conns_.emplace(conn->serial, conn);
      AddDeadline(conn->serial, absl::Now() + options_.handshake_timeout);
    }
  }
  if (closing) {
    pipe->close();
    return;
  }
  v1::PipeHello challenge;
  challenge.set_version(std::string(kPipeAuthVersion));
  challenge.set_step(v1::PipeHello::CHALLENGE);
  challenge.set_nonce(conn->challenge_nonce);
  challenge.set_agent_id(options_.id);
  for (const std::string& url : urls_) challenge.add_urls(url);
  for (const auto& [name, domain] : registry_->TransportDomains()) {
    (*challenge.mutable_transport_domains())[name] = domain;
  }
  for (const auto& [name, descriptor] : registry_->ChannelCpuDescriptors()) {
    (*challenge.mutable_channel_cpu_descriptors())[name] = descriptor;
  }
  WriteHello(conn, challenge);
  ReadHello(conn, &Agent::OnAnswer);
}

void Agent::OnAnswer(const std::shared_ptr<Conn>& conn, const tensorpipe::Descriptor& descriptor) {
  v1::PipeHello answer;
  const std::string remote_name = conn->pipe->getRemoteName();
  if (absl::Status s = ParseHello(descriptor, v1::PipeHello::ANSWER, &answer); !s.ok()) {
    RejectHandshake(conn, ClaimedPeer(answer, remote_name), std::string(s.message()));
    return;
  }
  conn->transcript.challenge_nonce = conn->challenge_nonce;
  conn->transcript.answer_nonce = answer.nonce();
  conn->transcript.acceptor_id = options_.id;
  conn->transcript.acceptor_urls = urls_;
  conn->transcript.dialed_url = answer.dialed_url();
  conn->transcript.connector_id = answer.agent_id();
  conn->transcript.connector_urls = ToVector(answer.urls());
  // The MAC first: someone without the token learns nothing from which check failed.
  if (!VerifyPipeMac(options_.cluster_token, PipeMacRole::kAnswer, conn->transcript,
                     answer.mac())) {
    RejectHandshake(conn, ClaimedPeer(answer, remote_name),
                    "bad MAC in its answer (another cluster token?)");
    return;
  }
  if (!DialedUrlIsOurs(answer.dialed_url(), urls_)) {
    RejectHandshake(conn, ClaimedPeer(answer, remote_name),
                    absl::StrCat("it dialed ", answer.dialed_url().substr(0, 200),
                                 ", which is not this agent's address ", address_,
                                 " (a relayed handshake?)"));
    return;
  }
  v1::PipeHello proof;
  proof.set_version(std::string(kPipeAuthVersion));
  proof.set_step(v1::PipeHello::PROOF);
  proof.set_mac(ComputePipeMac(options_.cluster_token, PipeMacRole::kProof, conn->transcript));
  WriteHello(conn, proof);
  {
    absl::MutexLock lock(&mu_);
    conn->peer.node = answer.agent_id();
    conn->peer.address = absl::StrJoin(answer.urls(), ",");
    conn->transport = registry_->PickTransport(ToMap(answer.transport_domains()));
    conn->channel = registry_->PickChannel(ToMap(answer.channel_cpu_descriptors()));
    conn->peer_transports = Keys(answer.transport_domains());
    conn->peer_channels = Keys(answer.channel_cpu_descriptors());
  }
  BecomeReady(conn);
}

// ---------------------------------------------------------------------------------------------
// Connector side of the handshake.

std::shared_ptr<Agent::Conn> Agent::NewOutbound(const PeerId& peer, absl::Status* error) {
  std::vector<std::string> peer_urls = absl::StrSplit(peer.address, ',', absl::SkipEmpty());
  std::string url;
  for (const std::string& transport : registry_->BootstrapOrder()) {
    for (const std::string& candidate : peer_urls) {
      if (absl::StartsWith(candidate, absl::StrCat(transport, "://"))) {
        url = candidate;
        break;
      }
    }
    if (!url.empty()) break;
  }
  if (url.empty()) {
    *error = absl::UnavailableError(absl::StrCat(
        "no transport in common with ", peer.ToString(), ": this agent has ",
        absl::StrJoin(registry_->BootstrapOrder(), ", ")));
    return nullptr;
  }
  if (!UrlIsSafe(url)) {
    *error = absl::InvalidArgumentError(
        absl::StrCat("the address of ", peer.ToString(),
                     " is not a TensorPipe URL with an IP address (uv://10.0.0.2:29501)"));
    return nullptr;
  }
  auto conn = std::make_shared<Conn>();
  conn->outbound = true;
  conn->peer = peer;
  conn->dialed_url = url;
  conn->serial = next_id_++;
  conns_.emplace(conn->serial, conn);
  outbound_[peer] = conn;
  AddDeadline(conn->serial, absl::Now() + options_.handshake_timeout);
  PeerCounters& counters = Counters(CountersKey(peer));
  counters.address = peer.address;
  counters.state = PipeState::kConnecting;
  return conn;
}

void Agent::Connect(const std::shared_ptr<Conn>& conn) {
  std::shared_ptr<tensorpipe::Pipe> pipe = context_->connect(
      conn->dialed_url, tensorpipe::PipeOptions().remoteName(conn->peer.node));
  bool failed;
  {
    absl::MutexLock lock(&mu_);
    conn->pipe = pipe;
    failed = conn->state == PipeState::kFailed;
  }
  if (failed) {
    // Failed before it had a pipe (FailPeer, the agent closing): FailConn could not close it.
    pipe->close();
    return;
  }
  ReadHello(conn, &Agent::OnChallenge);
}

void Agent::OnChallenge(const std::shared_ptr<Conn>& conn,
                        const tensorpipe::Descriptor& descriptor) {
  v1::PipeHello challenge;
  const std::string remote_name = conn->pipe->getRemoteName();
  if (absl::Status s = ParseHello(descriptor, v1::PipeHello::CHALLENGE, &challenge); !s.ok()) {
    RejectHandshake(conn, ClaimedPeer(challenge, remote_name), std::string(s.message()));
    return;
  }
  PeerId peer;
  {
    absl::MutexLock lock(&mu_);
    peer = conn->peer;
  }
  if (!peer.node.empty() && challenge.agent_id() != peer.node) {
    RejectHandshake(conn, ClaimedPeer(challenge, remote_name),
                    absl::StrCat("the agent at ", conn->dialed_url, " is \"",
                                 challenge.agent_id().substr(0, kMaxIdBytes), "\", not \"",
                                 peer.node, "\""));
    return;
  }
  conn->transcript.challenge_nonce = challenge.nonce();
  conn->transcript.answer_nonce = NewPipeNonce();
  conn->transcript.acceptor_id = challenge.agent_id();
  conn->transcript.acceptor_urls = ToVector(challenge.urls());
  conn->transcript.dialed_url = conn->dialed_url;
  conn->transcript.connector_id = options_.id;
  conn->transcript.connector_urls = urls_;
  v1::PipeHello answer;
  answer.set_version(std::string(kPipeAuthVersion));
  answer.set_step(v1::PipeHello::ANSWER);
  answer.set_nonce(conn->transcript.answer_nonce);
  answer.set_agent_id(options_.id);
  for (const std::string& url : urls_) answer.add_urls(url);
  answer.set_dialed_url(conn->dialed_url);
  answer.set_mac(ComputePipeMac(options_.cluster_token, PipeMacRole::kAnswer, conn->transcript));
  for (const auto& [name, domain] : registry_->TransportDomains()) {
    (*answer.mutable_transport_domains())[name] = domain;
  }
  for (const auto& [name, cpu] : registry_->ChannelCpuDescriptors()) {
    (*answer.mutable_channel_cpu_descriptors())[name] = cpu;
  }
  {
    absl::MutexLock lock(&mu_);
    conn->transport = registry_->PickTransport(ToMap(challenge.transport_domains()));
    conn->channel = registry_->PickChannel(ToMap(challenge.channel_cpu_descriptors()));
    conn->peer_transports = Keys(challenge.transport_domains());
    conn->peer_channels = Keys(challenge.channel_cpu_descriptors());
  }
  WriteHello(conn, answer);
  ReadHello(conn, &Agent::OnProof);
}

void Agent::OnProof(const std::shared_ptr<Conn>& conn, const tensorpipe::Descriptor& descriptor) {
  v1::PipeHello proof;
  const std::string claimed = conn->peer.ToString();
  if (absl::Status s = ParseHello(descriptor, v1::PipeHello::PROOF, &proof); !s.ok()) {
    RejectHandshake(conn, claimed, std::string(s.message()));
    return;
  }
  if (!VerifyPipeMac(options_.cluster_token, PipeMacRole::kProof, conn->transcript,
                     proof.mac())) {
    RejectHandshake(conn, claimed, "bad MAC in its proof (another cluster token?)");
    return;
  }
  BecomeReady(conn);
}

// ---------------------------------------------------------------------------------------------
// Handshake plumbing.

void Agent::ReadHello(const std::shared_ptr<Conn>& conn,
                      void (Agent::*next)(const std::shared_ptr<Conn>&,
                                          const tensorpipe::Descriptor&)) {
  conn->pipe->readDescriptor(
      [this, conn, next](const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
        if (error) {
          PeerId peer;
          {
            absl::MutexLock lock(&mu_);
            peer = conn->peer;
          }
          const std::string who =
              conn->outbound ? absl::StrCat("pipe to ", peer.ToString())
                             : std::string("a pipe accepted from an unauthenticated peer");
          absl::Status status = TensorPipeErrorToStatus(
              error, absl::StrCat(who, " closed during the handshake",
                                  conn->outbound ? " (does the peer have this cluster token?)"
                                                 : ""));
          FailConn(conn, status);
          return;
        }
        if (descriptor.payloads.empty() && descriptor.tensors.empty()) {
          // Every descriptor must be followed by a read, even of nothing.
          conn->pipe->read(tensorpipe::Allocation{}, [](const tensorpipe::Error&) {});
        }
        (this->*next)(conn, descriptor);
      });
}

void Agent::WriteHello(const std::shared_ptr<Conn>& conn, const v1::PipeHello& hello) {
  tensorpipe::Message message;
  message.metadata = hello.SerializeAsString();
  conn->pipe->write(std::move(message), [this, conn](const tensorpipe::Error& error) {
    if (error) FailConn(conn, TensorPipeErrorToStatus(error, "writing a handshake message"));
  });
}

void Agent::RejectHandshake(const std::shared_ptr<Conn>& conn, const std::string& claimed,
                            const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    ++auth_failures_;
  }
  LogAuthFailure(claimed, why);
  if (conn->outbound) {
    PeerId peer;
    {
      absl::MutexLock lock(&mu_);
      peer = conn->peer;
    }
    FailConn(conn, absl::UnauthenticatedError(absl::StrCat(
                       "pipe to ", peer.ToString(), " refused: ", why)));
  } else {
    FailConn(conn, absl::UnauthenticatedError(absl::StrCat("pipe from ", claimed,
                                                           " refused: ", why)));
  }
}

void Agent::TransportRefusals::Refused(const std::string& why) {
  ++count;
  int64_t held = 0;
  if (!log.Admit("transport", &held)) return;
  AgentLog().warn("[agent {}] {}{}", id, why, HeldBack(held, log.interval()));
}

void Agent::LogAuthFailure(const std::string& claimed, const std::string& why) {
  int64_t held = 0;
  if (!auth_log_.Admit(claimed, &held)) return;
  AgentLog().warn("[agent {}] [pipe from/to {}] handshake refused: {}{}", options_.id, claimed,
                  why, HeldBack(held, auth_log_.interval()));
}

void Agent::BecomeReady(const std::shared_ptr<Conn>& conn) {
  std::vector<uint64_t> queued;
  {
    absl::MutexLock lock(&mu_);
    if (conn->state != PipeState::kConnecting) return;
    conn->state = PipeState::kReady;
    deadlines_.Remove(conn->serial);
    queued = std::move(conn->queued);
    conn->queued.clear();
    PeerCounters& counters = Counters(CountersKey(conn->peer));
    counters.transport = conn->transport;
    counters.channel = conn->channel;
    counters.peer_transports = conn->peer_transports;
    counters.peer_channels = conn->peer_channels;
    if (conn->outbound) {
      counters.state = PipeState::kReady;
    } else {
      ++counters.inbound_pipes;
    }
  }
  AgentLog().debug("[agent {}] [peer {}] pipe {} ready ({} + {})", options_.id,
                   conn->peer.ToString(), conn->outbound ? "to" : "from", conn->transport,
                   conn->channel);
  ReadNext(conn);
  for (uint64_t id : queued) WriteCall(conn, id);
}

// ---------------------------------------------------------------------------------------------
// Calls.

void Agent::Send(const PeerId& peer, Message msg, absl::Time deadline, Callback done,
                 Allocator reply_allocator) {
  msg.header.set_kind(v1::AgentMessage::REQUEST);
  if (absl::Status s = PrepareHeader(msg, options_.max_message_bytes); !s.ok()) {
    done(Prefixed(s, "method \"", msg.header.method(), "\" to ", peer.ToString(), ": "));
    return;
  }
  const absl::Time now = absl::Now();
  std::shared_ptr<Conn> conn;
  bool connect = false;
  bool write_now = false;
  uint64_t id = 0;
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (closing_) {
      refused = absl::UnavailableError(absl::StrCat("agent ", options_.id, " is closing"));
    } else if (deadline <= now) {
      refused = absl::DeadlineExceededError(
          absl::StrCat("method \"", msg.header.method(), "\" to ", peer.ToString(),
                       ": deadline ", DeadlineText(deadline), " passed before the call was sent"));
    } else {
      auto it = outbound_.find(peer);
      if (it != outbound_.end()) {
        conn = it->second;
      } else {
        conn = NewOutbound(peer, &refused);
        connect = conn != nullptr;
      }
    }
    if (conn != nullptr) {
      id = next_id_++;
      msg.header.set_call_id(id);
      auto call = std::make_unique<Call>();
      call->id = id;
      call->peer = peer;
      call->method = msg.header.method();
      call->start = now;
      call->deadline = deadline;
      call->bytes = MessageBytes(msg);
      call->msg = std::move(msg);
      call->done = std::move(done);
      call->reply_allocator = std::move(reply_allocator);
      call->conn = conn;
      conn->pending.insert(id);
      if (conn->state == PipeState::kReady) {
        write_now = true;
      } else {
        conn->queued.push_back(id);
      }
      calls_.emplace(id, std::move(call));
      AddDeadline(id, deadline);
      ++Counters(CountersKey(peer)).calls_sent;
    } else {
      PeerCounters& counters = Counters(CountersKey(peer));
      ++counters.errors;
      counters.last_error = std::string(refused.message());
    }
  }
  if (conn == nullptr) {
    done(std::move(refused));
    return;
  }
  if (connect) Connect(conn);
  if (write_now) WriteCall(conn, id);
}

void Agent::WriteCall(const std::shared_ptr<Conn>& conn, uint64_t call_id) {
  tensorpipe::Message message;
  std::shared_ptr<const void> keepalive;
  size_t chunk_count = 0;
  Message chunked;  // what WriteChunks needs of a message with chunks
  std::string node;
  uint64_t bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(call_id);
    if (it == calls_.end()) return;
    Call& call = *it->second;
    if (call.outcome.has_value() || call.write_started) return;
    call.write_started = true;
    if (call.deadline != absl::InfiniteFuture()) {
      call.msg.header.set_timeout_us(
          std::max<int64_t>(1, absl::ToInt64Microseconds(call.deadline - absl::Now())));
    }
    message = ToTensorPipe(call.msg);
    keepalive = call.msg.keepalive;
    node = CountersKey(call.peer);
    bytes = call.bytes;
    chunk_count = ChunksOf(call.msg).size();
    if (chunk_count > 0) {
      chunked.header = call.msg.header;
      chunked.tensors = call.msg.tensors;
      chunked.when_chunk_ready = call.msg.when_chunk_ready;
    }
  }
  auto writes = std::make_shared<Writes>(
      1 + chunk_count, [this, call_id, node, bytes](absl::Status status, uint64_t unsent) {
        if (status.ok()) {
          // Counted here, not in OnCallWritten: the call may have its answer (and be gone)
          // before its last write ends.
          absl::MutexLock lock(&mu_);
          Counters(node).bytes_sent += bytes - unsent;
        }
        OnCallWritten(call_id, status);
      });
  conn->pipe->write(std::move(message), [this, conn, keepalive, writes](
                                            const tensorpipe::Error& error) {
    absl::Status status;
    if (error) {
      status = TensorPipeErrorToStatus(error,
                                       absl::StrCat("pipe to ", conn->peer.ToString(), " failed"));
      FailConn(conn, status);
    }
    writes->End(status);
  });
  if (chunk_count > 0) WriteChunks(conn, call_id, chunked, std::move(keepalive), writes);
}

void Agent::WriteChunks(const std::shared_ptr<Conn>& conn, uint64_t call_id, const Message& msg,
                        std::shared_ptr<const void> keepalive, std::shared_ptr<Writes> writes) {
  for (const Chunk& chunk : ChunksOf(msg)) {
    msg.when_chunk_ready(chunk.tensor, chunk.offset, chunk.length,
               [this, conn, call_id, chunk, keepalive, writes](absl::Status ready) {
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
                 conn->pipe->write(std::move(message), [this, conn, keepalive, writes, unsent](
                                                           const tensorpipe::Error& error) {
                   absl::Status status;
                   if (error) {
                     status = TensorPipeErrorToStatus(error, PipeFailed(conn->outbound, conn->peer));
                     FailConn(conn, status);
                   }
                   writes->End(status, unsent);
                 });
               });
  }
}

void Agent::OnCallWritten(uint64_t call_id, const absl::Status& status) {
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(call_id);
    if (it == calls_.end()) return;  // `done` ran already (the message had a keepalive)
    Call& call = *it->second;
    call.write_finished = true;
    if (!status.ok() && !call.outcome.has_value()) {
      call.outcome = Prefixed(status, "method \"", call.method, "\": ");
      if (call.conn != nullptr) call.conn->pending.erase(call_id);
      deadlines_.Remove(call_id);
    }
    TakeDoneIfFinished(call, &run);
  }
  for (auto& fn : run) fn();
}

void Agent::CompleteCall(uint64_t call_id, absl::StatusOr<Message> outcome) {
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(call_id);
    if (it == calls_.end()) return;
    Call& call = *it->second;
    if (call.outcome.has_value()) return;  // late: already failed (deadline); dropped
    if (!outcome.ok()) {
      PeerCounters& counters = Counters(CountersKey(call.peer));
      ++counters.errors;
      counters.last_error = std::string(outcome.status().message());
    }
    call.outcome = std::move(outcome);
    if (call.conn != nullptr) call.conn->pending.erase(call_id);
    deadlines_.Remove(call_id);
    TakeDoneIfFinished(call, &run);
  }
  for (auto& fn : run) fn();
}

void Agent::TakeDoneIfFinished(Call& call, std::vector<std::function<void()>>* run) {
  if (!call.outcome.has_value()) return;
  const bool buffers_free = !call.write_started || call.write_finished;
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

void Agent::Respond(const ReplyTo& to, Message response, SentCallback sent) {
  auto finish = [&sent](absl::Status status) {
    if (sent) sent(std::move(status));
  };
  std::shared_ptr<Conn> conn = std::static_pointer_cast<Conn>(to.conn_.lock());
  if (conn == nullptr) {
    finish(absl::UnavailableError(
        absl::StrCat("the pipe from ", to.node_, " that carried call ", to.call_id_, " is gone")));
    return;
  }
  response.header.set_call_id(to.call_id_);
  if (response.header.kind() != v1::AgentMessage::ERROR) {
    response.header.set_kind(v1::AgentMessage::RESPONSE);
  }
  if (response.header.method().empty()) response.header.set_method(to.method_);
  if (absl::Status s = PrepareHeader(response, options_.max_message_bytes); !s.ok()) {
    finish(Prefixed(s, "response to ", to.node_, " for method \"", to.method_, "\": "));
    return;
  }
  absl::Status pipe_error;
  {
    absl::MutexLock lock(&mu_);
    if (conn->state != PipeState::kReady) pipe_error = conn->error;
  }
  if (!pipe_error.ok()) {
    finish(absl::UnavailableError(absl::StrCat("response to ", to.node_, " for method \"",
                                               to.method_, "\": ", pipe_error.message())));
    return;
  }
  if (to.deadline_ != absl::InfiniteFuture() && absl::Now() > to.deadline_) {
    finish(absl::DeadlineExceededError(
        absl::StrCat("response to ", to.node_, " for method \"", to.method_, "\": deadline ",
                     DeadlineText(to.deadline_), " passed; not sent")));
    return;
  }
  const uint64_t bytes = MessageBytes(response);
  const std::string node = to.node_;
  const size_t chunk_count = ChunksOf(response).size();
  auto writes = std::make_shared<Writes>(
      1 + chunk_count,
      [this, sent = std::move(sent), bytes, node](absl::Status status, uint64_t unsent) mutable {
        if (status.ok()) {
          absl::MutexLock lock(&mu_);
          Counters(node).bytes_sent += bytes - unsent;
        }
        if (sent) sent(std::move(status));
      });
  std::shared_ptr<const void> keepalive = response.keepalive;
  conn->pipe->write(ToTensorPipe(response),
                    [this, conn, keepalive, node, writes](const tensorpipe::Error& error) {
                      absl::Status status;
                      if (error) {
                        status = TensorPipeErrorToStatus(
                            error, absl::StrCat("pipe from ", node, " failed"));
                        FailConn(conn, status);
                      }
                      writes->End(status);
                    });
  if (chunk_count > 0) WriteChunks(conn, to.call_id_, response, std::move(keepalive), writes);
}

// ---------------------------------------------------------------------------------------------
// Reading authenticated pipes.

void Agent::ReadNext(const std::shared_ptr<Conn>& conn) {
  conn->pipe->readDescriptor(
      [this, conn](const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
        if (error) {
          PeerId peer;
          {
            absl::MutexLock lock(&mu_);
            peer = conn->peer;
          }
          FailConn(conn, TensorPipeErrorToStatus(error, PipeFailed(conn->outbound, peer)));
          return;
        }
        OnDescriptor(conn, descriptor);
      });
}

void Agent::ClosePipe(const std::shared_ptr<Conn>& conn, const PeerId& peer,
                      const std::string& why) {
  AgentLog().error("[agent {}] [peer {}] closing the pipe: {}", options_.id, peer.ToString(), why);
  FailConn(conn, absl::UnavailableError(absl::StrCat("pipe ", conn->outbound ? "to " : "from ",
                                                     peer.ToString(), " closed: ", why)));
}

void Agent::OnDescriptor(const std::shared_ptr<Conn>& conn,
                         const tensorpipe::Descriptor& descriptor) {
  PeerId peer;
  {
    absl::MutexLock lock(&mu_);
    peer = conn->peer;
  }
  const std::string node = CountersKey(peer);
  auto protocol_error = [&](const std::string& why) { ClosePipe(conn, peer, why); };
  auto header = std::make_shared<v1::AgentMessage>();
  if (!header->ParseFromString(descriptor.metadata)) {
    protocol_error("it sent a message whose header is not an AgentMessage");
    return;
  }
  if (header->kind() == v1::AgentMessage::CHUNK) {
    OnChunk(conn, peer, *header, descriptor);
    return;
  }
  // The sizes come from TensorPipe's descriptor; the header must agree with them.
  size_t payload_size = 0;
  if (descriptor.payloads.size() > 1) {
    protocol_error("it sent a message with more than one payload");
    return;
  }
  if (!descriptor.payloads.empty()) payload_size = descriptor.payloads[0].length;
  if (payload_size != header->payload_bytes()) {
    protocol_error(absl::StrCat("a message's payload is ", payload_size,
                                " bytes, its header says ", header->payload_bytes()));
    return;
  }
  if (descriptor.tensors.size() != static_cast<size_t>(header->tensors_size())) {
    protocol_error(absl::StrCat("a message carries ", descriptor.tensors.size(),
                                " tensors, its header describes ", header->tensors_size()));
    return;
  }
  std::vector<size_t> tensor_sizes;
  uint64_t total = payload_size;
  uint64_t chunks = 0;
  uint64_t chunked_bytes = 0;
  // Sizes are summed only while the sum stays within max_message_bytes: a chunked tensor's
  // nbytes is the peer's word alone (no TensorPipe length backs it), and a sum that wrapped
  // would place the message in a block far smaller than its chunks.
  auto too_large = [&](uint64_t more) {
    protocol_error(absl::StrCat("it sent a message of more than ", options_.max_message_bytes,
                                " bytes (max_message_bytes): ", total, " + ", more));
  };
  if (total > options_.max_message_bytes) {
    too_large(0);
    return;
  }
  for (size_t i = 0; i < descriptor.tensors.size(); ++i) {
    const v1::TensorDescriptor& described = header->tensors(static_cast<int>(i));
    if (described.nbytes() > options_.max_message_bytes - total) {
      too_large(described.nbytes());
      return;
    }
    // A chunked tensor's bytes follow in CHUNK messages: an empty tensor holds its place.
    const size_t length = descriptor.tensors[i].length;
    const uint64_t expected = described.chunk_bytes() > 0 ? 0 : described.nbytes();
    if (length != expected || descriptor.tensors[i].sourceDevice.type != tensorpipe::kCpuDeviceType) {
      protocol_error(absl::StrCat("tensor ", i, " of a message is ", length,
                                  " bytes, its header says ", expected));
      return;
    }
    if (described.chunk_bytes() > 0) {
      if (described.chunk_bytes() < kMinChunkBytes || described.nbytes() == 0) {
        protocol_error(absl::StrCat("tensor ", i, " of a message comes in chunks of ",
                                    described.chunk_bytes(), " bytes (at least ", kMinChunkBytes,
                                    ", and only a tensor with bytes)"));
        return;
      }
      chunks += ChunkCount(described);
      chunked_bytes += described.nbytes();
    }
    tensor_sizes.push_back(described.nbytes());
    total += described.nbytes();
  }
  if (chunks > kMaxChunksPerMessage) {
    protocol_error(absl::StrCat("it sent a message in ", chunks, " chunks, more than ",
                                kMaxChunksPerMessage));
    return;
  }

  // Where the bytes go, and what happens once they are in.
  absl::StatusOr<Destination> destination;
  auto in = std::make_shared<Incoming>();
  in->header = header;
  const v1::AgentMessage::Kind kind = header->kind();
  if (kind == v1::AgentMessage::REQUEST) {
    {
      absl::MutexLock lock(&mu_);
      in->handler = handler_;
      ++Counters(node).calls_received;
    }
    if (in->handler == nullptr || !in->handler->deliver) {
      in->refused = absl::UnavailableError(
          absl::StrCat("agent ", options_.id, " serves no requests yet (no handler)"));
    } else {
      destination = in->handler->allocate
                        ? in->handler->allocate(*header, payload_size, tensor_sizes)
                        : HeapDestination(payload_size, tensor_sizes);
      if (destination.ok()) {
        in->refused = CheckDestination(*destination, payload_size, tensor_sizes);
      } else {
        in->refused = destination.status();
      }
    }
  } else if (kind == v1::AgentMessage::RESPONSE || kind == v1::AgentMessage::ERROR) {
    Allocator allocate;
    bool wanted = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = calls_.find(header->call_id());
      if (it != calls_.end() && !it->second->outcome.has_value() && it->second->conn == conn) {
        wanted = true;
        allocate = it->second->reply_allocator;
      }
    }
    if (wanted && allocate) {
      destination = allocate(*header, payload_size, tensor_sizes);
      absl::Status bad = destination.ok()
                             ? CheckDestination(*destination, payload_size, tensor_sizes)
                             : destination.status();
      if (!bad.ok()) {
        CompleteCall(header->call_id(),
                     Prefixed(bad, "the reply to method \"", header->method(), "\" from ",
                              peer.ToString(), " could not be placed: "));
        destination = bad;
      }
    } else {
      destination = HeapDestination(payload_size, tensor_sizes);
    }
  } else {
    protocol_error(absl::StrCat("it sent a message of kind ", static_cast<int>(kind)));
    return;
  }
  // Bytes that nobody takes are still read (a pipe cannot skip them), into a block dropped
  // right after.
  if (!destination.ok() || !in->refused.ok()) {
    destination = HeapDestination(payload_size, tensor_sizes);
    if (!destination.ok()) {
      protocol_error(std::string(destination.status().message()));
      return;
    }
  }
  tensorpipe::Allocation allocation;
  if (!descriptor.payloads.empty()) allocation.payloads.push_back({OrEmpty(destination->payload)});
  for (size_t i = 0; i < tensor_sizes.size(); ++i) {
    const bool chunked = header->tensors(static_cast<int>(i)).chunk_bytes() > 0;
    allocation.tensors.push_back(
        {tensorpipe::CpuBuffer{OrEmpty(chunked ? nullptr : destination->tensors[i])}});
  }
  in->message = std::make_shared<Message>();
  in->message->payload = Buffer{destination->payload, payload_size};
  for (size_t i = 0; i < tensor_sizes.size(); ++i) {
    in->message->tensors.push_back(Buffer{destination->tensors[i], tensor_sizes[i]});
  }
  in->message->keepalive = std::move(destination->keepalive);
  in->on_chunk = std::move(destination->on_chunk);
  in->received = absl::Now();
  if (chunks > 0) {
    // Registered before the read starts: the first chunk's descriptor may come before this
    // message's read completes.
    for (int i = 0; i < header->tensors_size(); ++i) {
      const v1::TensorDescriptor& described = header->tensors(i);
      in->chunk_seen.emplace_back(described.chunk_bytes() > 0 ? ChunkCount(described) : 0, false);
    }
    bool duplicate;
    bool too_many;
    {
      absl::MutexLock lock(&mu_);
      if (conn->state == PipeState::kFailed) return;
      too_many = conn->incoming.size() >= kMaxChunkedMessagesPerPipe;
      duplicate = !too_many && !conn->incoming.emplace(header->call_id(), in).second;
      if (!duplicate && !too_many) {
        in->chunks_left = chunks;
        in->timer_id = next_id_++;
        in->complete_by = in->received + options_.chunk_timeout +
                          absl::Seconds(static_cast<double>(chunked_bytes) /
                                        static_cast<double>(std::max<uint64_t>(
                                            options_.min_chunk_rate, 1)));
        chunk_timers_[in->timer_id] = {conn, header->call_id()};
        AddDeadline(in->timer_id,
                    std::min(in->received + options_.chunk_timeout, in->complete_by));
      }
    }
    if (duplicate || too_many) {
      protocol_error(too_many ? absl::StrCat("it has ", kMaxChunkedMessagesPerPipe,
                                             " messages waiting for their chunks on this pipe")
                              : absl::StrCat("it sent message ", header->call_id(),
                                             " again before all chunks of the first came"));
      return;
    }
  }
  const uint64_t main_bytes = payload_size + [&] {
    uint64_t sum = 0;
    for (const auto& t : descriptor.tensors) sum += t.length;
    return sum;
  }();
  conn->pipe->read(std::move(allocation),
                   [this, conn, in, main_bytes, peer](const tensorpipe::Error& error) {
                     OnPartRead(conn, peer, *in, error, main_bytes, /*main=*/true);
                   });
  ReadNext(conn);
}

void Agent::OnChunk(const std::shared_ptr<Conn>& conn, const PeerId& peer,
                    const v1::AgentMessage& header, const tensorpipe::Descriptor& descriptor) {
  auto protocol_error = [&](const std::string& why) { ClosePipe(conn, peer, why); };
  const uint64_t call_id = header.call_id();
  const bool failed = header.status_code() != 0;
  if (!descriptor.payloads.empty() || descriptor.tensors.size() != (failed ? 0u : 1u)) {
    protocol_error(absl::StrCat("a chunk of message ", call_id, " carries ",
                                descriptor.payloads.size(), " payloads and ",
                                descriptor.tensors.size(), " tensors"));
    return;
  }
  std::shared_ptr<Incoming> in;
  std::string bad;
  uint64_t length = 0;
  const size_t tensor = header.chunk_tensor();
  const uint64_t offset = header.chunk_offset();
  {
    absl::MutexLock lock(&mu_);
    auto it = conn->incoming.find(call_id);
    if (it == conn->incoming.end()) {
      bad = absl::StrCat("it sent a chunk of message ", call_id,
                         ", which is not waiting for chunks on this pipe");
    } else if (tensor >= it->second->chunk_seen.size() ||
               it->second->chunk_seen[tensor].empty()) {
      bad = absl::StrCat("it sent a chunk of tensor ", tensor, " of message ", call_id,
                         ", which is not sent in chunks");
    } else {
      in = it->second;
      const v1::TensorDescriptor& described = in->header->tensors(static_cast<int>(tensor));
      const uint64_t index = offset / described.chunk_bytes();
      length = std::min(described.chunk_bytes(), described.nbytes() - std::min(offset, described.nbytes()));
      if (offset % described.chunk_bytes() != 0 || offset >= described.nbytes()) {
        bad = absl::StrCat("it sent a chunk of tensor ", tensor, " of message ", call_id,
                           " at offset ", offset, ", not a chunk boundary inside its ",
                           described.nbytes(), " bytes");
      } else if (in->chunk_seen[tensor][index]) {
        bad = absl::StrCat("it sent chunk ", index, " of tensor ", tensor, " of message ",
                           call_id, " twice");
      } else if (!failed && (descriptor.tensors[0].length != length ||
                             descriptor.tensors[0].sourceDevice.type !=
                                 tensorpipe::kCpuDeviceType)) {
        bad = absl::StrCat("chunk ", index, " of tensor ", tensor, " of message ", call_id,
                           " is ", descriptor.tensors[0].length, " bytes, not ", length);
      } else {
        in->chunk_seen[tensor][index] = true;
        deadlines_.Remove(in->timer_id);
        AddDeadline(in->timer_id,
                    std::min(absl::Now() + options_.chunk_timeout, in->complete_by));
      }
    }
  }
  if (!bad.empty()) {
    protocol_error(bad);
    return;
  }
  if (failed) {
    // The sender could not produce these bytes: the message fails with its reason (a code it
    // names outside absl's range reads as UNKNOWN).
    const int code = header.status_code();
    const absl::StatusCode status_code =
        code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
            ? static_cast<absl::StatusCode>(code)
            : absl::StatusCode::kUnknown;
    absl::Status error(status_code, absl::StrCat("the sender could not send tensor ", tensor,
                                                 ": ", header.status_message().substr(0, 1024)));
    // Even a message with nothing to read must be read before the pipe gives the next one.
    conn->pipe->read(tensorpipe::Allocation{},
                     [this, conn, in, error, peer](const tensorpipe::Error& read_error) {
                       OnPartRead(conn, peer, *in, read_error, 0, /*main=*/false, error);
                     });
    ReadNext(conn);
    return;
  }
  tensorpipe::Allocation allocation;
  allocation.tensors.push_back(
      {tensorpipe::CpuBuffer{static_cast<char*>(in->message->tensors[tensor].data) + offset}});
  conn->pipe->read(std::move(allocation), [this, conn, in, tensor, offset, length,
                                           peer](const tensorpipe::Error& error) {
    if (!error && in->on_chunk) in->on_chunk(tensor, offset, length);
    OnPartRead(conn, peer, *in, error, length, /*main=*/false);
  });
  ReadNext(conn);
}

void Agent::OnPartRead(const std::shared_ptr<Conn>& conn, const PeerId& peer, Incoming& in,
                       const tensorpipe::Error& error, uint64_t bytes, bool main,
                       const absl::Status& chunk_error) {
  if (error) {
    FailConn(conn, TensorPipeErrorToStatus(error, PipeFailed(conn->outbound, peer)));
    return;
  }
  bool last;
  {
    absl::MutexLock lock(&mu_);
    Counters(CountersKey(peer)).bytes_received += bytes;
    if (in.chunk_error.ok()) in.chunk_error = chunk_error;
    last = PartRead(conn, in, main);
  }
  if (last) Finish(conn, peer, in);
}

bool Agent::PartRead(const std::shared_ptr<Conn>& conn, Incoming& in, bool main) {
  if (main) {
    in.main_read = true;
  } else {
    --in.chunks_left;
  }
  if (!in.main_read || in.chunks_left > 0 || in.finished) return false;
  in.finished = true;
  if (in.timer_id != 0) {
    deadlines_.Remove(in.timer_id);
    chunk_timers_.erase(in.timer_id);
    auto it = conn->incoming.find(in.header->call_id());
    if (it != conn->incoming.end() && it->second.get() == &in) conn->incoming.erase(it);
  }
  return true;
}

void Agent::Finish(const std::shared_ptr<Conn>& conn, const PeerId& peer, Incoming& in) {
  Message& message = *in.message;
  message.header = std::move(*in.header);
  absl::Status chunk_error;
  {
    absl::MutexLock lock(&mu_);
    chunk_error = in.chunk_error;
  }
  if (message.header.kind() != v1::AgentMessage::REQUEST) {
    const uint64_t call_id = message.header.call_id();
    if (!chunk_error.ok()) {
      CompleteCall(call_id, Prefixed(chunk_error, "the reply to method \"", message.header.method(),
                                     "\" from ", peer.ToString(), " failed: "));
      return;
    }
    CompleteCall(call_id, std::move(message));
    return;
  }
  ReplyTo reply_to;
  reply_to.conn_ = conn;
  reply_to.call_id_ = message.header.call_id();
  reply_to.node_ = peer.node;
  reply_to.method_ = message.header.method();
  if (message.header.timeout_us() > 0) {
    reply_to.deadline_ = in.received + absl::Microseconds(message.header.timeout_us());
  }
  const absl::Status refused = in.refused.ok() ? chunk_error : in.refused;
  if (!refused.ok()) {
    Message answer;
    answer.header.set_kind(v1::AgentMessage::ERROR);
    answer.header.set_status_code(static_cast<int>(refused.code()));
    answer.header.set_status_message(std::string(refused.message()));
    Respond(reply_to, std::move(answer));
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

void Agent::FailConn(const std::shared_ptr<Conn>& conn, const absl::Status& status) {
  std::vector<std::function<void()>> run;
  // Messages whose chunks will never come: their memory is let go after mu_.
  std::vector<std::shared_ptr<Incoming>> dropped;
  std::shared_ptr<tensorpipe::Pipe> pipe;
  bool closing;
  bool was_ready;
  {
    absl::MutexLock lock(&mu_);
    if (conn->state == PipeState::kFailed) return;
    was_ready = conn->state == PipeState::kReady;
    closing = closing_;
    conn->state = PipeState::kFailed;
    conn->error = status;
    pipe = conn->pipe;
    conns_.erase(conn->serial);
    deadlines_.Remove(conn->serial);
    if (conn->outbound) {
      auto it = outbound_.find(conn->peer);
      if (it != outbound_.end() && it->second == conn) outbound_.erase(it);
    }
    if (conn->outbound || was_ready) {
      PeerCounters& counters = Counters(CountersKey(conn->peer));
      if (!closing) {
        ++counters.errors;
        counters.last_error = std::string(status.message());
      }
      if (conn->outbound) counters.state = PipeState::kFailed;
      if (!conn->outbound) --counters.inbound_pipes;
    }
    for (uint64_t id : conn->pending) {
      auto it = calls_.find(id);
      if (it == calls_.end()) continue;
      Call& call = *it->second;
      if (!call.outcome.has_value()) {
        call.outcome = Prefixed(status, "method \"", call.method, "\": ");
        deadlines_.Remove(id);
      }
      TakeDoneIfFinished(call, &run);
    }
    conn->pending.clear();
    conn->queued.clear();
    for (auto& [call_id, in] : conn->incoming) {
      deadlines_.Remove(in->timer_id);
      chunk_timers_.erase(in->timer_id);
      in->finished = true;
      dropped.push_back(std::move(in));
    }
    conn->incoming.clear();
  }
  if (!closing && (conn->outbound || was_ready)) {
    AgentLog().info("[agent {}] {}", options_.id, std::string(status.message()));
  }
  if (pipe != nullptr) pipe->close();
  for (auto& fn : run) fn();
}

void Agent::FailPeer(const PeerId& peer, const absl::Status& status) {
  std::vector<std::shared_ptr<Conn>> matching;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [serial, conn] : conns_) {
      const bool same = peer.node.empty() ? conn->peer.address == peer.address
                                          : conn->peer.node == peer.node;
      if (same) matching.push_back(conn);
    }
  }
  for (const auto& conn : matching) FailConn(conn, status);
}

// ---------------------------------------------------------------------------------------------
// Bookkeeping.

void Agent::AddDeadline(uint64_t id, absl::Time deadline) {
  deadlines_.Add(id, deadline);
  // Wake the timer only if it sleeps past this deadline: most calls' deadlines come after
  // the one it waits for, and a wake-up per call costs a context switch per call.
  if (deadline < timer_wake_at_) timer_cv_.Signal();
}

Agent::PeerCounters& Agent::Counters(const std::string& node) { return counters_[node]; }

AgentStats Agent::Stats() const {
  AgentStats stats;
  stats.id = options_.id;
  stats.address = address_;
  absl::MutexLock lock(&mu_);
  stats.auth_failures = auth_failures_ + transport_refusals_->count.load();
  stats.listener_failures = listener_failures_;
  std::map<std::string, uint64_t> pending;
  for (const auto& [id, call] : calls_) {
    if (!call->outcome.has_value()) ++pending[CountersKey(call->peer)];
  }
  for (const auto& [node, counters] : counters_) {
    PeerStats peer;
    peer.node = node;
    peer.address = counters.address;
    peer.state = counters.state;
    peer.inbound_pipes = counters.inbound_pipes;
    peer.transport = counters.transport;
    peer.channel = counters.channel;
    peer.peer_transports = counters.peer_transports;
    peer.peer_channels = counters.peer_channels;
    peer.calls_sent = counters.calls_sent;
    peer.calls_received = counters.calls_received;
    peer.calls_pending = pending[node];
    peer.bytes_sent = counters.bytes_sent;
    peer.bytes_received = counters.bytes_received;
    peer.errors = counters.errors;
    peer.last_error = counters.last_error;
    stats.calls_pending += peer.calls_pending;
    stats.peers.push_back(std::move(peer));
  }
  return stats;
}

}  // namespace tpd::agent
