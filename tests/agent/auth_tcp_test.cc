// tpd's TCP transport on its own (agent/auth_tcp.h), without TensorPipe's core: two contexts
// with one token talk; another token, junk, silence and a flood of connections get nothing
// through and cost a bounded time; framing lengths are checked instead of trusted.

#include "agent/auth_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensorpipe/common/error.h"
#include "tensorpipe/transport/connection.h"
#include "tensorpipe/transport/context.h"
#include "tensorpipe/transport/listener.h"
#include "tests/testing/wait_until.h"

namespace tpd::agent {
namespace {

using ::testing::HasSubstr;
using tpd::testing::WaitUntil;

constexpr absl::Duration kWait = absl::Seconds(10);

std::shared_ptr<tensorpipe::transport::Context> Tcp(const std::string& token,
                                                    std::vector<std::string>* refused = nullptr,
                                                    absl::Mutex* mu = nullptr) {
  AuthTcpOptions options;
  options.token = token;
  options.handshake_timeout = absl::Milliseconds(500);
  options.max_handshakes = 4;
  options.max_message_bytes = 1 << 20;
  if (refused != nullptr) {
    options.on_refused = [refused, mu](const std::string& why) {
      absl::MutexLock lock(mu);
      refused->push_back(why);
    };
  }
  return CreateAuthTcp(std::move(options));
}

int PortOf(const std::string& addr) {
  int port = -1;
  EXPECT_TRUE(absl::SimpleAtoi(addr.substr(addr.rfind(':') + 1), &port)) << addr;
  return port;
}

int ConnectRaw(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// One accepted connection, awaited (nullptr: none came within `timeout`, or an error).
std::shared_ptr<tensorpipe::transport::Connection> AcceptOne(
    tensorpipe::transport::Listener& listener, absl::Duration timeout = kWait) {
  struct State {
    absl::Notification done;
    std::shared_ptr<tensorpipe::transport::Connection> connection;
  };
  auto state = std::make_shared<State>();
  listener.accept([state](const tensorpipe::Error& error,
                          std::shared_ptr<tensorpipe::transport::Connection> connection) {
    if (!error) state->connection = std::move(connection);
    state->done.Notify();
  });
  if (!state->done.WaitForNotificationWithTimeout(timeout)) return nullptr;
  return state->connection;
}

// The outcome of a read, awaited: the bytes, or the error's text.
struct ReadResult {
  bool ok = false;
  std::string bytes;
  std::string error;
};

ReadResult ReadAny(tensorpipe::transport::Connection& connection) {
  auto done = std::make_shared<absl::Notification>();
  auto result = std::make_shared<ReadResult>();
  connection.read([done, result](const tensorpipe::Error& error, const void* ptr, size_t length) {
    result->ok = !error;
    if (error) {
      result->error = error.what();
    } else {
      result->bytes.assign(static_cast<const char*>(ptr), length);
    }
    done->Notify();
  });
  EXPECT_TRUE(done->WaitForNotificationWithTimeout(kWait)) << "the read never ended";
  return *result;
}

tensorpipe::Error WriteAndWait(tensorpipe::transport::Connection& connection,
                               const std::string& bytes) {
  auto done = std::make_shared<absl::Notification>();
  auto result = std::make_shared<tensorpipe::Error>();
  connection.write(bytes.data(), bytes.size(), [done, result](const tensorpipe::Error& error) {
    *result = error;
    done->Notify();
  });
  EXPECT_TRUE(done->WaitForNotificationWithTimeout(kWait)) << "the write never ended";
  return *result;
}

TEST(AuthTcpTest, TwoContextsWithOneTokenExchangeMessagesBothWays) {
  auto server = Tcp("token");
  auto client = Tcp("token");
  auto listener = server->listen("127.0.0.1:0");
  ASSERT_GT(PortOf(listener->addr()), 0);
  auto outgoing = client->connect(listener->addr());
  // Written before the handshake ended: it waits for it.
  const std::string big(256 << 10, 'x');
  EXPECT_FALSE(WriteAndWait(*outgoing, "hello"));
  auto incoming = AcceptOne(*listener);
  ASSERT_NE(incoming, nullptr);
  ReadResult first = ReadAny(*incoming);
  ASSERT_TRUE(first.ok) << first.error;
  EXPECT_EQ(first.bytes, "hello");
  EXPECT_FALSE(WriteAndWait(*incoming, big));
  ReadResult second = ReadAny(*outgoing);
  ASSERT_TRUE(second.ok) << second.error;
  EXPECT_EQ(second.bytes, big);
  // A read of a given length into the caller's buffer.
  std::string into(5, '\0');
  absl::Notification got;
  std::string error;
  incoming->read(into.data(), into.size(), [&](const tensorpipe::Error& e, const void*, size_t) {
    if (e) error = e.what();
    got.Notify();
  });
  EXPECT_FALSE(WriteAndWait(*outgoing, "fixed"));
  ASSERT_TRUE(got.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(error, "");
  EXPECT_EQ(into, "fixed");
  for (auto& context : {server, client}) {
    context->close();
    context->join();
  }
}

TEST(AuthTcpTest, AnotherTokenIsRefusedOnBothSidesAndReachesNoAccept) {
  std::vector<std::string> refused;
  absl::Mutex mu;
  auto server = Tcp("token", &refused, &mu);
  auto stranger = Tcp("another");
  auto listener = server->listen("127.0.0.1:0");
  auto outgoing = stranger->connect(listener->addr());
  ReadResult read = ReadAny(*outgoing);
  EXPECT_FALSE(read.ok);
  EXPECT_THAT(read.error, HasSubstr("transport handshake"));
  EXPECT_EQ(AcceptOne(*listener, absl::Milliseconds(300)), nullptr);
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return !refused.empty();
  }));
  absl::MutexLock lock(&mu);
  EXPECT_THAT(refused[0], HasSubstr("bad MAC"));
}

TEST(AuthTcpTest, JunkAndSilenceAreClosedAndTheListenerServesOn) {
  std::vector<std::string> refused;
  absl::Mutex mu;
  auto server = Tcp("token", &refused, &mu);
  auto listener = server->listen("127.0.0.1:0");
  const int port = PortOf(listener->addr());
  // Junk that aborted TensorPipe's own listener: a huge length prefix and random bytes.
  for (const std::string& junk :
       {std::string(8, '\xff') + std::string(56, 'z'), std::string(4096, '\x5a')}) {
    const int fd = ConnectRaw(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
    char buffer[64];
    ssize_t n;
    while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) {
    }
    EXPECT_LE(n, 0) << "the transport closes it";
    close(fd);
  }
  // Silent connections are closed at the handshake timeout (500 ms).
  const int silent = ConnectRaw(port);
  ASSERT_GE(silent, 0);
  const absl::Time start = absl::Now();
  char buffer[64];
  ssize_t n;
  while ((n = recv(silent, buffer, sizeof(buffer), 0)) > 0) {
  }
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  close(silent);
  // A good peer still gets in.
  auto client = Tcp("token");
  auto outgoing = client->connect(listener->addr());
  EXPECT_FALSE(WriteAndWait(*outgoing, "after"));
  auto incoming = AcceptOne(*listener);
  ASSERT_NE(incoming, nullptr);
  EXPECT_EQ(ReadAny(*incoming).bytes, "after");
  absl::MutexLock lock(&mu);
  EXPECT_GE(refused.size(), 3u);
}

TEST(AuthTcpTest, AtMostMaxHandshakesWaitAndMoreAreClosedAtOnce) {
  std::vector<std::string> refused;
  absl::Mutex mu;
  auto server = Tcp("token", &refused, &mu);
  auto listener = server->listen("127.0.0.1:0");
  const int port = PortOf(listener->addr());
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) fds.push_back(ConnectRaw(port));
  EXPECT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    for (const std::string& why : refused) {
      if (absl::StrContains(why, "4 transport handshakes are under way")) return true;
    }
    return false;
  }));
  for (int fd : fds) close(fd);
}

TEST(AuthTcpTest, LengthsAreCheckedNotTrusted) {
  auto server = Tcp("token");
  auto client = Tcp("token");
  auto listener = server->listen("127.0.0.1:0");
  auto outgoing = client->connect(listener->addr());
  EXPECT_FALSE(WriteAndWait(*outgoing, "twelve bytes"));
  auto incoming = AcceptOne(*listener);
  ASSERT_NE(incoming, nullptr);
  // A read of 4 bytes meets a message of 12: an error, not 12 bytes into a 4-byte buffer.
  std::string into(4, '\0');
  absl::Notification got;
  std::string error;
  incoming->read(into.data(), into.size(), [&](const tensorpipe::Error& e, const void*, size_t) {
    if (e) error = e.what();
    got.Notify();
  });
  ASSERT_TRUE(got.WaitForNotificationWithTimeout(kWait));
  EXPECT_THAT(error, HasSubstr("a message of 12 bytes"));
  EXPECT_EQ(into, std::string(4, '\0'));

  // A message past the limit (1 MiB here) fails the connection before anything is allocated.
  auto second = client->connect(listener->addr());
  // Its write may fail once the receiver closed: not awaited, the buffer outlives it.
  static const std::string* const kTooBig = new std::string((1 << 20) + 1, 'y');
  second->write(kTooBig->data(), kTooBig->size(), [](const tensorpipe::Error&) {});
  auto accepted = AcceptOne(*listener);
  ASSERT_NE(accepted, nullptr);
  ReadResult read = ReadAny(*accepted);
  EXPECT_FALSE(read.ok);
  EXPECT_THAT(read.error, HasSubstr("exceeds the transport's limit"));
}

}  // namespace
}  // namespace tpd::agent
