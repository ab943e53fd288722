// What a local user can send to the real daemon's data socket (FAULTS.md B3, and the
// session-id half of B4): garbage bytes, a huge id length, connect-and-close, connections that
// stay silent, a wrong or another session's id (from another process), and a hundred attach
// attempts in a row. After each, the daemon answers health, a fresh client attaches and makes
// a call (Client::Call), the clients attached before go on, and the daemon's fds, threads and
// memfds return to their baseline.
//
// The daemon's agent port is here too: a connection closed early costs new pipes a moment, and
// garbage aborts the daemon inside TensorPipe (recorded as a known bug).
//
// Different credentials (another uid) cannot be tested without root; what binds a data
// connection to a session is the session id (docs/security.md, "The data socket"), so these
// tests check that an id cannot be guessed or bent, and what holding another's id allows.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/control.grpc.pb.h"
#include "shm/attach.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/one_daemon.h"
#include "tests/testing/proc_counts.h"
#include "tests/testing/raw_session.h"
#include "tests/testing/second_user.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::ProcCounts;
using testing::TempDir;
using testing::WaitUntil;

int ConnectTo(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends what it can of `bytes` (the daemon may close first).
void SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += n;
  }
}

// True when the daemon closed `fd` without sending anything: EOF, or a reset when it closed
// with our bytes unread.
bool ClosedWithoutReply(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// Whether `fd` is still open from the daemon's side (nothing to read, no hang-up).
bool StillOpen(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) == 0;
}

// Reads one attach reply from `fd`: the daemon's status, and the memfd on OK (-1 else). Uses
// no allocation or lock, so that a child forked from this (multi-threaded) process may call it.
absl::StatusCode ReadReply(int fd, int* memfd, char* message, size_t message_size) {
  *memfd = -1;
  uint8_t reply[shm::kAttachReplyBytes];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{reply, sizeof(reply)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(fd, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  if (n != static_cast<ssize_t>(sizeof(reply))) return absl::StatusCode::kUnavailable;
  if (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr && c->cmsg_type == SCM_RIGHTS) {
    std::memcpy(memfd, CMSG_DATA(c), sizeof(int));
  }
  // Layout of a reply (shm/attach.cc): magic[8], code u32, message length u32, segment
  // bytes u64, message[232].
  uint32_t code = 0;
  uint32_t length = 0;
  std::memcpy(&code, reply + 8, 4);
  std::memcpy(&length, reply + 12, 4);
  if (message != nullptr && message_size > 0) {
    const size_t copy = std::min<size_t>({length, shm::kMaxAttachMessageBytes, message_size - 1});
    std::memcpy(message, reply + 24, copy);
    message[copy] = '\0';
  }
  return static_cast<absl::StatusCode>(code);
}

// The attach exchange by hand on a fresh connection: the daemon's answer (UNAVAILABLE when it
// closed without one); *memfd gets the segment on OK.
absl::Status RawAttach(const std::string& path, const std::string& session_id, int* memfd,
                       int* connection = nullptr) {
  *memfd = -1;
  auto request = shm::EncodeAttachRequest(session_id);
  if (!request.ok()) return request.status();
  const int fd = ConnectTo(path);
  if (fd < 0) return absl::UnavailableError("connect");
  SendAll(fd, std::string(request->begin(), request->end()));
  char message[shm::kMaxAttachMessageBytes + 1];
  const absl::StatusCode code = ReadReply(fd, memfd, message, sizeof(message));
  if (connection != nullptr && code == absl::StatusCode::kOk) {
    *connection = fd;
  } else {
    close(fd);
  }
  return absl::Status(code, code == absl::StatusCode::kOk ? "" : message);
}

// An attach request with any field as given (EncodeAttachRequest refuses bad ones).
std::string Request(absl::string_view magic, uint32_t version, uint32_t length,
                    absl::string_view id) {
  std::string bytes(shm::kAttachRequestBytes, '\0');
  std::memcpy(bytes.data(), magic.data(), std::min<size_t>(magic.size(), 8));
  std::memcpy(bytes.data() + 8, &version, 4);
  std::memcpy(bytes.data() + 12, &length, 4);
  std::memcpy(bytes.data() + 16, id.data(), std::min<size_t>(id.size(), 64));
  return bytes;
}

std::string Random(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

std::string RandomId(std::mt19937_64& gen) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  for (char& c : id) c = kHex[gen() % 16];
  return id;
}

class DataSocketHostileTest : public testing::OneDaemonTest {
 protected:
  void SetUp() override {
    // Open to every user of the machine, so that a second user's connections can be tried.
    testing::OpenDirToSecondUser(dir_.path());
    testing::OneDaemonConfig config;
    config.node_name = "hostile";
    config.daemon_section = "socket_mode = \"0666\"\n";
    ASSERT_NO_FATAL_FAILURE(StartDaemon(config));
    data_socket_ = shm::DataSocketPath(socket_);
    // a and b, attached, in group g; b echoes.
    a_ = Connect();
    b_ = Connect();
    ASSERT_TRUE(a_ && b_);
    ASSERT_TRUE(Join(a_.get(), "a").ok());
    ASSERT_TRUE(Join(b_.get(), "b").ok());
    ASSERT_TRUE(b_->Handle("echo", [](const Message& request) -> absl::StatusOr<Message> {
                    return request;
                  }).ok());
    ASSERT_TRUE(a_->Call("g", "b", "echo", "warm", {}, absl::Seconds(10)).ok());
    ExpectServing();  // anything made lazily for a third client exists now
    // The fresh client of ExpectServing is still going away.
    std::optional<ProcCounts> settled = testing::SettledCounts(daemon_->pid());
    ASSERT_TRUE(settled.has_value()) << "the daemon's counts never held still";
    baseline_ = *settled;
    baseline_threads_ = testing::DescribeThreadsAndMemfds(daemon_->pid());
  }

  void TearDown() override {
    if (daemon_ == nullptr) return;
    ExpectServing();
    ExpectBackToBaseline();
  }

  // The daemon answers health; a fresh client joins, attaches and calls b; a calls b.
  void ExpectServing() {
    std::unique_ptr<Client> c = Connect();
    ASSERT_NE(c, nullptr);
    absl::StatusOr<bool> serving = c->Serving();
    ASSERT_TRUE(serving.ok()) << serving.status();
    EXPECT_TRUE(*serving);
    ASSERT_TRUE(Join(c.get(), absl::StrCat("c", ++fresh_)).ok());
    const absl::Time start = absl::Now();
    absl::StatusOr<Message> reply = c->Call("g", "b", "echo", "fresh", {}, absl::Seconds(10));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->payload, "fresh");
    EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "attach and call took too long";
    absl::StatusOr<Message> old = a_->Call("g", "b", "echo", "old", {}, absl::Seconds(10));
    ASSERT_TRUE(old.ok()) << old.status();
  }

  // The daemon's fds, threads and memfds are back where SetUp left them (fresh clients'
  // sessions are gone once they are).
  void ExpectBackToBaseline() {
    EXPECT_TRUE(testing::BackToBaseline(daemon_->pid(), baseline_, baseline_threads_));
  }

  // A session opened by hand (its stream kept open in the fixture); its id.
  std::string OpenRawSession() {
    if (raw_sessions_ == nullptr) {
      raw_sessions_ = std::make_unique<testing::RawSessionStreams>(socket_);
    }
    return raw_sessions_->Open();
  }
  void CloseRawSessions() { raw_sessions_.reset(); }

  std::string data_socket_;
  std::unique_ptr<Client> a_;
  std::unique_ptr<Client> b_;
  int fresh_ = 0;
  ProcCounts baseline_;
  std::string baseline_threads_;
  std::unique_ptr<testing::RawSessionStreams> raw_sessions_;
};

TEST_F(DataSocketHostileTest, GarbageBytesCloseOnlyTheirConnection) {
  const std::vector<std::string> inputs = {
      Random(shm::kAttachRequestBytes, 1),          // random, the request's size
      Random(4096, 2),                              // random, more than a request
      Random(1 << 20, 3),                           // 1 MiB
      std::string(shm::kAttachRequestBytes, '\0'),  // zeroes
      std::string(shm::kAttachRequestBytes, '\xff'),
  };
  for (const std::string& input : inputs) {
    const int fd = ConnectTo(data_socket_);
    ASSERT_GE(fd, 0);
    SendAll(fd, input);
    EXPECT_TRUE(ClosedWithoutReply(fd)) << input.size() << " bytes";
    close(fd);
  }
  ExpectServing();
}

TEST_F(DataSocketHostileTest, MalformedRequestsAreClosedWithoutAReply) {
  const std::string id = "0123456789abcdef0123456789abcdef";
  const std::vector<std::string> inputs = {
      Request("TPDATTQ1", 1, 0xffffffffu, id),                // a huge id length
      Request("TPDATTQ1", 1, 65, id),                         // one past the longest id
      Request("TPDATTQ1", 1, 0, ""),                          // none
      Request("TPDATTQ1", 0xffffffffu, 32, id),               // a version from the future
      Request("TPDATTQ2", 1, 32, id),                         // another magic
      Request("TPDATTQ1", 1, 32, absl::AsciiStrToUpper(id)),  // not [0-9a-f]
      Request("TPDATTQ1", 1, 16, id),  // bytes past the length: padding not zero
      Request("TPDATTQ1", 1, 32, std::string(31, 'a') + '\0'),  // a NUL inside
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int fd = ConnectTo(data_socket_);
    ASSERT_GE(fd, 0);
    SendAll(fd, inputs[i]);
    EXPECT_TRUE(ClosedWithoutReply(fd)) << "input " << i;
    close(fd);
  }
  // A whole request and one byte more, in one send.
  auto good = shm::EncodeAttachRequest(id);
  ASSERT_TRUE(good.ok());
  const int fd = ConnectTo(data_socket_);
  SendAll(fd, std::string(good->begin(), good->end()) + "x");
  EXPECT_TRUE(ClosedWithoutReply(fd));
  close(fd);
  ExpectServing();
}

TEST_F(DataSocketHostileTest, ConnectAndCloseAndCutRequests) {
  for (int i = 0; i < 100; ++i) {
    const int fd = ConnectTo(data_socket_);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  // Cut at every length, with a hang-up.
  auto request = shm::EncodeAttachRequest("0123456789abcdef");
  ASSERT_TRUE(request.ok());
  for (size_t cut = 1; cut < shm::kAttachRequestBytes; cut += 7) {
    const int fd = ConnectTo(data_socket_);
    ASSERT_GE(fd, 0);
    SendAll(fd, std::string(request->begin(), request->begin() + cut));
    shutdown(fd, SHUT_WR);
    EXPECT_TRUE(ClosedWithoutReply(fd)) << "cut at " << cut;
    close(fd);
  }
  ExpectServing();
}

TEST_F(DataSocketHostileTest, SilentConnectionsOfAnotherUserDoNotBlockAttaches) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  // A second user opens 200 connections and sends nothing: they take every place waiting for
  // a request (128) and queue for more; once idle (100 ms), those beyond its share of 8 are
  // closed for newcomers, so this user's clients attach meanwhile.
  auto other = testing::SecondUserConnections::Open(data_socket_, 200);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ((*other)->connected(), 200);
  ExpectServing();
  // Its connections fill no more than its share: this user may hold 7 of its own 8 places
  // (6 silent, one with half a request) and still attach.
  std::vector<int> silent;
  for (int i = 0; i < 6; ++i) {
    const int fd = ConnectTo(data_socket_);
    ASSERT_GE(fd, 0);
    silent.push_back(fd);
  }
  // One sent half a request and stopped.
  auto request = shm::EncodeAttachRequest("0123456789abcdef");
  ASSERT_TRUE(request.ok());
  const int half = ConnectTo(data_socket_);
  SendAll(half, std::string(request->begin(), request->begin() + 40));
  silent.push_back(half);
  ExpectServing();
  // The daemon closes them after the request timeout (5 s).
  const absl::Time start = absl::Now();
  for (int fd : silent) {
    EXPECT_TRUE(ClosedWithoutReply(fd));
    close(fd);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  ExpectServing();
}

TEST_F(DataSocketHostileTest, AJobsBurstOfConnectionsQueuesInsteadOfBeingRefused) {
  // More connections at once than may wait for their request (128), none sending yet: a job
  // of hundreds of processes starting together. None is refused; each is served when it
  // sends its request, and this user's own idle ones hold up none of its attaches.
  std::vector<int> burst;
  for (int i = 0; i < 200; ++i) {
    const int fd = ConnectTo(data_socket_);
    ASSERT_GE(fd, 0) << i;
    burst.push_back(fd);
  }
  std::unique_ptr<Client> c = Connect();
  ASSERT_NE(c, nullptr);
  auto attached = c->AttachSharedMemory();
  EXPECT_TRUE(attached.ok()) << attached.status();
  for (int fd : burst) close(fd);
  c.reset();
  ExpectServing();
}

TEST_F(DataSocketHostileTest, SessionIdsCannotBeGuessedOrBent) {
  const std::string id = OpenRawSession();
  ASSERT_EQ(id.size(), 32u) << id;
  int memfd = -1;
  // Well-formed ids that are not a session's.
  std::mt19937_64 gen(7);
  for (int i = 0; i < 50; ++i) {
    const absl::Status status = RawAttach(data_socket_, RandomId(gen), &memfd);
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
    EXPECT_EQ(memfd, -1);
  }
  // The real id bent: one digit changed, cut short, one digit longer, a prefix of it.
  std::string flipped = id;
  flipped[5] = flipped[5] == '0' ? '1' : '0';
  for (const std::string& bent : {flipped, id.substr(0, 31), id + "0", id.substr(0, 16)}) {
    const absl::Status status = RawAttach(data_socket_, bent, &memfd);
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << bent << ": " << status;
    EXPECT_EQ(memfd, -1);
  }
  // The real one still attaches, once.
  int connection = -1;
  ASSERT_TRUE(RawAttach(data_socket_, id, &memfd, &connection).ok());
  EXPECT_GE(memfd, 0);
  close(memfd);
  EXPECT_TRUE(StillOpen(connection));
  close(connection);
  CloseRawSessions();
  ExpectServing();
}

// Another process sends the id of a session this process holds: a session attached already is
// refused (ALREADY_EXISTS naming the holder's pid) and its holder keeps its connection; an id
// whose session is open but not attached yet attaches the other process in its owner's place
// (what holding the id allows: docs/security.md), and then the owner is refused.
TEST_F(DataSocketHostileTest, AnotherProcessWithASessionsId) {
  const std::string attached_id = OpenRawSession();
  int memfd = -1;
  int holder = -1;
  ASSERT_TRUE(RawAttach(data_socket_, attached_id, &memfd, &holder).ok());
  close(memfd);
  const std::string unattached_id = OpenRawSession();

  // The child only uses sockets (no gRPC, no allocation): safe after fork from a process
  // with threads. It reports each reply's code through a pipe, and holds what it attached
  // until told to exit.
  auto request_a = shm::EncodeAttachRequest(attached_id);
  auto request_u = shm::EncodeAttachRequest(unattached_id);
  ASSERT_TRUE(request_a.ok() && request_u.ok());
  int report[2];
  int go[2];
  ASSERT_EQ(pipe(report), 0);
  ASSERT_EQ(pipe(go), 0);
  const std::string path = data_socket_;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(report[0]);
    close(go[1]);
    uint32_t codes[2] = {99, 99};
    char message[shm::kMaxAttachMessageBytes + 1];
    int fds[2] = {-1, -1};
    const std::array<uint8_t, shm::kAttachRequestBytes>* requests[2] = {&*request_a, &*request_u};
    for (int i = 0; i < 2; ++i) {
      fds[i] = socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
      if (connect(fds[i], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) _exit(2);
      if (send(fds[i], requests[i]->data(), requests[i]->size(), MSG_NOSIGNAL) != 80) _exit(3);
      int child_memfd = -1;
      codes[i] = static_cast<uint32_t>(ReadReply(fds[i], &child_memfd, message, sizeof(message)));
      if (i == 0 && write(report[1], message, sizeof(message)) != sizeof(message)) _exit(4);
    }
    if (write(report[1], codes, sizeof(codes)) != sizeof(codes)) _exit(4);
    char byte;
    (void)!read(go[0], &byte, 1);
    _exit(0);
  }
  close(report[1]);
  close(go[0]);
  char message[shm::kMaxAttachMessageBytes + 1] = {};
  ASSERT_EQ(read(report[0], message, sizeof(message)), static_cast<ssize_t>(sizeof(message)));
  uint32_t codes[2] = {};
  ASSERT_EQ(read(report[0], codes, sizeof(codes)), static_cast<ssize_t>(sizeof(codes)));
  EXPECT_EQ(static_cast<absl::StatusCode>(codes[0]), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(message), HasSubstr(absl::StrCat("pid ", getpid())));
  EXPECT_TRUE(StillOpen(holder)) << "the holder's data connection was closed";
  // The child holds the other session now; Admin.Status names its pid; its owner is refused.
  EXPECT_EQ(static_cast<absl::StatusCode>(codes[1]), absl::StatusCode::kOk);
  auto status = a_->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  bool child_listed = false;
  for (const auto& session : status->attached_sessions()) {
    if (session.pid() == child) child_listed = true;
  }
  EXPECT_TRUE(child_listed) << "Admin.Status shows the pid that attached";
  const absl::Status owner = RawAttach(data_socket_, unattached_id, &memfd);
  EXPECT_EQ(owner.code(), absl::StatusCode::kAlreadyExists) << owner;
  EXPECT_THAT(owner.message(), HasSubstr(absl::StrCat("pid ", child)));
  // The child exits: its data connection ends that session.
  close(go[1]);
  int wait_status = 0;
  ASSERT_EQ(waitpid(child, &wait_status, 0), child);
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;
  close(report[0]);
  close(holder);
  CloseRawSessions();
  ExpectServing();
}

TEST_F(DataSocketHostileTest, AHundredAttachAttemptsInARow) {
  std::mt19937_64 gen(11);
  int memfd = -1;
  for (int i = 0; i < 100; ++i) {
    switch (i % 4) {
      case 0: {  // an id that is no session's
        const absl::Status status = RawAttach(data_socket_, RandomId(gen), &memfd);
        EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << i << ": " << status;
        break;
      }
      case 1: {  // garbage
        const int fd = ConnectTo(data_socket_);
        SendAll(fd, Random(shm::kAttachRequestBytes, 100 + i));
        EXPECT_TRUE(ClosedWithoutReply(fd)) << i;
        close(fd);
        break;
      }
      case 2: {  // connect and close
        close(ConnectTo(data_socket_));
        break;
      }
      case 3: {  // a real session, attached and let go at once
        const std::string id = OpenRawSession();
        int connection = -1;
        const absl::Status status = RawAttach(data_socket_, id, &memfd, &connection);
        EXPECT_TRUE(status.ok()) << i << ": " << status;
        if (memfd >= 0) close(memfd);
        if (connection >= 0) close(connection);
        CloseRawSessions();
        break;
      }
    }
  }
  ExpectServing();
}

// ---- The daemon's agent port (FAULTS.md B3 on the peer side; tests/agent/agent_hostile_test.cc
// has the agent alone). The daemon hosts the agent whenever peer.listen_address is set.

int ConnectTcp(const std::string& url) {  // "uv://127.0.0.1:PORT"
  const size_t colon = url.rfind(':');
  const int port = std::stoi(url.substr(colon + 1));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string AgentUvUrl(Client& client) {
  auto status = client.Status();
  if (!status.ok() || !status->has_agent()) return "";
  for (absl::string_view url : absl::StrSplit(status->agent().address(), ',')) {
    if (absl::StartsWith(url, "uv://")) return std::string(url);
  }
  return "";
}

TEST_F(DataSocketHostileTest, AgentPortConnectionsClosedEarlyCostNothing) {
  const std::string url = AgentUvUrl(*a_);
  ASSERT_FALSE(url.empty()) << "no agent";
  // Each closes before it proved the token: tpd's transport drops it, TensorPipe never sees it.
  for (int i = 0; i < 20; ++i) {
    const int fd = ConnectTcp(url);
    ASSERT_GE(fd, 0) << "round " << i;
    close(fd);
  }
  // Each was refused by the transport and counted.
  EXPECT_TRUE(WaitUntil([&] {
    absl::StatusOr<v1::StatusResponse> now = a_->Status();
    return now.ok() && now->agent().auth_failures() >= 20;
  }));
  ExpectServing();
}

// Garbage on the agent's port, before any token is involved, once aborted the whole daemon
// (std::bad_alloc from TensorPipe's length prefix on its loop thread; docs/security.md, "Agent
// pipes"). tpd's transport now meets it first: that connection is closed, nothing else.
TEST_F(DataSocketHostileTest, GarbageOnTheAgentPortClosesOnlyItsConnection) {
  const std::string url = AgentUvUrl(*a_);
  ASSERT_FALSE(url.empty()) << "no agent";
  for (uint64_t seed : {42, 43, 44}) {
    const int fd = ConnectTcp(url);
    ASSERT_GE(fd, 0);
    SendAll(fd, Random(4096, seed));
    close(fd);
  }
  EXPECT_EQ(daemon_->WaitExit(absl::Seconds(2)), std::nullopt);
  EXPECT_EQ(kill(daemon_->pid(), 0), 0) << "the daemon died of garbage on its agent port";
  ExpectServing();
}

}  // namespace
}  // namespace tpd
