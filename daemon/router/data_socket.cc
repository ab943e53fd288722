#include "daemon/router/data_socket.h"

#include <errno.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/logging.h"
#include "daemon/router/session_handle.h"
#include "shm/attach.h"
#include "shm/fd_message.h"

namespace tpd {
namespace {

constexpr uint64_t kListenTag = 0;
constexpr uint64_t kWakeTag = 1;
// Set in the tags of watched processes' pidfds, so the loop tells them from connections
// without a lookup (ids count up from 2 and never reach it).
constexpr uint64_t kProcessTagBit = uint64_t{1} << 63;

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Sends `reply`, with `fd` as SCM_RIGHTS when fd >= 0. False when it did not go whole.
bool SendReply(int socket, const shm::AttachReply& reply, int fd) {
  const std::array<uint8_t, shm::kAttachReplyBytes> bytes = shm::EncodeAttachReply(reply);
  // A fresh connection's send buffer always holds one reply, so a non-blocking send that
  // does not take it whole is a peer that is gone.
  return shm::SendWithFd(socket, bytes.data(), bytes.size(), fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataSocket>> DataSocket::Start(DataSocketOptions options) {
  absl::StatusOr<shm::Layout> layout = shm::ComputeLayout(options.limits);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<std::unique_ptr<SocketLock>> lock = SocketLock::Acquire(options.path);
  if (!lock.ok()) return lock.status();
  const int listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd < 0) return ErrnoError("cannot create the data socket", options.path);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, options.path.c_str(), sizeof(addr.sun_path) - 1);
  // Private until SetSocketOwnership widens it, as the gRPC socket.
  const mode_t old_umask = umask(0177);
  const int bound = bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old_umask);
  // A job's processes start together: hundreds connect at once, and a full backlog would
  // refuse them (EAGAIN) before the daemon sees them. SOMAXCONN is the kernel's cap.
  if (bound != 0 || listen(listen_fd, SOMAXCONN) != 0) {
    const absl::Status status = ErrnoError("cannot listen on the data socket", options.path);
    close(listen_fd);
    return status;
  }
  if (absl::Status status = SetSocketOwnership(options.path, options.mode, options.group);
      !status.ok()) {
    close(listen_fd);
    return status;
  }
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd < 0 || epoll_fd < 0) {
    const absl::Status status =
        ErrnoError("cannot create the loop of the data socket", options.path);
    close(listen_fd);
    if (wake_fd >= 0) close(wake_fd);
    if (epoll_fd >= 0) close(epoll_fd);
    return status;
  }
  epoll_event listen_event{};
  listen_event.events = EPOLLIN;
  listen_event.data.u64 = kListenTag;
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &listen_event);
  epoll_event wake_event{};
  wake_event.events = EPOLLIN;
  wake_event.data.u64 = kWakeTag;
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &wake_event);
  std::unique_ptr<DataSocket> socket(new DataSocket(
      std::move(options), layout->total_bytes, *std::move(lock), listen_fd, wake_fd, epoll_fd));
  socket->loop_ = std::thread([raw = socket.get()] { raw->Loop(); });
  DaemonLog().info(
      "[data {}] attaching sessions to shared memory ({} bytes per heap, at most {} "
      "sessions and {} bytes of segments, {} places kept for other users)",
      socket->path_, socket->options_.limits.tx_heap_bytes, socket->options_.max_sessions,
      socket->options_.max_shared_memory_bytes, socket->options_.sessions_kept_free);
  return socket;
}

DataSocket::DataSocket(DataSocketOptions options, uint64_t segment_bytes,
                       std::unique_ptr<SocketLock> lock, int listen_fd, int wake_fd, int epoll_fd)
    : options_(std::move(options)),
      segment_bytes_(segment_bytes),
      path_(options_.path),
      lock_(std::move(lock)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      epoll_fd_(epoll_fd) {}

DataSocket::~DataSocket() { Shutdown(); }

void DataSocket::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t written = write(wake_fd_, &one, sizeof(one));
  if (loop_.joinable()) loop_.join();
  std::map<uint64_t, Connection> connections;
  {
    absl::MutexLock lock(&mu_);
    connections = std::move(connections_);
    connections_.clear();
    attached_.clear();
  }
  for (auto& [id, connection] : connections) {
    close(connection.fd);
    if (!connection.session_id.empty() && options_.on_detach) {
      options_.on_detach(connection.session_id);
    }
  }
  connections.clear();  // unmaps every segment
  {
    absl::MutexLock lock(&mu_);
    for (auto& [tag, watch] : watches_) close(watch.pidfd);
    watches_.clear();
    watched_.clear();
  }
  close(listen_fd_);
  close(wake_fd_);
  close(epoll_fd_);
  lock_.reset();  // removes the socket file
}

void DataSocket::EndSession(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  if (auto watched = watched_.find(session_id); watched != watched_.end()) {
    close(watches_.at(watched->second).pidfd);  // leaves the epoll set with it
    watches_.erase(watched->second);
    watched_.erase(watched);
  }
  auto it = attached_.find(session_id);
  if (it == attached_.end()) return;
  // The loop sees the hang-up and closes; only the loop closes fds, so this one is ours.
  shutdown(connections_.at(it->second).fd, SHUT_RDWR);
}

std::vector<DataSocket::SessionInfo> DataSocket::Sessions() const {
  absl::MutexLock lock(&mu_);
  std::vector<SessionInfo> sessions;
  for (const auto& [session_id, id] : attached_) {
    const Connection& connection = connections_.at(id);
    SessionInfo info;
    info.session_id = session_id;
    info.pid = connection.pid;
    info.uid = connection.uid;
    info.gid = connection.gid;
    info.segment_bytes = connection.segment ? connection.segment->size() : 0;
    info.attached_at = connection.attached_at;
    sessions.push_back(std::move(info));
  }
  return sessions;
}

absl::Duration DataSocket::CloseSlowRequests() {
  const absl::Time now = absl::Now();
  std::vector<uint64_t> late;
  absl::Duration next = absl::InfiniteDuration();
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, connection] : connections_) {
      if (!connection.session_id.empty()) continue;
      const absl::Time due = connection.accepted_at + options_.request_timeout;
      if (due <= now) {
        late.push_back(id);
      } else {
        next = std::min(next, due - now);
      }
    }
  }
  for (uint64_t id : late) {
    uid_t uid;
    {
      absl::MutexLock lock(&mu_);
      uid = connections_.at(id).uid;
    }
    LogRefusal(uid, absl::StrCat("connection ", id, " sent no attach request within ",
                                 absl::FormatDuration(options_.request_timeout), "; closed"));
    Close(id, false);
  }
  return next;
}

void DataSocket::Loop() {
  pthread_setname_np(pthread_self(), "tpd-data");
  epoll_event events[64];
  while (true) {
    absl::Duration wait = CloseSlowRequests();
    if (accept_paused_until_ != absl::InfinitePast()) {
      const absl::Time now = absl::Now();
      if (now >= accept_paused_until_) {
        epoll_event listen_event{};
        listen_event.events = EPOLLIN;
        listen_event.data.u64 = kListenTag;
        epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &listen_event);
        accept_paused_until_ = absl::InfinitePast();
      } else {
        wait = std::min(wait, accept_paused_until_ - now);
      }
    }
    const int timeout_ms =
        wait == absl::InfiniteDuration()
            ? -1
            : static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(wait) + 1));
    const int n = epoll_wait(epoll_fd_, events, 64, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      DaemonLog().error("[data {}] epoll_wait: {}; attaching stops", path_, std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
      } else if (tag == kListenTag) {
        Accept();
      } else if (tag & kProcessTagBit) {
        ProcessExited(tag);
      } else {
        OnReadable(tag);
      }
    }
  }
}

bool DataSocket::EvictIdlePending() {
  std::map<uid_t, int64_t> pending_by_uid;
  for (const auto& [id, connection] : connections_) {
    if (connection.session_id.empty()) ++pending_by_uid[connection.uid];
  }
  const absl::Time idle_since = absl::Now() - kPendingGrace;
  std::optional<uint64_t> victim;
  absl::Time oldest = absl::InfiniteFuture();
  for (const auto& [id, connection] : connections_) {
    if (!connection.session_id.empty() || connection.accepted_at > idle_since) continue;
    if (pending_by_uid[connection.uid] <= options_.max_pending_per_uid) continue;
    if (connection.accepted_at < oldest) {
      oldest = connection.accepted_at;
      victim = id;
    }
  }
  if (!victim) return false;
  const Connection& connection = connections_.at(*victim);
  LogRefusal(connection.uid,
             absl::StrCat("uid ", connection.uid, " holds ", pending_by_uid[connection.uid],
                          " connections that have not attached yet (its share is ",
                          options_.max_pending_per_uid, ") and every place is taken: closed its ",
                          "oldest, idle since ", absl::FormatTime(connection.accepted_at)));
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, connection.fd, nullptr);
  close(connection.fd);
  connections_.erase(*victim);
  return true;
}

void DataSocket::Accept() {
  while (true) {
    {
      // Every place for a connection that has not sent its request is taken. A burst of one
      // job's processes is served in a moment: the listener waits (they queue in the
      // backlog) rather than refusing them. A user holding more than its share idle gives up
      // its oldest, so its connections cannot keep others waiting.
      absl::MutexLock lock(&mu_);
      const int64_t pending = static_cast<int64_t>(connections_.size() - attached_.size());
      if (pending >= options_.max_pending && !EvictIdlePending()) {
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        accept_paused_until_ = absl::Now() + kAcceptPause;
        return;
      }
    }
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      if (error == EINTR || error == ECONNABORTED) continue;
      if (error == EAGAIN || error == EWOULDBLOCK) return;
      if (error == EMFILE || error == ENFILE) {
        // Level-triggered: the listener would wake the loop again at once, for ever.
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        accept_paused_until_ = absl::Now() + absl::Milliseconds(100);
      }
      LogRefusal(
          static_cast<uid_t>(-1),
          absl::StrCat("accept: ", std::strerror(error),
                       error == EMFILE || error == ENFILE ? "; accepting again in 100 ms" : ""));
      return;
    }
    ucred cred{};
    socklen_t length = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
      close(fd);
      continue;
    }
    uint64_t id;
    {
      absl::MutexLock lock(&mu_);
      id = next_id_++;
      Connection& connection = connections_[id];
      connection.fd = fd;
      connection.pid = cred.pid;
      connection.uid = cred.uid;
      connection.gid = cred.gid;
      connection.accepted_at = absl::Now();
    }
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP;
    event.data.u64 = id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
  }
}

void DataSocket::OnReadable(uint64_t id) {
  int fd;
  bool attached;
  std::string request;
  {
    absl::MutexLock lock(&mu_);
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    fd = it->second.fd;
    attached = !it->second.session_id.empty();
    request = it->second.request;
  }
  // One byte past a request tells an oversized one apart from a whole one.
  char buffer[shm::kAttachRequestBytes + 1];
  const size_t want = attached ? sizeof(buffer) : sizeof(buffer) - request.size();
  const ssize_t got = recv(fd, buffer, want, MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (attached) {
    // Nothing may come after the request: a hang-up or any byte ends the session.
    Close(id, /*end=*/true);
    return;
  }
  if (got <= 0) {
    Close(id, false);
    return;
  }
  request.append(buffer, static_cast<size_t>(got));
  if (request.size() > shm::kAttachRequestBytes) {
    LogRefusal(UidOf(id),
               absl::StrCat("connection ", id, " sent more than an attach request; closed"));
    Close(id, false);
    return;
  }
  if (request.size() < shm::kAttachRequestBytes) {
    absl::MutexLock lock(&mu_);
    connections_.at(id).request = std::move(request);
    return;
  }
  absl::StatusOr<shm::DataRequest> decoded = shm::DecodeDataRequest(request);
  if (!decoded.ok()) {
    LogRefusal(UidOf(id),
               absl::StrCat("connection ", id, ": ", decoded.status().message(), "; closed"));
    Close(id, false);
    return;
  }
  if (decoded->kind == shm::DataRequest::Kind::kIdentify) {
    Identify(id, decoded->session_id);
  } else {
    Attach(id, decoded->session_id);
  }
}

absl::Status DataSocket::OpenAndBound(const std::string& session_id, uid_t uid) {
  if (!options_.session_open(session_id)) {
    return absl::NotFoundError(
        "no open session with this id: open one with Control.OpenSession, keep its stream "
        "open and send the id it gave");
  }
  return options_.bind_uid ? options_.bind_uid(session_id, uid) : absl::OkStatus();
}

void DataSocket::Identify(uint64_t id, const std::string& session_id) {
  int fd;
  uid_t uid;
  pid_t pid;
  {
    absl::MutexLock lock(&mu_);
    const Connection& connection = connections_.at(id);
    fd = connection.fd;
    uid = connection.uid;
    pid = connection.pid;
  }
  shm::AttachReply reply;
  reply.status = OpenAndBound(session_id, uid);
  if (!reply.status.ok()) {
    LogRefusal(uid, absl::StrCat("identify from pid ", pid, " uid ", uid,
                                 " refused: ", reply.status.ToString()));
  }
  SendReply(fd, reply, -1);
  Close(id, false);
  if (reply.status.ok()) WatchProcess(session_id, pid);
}

void DataSocket::WatchProcess(const std::string& session_id, pid_t pid) {
  if (pid <= 0) return;
  {
    absl::MutexLock lock(&mu_);
    if (watched_.count(session_id) > 0) return;
  }
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    if (errno == ESRCH) {
      // Gone already: its session has nobody left to serve.
      options_.end_session(session_id, absl::StrCat("its process (pid ", pid, ") exited"));
      return;
    }
    // A kernel before 5.3: the session ends with its connections instead (a forked child
    // holding them keeps it). Logged once per uid a second, as refusals are.
    LogRefusal(static_cast<uid_t>(-1),
               absl::StrCat("pidfd_open(", pid, "): ", std::strerror(errno),
                            "; the session ends when its connections close"));
    return;
  }
  absl::MutexLock lock(&mu_);
  const uint64_t tag = next_id_++ | kProcessTagBit;
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = tag;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, pidfd, &event) != 0) {
    close(pidfd);
    return;
  }
  watches_[tag] = ProcessWatch{pidfd, session_id, pid};
  watched_[session_id] = tag;
}

void DataSocket::ProcessExited(uint64_t tag) {
  ProcessWatch watch;
  {
    absl::MutexLock lock(&mu_);
    auto it = watches_.find(tag);
    if (it == watches_.end()) return;
    watch = std::move(it->second);
    watches_.erase(it);
    watched_.erase(watch.session_id);
    close(watch.pidfd);
  }
  DaemonLog().info("[session {}] its process (pid {}) exited; ending the session",
                   SessionHandle(watch.session_id), watch.pid);
  options_.end_session(watch.session_id, absl::StrCat("its process (pid ", watch.pid, ") exited"));
}

void DataSocket::Attach(uint64_t id, const std::string& session_id) {
  int fd = -1;
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  {
    absl::MutexLock lock(&mu_);
    const Connection& connection = connections_.at(id);
    fd = connection.fd;
    pid = connection.pid;
    uid = connection.uid;
    gid = connection.gid;
  }
  absl::Status refused = OpenAndBound(session_id, uid);
  {
    absl::MutexLock lock(&mu_);
    if (refused.ok() && attached_.count(session_id) != 0) {
      const Connection& holder = connections_.at(attached_.at(session_id));
      refused = absl::AlreadyExistsError(absl::StrCat("session ", SessionHandle(session_id),
                                                      " is attached already (by pid ", holder.pid,
                                                      "); a session attaches once"));
    } else if (refused.ok()) {
      refused = RoomFor(uid);
    }
  }
  if (refused.ok()) {
    absl::StatusOr<shm::Segment> segment = shm::Segment::Create(options_.limits);
    if (!segment.ok()) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("cannot create the session's segment (data.arena_bytes ",
                       options_.limits.tx_heap_bytes, "): ", segment.status().message()));
    } else {
      shm::AttachReply reply;
      reply.segment_bytes = segment->size();
      // Recorded before the reply goes, so whatever the client does next (Admin.Status, a
      // second attach) sees the session attached.
      int memfd;
      std::shared_ptr<shm::Segment> attached_segment;
      {
        absl::MutexLock lock(&mu_);
        Connection& connection = connections_.at(id);
        connection.session_id = session_id;
        connection.segment = std::make_shared<shm::Segment>(*std::move(segment));
        connection.attached_at = absl::Now();
        memfd = connection.segment->fd();
        attached_[session_id] = id;
        attached_segment = connection.segment;
      }
      // The router serves the session before its client learns it is attached, so a call
      // made right after the reply finds it; a failed send detaches it again (Close).
      absl::Status served = options_.on_attach ? options_.on_attach(session_id, {uid, gid, fd},
                                                                    std::move(attached_segment))
                                               : absl::OkStatus();
      if (!served.ok()) {
        LogRefusal(uid, absl::StrCat("attach from pid ", pid, " uid ", uid,
                                     " refused: ", served.ToString()));
        reply = shm::AttachReply{};
        reply.status = served;
        SendReply(fd, reply, -1);
        Close(id, false);  // detached: the router has no such session, on_detach is a no-op
        return;
      }
      if (!SendReply(fd, reply, memfd)) {
        Close(id, false);
        return;
      }
      {
        absl::MutexLock lock(&mu_);
        connections_.at(id).segment->CloseFd();
      }
      DaemonLog().info("[session {}] attached to shared memory by pid {} uid {} gid {} ({} bytes)",
                       SessionHandle(session_id), pid, uid, gid, reply.segment_bytes);
      // The stream may have ended between the check above and now; then EndSession found
      // nothing to close, so close here.
      if (!options_.session_open(session_id)) EndSession(session_id);
      return;
    }
  }
  LogRefusal(uid,
             absl::StrCat("attach from pid ", pid, " uid ", uid, " refused: ", refused.ToString()));
  shm::AttachReply reply;
  reply.status = refused;
  SendReply(fd, reply, -1);
  Close(id, false);
}

void DataSocket::LogRefusal(uid_t uid, const std::string& what) {
  int64_t held = 0;
  if (!refusals_.Admit(absl::StrCat(uid), &held)) return;
  DaemonLog().warn("[data {}] {}{}", path_, what, HeldBack(held, refusals_.interval()));
}

uid_t DataSocket::UidOf(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(id);
  return it == connections_.end() ? static_cast<uid_t>(-1) : it->second.uid;
}

absl::Status DataSocket::RoomFor(uid_t uid) const {
  const int64_t attached = static_cast<int64_t>(attached_.size());
  const int64_t mine = CountOf(uid, /*attached=*/true);
  const int64_t free_after = options_.max_sessions - attached - 1;
  // Every segment is the same size, so the memory bound is a number of sessions too; it is
  // named apart because an operator may have set max_sessions above what it allows.
  const int64_t segment_bytes = static_cast<int64_t>(segment_bytes_);
  if (attached >= options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("data.max_sessions (", options_.max_sessions,
                     ") sessions are attached to shared memory; raise it or end other sessions"));
  }
  if ((attached + 1) * segment_bytes > options_.max_shared_memory_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("data.max_shared_memory_bytes (", options_.max_shared_memory_bytes, ") holds ",
                     attached, " session segments of ", segment_bytes, " bytes (data.arena_bytes ",
                     options_.limits.tx_heap_bytes,
                     " twice), all attached; raise it, lower data.arena_bytes "
                     "or end other sessions"));
  }
  if (mine >= options_.max_sessions_per_uid) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "data.max_sessions_per_uid (", options_.max_sessions_per_uid, ") sessions of uid ", uid,
        " are attached to shared memory; end some of them"));
  }
  if (mine >= options_.sessions_kept_free && free_after < options_.sessions_kept_free) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "data.sessions_kept_free (", options_.sessions_kept_free, "): uid ", uid, " has ", mine,
        " sessions attached and ", free_after + 1, " of data.max_sessions (", options_.max_sessions,
        ") places are free; the last ", options_.sessions_kept_free,
        " are kept for other users' sessions (raise data.max_sessions, or lower "
        "data.sessions_kept_free on a node with one user)"));
  }
  return absl::OkStatus();
}

int64_t DataSocket::CountOf(uid_t uid, bool attached) const {
  int64_t n = 0;
  for (const auto& [id, connection] : connections_) {
    if (connection.uid == uid && connection.session_id.empty() != attached) ++n;
  }
  return n;
}

std::map<uid_t, DataSocket::UidUse> DataSocket::UsePerUid() const {
  absl::MutexLock lock(&mu_);
  std::map<uid_t, UidUse> use;
  for (const auto& [id, connection] : connections_) {
    UidUse& of = use[connection.uid];
    if (connection.session_id.empty()) {
      ++of.pending;
    } else {
      ++of.sessions;
      of.segment_bytes += connection.segment ? connection.segment->size() : 0;
    }
  }
  return use;
}

void DataSocket::Close(uint64_t id, bool end) {
  Connection connection;
  {
    absl::MutexLock lock(&mu_);
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    connection = std::move(it->second);
    connections_.erase(it);
    if (!connection.session_id.empty()) attached_.erase(connection.session_id);
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, connection.fd, nullptr);
  close(connection.fd);
  if (connection.session_id.empty()) return;
  if (options_.on_detach) options_.on_detach(connection.session_id);
  connection.segment.reset();  // unmapped here unless a transfer still reads it
  DaemonLog().info("[session {}] data connection of pid {} closed; segment freed",
                   SessionHandle(connection.session_id), connection.pid);
  if (end) {
    options_.end_session(connection.session_id,
                         "the session's data connection closed; open a new session");
  }
}

}  // namespace tpd
