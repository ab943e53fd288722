// DataSocket in-process, with fake session hooks: the socket's file and mode, the attach
// exchange, which hook runs when, and cleanup.

#include "daemon/router/data_socket.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "shm/attach.h"
#include "shm/layout.h"
#include "shm/segment.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

// The sessions "ControlService" knows, and the ones the data socket ended.
struct FakeSessions {
  absl::Mutex mu;
  std::set<std::string> open ABSL_GUARDED_BY(mu);
  std::vector<std::string> ended ABSL_GUARDED_BY(mu);

  size_t EndedCount() {
    absl::MutexLock lock(&mu);
    return ended.size();
  }
};

int ConnectTo(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
  return fd;
}

// Sends an attach request for `id` on `fd`; the daemon's answer, and the memfd on OK.
absl::Status Attach(int fd, const std::string& id, int* memfd) {
  *memfd = -1;
  auto request = shm::EncodeAttachRequest(id);
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
  if (recvmsg(fd, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC) != static_cast<ssize_t>(reply.size())) {
    return absl::UnavailableError("no reply");
  }
  if (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr && c->cmsg_type == SCM_RIGHTS) {
    std::memcpy(memfd, CMSG_DATA(c), sizeof(int));
  }
  auto decoded = shm::DecodeAttachReply(reply);
  return decoded.ok() ? decoded->status : decoded.status();
}

class DataSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tpd-data-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    DataSocketOptions options;
    options.path = absl::StrCat(root_, "/tpd.sock.data");
    options.mode = 0640;
    options.limits.tx_heap_bytes = 64 << 10;
    options.limits.rx_heap_bytes = 64 << 10;
    options.max_sessions = 2;
    Configure(&options);
    options.session_open = [this](const std::string& id) {
      absl::MutexLock lock(&sessions_.mu);
      return sessions_.open.count(id) != 0;
    };
    options.end_session = [this](const std::string& id, const std::string&) {
      absl::MutexLock lock(&sessions_.mu);
      sessions_.open.erase(id);
      sessions_.ended.push_back(id);
    };
    auto socket = DataSocket::Start(std::move(options));
    ASSERT_TRUE(socket.ok()) << socket.status();
    socket_ = *std::move(socket);
  }
  // What a test's fixture sets beyond the options above.
  virtual void Configure(DataSocketOptions*) {}

  void TearDown() override {
    socket_.reset();
    std::filesystem::remove_all(root_);
  }

  void Open(const std::string& id) {
    absl::MutexLock lock(&sessions_.mu);
    sessions_.open.insert(id);
  }

  std::string root_;
  FakeSessions sessions_;
  std::unique_ptr<DataSocket> socket_;
};

TEST_F(DataSocketTest, SocketFileHasTheConfiguredModeAndGoesAtShutdown) {
  struct stat st;
  ASSERT_EQ(lstat(socket_->path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  socket_->Shutdown();
  EXPECT_NE(lstat(socket_->path().c_str(), &st), 0);
  socket_->Shutdown();  // idempotent
}

TEST_F(DataSocketTest, SecondDaemonOnTheSamePathIsRefused) {
  DataSocketOptions options;
  options.path = socket_->path();
  options.session_open = [](const std::string&) { return true; };
  options.end_session = [](const std::string&, const std::string&) {};
  EXPECT_EQ(DataSocket::Start(std::move(options)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(DataSocketTest, AttachSendsAValidSegmentAndRecordsTheCredentials) {
  Open("abc");
  const int fd = ConnectTo(socket_->path());
  int memfd;
  ASSERT_TRUE(Attach(fd, "abc", &memfd).ok());
  auto segment = shm::Segment::Map(memfd);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(segment->layout().tx_heap.bytes, 64u << 10);
  std::vector<DataSocket::SessionInfo> sessions = socket_->Sessions();
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].session_id, "abc");
  EXPECT_EQ(sessions[0].pid, getpid());
  EXPECT_EQ(sessions[0].uid, getuid());
  EXPECT_EQ(sessions[0].segment_bytes, segment->size());
  close(fd);
}

TEST_F(DataSocketTest, ClosingTheDataConnectionEndsTheSessionOnce) {
  Open("abc");
  const int fd = ConnectTo(socket_->path());
  int memfd;
  ASSERT_TRUE(Attach(fd, "abc", &memfd).ok());
  close(memfd);
  close(fd);
  ASSERT_TRUE(testing::WaitUntil([&] { return sessions_.EndedCount() == 1; }));
  EXPECT_TRUE(socket_->Sessions().empty());
  usleep(50000);
  EXPECT_EQ(sessions_.EndedCount(), 1u);
}

TEST_F(DataSocketTest, EndSessionClosesTheConnectionAndFreesTheSegment) {
  Open("abc");
  const int fd = ConnectTo(socket_->path());
  int memfd;
  ASSERT_TRUE(Attach(fd, "abc", &memfd).ok());
  close(memfd);
  socket_->EndSession("abc");
  char byte;
  EXPECT_LE(recv(fd, &byte, 1, 0), 0);
  EXPECT_TRUE(testing::WaitUntil([&] { return socket_->Sessions().empty(); }));
  socket_->EndSession("abc");      // no-op now
  socket_->EndSession("unknown");  // and for sessions never attached
  close(fd);
}

TEST_F(DataSocketTest, RefusalsNameTheirReason) {
  Open("a1");
  Open("a2");
  Open("a3");
  std::vector<int> fds;
  int memfd;
  for (const char* id : {"a1", "a2"}) {
    fds.push_back(ConnectTo(socket_->path()));
    ASSERT_TRUE(Attach(fds.back(), id, &memfd).ok());
    close(memfd);
  }
  fds.push_back(ConnectTo(socket_->path()));
  absl::Status full = Attach(fds.back(), "a3", &memfd);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("data.max_sessions (2)"), std::string::npos) << full;
  EXPECT_EQ(memfd, -1);
  fds.push_back(ConnectTo(socket_->path()));
  EXPECT_EQ(Attach(fds.back(), "a1", &memfd).code(), absl::StatusCode::kAlreadyExists);
  fds.push_back(ConnectTo(socket_->path()));
  EXPECT_EQ(Attach(fds.back(), "ffff", &memfd).code(), absl::StatusCode::kNotFound);
  for (int fd : fds) close(fd);
}

// Six places, two kept for other users, and memory for five segments.
class DataSocketSharesTest : public DataSocketTest {
 protected:
  void Configure(DataSocketOptions* options) override {
    options->max_sessions = 6;
    options->sessions_kept_free = 2;
    absl::StatusOr<shm::Layout> layout = shm::ComputeLayout(options->limits);
    ASSERT_TRUE(layout.ok());
    options->max_shared_memory_bytes = 5 * static_cast<int64_t>(layout->total_bytes);
  }
};

TEST_F(DataSocketSharesTest, AUserAloneTakesAllButTheKeptPlacesAndTheMemoryBoundsThemAll) {
  std::vector<int> fds;
  int memfd;
  for (int i = 0; i < 5; ++i) Open(absl::StrCat("b", i));
  // This test's one uid takes four places: two stay free for someone else.
  for (int i = 0; i < 4; ++i) {
    fds.push_back(ConnectTo(socket_->path()));
    ASSERT_TRUE(Attach(fds.back(), absl::StrCat("b", i), &memfd).ok()) << i;
    close(memfd);
  }
  fds.push_back(ConnectTo(socket_->path()));
  absl::Status kept = Attach(fds.back(), "b4", &memfd);
  EXPECT_EQ(kept.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(kept.message().find("data.sessions_kept_free (2): uid "), std::string::npos) << kept;
  EXPECT_NE(kept.message().find("has 4 sessions attached and 2 of data.max_sessions (6) places "
                                "are free"),
            std::string::npos)
      << kept;
  EXPECT_EQ(memfd, -1);
  for (int fd : fds) close(fd);
}

// Places for eight, memory for two: the memory bound refuses the third, naming itself.
class DataSocketMemoryTest : public DataSocketTest {
 protected:
  void Configure(DataSocketOptions* options) override {
    options->max_sessions = 8;
    absl::StatusOr<shm::Layout> layout = shm::ComputeLayout(options->limits);
    ASSERT_TRUE(layout.ok());
    options->max_shared_memory_bytes = 2 * static_cast<int64_t>(layout->total_bytes) + 1;
  }
};

TEST_F(DataSocketMemoryTest, SegmentsBeyondMaxSharedMemoryBytesAreRefusedNamingIt) {
  std::vector<int> fds;
  int memfd;
  for (const char* id : {"c1", "c2", "c3"}) Open(id);
  for (const char* id : {"c1", "c2"}) {
    fds.push_back(ConnectTo(socket_->path()));
    absl::Status attached = Attach(fds.back(), id, &memfd);
    ASSERT_TRUE(attached.ok()) << id << attached;
    close(memfd);
  }
  fds.push_back(ConnectTo(socket_->path()));
  absl::Status full = Attach(fds.back(), "c3", &memfd);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("data.max_shared_memory_bytes ("), std::string::npos) << full;
  EXPECT_NE(full.message().find("holds 2 session segments"), std::string::npos) << full;
  for (int fd : fds) close(fd);
}

// CPU time this process used, in ms.
int64_t CpuMillis() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000 +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000;
}

TEST_F(DataSocketTest, OutOfFileDescriptorsTheLoopPausesInsteadOfSpinningAndRecovers) {
  Open("abc");
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  // No fd left for this process: the loop's accept fails with EMFILE.
  rlimit none = saved;
  none.rlim_cur = 0;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &none), 0);
  // Another process (its own fd table) connects and waits.
  const pid_t child = fork();
  if (child == 0) {
    rlimit restore = saved;
    setrlimit(RLIMIT_NOFILE, &restore);
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_->path().c_str(), sizeof(addr.sun_path) - 1);
    connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    pause();
    _exit(0);
  }
  const int64_t cpu_before = CpuMillis();
  usleep(500000);
  const int64_t cpu = CpuMillis() - cpu_before;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_LT(cpu, 200) << "the loop spun on a connection it could not accept";
  // Accepting again once fds are back.
  const int fd = ConnectTo(socket_->path());
  int memfd;
  EXPECT_TRUE(Attach(fd, "abc", &memfd).ok());
  if (memfd >= 0) close(memfd);
  close(fd);
}

}  // namespace
}  // namespace tpd
