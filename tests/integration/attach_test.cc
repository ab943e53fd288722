// Attaching a client session to its shared memory through the real daemon's data socket
// (docs/data_plane.md, "Attaching a session"): the segment arrives sealed and of the
// configured size; a session attaches once, an unknown id not at all; garbage and oversized
// requests only close their own connection; data.max_sessions is enforced naming itself; a
// killed client's segment is freed; either half of a session ending ends the other.

#include "shm/attach.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/control.grpc.pb.h"
#include "shm/segment.h"
#include "tests/testing/daemon_nodes.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WaitUntil;

constexpr int64_t kArenaBytes = 1 << 20;

int ConnectTo(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True when the daemon closed `fd` without sending anything: EOF, or a reset when it closed
// with our bytes unread.
bool ClosedWithoutReply(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// The attach exchange by hand on `fd`: the daemon's status, and the memfd on OK (-1 else).
absl::Status RawAttach(int fd, const std::string& session_id, int* memfd) {
  *memfd = -1;
  auto request = shm::EncodeAttachRequest(session_id);
  if (!request.ok()) return request.status();
  if (send(fd, request->data(), request->size(), MSG_NOSIGNAL) != 80) {
    return absl::UnavailableError("send");
  }
  std::string reply(shm::kAttachReplyBytes, '\0');
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{reply.data(), reply.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(fd, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  if (n != static_cast<ssize_t>(reply.size())) return absl::UnavailableError("no reply");
  if (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr && c->cmsg_type == SCM_RIGHTS) {
    std::memcpy(memfd, CMSG_DATA(c), sizeof(int));
  }
  auto decoded = shm::DecodeAttachReply(reply);
  if (!decoded.ok()) return decoded.status();
  return decoded->status;
}

// Entries of /proc/<pid>/fd.
int CountFds(pid_t pid) {
  int count = 0;
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

// Mappings of session segments in /proc/<pid>/maps (a segment is several: its regions differ
// in protection).
int CountSegmentMaps(pid_t pid) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::string line;
  int count = 0;
  while (std::getline(maps, line)) {
    if (absl::StrContains(line, "memfd:tpd-session")) ++count;
  }
  return count;
}

class AttachTest : public ::testing::Test {
 protected:
  // Without `max_sessions`, [data] is the shipped default: its limits derived from the machine.
  void StartDaemon(std::optional<int64_t> max_sessions) {
    socket_ = absl::StrCat(dir_.path(), "/tpd.sock");
    const std::string config = dir_.WriteFile(
        "tpd.toml", absl::StrCat("[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"secret\"\n",
                                 "node_name = \"attach\"\n",
                                 max_sessions ? absl::StrCat("[data]\narena_bytes = ", kArenaBytes,
                                                             "\nmax_sessions = ", *max_sessions,
                                                             "\nsessions_kept_free = 0\n")
                                              : ""));
    auto daemon = DaemonProcess::Start(socket_, {"--config", config});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
  }

  std::string DataSocket() const { return shm::DataSocketPath(socket_); }

  std::unique_ptr<Client> Connect() {
    auto client = Client::Connect(socket_);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // A session opened by hand; its id, and its stream kept open in the fixture.
  std::string OpenRawSession() {
    if (control_ == nullptr) {
      control_ = v1::Control::NewStub(
          grpc::CreateChannel(absl::StrCat("unix:", socket_), grpc::InsecureChannelCredentials()));
    }
    contexts_.push_back(std::make_unique<grpc::ClientContext>());
    streams_.push_back(control_->OpenSession(contexts_.back().get(), v1::OpenSessionRequest()));
    v1::SessionEvent event;
    EXPECT_TRUE(streams_.back()->Read(&event));
    EXPECT_EQ(event.data_socket(), DataSocket());
    return event.session_id();
  }

  void ExpectAttachStillWorks() {
    std::unique_ptr<Client> client = Connect();
    ASSERT_NE(client, nullptr);
    auto segment = client->AttachSharedMemory();
    EXPECT_TRUE(segment.ok()) << segment.status();
  }

  TempDir dir_;
  std::string socket_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::Control::Stub> control_;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::SessionEvent>>> streams_;
};

TEST_F(AttachTest, ClientReceivesASealedSegmentOfTheConfiguredSize) {
  StartDaemon(8);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  auto segment = client->AttachSharedMemory();
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ((*segment)->layout().tx_heap.bytes, static_cast<uint64_t>(kArenaBytes));
  EXPECT_EQ((*segment)->layout().rx_heap.bytes, static_cast<uint64_t>(kArenaBytes));
  EXPECT_GT((*segment)->size(), static_cast<uint64_t>(2 * kArenaBytes));
  EXPECT_EQ(fcntl((*segment)->fd(), F_GET_SEALS) & shm::kRequiredSeals, shm::kRequiredSeals);
  // Attached once: the same segment again.
  auto again = client->AttachSharedMemory();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), segment->get());
  struct stat st;
  ASSERT_EQ(stat(DataSocket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u) << "the data socket has the gRPC socket's mode";
}

TEST_F(AttachTest, AJobOfFortyEightProcessesOfOneUserFitsTheShippedDefaults) {
  // More sessions of one uid than the old fixed bound (32), with nothing configured: the job
  // of a node's one user may use the node (issue 31).
  constexpr int kRanks = 48;
  StartDaemon(std::nullopt);
  std::unique_ptr<Client> observer = Connect();
  ASSERT_NE(observer, nullptr);
  absl::StatusOr<v1::StatusResponse> status = observer->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  const v1::ConfigSummary& config = status->config();
  if (config.data_max_sessions() - config.data_sessions_kept_free() < kRanks) {
    GTEST_SKIP() << "this machine's memory and cores derive only " << config.data_max_sessions()
                 << " places (" << config.data_sessions_kept_free() << " kept for other users)";
  }
  std::vector<std::unique_ptr<Client>> ranks;
  std::vector<Client*> clients;
  for (int r = 0; r < kRanks; ++r) {
    ranks.push_back(Connect());
    ASSERT_NE(ranks.back(), nullptr);
    auto segment = ranks.back()->AttachSharedMemory();
    ASSERT_TRUE(segment.ok()) << "rank " << r << ": " << segment.status();
    clients.push_back(ranks.back().get());
  }
  JoinOptions join;
  join.group = "big";
  join.init_method = absl::StrCat("tcp://", status->peer_address());
  join.timeout = absl::Seconds(120);
  std::vector<absl::StatusOr<v1::JoinResponse>> joined = testing::JoinStatic(clients, join);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(joined[r].ok()) << "rank " << r << ": " << joined[r].status();
    EXPECT_EQ(joined[r]->group().phase(), "FORMED");
  }
  absl::StatusOr<v1::StatusResponse> after = observer->Status();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->attached_session_count(), kRanks);
}

TEST_F(AttachTest, StatusListsAttachedSessionsWithTheirCredentials) {
  StartDaemon(8);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  auto before = client->Status();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->data_socket(), DataSocket());
  EXPECT_EQ(before->attached_session_count(), 0);
  EXPECT_EQ(before->config().data_max_sessions(), 8);
  EXPECT_EQ(before->config().data_arena_bytes(), kArenaBytes);
  auto segment = client->AttachSharedMemory();
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto after = client->Status();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->attached_session_count(), 1);
  ASSERT_EQ(after->attached_sessions_size(), 1);
  const v1::AttachedSession& session = after->attached_sessions(0);
  EXPECT_EQ(session.pid(), getpid());
  EXPECT_EQ(session.uid(), static_cast<int64_t>(getuid()));
  EXPECT_EQ(session.gid(), static_cast<int64_t>(getgid()));
  EXPECT_EQ(session.arena_bytes(), static_cast<uint64_t>(kArenaBytes));
  EXPECT_EQ(session.segment_bytes(), (*segment)->size());
  // The call router learns of the session just after the attach reply goes; until then its
  // call fields read zero.
  v1::AttachedSession routed;
  EXPECT_TRUE(WaitUntil([&] {
    auto status = client->Status();
    if (!status.ok() || status->attached_sessions_size() != 1) return false;
    routed = status->attached_sessions(0);
    return routed.rx_heap_bytes() != 0;
  })) << "the session's rx heap shows once the router has it";
  EXPECT_EQ(routed.rx_heap_bytes(), static_cast<uint64_t>(kArenaBytes));
  EXPECT_EQ(routed.rx_heap_used(), 0u);
  EXPECT_EQ(routed.calls_in_flight(), 0);
  const testing::ProcessResult tpctl =
      testing::RunProcess({testing::RunfilePath("client/tpctl"), "--socket", socket_, "status"});
  EXPECT_EQ(tpctl.exit_code, 0) << tpctl.output;
  EXPECT_THAT(tpctl.output, HasSubstr("1 sessions attached (max 8, "));
  EXPECT_THAT(tpctl.output, HasSubstr("large tensors shared between sessions of one uid and gid"));
  EXPECT_THAT(tpctl.output, HasSubstr(absl::StrCat("pid ", getpid(), " uid ", getuid())));
  EXPECT_THAT(tpctl.output,
              HasSubstr(absl::StrCat("0 calls in flight, rx heap 0/", kArenaBytes, " B used")));
}

TEST_F(AttachTest, SecondAttachOfTheSameSessionIsRefused) {
  StartDaemon(8);
  const std::string id = OpenRawSession();
  const int first = ConnectTo(DataSocket());
  int memfd;
  ASSERT_TRUE(RawAttach(first, id, &memfd).ok());
  ASSERT_GE(memfd, 0);
  close(memfd);
  const int second = ConnectTo(DataSocket());
  const absl::Status refused = RawAttach(second, id, &memfd);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << refused;
  EXPECT_EQ(memfd, -1);
  EXPECT_TRUE(ClosedWithoutReply(second));
  close(second);
  close(first);
}

TEST_F(AttachTest, UnknownSessionIdIsRefused) {
  StartDaemon(8);
  const int fd = ConnectTo(DataSocket());
  int memfd;
  const absl::Status refused = RawAttach(fd, "0123456789abcdef0123456789abcdef", &memfd);
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound) << refused;
  EXPECT_EQ(memfd, -1);
  close(fd);
  ExpectAttachStillWorks();
}

TEST_F(AttachTest, GarbageAndOversizedRequestsCloseOnlyTheirConnection) {
  StartDaemon(8);
  const int garbage = ConnectTo(DataSocket());
  const std::string junk(shm::kAttachRequestBytes, 'x');
  ASSERT_EQ(send(garbage, junk.data(), junk.size(), MSG_NOSIGNAL), 80);
  EXPECT_TRUE(ClosedWithoutReply(garbage));
  close(garbage);

  const int oversized = ConnectTo(DataSocket());
  const std::string big(4096, 'y');
  send(oversized, big.data(), big.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(ClosedWithoutReply(oversized));
  close(oversized);

  // A request cut short, then a hang-up.
  const int cut = ConnectTo(DataSocket());
  ASSERT_EQ(send(cut, junk.data(), 10, MSG_NOSIGNAL), 10);
  shutdown(cut, SHUT_WR);
  EXPECT_TRUE(ClosedWithoutReply(cut));
  close(cut);

  ExpectAttachStillWorks();
}

TEST_F(AttachTest, ConnectionsThatNeverSendARequestAreClosedAndDoNotBlockOthers) {
  StartDaemon(8);
  // Idle connections, fewer than may wait for their request (128): each is closed after the
  // request timeout (5 s); then attaching works again.
  std::vector<int> idle;
  for (int i = 0; i < 80; ++i) idle.push_back(ConnectTo(DataSocket()));
  const absl::Time start = absl::Now();
  for (int fd : idle) {
    EXPECT_TRUE(ClosedWithoutReply(fd));
    close(fd);
  }
  EXPECT_GE(absl::Now() - start, absl::Seconds(4));
  ExpectAttachStillWorks();
}

TEST_F(AttachTest, MaxSessionsIsEnforcedNamingTheSetting) {
  StartDaemon(2);
  std::unique_ptr<Client> a = Connect();
  std::unique_ptr<Client> b = Connect();
  std::unique_ptr<Client> c = Connect();
  ASSERT_TRUE(a->AttachSharedMemory().ok());
  ASSERT_TRUE(b->AttachSharedMemory().ok());
  auto refused = c->AttachSharedMemory();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("data.max_sessions"));
  a.reset();
  EXPECT_TRUE(WaitUntil([&] { return c->AttachSharedMemory().ok(); }));
}

TEST_F(AttachTest, KilledClientsSegmentIsFreed) {
  StartDaemon(8);
  const pid_t daemon = daemon_->pid();
  // Nothing of the data socket is made lazily: its listener, epoll and eventfd are all open
  // once the daemon serves, so this is the baseline.
  ASSERT_EQ(CountSegmentMaps(daemon), 0);
  const int fds = CountFds(daemon);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  // No gRPC in this process before the fork: the child owns the only client.
  const pid_t child = fork();
  if (child == 0) {
    close(ready[0]);
    auto client = Client::Connect(socket_);
    if (!client.ok() || !(*client)->AttachSharedMemory().ok()) _exit(1);
    const char ok = 'k';
    if (write(ready[1], &ok, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1) << "the child did not attach";
  close(ready[0]);
  EXPECT_GT(CountSegmentMaps(daemon), 0);
  EXPECT_GT(CountFds(daemon), fds);
  kill(child, SIGKILL);
  int status;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WaitUntil([&] { return CountSegmentMaps(daemon) == 0; }))
      << "the killed client's segment is still mapped in the daemon";
  EXPECT_TRUE(WaitUntil([&] { return CountFds(daemon) <= fds; }))
      << "daemon fds: " << CountFds(daemon) << ", baseline " << fds;
}

TEST_F(AttachTest, SessionStreamEndingClosesTheDataConnection) {
  StartDaemon(8);
  const std::string id = OpenRawSession();
  const int fd = ConnectTo(DataSocket());
  int memfd;
  ASSERT_TRUE(RawAttach(fd, id, &memfd).ok());
  close(memfd);
  EXPECT_GT(CountSegmentMaps(daemon_->pid()), 0);
  contexts_.back()->TryCancel();
  EXPECT_TRUE(ClosedWithoutReply(fd));
  close(fd);
  EXPECT_TRUE(WaitUntil([&] { return CountSegmentMaps(daemon_->pid()) == 0; }));
}

TEST_F(AttachTest, ClosingTheDataConnectionEndsTheSessionAndItsMembersLeave) {
  StartDaemon(8);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  auto status = client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  JoinOptions join;
  join.group = "attached";
  join.name = "w0";
  join.init_method = absl::StrCat("tcp://", status->peer_address());
  join.timeout = absl::Seconds(30);
  auto joined = client->Join(join);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_TRUE(client->AttachSharedMemory().ok());
  auto members = [&] {
    auto view = client->GetGroup("attached", join.init_method);
    return view.ok() ? view->members_size() : -1;
  };
  EXPECT_EQ(members(), 1);
  client->DetachSharedMemory();
  EXPECT_TRUE(WaitUntil([&] { return members() == 0; })) << "w0 did not leave";
  EXPECT_TRUE(WaitUntil([&] { return CountSegmentMaps(daemon_->pid()) == 0; }));
}

TEST_F(AttachTest, ShutdownClosesAttachedSessionsAndRemovesTheDataSocket) {
  StartDaemon(8);
  const std::string id = OpenRawSession();
  const int fd = ConnectTo(DataSocket());
  int memfd;
  ASSERT_TRUE(RawAttach(fd, id, &memfd).ok());
  close(memfd);
  daemon_->Signal(SIGTERM);
  EXPECT_TRUE(ClosedWithoutReply(fd));
  close(fd);
  EXPECT_EQ(daemon_->WaitExit(absl::Seconds(60)), 0);
  struct stat st;
  EXPECT_NE(stat(DataSocket().c_str(), &st), 0) << "the data socket outlived the daemon";
  EXPECT_NE(stat(socket_.c_str(), &st), 0);
}

}  // namespace
}  // namespace tpd
