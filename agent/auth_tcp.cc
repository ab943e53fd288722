#include "agent/auth_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/hmac.h"
#include "base/random_bytes.h"
#include "tensorpipe/common/error.h"
#include "tensorpipe/common/nop.h"
#include "tensorpipe/transport/connection.h"
#include "tensorpipe/transport/context.h"
#include "tensorpipe/transport/error.h"
#include "tensorpipe/transport/listener.h"

namespace tpd::agent {
namespace {

using tensorpipe::Error;

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
// How often the loop looks at handshakes' deadlines.
constexpr absl::Duration kTick = absl::Milliseconds(500);

class TextError final : public tensorpipe::BaseError {
 public:
  explicit TextError(std::string what) : what_(std::move(what)) {}
  std::string what() const override { return what_; }

 private:
  std::string what_;
};

template <typename T, typename... Args>
Error MakeError(Args&&... args) {
  return Error(std::make_shared<T>(std::forward<Args>(args)...), __FILE__, __LINE__);
}

Error Failure(std::string what) { return MakeError<TextError>(std::move(what)); }

std::string Mac(const std::string& token, absl::string_view role, absl::string_view nonce_a,
                absl::string_view nonce_c) {
  return HmacSha256(token, absl::StrCat("tpd-conn-v1 ", role, nonce_a, nonce_c));
}

// "host:port" (host an IPv4 literal, or an IPv6 one in brackets), or a host alone (port 0).
bool ParseAddress(const std::string& addr, sockaddr_storage* out, socklen_t* length) {
  std::string host = addr;
  int port = 0;
  if (!addr.empty() && addr[0] == '[') {
    const size_t close = addr.find(']');
    if (close == std::string::npos) return false;
    host = addr.substr(1, close - 1);
    if (close + 1 < addr.size()) {
      if (addr[close + 1] != ':' || !absl::SimpleAtoi(addr.substr(close + 2), &port)) return false;
    }
  } else if (const size_t colon = addr.rfind(':');
             colon != std::string::npos && addr.find(':') == colon) {
    host = addr.substr(0, colon);
    if (!absl::SimpleAtoi(addr.substr(colon + 1), &port)) return false;
  }
  if (port < 0 || port > 65535) return false;
  std::memset(out, 0, sizeof(*out));
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in);
    return true;
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

std::string FormatAddress(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text));
    return absl::StrCat(text, ":", ntohs(v4.sin_port));
  }
  const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
  inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text));
  return absl::StrCat("[", text, "]:", ntohs(v6.sin6_port));
}

std::string PeerOf(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "?";
  return FormatAddress(address);
}

// Something the loop watches: a connection or a listener.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual void OnEvents(uint32_t events) = 0;
  virtual void OnTick(absl::Time now) = 0;
  // The context closes: fail everything, release the fd.
  virtual void OnClose() = 0;
};

// One thread and its epoll set. Everything a handler does runs here; handlers are kept alive
// while watched.
class Loop {
 public:
  Loop()
      : epoll_fd_(epoll_create1(EPOLL_CLOEXEC)), wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = 0;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &event);
    thread_ = std::thread([this] { Run(); });
  }
  ~Loop() {
    Close();
    Join();
    close(epoll_fd_);
    close(wake_fd_);
  }

  // Runs `fn` on the loop thread; once the loop has ended, on the caller's (one at a time).
  void Defer(std::function<void()> fn) {
    {
      absl::MutexLock lock(&mu_);
      if (!ended_) {
        tasks_.push_back(std::move(fn));
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t written = write(wake_fd_, &one, sizeof(one));
        return;
      }
    }
    // One at a time; a task that defers another (a callback closing a connection) runs it
    // in place rather than wait for itself.
    thread_local bool running_late = false;
    if (running_late) {
      fn();
      return;
    }
    absl::MutexLock late(&late_mu_);
    running_late = true;
    fn();
    running_late = false;
  }

  // Loop thread only (or the caller's, once the loop ended: the handler is closed at once).
  void Watch(int fd, uint32_t events, std::shared_ptr<Handler> handler) {
    if (stop_) {
      handler->OnClose();
      return;
    }
    const uint64_t id = next_id_++;
    handlers_[id] = std::move(handler);
    ids_[fd] = id;
    epoll_event event{};
    event.events = events;
    event.data.u64 = id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
  }
  void Modify(int fd, uint32_t events) {
    epoll_event event{};
    event.events = events;
    event.data.u64 = ids_.at(fd);
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &event);
  }
  // Stops watching `fd`; its handler goes once the current event is handled.
  void Unwatch(int fd) {
    auto it = ids_.find(fd);
    if (it == ids_.end()) return;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    retired_.push_back(std::move(handlers_[it->second]));
    handlers_.erase(it->second);
    ids_.erase(it);
  }

  // Fails every handler and ends the thread after the tasks queued before it.
  void Close() {
    Defer([this] {
      std::map<uint64_t, std::shared_ptr<Handler>> all = handlers_;
      for (auto& [id, handler] : all) handler->OnClose();
      stop_ = true;
    });
  }
  void Join() {
    absl::MutexLock lock(&join_mu_);
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    pthread_setname_np(pthread_self(), "tpd-tcp");
    epoll_event events[64];
    absl::Time next_tick = absl::Now() + kTick;
    while (!stop_) {
      const int timeout = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(next_tick - absl::Now())));
      const int n = epoll_wait(epoll_fd_, events, 64, timeout);
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 == 0) {
          uint64_t count;
          [[maybe_unused]] ssize_t got = read(wake_fd_, &count, sizeof(count));
          continue;
        }
        auto it = handlers_.find(events[i].data.u64);
        if (it == handlers_.end()) continue;  // unwatched by an earlier event of this batch
        std::shared_ptr<Handler> handler = it->second;
        handler->OnEvents(events[i].events);
      }
      RunTasks();
      if (absl::Now() >= next_tick) {
        const absl::Time now = absl::Now();
        std::map<uint64_t, std::shared_ptr<Handler>> all = handlers_;
        for (auto& [id, handler] : all) handler->OnTick(now);
        next_tick = now + kTick;
      }
      retired_.clear();
    }
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
    }
    RunTasks();  // queued before `ended_`: the later ones run on their callers
    retired_.clear();
  }

  void RunTasks() {
    std::deque<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&mu_);
      tasks.swap(tasks_);
    }
    for (std::function<void()>& task : tasks) task();
  }

  const int epoll_fd_;
  const int wake_fd_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex late_mu_;
  absl::Mutex join_mu_;
  // Loop thread only.
  bool stop_ = false;
  uint64_t next_id_ = 1;  // 0: the wake fd
  std::map<uint64_t, std::shared_ptr<Handler>> handlers_;
  std::map<int, uint64_t> ids_;
  std::vector<std::shared_ptr<Handler>> retired_;
  std::thread thread_;
};

// One connection. Every method runs on the loop thread.
class Conn final : public Handler, public std::enable_shared_from_this<Conn> {
 public:
  enum class Role { kConnector, kAcceptor };
  enum class State { kConnecting, kHandshake, kOpen, kFailed };
  using Ready = std::function<void(const std::shared_ptr<Conn>&, const Error&)>;

  Conn(std::shared_ptr<Loop> loop, std::shared_ptr<const AuthTcpOptions> options, Role role)
      : loop_(std::move(loop)), options_(std::move(options)), role_(role) {}

  // A connection to `addr`: the connect and the handshake start now; operations wait.
  void StartConnect(const std::string& addr) {
    sockaddr_storage address{};
    socklen_t length = 0;
    if (!ParseAddress(addr, &address, &length)) {
      Fail(Failure(absl::StrCat("cannot connect to \"", addr, "\": not an IP address and port")));
      return;
    }
    fd_ = socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      Fail(MakeError<tensorpipe::SystemError>("socket", errno));
      return;
    }
    peer_ = addr;
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    deadline_ = absl::Now() + options_->handshake_timeout;
    if (connect(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 && errno != EINPROGRESS) {
      Fail(MakeError<tensorpipe::SystemError>("connect", errno));
      return;
    }
    state_ = State::kConnecting;
    events_ = EPOLLOUT;
    loop_->Watch(fd_, events_, shared_from_this());
  }

  // An accepted socket: the handshake starts now; `ready` is told how it ended.
  void StartAccepted(int fd, Ready ready) {
    fd_ = fd;
    peer_ = PeerOf(fd);
    ready_ = std::move(ready);
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    deadline_ = absl::Now() + options_->handshake_timeout;
    state_ = State::kHandshake;
    nonce_a_ = RandomBytes(kNonceBytes);
    out_ = nonce_a_;
    need_ = kNonceBytes + kMacBytes;
    events_ = EPOLLIN | EPOLLOUT;
    loop_->Watch(fd_, events_, shared_from_this());
  }

  void Read(tensorpipe::transport::Connection::read_callback_fn fn) {
    AddRead(ReadOp{ReadOp::kAny, nullptr, 0, nullptr, std::move(fn), nullptr});
  }
  void ReadInto(void* ptr, size_t length, tensorpipe::transport::Connection::read_callback_fn fn) {
    AddRead(ReadOp{ReadOp::kFixed, static_cast<uint8_t*>(ptr), length, nullptr, std::move(fn),
                   nullptr});
  }
  void ReadNop(tensorpipe::AbstractNopHolder* object,
               tensorpipe::transport::Connection::read_nop_callback_fn fn) {
    AddRead(ReadOp{ReadOp::kNop, nullptr, 0, object, nullptr, std::move(fn)});
  }
  void Write(const void* ptr, size_t length, std::shared_ptr<std::vector<uint8_t>> owned,
             tensorpipe::transport::Connection::write_callback_fn fn) {
    if (state_ == State::kFailed) {
      fn(error_);
      return;
    }
    WriteOp op;
    op.header = static_cast<uint64_t>(length);
    op.ptr = static_cast<const uint8_t*>(ptr);
    op.length = length;
    op.owned = std::move(owned);
    op.fn = std::move(fn);
    writes_.push_back(std::move(op));
    if (state_ == State::kOpen) DoWrites();
    UpdateInterest();
  }
  void Close() { Fail(MakeError<tensorpipe::transport::ConnectionClosedError>()); }

  void OnEvents(uint32_t events) override {
    if (state_ == State::kConnecting) {
      int error = 0;
      socklen_t length = sizeof(error);
      getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        Fail(MakeError<tensorpipe::SystemError>("connect", error));
        return;
      }
      state_ = State::kHandshake;
      need_ = kNonceBytes;  // the acceptor's challenge
    }
    if (state_ == State::kHandshake) {
      Handshake();
    } else if (state_ == State::kOpen) {
      if ((events & EPOLLOUT) != 0) DoWrites();
      if (state_ == State::kOpen && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) {
        if (reads_.empty()) {
          // Nothing to read into, and the peer is gone: nothing more can happen here.
          if ((events & (EPOLLHUP | EPOLLERR)) != 0) Fail(MakeError<tensorpipe::EOFError>());
        } else {
          DoReads();
        }
      }
    }
    UpdateInterest();
  }

  void OnTick(absl::Time now) override {
    if ((state_ == State::kConnecting || state_ == State::kHandshake) && now >= deadline_) {
      Fail(Failure(absl::StrCat("no transport handshake with ", peer_, " within ",
                                absl::FormatDuration(options_->handshake_timeout))));
    }
  }

  void OnClose() override { Fail(MakeError<tensorpipe::transport::ContextClosedError>()); }

  void Fail(const Error& error) {
    if (state_ == State::kFailed) return;
    const bool handshaking = state_ != State::kOpen;
    state_ = State::kFailed;
    error_ = error;
    if (fd_ >= 0) {
      loop_->Unwatch(fd_);
      close(fd_);
      fd_ = -1;
    }
    if (handshaking && ready_) {
      Ready ready = std::move(ready_);
      ready_ = nullptr;
      ready(shared_from_this(), error);
    }
    std::deque<ReadOp> reads = std::move(reads_);
    reads_.clear();
    std::deque<WriteOp> writes = std::move(writes_);
    writes_.clear();
    for (ReadOp& op : reads) op.Finish(error_, nullptr, 0);
    for (WriteOp& op : writes) op.fn(error_);
  }

  const std::string& peer() const { return peer_; }

 private:
  struct ReadOp {
    enum Kind { kAny, kFixed, kNop } kind;
    uint8_t* ptr;  // kFixed: the caller's buffer
    size_t length;
    tensorpipe::AbstractNopHolder* object;
    tensorpipe::transport::Connection::read_callback_fn fn;
    tensorpipe::transport::Connection::read_nop_callback_fn nop_fn;
    std::array<uint8_t, 8> header{};
    size_t header_got = 0;
    uint64_t frame = 0;  // the frame's length, once its header is in
    std::unique_ptr<uint8_t[]> buffer;
    uint64_t got = 0;

    void Finish(const Error& error, const void* data, size_t size) {
      if (nop_fn) {
        nop_fn(error);
      } else {
        fn(error, data, size);
      }
    }
  };
  struct WriteOp {
    uint64_t header = 0;
    const uint8_t* ptr = nullptr;
    size_t length = 0;
    std::shared_ptr<std::vector<uint8_t>> owned;  // a serialized nop object
    tensorpipe::transport::Connection::write_callback_fn fn;
    size_t sent = 0;  // of the 8 + length bytes
  };

  void AddRead(ReadOp op) {
    if (state_ == State::kFailed) {
      op.Finish(error_, nullptr, 0);
      return;
    }
    reads_.push_back(std::move(op));
    if (state_ == State::kOpen) DoReads();
    UpdateInterest();
  }

  void Handshake() {
    // Reads exactly what the step needs: never a byte of TensorPipe's that follows.
    while (got_ < need_) {
      const ssize_t n = recv(fd_, in_.data() + got_, need_ - got_, 0);
      if (n == 0) {
        Fail(Failure(
            absl::StrCat("connection from/to ", peer_, " closed during the transport handshake")));
        return;
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) break;
        Fail(MakeError<tensorpipe::SystemError>("recv", errno));
        return;
      }
      got_ += static_cast<size_t>(n);
    }
    if (got_ == need_ && need_ > 0) {
      const std::string in(reinterpret_cast<const char*>(in_.data()), got_);
      got_ = 0;
      need_ = 0;
      if (role_ == Role::kAcceptor) {
        const std::string nonce_c = in.substr(0, kNonceBytes);
        if (!ConstantTimeEquals(in.substr(kNonceBytes),
                                Mac(options_->token, "connect", nonce_a_, nonce_c))) {
          Fail(Failure(absl::StrCat("transport handshake refused from ", peer_,
                                    ": bad MAC (another token, or not a tpd agent)")));
          return;
        }
        out_ += Mac(options_->token, "accept", nonce_a_, nonce_c);
        proved_ = true;
      } else if (nonce_a_.empty()) {
        nonce_a_ = in;
        nonce_c_ = RandomBytes(kNonceBytes);
        out_ += nonce_c_ + Mac(options_->token, "connect", nonce_a_, nonce_c_);
        need_ = kMacBytes;
      } else {
        if (!ConstantTimeEquals(in, Mac(options_->token, "accept", nonce_a_, nonce_c_))) {
          Fail(Failure(absl::StrCat("transport handshake refused by ", peer_,
                                    ": bad MAC (another token, or not a tpd agent)")));
          return;
        }
        proved_ = true;
      }
    }
    while (sent_ < out_.size()) {
      const ssize_t n = send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        Fail(MakeError<tensorpipe::SystemError>("send", errno));
        return;
      }
      sent_ += static_cast<size_t>(n);
    }
    if (proved_ && sent_ == out_.size()) Open();
  }

  void Open() {
    state_ = State::kOpen;
    out_.clear();
    if (ready_) {
      Ready ready = std::move(ready_);
      ready_ = nullptr;
      ready(shared_from_this(), Error::kSuccess);
    }
    DoWrites();
    if (state_ == State::kOpen && !reads_.empty()) DoReads();
  }

  void DoReads() {
    while (state_ == State::kOpen && !reads_.empty()) {
      ReadOp& op = reads_.front();
      if (op.header_got < op.header.size()) {
        const ssize_t n =
            recv(fd_, op.header.data() + op.header_got, op.header.size() - op.header_got, 0);
        if (!Received(n)) return;
        op.header_got += static_cast<size_t>(n);
        if (op.header_got < op.header.size()) continue;
        std::memcpy(&op.frame, op.header.data(), sizeof(op.frame));
        if (op.kind == ReadOp::kFixed && op.frame != op.length) {
          Fail(Failure(absl::StrCat("a message of ", op.frame, " bytes from ", peer_, " where ",
                                    op.length, " were expected")));
          return;
        }
        if (op.kind != ReadOp::kFixed) {
          if (op.frame > options_->max_message_bytes) {
            Fail(Failure(absl::StrCat("a message of ", op.frame, " bytes from ", peer_,
                                      " exceeds the transport's limit of ",
                                      options_->max_message_bytes)));
            return;
          }
          op.buffer = std::make_unique<uint8_t[]>(op.frame > 0 ? op.frame : 1);
          op.ptr = op.buffer.get();
        }
      }
      if (op.got < op.frame) {
        const ssize_t n = recv(fd_, op.ptr + op.got, op.frame - op.got, 0);
        if (!Received(n)) return;
        op.got += static_cast<uint64_t>(n);
        if (op.got < op.frame) continue;
      }
      ReadOp done = std::move(reads_.front());
      reads_.pop_front();
      if (done.kind == ReadOp::kNop) {
        tensorpipe::NopReader reader(done.ptr, done.frame);
        if (!done.object->read(reader)) {
          reads_.push_front(std::move(done));  // failed below with the rest
          Fail(Failure(absl::StrCat("a control message from ", peer_, " that does not decode")));
          return;
        }
      }
      done.Finish(Error::kSuccess, done.ptr, done.frame);
    }
  }

  // Whether `n` bytes came; fails the connection on an end or an error (false on EAGAIN too).
  bool Received(ssize_t n) {
    if (n > 0) return true;
    if (n == 0) {
      Fail(MakeError<tensorpipe::EOFError>());
    } else if (errno != EAGAIN && errno != EINTR) {
      Fail(MakeError<tensorpipe::SystemError>("recv", errno));
    }
    return false;
  }

  void DoWrites() {
    while (state_ == State::kOpen && !writes_.empty()) {
      WriteOp& op = writes_.front();
      iovec parts[2];
      int count = 0;
      if (op.sent < sizeof(op.header)) {
        parts[count++] = {reinterpret_cast<uint8_t*>(&op.header) + op.sent,
                          sizeof(op.header) - op.sent};
      }
      const size_t body_sent = op.sent > sizeof(op.header) ? op.sent - sizeof(op.header) : 0;
      if (body_sent < op.length) {
        parts[count++] = {const_cast<uint8_t*>(op.ptr) + body_sent, op.length - body_sent};
      }
      msghdr message{};
      message.msg_iov = parts;
      message.msg_iovlen = static_cast<size_t>(count);
      const ssize_t n = count == 0 ? 0 : sendmsg(fd_, &message, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        Fail(MakeError<tensorpipe::SystemError>("sendmsg", errno));
        return;
      }
      op.sent += static_cast<size_t>(n);
      if (op.sent < sizeof(op.header) + op.length) continue;
      WriteOp done = std::move(writes_.front());
      writes_.pop_front();
      done.fn(Error::kSuccess);
    }
  }

  void UpdateInterest() {
    if (state_ == State::kFailed || fd_ < 0) return;
    uint32_t events = 0;
    if (state_ == State::kConnecting) {
      events = EPOLLOUT;
    } else if (state_ == State::kHandshake) {
      if (got_ < need_) events |= EPOLLIN;
      if (sent_ < out_.size()) events |= EPOLLOUT;
    } else {
      if (!reads_.empty()) events |= EPOLLIN;
      if (!writes_.empty()) events |= EPOLLOUT;
    }
    if (events != events_) {
      events_ = events;
      loop_->Modify(fd_, events_);
    }
  }

  const std::shared_ptr<Loop> loop_;
  const std::shared_ptr<const AuthTcpOptions> options_;
  const Role role_;
  int fd_ = -1;
  State state_ = State::kConnecting;
  Error error_;
  std::string peer_;
  absl::Time deadline_ = absl::InfiniteFuture();
  Ready ready_;
  // The handshake.
  std::string nonce_a_;
  std::string nonce_c_;
  std::array<uint8_t, kNonceBytes + kMacBytes> in_{};
  size_t need_ = 0;
  size_t got_ = 0;
  std::string out_;
  size_t sent_ = 0;
  bool proved_ = false;  // the peer proved the token
  std::deque<ReadOp> reads_;
  std::deque<WriteOp> writes_;
  uint32_t events_ = 0;
};

// What TensorPipe holds: its going closes the connection, as uv's does.
class ConnHandle final : public tensorpipe::transport::Connection {
 public:
  ConnHandle(std::shared_ptr<Loop> loop, std::shared_ptr<Conn> conn)
      : loop_(std::move(loop)), conn_(std::move(conn)) {}
  ~ConnHandle() override { close(); }

  void read(read_callback_fn fn) override {
    loop_->Defer([conn = conn_, fn = std::move(fn)]() mutable { conn->Read(std::move(fn)); });
  }
  void read(void* ptr, size_t length, read_callback_fn fn) override {
    loop_->Defer([conn = conn_, ptr, length, fn = std::move(fn)]() mutable {
      conn->ReadInto(ptr, length, std::move(fn));
    });
  }
  void write(const void* ptr, size_t length, write_callback_fn fn) override {
    loop_->Defer([conn = conn_, ptr, length, fn = std::move(fn)]() mutable {
      conn->Write(ptr, length, nullptr, std::move(fn));
    });
  }
  void read(tensorpipe::AbstractNopHolder& object, read_nop_callback_fn fn) override {
    loop_->Defer([conn = conn_, object = &object, fn = std::move(fn)]() mutable {
      conn->ReadNop(object, std::move(fn));
    });
  }
  void write(const tensorpipe::AbstractNopHolder& object, write_callback_fn fn) override {
    // Serialized now: the caller may change the object once this returns.
    auto bytes = std::make_shared<std::vector<uint8_t>>(object.getSize());
    tensorpipe::NopWriter writer(bytes->data(), bytes->size());
    const bool written = static_cast<bool>(object.write(writer));
    loop_->Defer([conn = conn_, bytes, written, fn = std::move(fn)]() mutable {
      if (!written) {
        fn(Failure("a control message that does not serialize"));
        return;
      }
      const uint8_t* data = bytes->data();
      const size_t size = bytes->size();
      conn->Write(data, size, std::move(bytes), std::move(fn));
    });
  }
  void setId(std::string id) override { (void)id; }
  void close() override {
    loop_->Defer([conn = conn_] { conn->Close(); });
  }

 private:
  const std::shared_ptr<Loop> loop_;
  const std::shared_ptr<Conn> conn_;
};

// A listening socket. Its connections reach TensorPipe only once they proved the token.
class ListenerImpl final : public Handler, public std::enable_shared_from_this<ListenerImpl> {
 public:
  ListenerImpl(std::shared_ptr<Loop> loop, std::shared_ptr<const AuthTcpOptions> options)
      : loop_(std::move(loop)), options_(std::move(options)) {}

  // On the caller's thread, before the loop knows the listener: bind and listen, so that
  // addr() knows the port at once.
  void Bind(const std::string& addr) {
    sockaddr_storage address{};
    socklen_t length = 0;
    if (!ParseAddress(addr, &address, &length)) {
      error_ = Failure(absl::StrCat("cannot listen on \"", addr, "\": not an IP address"));
      return;
    }
    fd_ = socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int one = 1;
    if (fd_ < 0 || setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 || listen(fd_, 128) != 0) {
      error_ = MakeError<tensorpipe::SystemError>("listen", errno);
      if (fd_ >= 0) close(fd_);
      fd_ = -1;
      return;
    }
    sockaddr_storage bound{};
    socklen_t bound_length = sizeof(bound);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &bound_length);
    addr_ = FormatAddress(bound);
  }
  void Start() {
    if (fd_ >= 0) loop_->Watch(fd_, EPOLLIN, shared_from_this());
  }

  const std::string& addr() const { return addr_; }

  void Accept(tensorpipe::transport::Listener::accept_callback_fn fn) {
    if (error_) {
      fn(error_, nullptr);
      return;
    }
    accepts_.push_back(std::move(fn));
    Deliver();
  }

  void OnEvents(uint32_t /*events*/) override {
    while (fd_ >= 0) {
      const int fd = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) {
          // Out of fds the listener stays readable: stop watching it until the next tick
          // rather than spin on a connection it cannot accept.
          loop_->Modify(fd_, 0);
          paused_ = true;
          Refused("out of file descriptors; accepting again in a moment");
        }
        return;  // EAGAIN: all accepted
      }
      if (handshaking_.size() >= options_->max_handshakes) {
        const std::string peer = PeerOf(fd);
        close(fd);
        Refused(absl::StrCat(options_->max_handshakes,
                             " transport handshakes are under way; closed one more from ", peer));
        continue;
      }
      auto conn = std::make_shared<Conn>(loop_, options_, Conn::Role::kAcceptor);
      handshaking_.insert(conn);
      std::weak_ptr<ListenerImpl> weak = weak_from_this();
      conn->StartAccepted(fd, [weak](const std::shared_ptr<Conn>& done, const Error& error) {
        if (std::shared_ptr<ListenerImpl> self = weak.lock()) self->Done(done, error);
      });
    }
  }
  void OnTick(absl::Time /*now*/) override {
    if (paused_ && fd_ >= 0) {
      paused_ = false;
      loop_->Modify(fd_, EPOLLIN);
    }
  }
  void OnClose() override { Close(MakeError<tensorpipe::transport::ContextClosedError>()); }

  void Close(const Error& error) {
    if (error_) return;
    error_ = error;
    if (fd_ >= 0) {
      loop_->Unwatch(fd_);
      close(fd_);
      fd_ = -1;
    }
    std::set<std::shared_ptr<Conn>> handshaking = std::move(handshaking_);
    handshaking_.clear();
    for (const std::shared_ptr<Conn>& conn : handshaking) conn->Close();
    std::deque<std::shared_ptr<Conn>> ready = std::move(ready_);
    ready_.clear();
    for (const std::shared_ptr<Conn>& conn : ready) conn->Close();
    std::deque<tensorpipe::transport::Listener::accept_callback_fn> accepts = std::move(accepts_);
    accepts_.clear();
    for (auto& fn : accepts) fn(error_, nullptr);
  }

 private:
  void Done(const std::shared_ptr<Conn>& conn, const Error& error) {
    if (handshaking_.erase(conn) == 0) return;  // the listener closed it
    if (error) {
      Refused(error.what());
      return;
    }
    ready_.push_back(conn);
    Deliver();
  }

  void Deliver() {
    while (!accepts_.empty() && !ready_.empty()) {
      auto fn = std::move(accepts_.front());
      accepts_.pop_front();
      std::shared_ptr<Conn> conn = std::move(ready_.front());
      ready_.pop_front();
      fn(Error::kSuccess, std::make_shared<ConnHandle>(loop_, std::move(conn)));
    }
  }

  void Refused(const std::string& why) {
    if (options_->on_refused) options_->on_refused(why);
  }

  const std::shared_ptr<Loop> loop_;
  const std::shared_ptr<const AuthTcpOptions> options_;
  int fd_ = -1;
  bool paused_ = false;  // not watched after running out of fds, until the next tick
  std::string addr_;
  Error error_;
  std::set<std::shared_ptr<Conn>> handshaking_;
  std::deque<std::shared_ptr<Conn>> ready_;
  std::deque<tensorpipe::transport::Listener::accept_callback_fn> accepts_;
};

class ListenerHandle final : public tensorpipe::transport::Listener {
 public:
  ListenerHandle(std::shared_ptr<Loop> loop, std::shared_ptr<ListenerImpl> impl)
      : loop_(std::move(loop)), impl_(std::move(impl)), addr_(impl_->addr()) {}
  ~ListenerHandle() override { close(); }

  void accept(accept_callback_fn fn) override {
    loop_->Defer([impl = impl_, fn = std::move(fn)]() mutable { impl->Accept(std::move(fn)); });
  }
  std::string addr() const override { return addr_; }
  void setId(std::string id) override { (void)id; }
  void close() override {
    loop_->Defer(
        [impl = impl_] { impl->Close(MakeError<tensorpipe::transport::ListenerClosedError>()); });
  }

 private:
  const std::shared_ptr<Loop> loop_;
  const std::shared_ptr<ListenerImpl> impl_;
  const std::string addr_;
};

class Context final : public tensorpipe::transport::Context {
 public:
  explicit Context(AuthTcpOptions options)
      : options_(std::make_shared<const AuthTcpOptions>(std::move(options))),
        loop_(std::make_shared<Loop>()),
        domain_(kAuthTcpDomain) {}
  ~Context() override {
    close();
    join();
  }

  std::shared_ptr<tensorpipe::transport::Connection> connect(std::string addr) override {
    auto conn = std::make_shared<Conn>(loop_, options_, Conn::Role::kConnector);
    loop_->Defer([conn, addr = std::move(addr)] { conn->StartConnect(addr); });
    return std::make_shared<ConnHandle>(loop_, std::move(conn));
  }
  std::shared_ptr<tensorpipe::transport::Listener> listen(std::string addr) override {
    auto impl = std::make_shared<ListenerImpl>(loop_, options_);
    impl->Bind(addr);
    loop_->Defer([impl] { impl->Start(); });
    return std::make_shared<ListenerHandle>(loop_, std::move(impl));
  }
  bool isViable() const override { return true; }
  const std::string& domainDescriptor() const override { return domain_; }
  void setId(std::string id) override { (void)id; }
  void close() override {
    if (!closed_.exchange(true)) loop_->Close();
  }
  void join() override {
    close();
    loop_->Join();
  }

 private:
  // Shared with the loop's handlers, which may outlive this object by a moment.
  const std::shared_ptr<const AuthTcpOptions> options_;
  const std::shared_ptr<Loop> loop_;
  const std::string domain_;
  std::atomic<bool> closed_{false};
};

}  // namespace

std::shared_ptr<tensorpipe::transport::Context> CreateAuthTcp(AuthTcpOptions options) {
  return std::make_shared<Context>(std::move(options));
}

}  // namespace tpd::agent
