#include "client/client.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "client/segment/cuda_export.h"
#include "client/socket_path.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/store_scope.h"
#include "shm/attach.h"
#include "shm/descriptor.h"
#include "shm/fd_message.h"

namespace tpd {
namespace {

// The daemon's codes arrive unchanged; absl and gRPC number their codes alike.
absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// Extra time a waiting call's RPC deadline gets over the wait itself.
constexpr absl::Duration kWaitSlack = absl::Seconds(2);
// Handler threads when a group's view names none (PyTorch's num_worker_threads default),
// and the most one group can ask for.
constexpr int kDefaultHandlerThreads = 16;
constexpr int64_t kMaxHandlerThreads = 1024;
// How long Leave waits for a call in flight that has no deadline, in a group with none.
constexpr absl::Duration kLeaveWaitWithoutTimeout = absl::Seconds(60);

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path,
                                                        ClientOptions options) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // see client.h
  const std::string path = socket_path.empty() ? DefaultClientSocketPath() : socket_path;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat("no tpd socket at ", path,
                                               ": is the daemon running? (systemctl status tpd, "
                                               "or pass --socket / set TPD_SOCKET)"));
  }
  // Who owns the socket: a daemon another user runs must not get this client's keys.
  if (absl::Status trusted = CheckSocketOwner(path); !trusted.ok()) return trusted;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // A Client is one session with the daemon: its own connection, never one shared with
  // another Client of the same process through gRPC's global subchannel pool.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      absl::StrCat("unix:", path), grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
    return absl::UnavailableError(
        absl::StrCat("tpd at ", path, " did not accept a connection within ",
                     absl::FormatDuration(options.connect_timeout),
                     " (is it running, and may this user use the socket?)"));
  }
  return std::unique_ptr<Client>(new Client(path, std::move(options), std::move(channel)));
}

Client::Client(std::string socket_path, ClientOptions options,
               std::shared_ptr<grpc::Channel> channel)
    : socket_path_(std::move(socket_path)),
      options_(std::move(options)),
      channel_(std::move(channel)),
      store_(v1::Store::NewStub(channel_)),
      admin_(v1::Admin::NewStub(channel_)),
      control_(v1::Control::NewStub(channel_)) {}

Client::~Client() {
  DetachSharedMemory();
  {
    absl::MutexLock lock(&session_mu_);
    if (session_context_ != nullptr) session_context_->TryCancel();
  }
  if (session_reader_.joinable()) session_reader_.join();
}

namespace {

// Connects to the data socket at `path`, sends `request` (an attach or an identify request)
// and reads the reply; the fd that came with an OK reply (-1: none came).
absl::StatusOr<int> ExchangeOver(int fd, const std::string& path,
                                 const std::array<uint8_t, shm::kAttachRequestBytes>& request,
                                 absl::Duration timeout) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("data socket path too long: ", path));
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(timeout));
  tv.tv_usec =
      static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout - absl::Seconds(tv.tv_sec)));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to the tpd data socket ", path, ": ", std::strerror(errno)));
  }
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return absl::UnavailableError(
        absl::StrCat("cannot send the attach request to ", path, ": ", std::strerror(errno)));
  }
  std::string reply(shm::kAttachReplyBytes, '\0');
  absl::StatusOr<int> memfd = shm::ReceiveWithFd(fd, reply.data(), reply.size());
  if (!memfd.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "the tpd daemon at ", path,
        " closed the data connection without an attach reply: ", memfd.status().message()));
  }
  absl::StatusOr<shm::AttachReply> decoded = shm::DecodeAttachReply(reply);
  absl::Status status = decoded.ok() ? decoded->status : decoded.status();
  if (!status.ok()) {
    if (*memfd >= 0) close(*memfd);
    return status;
  }
  return *memfd;
}

// Binds `session_id` to this process's user on the daemon's data socket `path`.
absl::Status Identify(const std::string& path, const std::string& session_id,
                      absl::Duration timeout) {
  absl::StatusOr<std::array<uint8_t, shm::kAttachRequestBytes>> request =
      shm::EncodeIdentifyRequest(session_id);
  if (!request.ok()) return request.status();
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  absl::StatusOr<int> none = ExchangeOver(fd, path, *request, timeout);
  close(fd);
  if (none.ok() && *none >= 0) close(*none);
  return none.status();
}

}  // namespace

absl::StatusOr<std::string> Client::Session() {
  absl::MutexLock lock(&session_mu_);
  if (!session_id_.empty()) return session_id_;
  // A session that ended (the daemon restarted) is replaced by a new one.
  if (session_reader_.joinable()) session_reader_.join();
  session_context_ = std::make_unique<grpc::ClientContext>();
  v1::OpenSessionRequest request;
  request.set_client(absl::StrCat("pid ", getpid()));
  std::shared_ptr<grpc::ClientReader<v1::SessionEvent>> reader(
      control_->OpenSession(session_context_.get(), request).release());
  v1::SessionEvent event;
  if (!reader->Read(&event)) {
    absl::Status status = FromGrpc(reader->Finish());
    session_context_.reset();
    return status.ok() ? absl::UnavailableError("the daemon closed the session at once") : status;
  }
  // Before anything uses the session, bind it to this process's user (docs/security.md, "Who
  // may join a group"): its joins are this uid's, and no other uid can attach it.
  const std::string path =
      event.data_socket().empty() ? shm::DataSocketPath(socket_path_) : event.data_socket();
  absl::Status identified = CheckDataSocketOwner(path, socket_path_);
  if (identified.ok()) identified = Identify(path, event.session_id(), options_.connect_timeout);
  if (!identified.ok()) {
    session_context_->TryCancel();
    reader->Finish();
    session_context_.reset();
    return identified;
  }
  session_id_ = event.session_id();
  data_socket_ = event.data_socket();
  // The stream carries nothing more today; reading it keeps it open and notices its end.
  session_reader_ = std::thread([this, reader, session = session_id_] {
    v1::SessionEvent ignored;
    while (reader->Read(&ignored)) {
    }
    const absl::Status ended = FromGrpc(reader->Finish());
    // No reply will come through this session's rings: its calls fail now, naming the daemon,
    // not at their deadlines (a client closing itself has detached its engine already).
    std::shared_ptr<CallEngine> engine;
    {
      absl::MutexLock lock(&data_mu_);
      if (attached_session_ == session) engine = calls_;
    }
    if (engine != nullptr) {
      engine->Break(absl::UnavailableError(absl::StrCat(
          "the tpd daemon at ", socket_path_, " ended this client's session (it exited, ",
          "restarted or ended the session)", ended.ok() ? "" : ": ", ended.message())));
    }
    // Members of this session are gone with it; the next group call opens a new session.
    absl::MutexLock lock(&session_mu_);
    session_id_.clear();
  });
  return session_id_;
}

absl::StatusOr<std::shared_ptr<const shm::Segment>> Client::AttachSharedMemory() {
  absl::MutexLock data_lock(&data_mu_);
  absl::StatusOr<std::string> session = Session();
  if (!session.ok()) return session.status();
  if (segment_ != nullptr && attached_session_ == *session) return segment_;
  std::string path;
  {
    absl::MutexLock lock(&session_mu_);
    path = data_socket_.empty() ? shm::DataSocketPath(socket_path_) : data_socket_;
  }
  // The same trust as the gRPC socket: another user's socket must not hand us memory.
  if (absl::Status trusted = CheckDataSocketOwner(path, socket_path_); !trusted.ok()) {
    return trusted;
  }
  if (data_fd_ >= 0) shutdown(data_fd_, SHUT_RDWR);  // the old session's end (see Detach)
  if (data_fd_ >= 0) close(data_fd_);
  data_fd_ = -1;
  segment_.reset();
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  absl::StatusOr<std::array<uint8_t, shm::kAttachRequestBytes>> request =
      shm::EncodeAttachRequest(*session);
  absl::StatusOr<int> memfd =
      request.ok() ? ExchangeOver(fd, path, *request, options_.connect_timeout) : request.status();
  if (memfd.ok() && *memfd < 0) {
    memfd = absl::InternalError("the attach reply came without the segment's fd");
  }
  if (!memfd.ok()) {
    close(fd);
    return memfd.status();
  }
  absl::StatusOr<shm::Segment> segment = shm::Segment::Map(*memfd);
  if (!segment.ok()) {
    close(fd);
    return segment.status();
  }
  // The connection stays open, silent, for the session's lifetime. A client that takes no
  // tensors in their senders' memory closes its reading side: the daemon's first peer notice
  // then fails (EPIPE), and it copies every tensor for this session from then on.
  if (!options_.tensors_in_sender_memory) shutdown(fd, SHUT_RD);
  data_fd_ = fd;
  attached_session_ = *session;
  segment_ = std::make_shared<const shm::Segment>(*std::move(segment));
  return segment_;
}

void Client::DetachSharedMemory() {
  std::shared_ptr<CallEngine> calls;  // stopped outside the lock: its handlers may call
  {
    absl::MutexLock lock(&data_mu_);
    // The connection ends now, though the engine still holds a dup of it for peer notices:
    // its end is the session's end to the daemon.
    if (data_fd_ >= 0) shutdown(data_fd_, SHUT_RDWR);
    if (data_fd_ >= 0) close(data_fd_);
    data_fd_ = -1;
    segment_.reset();
    attached_session_.clear();
    calls = std::move(calls_);
    calls_segment_.reset();
  }
}

std::shared_ptr<CallEngine> Client::AttachedEngine() {
  {
    absl::MutexLock lock(&data_mu_);
    if (segment_ == nullptr) return nullptr;
    if (calls_ != nullptr && calls_segment_ == segment_) return calls_;
  }
  absl::StatusOr<std::shared_ptr<CallEngine>> engine = Engine();
  return engine.ok() ? *std::move(engine) : nullptr;
}

absl::StatusOr<std::shared_ptr<CallEngine>> Client::Engine() {
  absl::StatusOr<std::shared_ptr<const shm::Segment>> segment = AttachSharedMemory();
  if (!segment.ok()) return segment.status();
  std::shared_ptr<CallEngine> old;  // stopped outside the lock: its handlers may call
  std::shared_ptr<CallEngine> calls;
  std::set<int> devices;
  {
    absl::MutexLock lock(&data_mu_);
    if (calls_ != nullptr && calls_segment_ == *segment) return calls_;
    old = std::move(calls_);
    // The engine reads peer notices on its own dup of the data connection: it may outlive
    // this Client's (one dropped on its own thread stops later), and the connection ends when
    // both are closed.
    const int notice_fd = data_fd_ >= 0 && options_.tensors_in_sender_memory
                              ? fcntl(data_fd_, F_DUPFD_CLOEXEC, 0)
                              : -1;
    calls_ = std::make_shared<CallEngine>(*segment, handler_threads_, notice_fd);
    calls_segment_ = *segment;
    for (const auto& [method, handler] : handlers_) calls_->HandleDeferred(method, handler);
    calls = calls_;
    devices = cuda_devices_;
  }
  old.reset();
  // A new session: the pools go to its daemon side again. A failure here was reported by the
  // Join that asked for the device; calls into it name the missing pool.
  for (int device : devices) (void)calls->LendDevicePool(device, options_.cuda_pool_bytes);
  return calls;
}

absl::StatusOr<Client::Joined> Client::CallerIn(const std::string& group) {
  absl::MutexLock lock(&joined_mu_);
  auto it = joined_.find(group);
  if (it == joined_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("this client has not joined group '", group,
                                                      "': Join it before calling its workers"));
  }
  return it->second;
}

absl::Status Client::Handle(const std::string& method, Handler handler) {
  return HandleDeferred(method, AnswerOnReturn(std::move(handler)));
}

absl::Status Client::HandleDeferred(const std::string& method, DeferredHandler handler) {
  {
    absl::MutexLock lock(&data_mu_);
    handlers_[method] = handler;
  }
  absl::StatusOr<std::shared_ptr<CallEngine>> calls = Engine();
  if (!calls.ok()) return calls.status();
  (*calls)->HandleDeferred(method, std::move(handler));
  return absl::OkStatus();
}

namespace {

// The timeout a call runs with: absent, the group's.
absl::StatusOr<absl::Duration> CallTimeout(std::optional<absl::Duration> timeout,
                                           absl::Duration group_timeout,
                                           const std::string& worker) {
  if (!timeout.has_value()) return group_timeout;
  if (*timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "call to worker '", worker, "': timeout ", absl::FormatDuration(*timeout),
        " is negative (pass kNoTimeout for none, or nothing for the group's rpc_timeout)"));
  }
  return *timeout;
}

}  // namespace

CallFuture Client::CallAsync(const std::string& group, const std::string& worker,
                             const std::string& method, std::string_view payload,
                             const std::vector<Tensor>& tensors,
                             std::optional<absl::Duration> timeout, bool by_reverse_map) {
  absl::StatusOr<Joined> from = CallerIn(group);
  if (!from.ok()) return CallFuture::Ready(from.status());
  absl::StatusOr<absl::Duration> wait = CallTimeout(timeout, from->rpc_timeout, worker);
  if (!wait.ok()) return CallFuture::Ready(wait.status());
  absl::StatusOr<std::shared_ptr<CallEngine>> calls = Engine();
  if (!calls.ok()) return CallFuture::Ready(calls.status());
  CallFuture future = (*calls)->CallAsync(group, from->name, worker, method, payload, tensors,
                                          *wait, by_reverse_map ? shm::kFlagReverseMap : 0);
  return future;
}

absl::StatusOr<Message> Client::Call(const std::string& group, const std::string& worker,
                                     const std::string& method, std::string_view payload,
                                     const std::vector<Tensor>& tensors,
                                     std::optional<absl::Duration> timeout) {
  absl::StatusOr<Joined> from = CallerIn(group);
  if (!from.ok()) return from.status();
  absl::StatusOr<absl::Duration> wait = CallTimeout(timeout, from->rpc_timeout, worker);
  if (!wait.ok()) return wait.status();
  absl::StatusOr<std::shared_ptr<CallEngine>> calls = Engine();
  if (!calls.ok()) return calls.status();
  absl::StatusOr<Message> reply =
      (*calls)->Call(group, from->name, worker, method, payload, tensors, *wait);
  return reply;
}

absl::StatusOr<Tensor> Client::AllocateTensor(shm::DType dtype, std::vector<int64_t> shape) {
  absl::StatusOr<std::shared_ptr<CallEngine>> calls = Engine();
  if (!calls.ok()) return calls.status();
  absl::StatusOr<Tensor> tensor = (*calls)->AllocateTensor(dtype, std::move(shape));
  return tensor;
}

absl::StatusOr<CallEngineStats> Client::GetCallStats() {
  std::shared_ptr<CallEngine> calls;
  {
    absl::MutexLock lock(&data_mu_);
    calls = calls_;
  }
  if (calls == nullptr) {
    return absl::FailedPreconditionError(
        "no call engine: Handle, Call or AllocateTensor starts it");
  }
  CallEngineStats stats = calls->Stats();
  return stats;
}

absl::StatusOr<v1::JoinResponse> Client::Join(const JoinOptions& options) {
  absl::StatusOr<std::string> session = Session();
  if (!session.ok()) return session.status();
  v1::JoinRequest request;
  request.set_session_id(*session);
  request.set_group(options.group);
  request.set_name(options.name);
  if (options.rank) request.set_rank(*options.rank);
  if (options.world_size) request.set_world_size(*options.world_size);
  request.set_init_method(options.init_method);
  request.set_secret(options.secret);
  if (options.env.empty()) {
    for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"}) {
      if (const char* value = std::getenv(name)) (*request.mutable_env())[name] = value;
    }
  } else {
    request.mutable_env()->insert(options.env.begin(), options.env.end());
  }
  *request.mutable_options() = options.options;
  request.set_timeout_ms(absl::ToInt64Milliseconds(options.timeout));
  request.set_include_members(options.include_members);
  request.set_abandon(options.abandon);
  v1::JoinResponse response;
  absl::Status status =
      FromGrpc(control_->Join(Context(options.timeout, true).get(), request, &response));
  if (!status.ok()) return status;
  // PyTorch's defaults where the view has none (a daemon that did not negotiate).
  const int threads = response.group().num_worker_threads() > 0
                          ? static_cast<int>(std::min<int64_t>(
                                response.group().num_worker_threads(), kMaxHandlerThreads))
                          : kDefaultHandlerThreads;
  {
    absl::MutexLock lock(&joined_mu_);
    joined_[options.group] = {options.name, absl::Milliseconds(response.group().rpc_timeout_ms())};
  }
  // Receive pools for the worker's CUDA devices; none in a process without a usable NVIDIA
  // driver (it has no CUDA memory to receive into: negotiation may still name devices, e.g.
  // under [group] cuda_device_count), where CUDA tensors sent to it fail naming the missing pool.
  // The driver is asked only then: a CPU-only worker never loads it.
  std::vector<int> devices;
  for (const std::string& device : response.negotiated().devices()) {
    int index = -1;
    if (absl::StartsWith(device, "cuda:") &&
        absl::SimpleAtoi(absl::string_view(device).substr(5), &index) && index >= 0) {
      devices.push_back(index);
    }
  }
  if (!devices.empty() && !calls_internal::CudaExporter::Get().ok()) devices.clear();
  std::shared_ptr<CallEngine> calls;
  {
    absl::MutexLock lock(&data_mu_);
    handler_threads_ = std::max(handler_threads_, threads);
    if (options_.cuda_pool_bytes > 0) cuda_devices_.insert(devices.begin(), devices.end());
    calls = calls_;
  }
  absl::Status lent;
  if (calls != nullptr) {
    calls->EnsureHandlerThreads(threads);
    calls->Rejoined(options.group, options.name);
  } else if (!devices.empty() && options_.cuda_pool_bytes > 0) {
    // Lent now rather than at the first call: a worker may be called before it calls.
    absl::StatusOr<std::shared_ptr<CallEngine>> started = Engine();
    lent = started.status();
    if (started.ok()) calls = *std::move(started);
  }
  if (calls != nullptr && options_.cuda_pool_bytes > 0) {
    for (int device : devices) {
      if (!lent.ok()) break;
      lent = calls->LendDevicePool(device, options_.cuda_pool_bytes);
    }
  }
  calls.reset();
  if (!lent.ok()) {
    return Prefixed(lent, "joined group '", options.group, "' as '", options.name, "', but ");
  }
  return response;
}

absl::Status Client::Leave(absl::string_view group_name, absl::string_view worker_name) {
  const std::string group(group_name);
  const std::string name(worker_name);
  absl::StatusOr<std::string> session = Session();
  if (!session.ok()) return session.status();
  absl::Duration no_deadline_wait = kLeaveWaitWithoutTimeout;
  {
    absl::MutexLock lock(&joined_mu_);
    auto it = joined_.find(group);
    if (it != joined_.end() && it->second.name == name &&
        it->second.rpc_timeout > absl::ZeroDuration()) {
      no_deadline_wait = it->second.rpc_timeout;
    }
  }
  std::shared_ptr<CallEngine> calls;
  {
    absl::MutexLock lock(&data_mu_);
    calls = calls_;
  }
  if (calls != nullptr) {
    calls->BeginLeave(group, name);
    // Calls still running past the bound finish normally; the member leaves anyway.
    (void)calls->DrainLeave(group, name, no_deadline_wait);
  }
  v1::LeaveRequest request;
  request.set_session_id(*session);
  request.set_group(group);
  request.set_name(name);
  v1::LeaveResponse response;
  absl::Status status = FromGrpc(control_->Leave(Context().get(), request, &response));
  if (!status.ok() && calls != nullptr) calls->Rejoined(group, name);
  calls.reset();
  if (!status.ok()) return status;
  absl::MutexLock lock(&joined_mu_);
  auto it = joined_.find(group);
  if (it != joined_.end() && it->second.name == name) joined_.erase(it);
  return status;
}

absl::Status Client::Barrier(absl::string_view group, absl::string_view name,
                             absl::Duration timeout, std::vector<std::string>* gone) {
  absl::StatusOr<std::string> session = Session();
  if (!session.ok()) return session.status();
  v1::BarrierRequest request;
  request.set_session_id(*session);
  request.set_group(std::string(group));
  request.set_name(std::string(name));
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::BarrierResponse response;
  absl::Status status =
      FromGrpc(control_->Barrier(Context(timeout, true).get(), request, &response));
  if (status.ok() && gone != nullptr) gone->assign(response.gone().begin(), response.gone().end());
  return status;
}

absl::StatusOr<v1::GroupView> Client::GetGroup(absl::string_view group,
                                               absl::string_view init_method) {
  v1::GetGroupRequest request;
  request.set_group(std::string(group));
  request.set_init_method(std::string(init_method));
  v1::GroupView view;
  absl::Status status = FromGrpc(control_->GetGroup(Context().get(), request, &view));
  if (!status.ok()) return status;
  return view;
}

absl::StatusOr<std::string> Client::UserSecret(absl::string_view purpose) {
  absl::StatusOr<std::string> session = Session();
  if (!session.ok()) return session.status();
  v1::UserSecretRequest request;
  request.set_session_id(*session);
  request.set_purpose(std::string(purpose));
  v1::UserSecretResponse response;
  absl::Status status = FromGrpc(control_->UserSecret(Context().get(), request, &response));
  if (!status.ok()) return status;
  return std::move(*response.mutable_secret());
}

absl::StatusOr<std::vector<v1::GroupView>> Client::ListGroups() {
  v1::ListGroupsResponse response;
  absl::Status status =
      FromGrpc(control_->ListGroups(Context().get(), v1::ListGroupsRequest(), &response));
  if (!status.ok()) return status;
  return std::vector<v1::GroupView>(response.groups().begin(), response.groups().end());
}

namespace {

class GrpcGroupWatch : public GroupWatch {
 public:
  GrpcGroupWatch(v1::Control::Stub* stub, const v1::WatchGroupRequest& request)
      : reader_(stub->WatchGroup(&context_, request)) {}
  // REQUIRES: no Next in progress on another thread (Cancel and join it first).
  ~GrpcGroupWatch() override {
    if (!finished_) (void)Finish();
  }
  bool Next(v1::GroupEvent* event) override {
    ended_ = !reader_->Read(event);
    return !ended_;
  }
  void Cancel() override { context_.TryCancel(); }
  absl::Status Finish() override {
    // Finish on a live stream would wait for the daemon to end it: end it ourselves.
    if (!ended_) context_.TryCancel();
    finished_ = true;
    return FromGrpc(reader_->Finish());
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::GroupEvent>> reader_;
  bool ended_ = false;
  bool finished_ = false;
};

}  // namespace

std::unique_ptr<GroupWatch> Client::Watch(absl::string_view group, absl::string_view init_method) {
  v1::WatchGroupRequest request;
  request.set_group(std::string(group));
  request.set_init_method(std::string(init_method));
  return std::make_unique<GrpcGroupWatch>(control_.get(), request);
}

std::unique_ptr<grpc::ClientContext> Client::Context(absl::Duration wait, bool waits) const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!waits) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  } else if (wait > absl::ZeroDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + wait + kWaitSlack));
  }
  // A wait with the daemon's default timeout carries no RPC deadline: the daemon ends it.
  return context;
}

template <typename Request, typename Response>
absl::Status StoreView::Unary(grpc::Status (v1::Store::Stub::*method)(grpc::ClientContext*,
                                                                      const Request&, Response*),
                              const Request& request, Response* response, absl::Duration wait,
                              bool waits) const {
  // Attached to shared memory: through the session's rings, with no gRPC on the way.
  if (std::shared_ptr<CallEngine> engine = client_->AttachedEngine(); engine != nullptr) {
    // The method is the request's type without "Request" ("SetRequest": "Set").
    static const std::string name = [] {
      const std::string& type = Request::descriptor()->name();
      return type.substr(0, type.size() - std::strlen("Request"));
    }();
    const absl::Duration timeout = !waits                        ? client_->options_.call_timeout
                                   : wait > absl::ZeroDuration() ? wait + kWaitSlack
                                                                 : absl::ZeroDuration();
    absl::StatusOr<std::string> answer =
        engine->StoreCall(group_, name, request.SerializeAsString(), timeout);
    if (!answer.ok()) return answer.status();
    if (!response->ParseFromString(*answer)) {
      return absl::InternalError(
          absl::StrCat("the daemon's answer to ", name, " over shared memory does not parse"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<grpc::ClientContext>> context = Context(wait, waits);
  if (!context.ok()) return context.status();
  return FromGrpc(((*client_->store_).*method)(context->get(), request, response));
}

absl::StatusOr<std::unique_ptr<grpc::ClientContext>> StoreView::Context(absl::Duration wait,
                                                                        bool waits) const {
  std::unique_ptr<grpc::ClientContext> context = client_->Context(wait, waits);
  absl::StatusOr<std::string> session = client_->Session();
  if (group_.empty()) {
    // The daemon charges the call to this process's user (docs/security.md, "Per-user
    // bounds"); without a session it counts among the callers without one.
    if (session.ok()) context->AddMetadata(kStoreSessionMetadata, *session);
    return context;
  }
  if (!session.ok()) return session.status();
  context->AddMetadata(kStoreGroupMetadata, group_);
  context->AddMetadata(kStoreSessionMetadata, *session);
  return context;
}

absl::Status StoreView::Set(absl::string_view key, absl::string_view value) const {
  v1::SetRequest request;
  request.set_namespace_(name_space_);
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::SetResponse response;
  return Unary(&v1::Store::Stub::Set, request, &response);
}

absl::StatusOr<std::string> StoreView::Get(absl::string_view key, absl::Duration timeout) const {
  v1::GetRequest request;
  request.set_namespace_(name_space_);
  request.set_key(std::string(key));
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::GetResponse response;
  absl::Status status = Unary(&v1::Store::Stub::Get, request, &response, timeout, true);
  if (!status.ok()) return status;
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> StoreView::Add(absl::string_view key, int64_t delta) const {
  v1::AddRequest request;
  request.set_namespace_(name_space_);
  request.set_key(std::string(key));
  request.set_delta(delta);
  v1::AddResponse response;
  absl::Status status = Unary(&v1::Store::Stub::Add, request, &response);
  if (!status.ok()) return status;
  return response.value();
}

absl::StatusOr<std::string> StoreView::CompareSet(absl::string_view key, absl::string_view expected,
                                                  absl::string_view desired) const {
  v1::CompareSetRequest request;
  request.set_namespace_(name_space_);
  request.set_key(std::string(key));
  request.set_expected_value(std::string(expected));
  request.set_desired_value(std::string(desired));
  v1::CompareSetResponse response;
  absl::Status status = Unary(&v1::Store::Stub::CompareSet, request, &response);
  if (!status.ok()) return status;
  return std::move(*response.mutable_value());
}

absl::Status StoreView::Wait(const std::vector<std::string>& keys, absl::Duration timeout) const {
  v1::WaitRequest request;
  request.set_namespace_(name_space_);
  request.mutable_keys()->Add(keys.begin(), keys.end());
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::WaitResponse response;
  return Unary(&v1::Store::Stub::Wait, request, &response, timeout, true);
}

absl::StatusOr<bool> StoreView::Check(const std::vector<std::string>& keys) const {
  v1::CheckRequest request;
  request.set_namespace_(name_space_);
  request.mutable_keys()->Add(keys.begin(), keys.end());
  v1::CheckResponse response;
  absl::Status status = Unary(&v1::Store::Stub::Check, request, &response);
  if (!status.ok()) return status;
  return response.ready();
}

absl::StatusOr<bool> StoreView::DeleteKey(absl::string_view key) const {
  v1::DeleteKeyRequest request;
  request.set_namespace_(name_space_);
  request.set_key(std::string(key));
  v1::DeleteKeyResponse response;
  absl::Status status = Unary(&v1::Store::Stub::DeleteKey, request, &response);
  if (!status.ok()) return status;
  return response.deleted();
}

absl::StatusOr<int64_t> StoreView::NumKeys() const {
  v1::NumKeysRequest request;
  request.set_namespace_(name_space_);
  v1::NumKeysResponse response;
  absl::Status status = Unary(&v1::Store::Stub::NumKeys, request, &response);
  if (!status.ok()) return status;
  return response.num_keys();
}

absl::StatusOr<std::vector<std::string>> StoreView::MultiGet(const std::vector<std::string>& keys,
                                                             absl::Duration timeout) const {
  v1::MultiGetRequest request;
  request.set_namespace_(name_space_);
  request.mutable_keys()->Add(keys.begin(), keys.end());
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::MultiGetResponse response;
  absl::Status status = Unary(&v1::Store::Stub::MultiGet, request, &response, timeout, true);
  if (!status.ok()) return status;
  return std::vector<std::string>(std::make_move_iterator(response.mutable_values()->begin()),
                                  std::make_move_iterator(response.mutable_values()->end()));
}

absl::Status StoreView::MultiSet(const std::vector<std::string>& keys,
                                 const std::vector<std::string>& values) const {
  v1::MultiSetRequest request;
  request.set_namespace_(name_space_);
  request.mutable_keys()->Add(keys.begin(), keys.end());
  request.mutable_values()->Add(values.begin(), values.end());
  v1::MultiSetResponse response;
  return Unary(&v1::Store::Stub::MultiSet, request, &response);
}

absl::Status StoreView::Append(absl::string_view key, absl::string_view value) const {
  v1::AppendRequest request;
  request.set_namespace_(name_space_);
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::AppendResponse response;
  return Unary(&v1::Store::Stub::Append, request, &response);
}

absl::StatusOr<v1::StatusResponse> Client::Status() {
  v1::StatusResponse response;
  absl::Status status = FromGrpc(admin_->Status(Context().get(), v1::StatusRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::ProbePeersResponse> Client::ProbePeers() {
  v1::ProbePeersResponse response;
  absl::Status status =
      FromGrpc(admin_->ProbePeers(Context().get(), v1::ProbePeersRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::ProbeStoresResponse> Client::ProbeStores() {
  v1::ProbeStoresResponse response;
  absl::Status status =
      FromGrpc(admin_->ProbeStores(Context().get(), v1::ProbeStoresRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<bool> Client::Serving() {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckResponse response;
  absl::Status status =
      FromGrpc(health->Check(Context().get(), grpc::health::v1::HealthCheckRequest(), &response));
  if (!status.ok()) return status;
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace tpd
