// What reaches the agent's uv port from someone without the cluster token (FAULTS.md B3, B4):
// raw TCP bytes (random, a huge length prefix, a truncated header, zeroes, 1 MiB), connections
// that close at once or stay silent, an agent with the wrong token, and raw TensorPipe pipes
// that skip the handshake or send something else. After each, the agent still serves a
// correct call between two good agents, and its handler got nothing from the bad ones.
//
// Some inputs abort the process inside TensorPipe before the agent ever sees a pipe (see
// docs/security.md, "Agent pipes"). Those run against an agent in a child process
// (tests/agent/agent_peer) and the test states what happens to it: they are the record of a
// known crash, and they fail the day TensorPipe (or a guard of ours) stops it, so that the
// expectation can be turned around.

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <tensorpipe/tensorpipe.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "agent/agent.h"
#include "agent/pipe_auth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/agent.pb.h"
#include "tests/agent/agent_testing.h"
#include "tests/agent/peer_process.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait_until.h"

namespace tpd::agent {
namespace {

using testing::CallAndWait;
using testing::Checksums;
using testing::EchoHandler;
using ::testing::HasSubstr;
using testing::MakeMessage;
using testing::PeerOf;
using testing::PeerProcess;
using testing::RawContext;
using testing::StartPeer;
using testing::TestOptions;
using tpd::testing::WaitUntil;

constexpr absl::Duration kWait = absl::Seconds(30);

// The port of the first uv:// URL of an agent address ("uv://127.0.0.1:PORT,shm://...").
int UvPort(const std::string& address) {
  const size_t start = address.find("uv://");
  if (start == std::string::npos) return -1;
  const size_t end = address.find(',', start);
  const std::string url = address.substr(start, end == std::string::npos ? end : end - start);
  int port = -1;
  if (!absl::SimpleAtoi(url.substr(url.rfind(':') + 1), &port)) return -1;
  return port;
}

std::string UvUrl(const Agent& agent) {
  return absl::StrCat("uv://127.0.0.1:", UvPort(agent.address()));
}

// A TCP connection to 127.0.0.1:port; -1 if it fails.
int ConnectTcp(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

// Sends `bytes` on a fresh connection and closes it. False if it could not connect.
bool SendAndClose(int port, const std::string& bytes) {
  const int fd = ConnectTcp(port);
  if (fd < 0) return false;
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the other side may close first; that is fine
    sent += n;
  }
  close(fd);
  return true;
}

std::string Random(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[i] = static_cast<char>(x);
  }
  return s;
}

// TensorPipe's stream framing: an 8-byte little-endian length, then that many bytes.
std::string Frame(uint64_t length, const std::string& body) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &length, 8);
  return s + body;
}

// Entries of /proc/self/fd, /proc/self/task.
// Raw system calls, not libc's: under ThreadSanitizer, the directory's fd would reuse a number
// that TensorPipe's (uninstrumented) libuv just closed on its own thread, which TSan reports
// as a race of ours.
int CountEntries(const std::string& dir_path) {
  const long fd =
      syscall(SYS_openat, AT_FDCWD, dir_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int count = 0;
  alignas(8) char buffer[8192];
  while (true) {
    const long n = syscall(SYS_getdents64, fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      // struct linux_dirent64: d_ino u64, d_off s64, d_reclen u16, d_type u8, d_name[].
      uint16_t reclen;
      std::memcpy(&reclen, buffer + at + 16, sizeof(reclen));
      if (buffer[at + 19] != '.') ++count;
      at += reclen;
    }
  }
  syscall(SYS_close, fd);
  return count;
}
int Fds() { return CountEntries("/proc/self/fd"); }
int Threads() { return CountEntries("/proc/self/task"); }

// ---------------------------------------------------------------------------------------------
// Raw TensorPipe, for playing a peer without the token (as agent_test.cc does).

// Reads one message (metadata only, its payloads and tensors into scratch); the metadata, or
// an error once the pipe fails.
absl::StatusOr<std::string> ReadMetadata(tensorpipe::Pipe& pipe) {
  struct State {
    absl::Notification done;
    absl::StatusOr<std::string> result;
  };
  auto state = std::make_shared<State>();
  pipe.readDescriptor(
      [state, &pipe](const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
        if (error) {
          state->result = absl::UnavailableError(error.what());
          state->done.Notify();
          return;
        }
        state->result = descriptor.metadata;
        tensorpipe::Allocation allocation;
        std::vector<std::shared_ptr<std::vector<char>>> buffers;
        for (const auto& payload : descriptor.payloads) {
          buffers.push_back(std::make_shared<std::vector<char>>(payload.length + 1));
          allocation.payloads.push_back({buffers.back()->data()});
        }
        for (const auto& tensor : descriptor.tensors) {
          buffers.push_back(std::make_shared<std::vector<char>>(tensor.length + 1));
          allocation.tensors.push_back({tensorpipe::CpuBuffer{buffers.back()->data()}});
        }
        pipe.read(std::move(allocation),
                  [state, buffers](const tensorpipe::Error&) { state->done.Notify(); });
      });
  if (!state->done.WaitForNotificationWithTimeout(kWait)) {
    return absl::DeadlineExceededError("nothing to read");
  }
  return state->result;
}

// Writes a message of `metadata`, `payloads` and CPU `tensors` (all held until written).
void Write(tensorpipe::Pipe& pipe, std::string metadata, std::vector<std::string> payloads = {},
           std::vector<std::string> tensors = {}) {
  auto held = std::make_shared<std::vector<std::string>>();
  for (auto& p : payloads) held->push_back(std::move(p));
  for (auto& t : tensors) held->push_back(std::move(t));
  tensorpipe::Message message;
  message.metadata = std::move(metadata);
  size_t i = 0;
  for (; i < payloads.size(); ++i) {
    message.payloads.push_back({(*held)[i].data(), (*held)[i].size(), ""});
  }
  for (; i < held->size(); ++i) {
    tensorpipe::Message::Tensor tensor;
    tensor.buffer = tensorpipe::CpuBuffer{(*held)[i].data()};
    tensor.length = (*held)[i].size();
    message.tensors.push_back(std::move(tensor));
  }
  pipe.write(std::move(message), [held](const tensorpipe::Error&) {});
}

// ---------------------------------------------------------------------------------------------

// The agent under attack ("node-a", uv + basic, echoing). Every check of it dials it from a
// fresh good agent, so that a new pipe must be accepted: a listener that stopped accepting is
// caught, not hidden behind a pipe opened before the attack.
class AgentHostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AgentOptions options = TestOptions("node-a", {"uv"}, {"basic"});
    options.handshake_timeout = handshake_timeout_;
    options.chunk_timeout = chunk_timeout_;
    auto a = Agent::Create(options);
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = *std::move(a);
    echo_ = std::make_unique<EchoHandler>(*a_);
    port_ = UvPort(a_->address());
    ASSERT_GT(port_, 0) << a_->address();
  }

  // A correct call from a new good agent is answered, and the handler has seen exactly the
  // good calls so far.
  void ExpectServesGoodCallsOnly() {
    ++good_calls_;
    auto b = Agent::Create(TestOptions(absl::StrCat("node-b", good_calls_), {"uv"}, {"basic"}));
    ASSERT_TRUE(b.ok()) << b.status();
    Message request = MakeMessage("echo", 100, {4096}, good_calls_);
    const auto sums = Checksums(request);
    absl::StatusOr<Message> reply = CallAndWait(**b, PeerOf(*a_), std::move(request), kWait);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(Checksums(*reply), sums);
    EXPECT_EQ(echo_->requests(), good_calls_) << "the handler got something from a bad peer";
  }

  // After a listener failure: the agent listens again within `within`, and then serves as
  // ExpectServesGoodCallsOnly (calls tried in the gap are refused; they reach no handler).
  void ExpectServesAgainWithin(absl::Duration within) {
    const absl::Time until = absl::Now() + within;
    while (true) {
      auto b = Agent::Create(TestOptions(absl::StrCat("node-r", ++retries_), {"uv"}, {"basic"}));
      ASSERT_TRUE(b.ok()) << b.status();
      absl::StatusOr<Message> reply =
          CallAndWait(**b, PeerOf(*a_), MakeMessage("echo", 1, {}, 7), absl::Seconds(2));
      if (reply.ok()) {
        ++good_calls_;
        break;
      }
      ASSERT_LT(absl::Now(), until) << "the agent does not accept again: " << reply.status();
      absl::SleepFor(absl::Milliseconds(10));
    }
    ExpectServesGoodCallsOnly();
  }

  // This process's fds and threads (the agent is in it) return to what they were.
  static void ExpectBackToBaseline(int fds, int threads) {
    EXPECT_TRUE(WaitUntil([&] { return Fds() <= fds && Threads() <= threads; }))
        << "fds " << Fds() << " (baseline " << fds << "), threads " << Threads() << " (baseline "
        << threads << ")";
  }

  absl::Duration handshake_timeout_ = absl::Seconds(2);
  absl::Duration chunk_timeout_ = absl::Seconds(1);
  std::unique_ptr<Agent> a_;
  std::unique_ptr<EchoHandler> echo_;
  int port_ = -1;
  int64_t good_calls_ = 0;
  int retries_ = 0;
};

// ---- Raw TCP (B3) that TensorPipe survives.

TEST_F(AgentHostileTest, SilentAndHalfSentConnectionsDoNotBlockGoodCalls) {
  ExpectServesGoodCallsOnly();
  const int fds = Fds();
  std::vector<int> silent;
  for (int i = 0; i < 50; ++i) {
    const int fd = ConnectTcp(port_);
    ASSERT_GE(fd, 0);
    silent.push_back(fd);
  }
  // A truncated length prefix on one more, left open.
  const int partial = ConnectTcp(port_);
  ASSERT_EQ(send(partial, "\x10\x00\x00", 3, MSG_NOSIGNAL), 3);
  silent.push_back(partial);
  ExpectServesGoodCallsOnly();
  // Past the agent's handshake timeout the transport has closed them all (they never proved
  // the token, so TensorPipe never saw them): each of ours reads the challenge, then the end.
  auto closed_by_agent = [](int fd) {
    char buffer[64];
    while (true) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n == 0) return true;
      if (n < 0) return false;  // nothing more yet: still open
    }
  };
  EXPECT_TRUE(WaitUntil(
      [&] {
        for (int fd : silent) {
          if (!closed_by_agent(fd)) return false;
        }
        return true;
      },
      handshake_timeout_ + absl::Seconds(3)));
  ExpectServesGoodCallsOnly();
  for (int fd : silent) close(fd);
  EXPECT_TRUE(WaitUntil([&] { return Fds() <= fds; })) << Fds() << " fds, baseline " << fds;
  EXPECT_EQ(a_->Stats().listener_failures, 0u) << "a stranger reached TensorPipe's listener";
}

// Connections that close before they proved the token never reach TensorPipe: its listener,
// which fails for good when a connection closes before its first packet, never sees them.
TEST_F(AgentHostileTest, AConnectionClosedBeforeItsHandshakeCostsNothing) {
  // A pipe opened before.
  auto before = Agent::Create(TestOptions("node-b", {"uv"}, {"basic"}));
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(CallAndWait(**before, PeerOf(*a_), MakeMessage("echo", 1, {}, 1)).ok());
  ++good_calls_;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(SendAndClose(port_, ""));
  // A truncated length prefix, then a hang-up.
  ASSERT_TRUE(SendAndClose(port_, std::string("\x10\x00\x00", 3)));
  ExpectServesGoodCallsOnly();
  EXPECT_TRUE(WaitUntil([&] { return a_->Stats().auth_failures >= 21; }));
  EXPECT_EQ(a_->Stats().listener_failures, 0u);
  // The pipe opened before never noticed.
  EXPECT_TRUE(CallAndWait(**before, PeerOf(*a_), MakeMessage("echo", 1, {}, 2)).ok());
  ++good_calls_;
  EXPECT_EQ(echo_->requests(), good_calls_);
  EXPECT_EQ(UvPort(a_->address()), port_) << "the same address";
}

// A peer with the token that closes right after its connection proved it (a peer agent
// shutting down, a call failing at once) does reach TensorPipe's listener before its first
// packet, which fails that listener for good: the agent listens again on the same URLs, so that
// costs new peers a moment only.
TEST_F(AgentHostileTest, APeerClosingBeforeItsFirstPacketCostsAMomentOfAccepting) {
  ExpectServesGoodCallsOnly();
  const int fds = Fds();
  const int threads = Threads();
  for (int i = 0; i < 5; ++i) {
    testing::ConnectProveAndClose(port_);
    ASSERT_TRUE(WaitUntil([&] { return a_->Stats().listener_failures > static_cast<uint64_t>(i); }))
        << "round " << i;
    ExpectServesAgainWithin(absl::Seconds(1));  // a new peer, a new pipe
  }
  {
    RawContext raw;
    for (int i = 0; i < 10; ++i) raw.context().connect(UvUrl(*a_))->close();
  }
  ExpectServesAgainWithin(absl::Seconds(1));
  ExpectBackToBaseline(fds, threads);
  EXPECT_EQ(UvPort(a_->address()), port_) << "the same address";
}

// ---- Raw TCP (B3) that used to stop or kill the agent: TensorPipe's bugs, kept away.
//
// TensorPipe 0.0~git20220513.bb1473a (Debian 12) reads every new connection's first packet in
// code that a stranger could break (docs/security.md, "Agent pipes"):
//  * core/listener_impl.cc, ListenerImpl::onAccept: an error on that one connection (EOF,
//    reset) fails the whole listener;
//  * common/stream_read_write_ops.h: the 8-byte length prefix goes straight to
//    std::make_unique<char[]>(length): std::bad_alloc (SIGABRT) for a huge one, that much
//    memory committed for one that fits;
//  * transport/connection_impl_boilerplate.h:249: a body that is not a nop Packet is
//    TP_THROW_ASSERT_IF (SIGABRT); common/nop.h: a zero-length frame is a null read (SIGSEGV).
// tpd's transport (agent/auth_tcp.h) runs its handshake on the raw socket first, so none of
// those bytes reaches TensorPipe: these tests send them to an agent in a child process
// (tests/agent/agent_peer) and check that it lives, holds no memory for them, and serves. The
// bugs remain for peers that hold the token.

// Sends `bytes` to a fresh child agent and returns how it ended: the signal that killed it
// within 2 s (a sanitizer's exit status, negated), or 0 if it still runs.
int SignalAfter(const std::string& bytes, bool close_after = true) {
  std::unique_ptr<PeerProcess> peer = StartPeer("node-v", {"--transports=uv", "--channels=basic"});
  EXPECT_TRUE(peer != nullptr && !peer->address.empty()) << "agent_peer did not start";
  if (peer == nullptr || peer->address.empty()) return -1;
  const int port = UvPort(peer->address);
  const int fd = ConnectTcp(port);
  EXPECT_GE(fd, 0);
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += n;
  }
  if (close_after) close(fd);
  const bool died = WaitUntil([&] { return peer->Died(); }, absl::Seconds(2));
  if (!close_after) close(fd);
  if (!died) return 0;
  return WIFSIGNALED(peer->status) ? WTERMSIG(peer->status) : -WEXITSTATUS(peer->status);
}

TEST(AgentPortJunk, RandomBytesCloseOnlyTheirConnection) {
  EXPECT_EQ(SignalAfter(Random(4096, 1)), 0);
  EXPECT_EQ(SignalAfter(Random(1 << 20, 4)), 0);
}

TEST(AgentPortJunk, AHugeLengthPrefixClosesOnlyItsConnection) {
  EXPECT_EQ(SignalAfter(Frame(~uint64_t{0}, Random(64, 2))), 0);
  EXPECT_EQ(SignalAfter(Frame(uint64_t{1} << 48, "")), 0);
}

TEST(AgentPortJunk, AFramedBodyThatIsNotAPacketClosesOnlyItsConnection) {
  EXPECT_EQ(SignalAfter(Frame(64, Random(64, 3))), 0);
}

TEST(AgentPortJunk, AZeroLengthFrameClosesOnlyItsConnection) {
  EXPECT_EQ(SignalAfter(std::string(64, '\0')), 0);
}

TEST(AgentPortJunk, ALengthPrefixCommitsNoMemory) {
  std::unique_ptr<PeerProcess> peer = StartPeer("node-v", {"--transports=uv", "--channels=basic"});
  ASSERT_TRUE(peer != nullptr && !peer->address.empty());
  auto rss_kib = [&] {
    std::ifstream status(absl::StrCat("/proc/", peer->pid, "/status"));
    std::string line;
    while (std::getline(status, line)) {
      int64_t kib = 0;
      if (absl::StartsWith(line, "VmRSS:") &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(line.substr(6), "kB")),
                           &kib)) {
        return kib;
      }
    }
    return int64_t{-1};
  };
  const int64_t before = rss_kib();
  const int fd = ConnectTcp(UvPort(peer->address));
  ASSERT_GE(fd, 0);
  const std::string prefix = Frame(uint64_t{256} << 20, "");  // claims 256 MiB, sends none
  ASSERT_EQ(send(fd, prefix.data(), prefix.size(), MSG_NOSIGNAL), 8);
  EXPECT_FALSE(WaitUntil([&] { return rss_kib() - before > 200 * 1024; }, absl::Seconds(2)))
      << "RSS " << before << " KiB -> " << rss_kib() << " KiB";
  close(fd);
  EXPECT_FALSE(peer->Died());
}

// ---- A peer with the wrong token (B4).

TEST_F(AgentHostileTest, AnAgentWithTheWrongTokenReachesNoHandler) {
  ExpectServesGoodCallsOnly();
  const int fds = Fds();
  const int threads = Threads();
  {
    AgentOptions wrong = TestOptions("node-m", {"uv"}, {"basic"});
    wrong.cluster_token = "not-the-cluster-token";
    auto m = Agent::Create(wrong);
    ASSERT_TRUE(m.ok()) << m.status();
    for (int i = 0; i < 5; ++i) {
      absl::StatusOr<Message> reply =
          CallAndWait(**m, PeerOf(*a_), MakeMessage("steal", 10, {100}, 100 + i), kWait);
      EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
      EXPECT_THAT(reply.status().message(), HasSubstr("node-a"));
    }
    EXPECT_TRUE(WaitUntil([&] { return a_->Stats().auth_failures >= 5; }))
        << a_->Stats().auth_failures;
    ExpectServesGoodCallsOnly();
  }
  ExpectBackToBaseline(fds, threads);
}

// ---- Raw TensorPipe pipes that skip or break the handshake (B3/B4).

TEST_F(AgentHostileTest, RawPipesThatSendSomethingElseAreClosedAndCounted) {
  ExpectServesGoodCallsOnly();
  const int fds = Fds();
  const int threads = Threads();
  {
    RawContext raw;
    const std::string url = absl::StrCat("uv://127.0.0.1:", port_);
    int refused = 0;
    auto attack = [&](const std::function<void(tensorpipe::Pipe&)>& send) {
      std::shared_ptr<tensorpipe::Pipe> pipe = raw.context().connect(url);
      ASSERT_TRUE(ReadMetadata(*pipe).ok()) << "the challenge";
      send(*pipe);
      EXPECT_FALSE(ReadMetadata(*pipe).ok()) << "no answer but the pipe closing";
      ++refused;
      pipe->close();
    };
    // Metadata that is not a PipeHello.
    attack([](tensorpipe::Pipe& pipe) { Write(pipe, Random(200, 5)); });
    // An empty message.
    attack([](tensorpipe::Pipe& pipe) { Write(pipe, ""); });
    // A request as if authenticated, with payload and a tensor.
    attack([](tensorpipe::Pipe& pipe) {
      v1::AgentMessage request;
      request.set_kind(v1::AgentMessage::REQUEST);
      request.set_call_id(1);
      request.set_method("echo");
      request.set_payload_bytes(5);
      Write(pipe, request.SerializeAsString(), {"hello"}, {std::string(4096, 't')});
    });
    // Metadata over the hello limit (64 KiB).
    attack([](tensorpipe::Pipe& pipe) { Write(pipe, std::string(1 << 20, 'm')); });
    // An ANSWER with many payloads.
    attack([](tensorpipe::Pipe& pipe) {
      v1::PipeHello answer;
      answer.set_version(std::string(kPipeAuthVersion));
      answer.set_step(v1::PipeHello::ANSWER);
      answer.set_nonce(NewPipeNonce());
      answer.set_agent_id("node-m");
      answer.set_mac(std::string(32, 'z'));
      std::vector<std::string> payloads(100, std::string(1000, 'p'));
      Write(pipe, answer.SerializeAsString(), payloads);
    });
    // A CHALLENGE sent back to the acceptor.
    attack([](tensorpipe::Pipe& pipe) {
      v1::PipeHello challenge;
      challenge.set_version(std::string(kPipeAuthVersion));
      challenge.set_step(v1::PipeHello::CHALLENGE);
      challenge.set_nonce(NewPipeNonce());
      challenge.set_agent_id("node-m");
      Write(pipe, challenge.SerializeAsString());
    });
    EXPECT_TRUE(WaitUntil([&] {
      return a_->Stats().auth_failures >= static_cast<uint64_t>(refused);
    })) << a_->Stats().auth_failures
        << " of " << refused;
    ExpectServesGoodCallsOnly();
  }
  ExpectBackToBaseline(fds, threads);
}

TEST_F(AgentHostileTest, RawPipesThatStaySilentAreClosedAtTheHandshakeTimeout) {
  ExpectServesGoodCallsOnly();
  const int fds = Fds();
  const int threads = Threads();
  {
    RawContext raw;
    const std::string url = absl::StrCat("uv://127.0.0.1:", port_);
    std::vector<std::shared_ptr<tensorpipe::Pipe>> pipes;
    for (int i = 0; i < 10; ++i) pipes.push_back(raw.context().connect(url));
    const absl::Time start = absl::Now();
    for (auto& pipe : pipes) {
      ASSERT_TRUE(ReadMetadata(*pipe).ok()) << "the challenge";
    }
    ExpectServesGoodCallsOnly();
    for (auto& pipe : pipes) {
      EXPECT_FALSE(ReadMetadata(*pipe).ok()) << "closed by the agent";
    }
    EXPECT_LT(absl::Now() - start, handshake_timeout_ + absl::Seconds(3));
    EXPECT_TRUE(WaitUntil([&] { return a_->Stats().auth_failures >= 10; }));
    ExpectServesGoodCallsOnly();
  }
  ExpectBackToBaseline(fds, threads);
}

// ---- Authenticated peers that break the chunk protocol (a daemon holding the token, buggy or
// taken over): each has its pipe closed, naming what it did, and nothing reaches the handler.

// Completes the handshake on `pipe` (dialed at `url`) as connector "node-m" with the test
// token; false if the agent did not prove itself back.
bool Authenticate(tensorpipe::Pipe& pipe, const std::string& url) {
  absl::StatusOr<std::string> metadata = ReadMetadata(pipe);
  v1::PipeHello challenge;
  if (!metadata.ok() || !challenge.ParseFromString(*metadata)) return false;
  PipeTranscript transcript;
  transcript.challenge_nonce = challenge.nonce();
  transcript.answer_nonce = NewPipeNonce();
  transcript.acceptor_id = challenge.agent_id();
  transcript.acceptor_urls.assign(challenge.urls().begin(), challenge.urls().end());
  transcript.dialed_url = url;
  transcript.connector_id = "node-m";
  transcript.connector_urls = {"uv://127.0.0.1:1"};
  v1::PipeHello answer;
  answer.set_version(std::string(kPipeAuthVersion));
  answer.set_step(v1::PipeHello::ANSWER);
  answer.set_nonce(transcript.answer_nonce);
  answer.set_agent_id(transcript.connector_id);
  answer.add_urls(transcript.connector_urls[0]);
  answer.set_dialed_url(url);
  answer.set_mac(ComputePipeMac(testing::kTestToken, PipeMacRole::kAnswer, transcript));
  Write(pipe, answer.SerializeAsString());
  v1::PipeHello proof;
  metadata = ReadMetadata(pipe);
  return metadata.ok() && proof.ParseFromString(*metadata) &&
         VerifyPipeMac(testing::kTestToken, PipeMacRole::kProof, transcript, proof.mac());
}

// A request whose one tensor of `nbytes` comes in chunks of `chunk_bytes` (none sent yet).
std::string ChunkedRequest(uint64_t call_id, uint64_t nbytes, uint64_t chunk_bytes) {
  v1::AgentMessage request;
  request.set_kind(v1::AgentMessage::REQUEST);
  request.set_call_id(call_id);
  request.set_method("echo");
  v1::TensorDescriptor* tensor = request.add_tensors();
  tensor->set_dtype("uint8");
  tensor->set_device("cpu");
  tensor->set_nbytes(nbytes);
  tensor->set_chunk_bytes(chunk_bytes);
  return request.SerializeAsString();
}

std::string ChunkHeader(uint64_t call_id, uint32_t tensor, uint64_t offset) {
  v1::AgentMessage chunk;
  chunk.set_kind(v1::AgentMessage::CHUNK);
  chunk.set_call_id(call_id);
  chunk.set_chunk_tensor(tensor);
  chunk.set_chunk_offset(offset);
  return chunk.SerializeAsString();
}

TEST_F(AgentHostileTest, PeersThatBreakTheChunkProtocolHaveTheirPipesClosed) {
  ExpectServesGoodCallsOnly();
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  const std::string one_mib(kMiB, 'c');
  {
    RawContext raw;
    const std::string url = absl::StrCat("uv://127.0.0.1:", port_);
    auto attack = [&](const std::string& what, const std::function<void(tensorpipe::Pipe&)>& send) {
      std::shared_ptr<tensorpipe::Pipe> pipe = raw.context().connect(url);
      ASSERT_TRUE(Authenticate(*pipe, url)) << what;
      send(*pipe);
      EXPECT_FALSE(ReadMetadata(*pipe).ok()) << what << ": no answer but the pipe closing";
      pipe->close();
      ExpectServesGoodCallsOnly();
    };
    attack("a chunk of a message never sent",
           [&](tensorpipe::Pipe& pipe) { Write(pipe, ChunkHeader(7, 0, 0), {}, {one_mib}); });
    attack("a chunk off a chunk boundary", [&](tensorpipe::Pipe& pipe) {
      Write(pipe, ChunkedRequest(1, 2 * kMiB, kMiB), {}, {""});
      Write(pipe, ChunkHeader(1, 0, 12345), {}, {one_mib});
    });
    attack("the same chunk twice", [&](tensorpipe::Pipe& pipe) {
      Write(pipe, ChunkedRequest(1, 2 * kMiB, kMiB), {}, {""});
      Write(pipe, ChunkHeader(1, 0, 0), {}, {one_mib});
      Write(pipe, ChunkHeader(1, 0, 0), {}, {one_mib});
    });
    attack("a chunk of the wrong length", [&](tensorpipe::Pipe& pipe) {
      Write(pipe, ChunkedRequest(1, 2 * kMiB, kMiB), {}, {""});
      Write(pipe, ChunkHeader(1, 0, kMiB), {}, {std::string(100, 'c')});
    });
    attack("a chunk of a tensor not sent in chunks", [&](tensorpipe::Pipe& pipe) {
      Write(pipe, ChunkedRequest(1, 2 * kMiB, kMiB), {}, {""});
      Write(pipe, ChunkHeader(1, 3, 0), {}, {one_mib});
    });
    attack("chunks below the minimum", [&](tensorpipe::Pipe& pipe) {
      Write(pipe, ChunkedRequest(1, 2 * kMiB, 4096), {}, {""});
    });
    attack("a chunked tensor whose bytes also came with the message", [&](tensorpipe::Pipe& pipe) {
      Write(pipe, ChunkedRequest(1, kMiB, kMiB), {}, {one_mib});
    });
    attack("a chunked tensor past max_message_bytes", [&](tensorpipe::Pipe& pipe) {
      Write(pipe, ChunkedRequest(1, uint64_t{3} << 30, uint64_t{1} << 30), {}, {""});
    });
    attack("chunked sizes whose sum wraps to 4 KiB", [&](tensorpipe::Pipe& pipe) {
      // 2^63 + (2^63 + 4096) is 4096 in 64 bits: summed naively, the message would be placed
      // in 4 KiB and its first chunk (2^62 bytes) written past it.
      v1::AgentMessage request;
      request.ParseFromString(ChunkedRequest(1, uint64_t{1} << 63, uint64_t{1} << 62));
      *request.add_tensors() = request.tensors(0);
      request.mutable_tensors(1)->set_nbytes((uint64_t{1} << 63) + 4096);
      Write(pipe, request.SerializeAsString(), {}, {"", ""});
      Write(pipe, ChunkHeader(1, 0, 0), {}, {one_mib});
    });
    attack("a message sent again before its chunks came", [&](tensorpipe::Pipe& pipe) {
      Write(pipe, ChunkedRequest(1, 2 * kMiB, kMiB), {}, {""});
      Write(pipe, ChunkedRequest(1, 2 * kMiB, kMiB), {}, {""});
    });
    // Chunks promised and never sent hold the agent's memory only until chunk_timeout.
    const absl::Time start = absl::Now();
    attack("chunks that never come", [&](tensorpipe::Pipe& pipe) {
      Write(pipe, ChunkedRequest(1, 2 * kMiB, kMiB), {}, {""});
      Write(pipe, ChunkHeader(1, 0, 0), {}, {one_mib});
    });
    EXPECT_LT(absl::Now() - start, chunk_timeout_ + absl::Seconds(5));
  }
  // A chunk its sender says it could not produce fails only that request: answered ERROR
  // with the sender's reason, the pipe kept.
  RawContext raw;
  const std::string url = absl::StrCat("uv://127.0.0.1:", port_);
  std::shared_ptr<tensorpipe::Pipe> pipe = raw.context().connect(url);
  ASSERT_TRUE(Authenticate(*pipe, url));
  Write(*pipe, ChunkedRequest(1, 2 * kMiB, kMiB), {}, {""});
  Write(*pipe, ChunkHeader(1, 0, 0), {}, {one_mib});
  v1::AgentMessage failed;
  failed.ParseFromString(ChunkHeader(1, 0, kMiB));
  failed.set_status_code(999);  // not a status code: read as UNKNOWN
  failed.set_status_message("device copy failed");
  Write(*pipe, failed.SerializeAsString());
  absl::StatusOr<std::string> answer = ReadMetadata(*pipe);
  ASSERT_TRUE(answer.ok()) << answer.status();
  v1::AgentMessage error;
  ASSERT_TRUE(error.ParseFromString(*answer));
  EXPECT_EQ(error.kind(), v1::AgentMessage::ERROR);
  EXPECT_EQ(error.call_id(), 1u);
  EXPECT_EQ(error.status_code(), static_cast<int>(absl::StatusCode::kUnknown));
  EXPECT_THAT(error.status_message(),
              ::testing::HasSubstr("could not send tensor 0: device copy failed"));
  pipe->close();
  ExpectServesGoodCallsOnly();
}

}  // namespace
}  // namespace tpd::agent
