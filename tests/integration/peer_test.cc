// Trust between daemons, with real tpd processes: the cluster token never travels (not even to
// an address a local client names), calls without a valid MAC are refused, daemons dial only
// inside [peer] dial_networks, mutual TLS, a daemon reaches its own store through its own peer
// port (so "self" is never guessed from an address), two daemons never share a peer port, and
// the peer port serves neither reflection nor health.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "proto/store.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/impostor_store.h"

namespace tpd {
namespace {

using ::testing::AllOf;
using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::RunProcess;
using testing::TempDir;

constexpr char kToken[] = "do-not-leak-7f3a9c21";

// A TCP listener that speaks just enough HTTP/2 for a gRPC client to send its requests (the
// server preface: an empty SETTINGS frame, and an ACK of the client's), never answers them,
// and records every byte it receives.
class FakePeer {
 public:
  FakePeer() {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    listen(listener_, 16);
    socklen_t length = sizeof(address);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { Run(); });
  }

  ~FakePeer() {
    stop_ = true;
    thread_.join();
    close(listener_);
  }

  int port() const { return port_; }

  std::string Received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }

 private:
  void Run() {
    std::vector<pollfd> fds = {{listener_, POLLIN, 0}};
    while (!stop_) {
      if (poll(fds.data(), fds.size(), 50) <= 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        if (i == 0) {
          const int connection = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
          if (connection < 0) continue;
          // SETTINGS (empty), then SETTINGS with the ACK flag.
          const unsigned char preface[] = {0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 4, 1, 0, 0, 0, 0};
          (void)!write(connection, preface, sizeof(preface));
          fds.push_back({connection, POLLIN, 0});
          continue;
        }
        char buffer[4096];
        const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
        if (n <= 0) {
          close(fds[i].fd);
          fds[i].fd = -1;  // poll ignores it from now on
          continue;
        }
        absl::MutexLock lock(&mu_);
        received_.append(buffer, n);
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].fd >= 0) close(fds[i].fd);
    }
  }

  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::string received_ ABSL_GUARDED_BY(mu_);
};

class PeerTest : public ::testing::Test {
 protected:
  // A daemon on a fresh socket with `peer_config` as its [peer] table (plus a fast heartbeat
  // and a node name unless given); returns its index, or -1 after a test failure.
  int StartDaemon(const std::string& peer_config) {
    const int i = static_cast<int>(daemons_.size());
    const std::string socket = absl::StrCat(dir_.path(), "/d", i, ".sock");
    std::string peer = peer_config;
    if (!absl::StrContains(peer, "node_name")) absl::StrAppend(&peer, "node_name = \"n", i, "\"\n");
    if (!absl::StrContains(peer, "heartbeat_interval_ms")) {
      absl::StrAppend(&peer, "heartbeat_interval_ms = 100\nheartbeat_timeout_ms = 2000\n");
    }
    const std::string config =
        dir_.WriteFile(absl::StrCat("d", i, ".toml"),
                       absl::StrCat("[daemon]\nshutdown_grace_ms = 600000\n[peer]\n", peer));
    absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
        DaemonProcess::Start(socket, {"--config", config});
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    if (!daemon.ok()) return -1;
    daemons_.push_back(*std::move(daemon));
    sockets_.push_back(socket);
    return i;
  }

  std::unique_ptr<Client> Connect(int daemon) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(sockets_[daemon]);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::string PeerAddress(int daemon) { return Connect(daemon)->Status()->peer_address(); }

  static int PortOf(const std::string& address) {
    return std::stoi(address.substr(address.rfind(':') + 1));
  }

  // Joins a static group of two, rank 0 through daemon `a` and rank 1 through `b`.
  std::vector<absl::StatusOr<v1::JoinResponse>> JoinPair(int a, int b,
                                                         const std::string& init_method,
                                                         absl::Duration timeout) {
    std::vector<absl::StatusOr<v1::JoinResponse>> results(2, absl::UnknownError("not run"));
    std::vector<std::unique_ptr<Client>> clients;
    clients.push_back(Connect(a));
    clients.push_back(Connect(b));
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      JoinOptions options;
      options.group = "pair";
      options.name = absl::StrCat("w", r);
      options.rank = r;
      options.world_size = 2;
      options.init_method = init_method;
      options.timeout = timeout;
      options.include_members = true;  // ExpectFormed reads the list
      threads.emplace_back([&, r, options] { results[r] = clients[r]->Join(options); });
    }
    for (std::thread& thread : threads) thread.join();
    return results;
  }

  static void ExpectFormed(const std::vector<absl::StatusOr<v1::JoinResponse>>& results) {
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
      EXPECT_EQ(results[r]->group().phase(), "FORMED");
      EXPECT_EQ(results[r]->group().members_size(), 2);
    }
  }

  TempDir dir_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
  std::vector<std::string> sockets_;
};

std::string TokenConfig(const std::string& listen) {
  return absl::StrCat("listen_address = \"", listen, "\"\ntoken = \"", kToken, "\"\n");
}

TEST_F(PeerTest, TheTokenNeverReachesAnAddressAClientNames) {
  FakePeer fake;
  const int d = StartDaemon(TokenConfig("127.0.0.1:0"));
  ASSERT_GE(d, 0);
  const std::string url = absl::StrCat("tcp://127.0.0.1:", fake.port());
  std::unique_ptr<Client> client = Connect(d);
  // GetGroup alone makes the daemon use that store (heartbeats, the group's versions) ...
  (void)client->GetGroup("probe", url);
  // ... and so does a Join, which waits for the store until its timeout.
  JoinOptions join;
  join.group = "probe-join";
  join.name = "w0";
  join.init_method = url;
  join.timeout = absl::Seconds(2);
  EXPECT_FALSE(client->Join(join).ok());
  // The daemon's calls reached the fake peer: the HTTP/2 preface and signed requests ...
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!absl::StrContains(fake.Received(), "tpd-auth") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string received = fake.Received();
  const std::string size = absl::StrCat(received.size(), " bytes received");
  EXPECT_TRUE(absl::StrContains(received, "PRI * HTTP/2.0")) << size;
  EXPECT_TRUE(absl::StrContains(received, "/tpd.v1.Store/")) << size;
  EXPECT_TRUE(absl::StrContains(received, "tpd-mac-v1 aud=127.0.0.1:")) << size;
  // ... but never the token.
  EXPECT_FALSE(absl::StrContains(received, kToken)) << "the token reached a client's address";
  EXPECT_FALSE(absl::StrContains(received, "tpd-token"));
}

// docs/security.md, "Answers are authenticated too": a store that answers everything (one a
// user serves itself and names in a tcp:// URL, or a host on the path) but cannot prove the
// cluster token is never followed: the join fails naming it and no forged record is used.
TEST_F(PeerTest, ADaemonFollowsNoStoreThatCannotProveTheToken) {
  testing::ImpostorStore impostor("not the cluster's token");
  const int d = StartDaemon(TokenConfig("127.0.0.1:0"));
  ASSERT_GE(d, 0);
  std::unique_ptr<Client> client = Connect(d);
  JoinOptions join;
  join.group = "hijacked";
  join.name = "w0";
  join.init_method = absl::StrCat("tcp://", impostor.address());
  join.timeout = absl::Seconds(5);
  absl::StatusOr<v1::JoinResponse> joined = client->Join(join);
  ASSERT_FALSE(joined.ok());
  EXPECT_THAT(joined.status().message(), HasSubstr("did not prove the cluster token"));
  EXPECT_THAT(joined.status().message(), HasSubstr(impostor.address()));
  absl::StatusOr<v1::GroupView> view = client->GetGroup("hijacked");
  EXPECT_TRUE(!view.ok() || view->members_size() == 0) << view->DebugString();
  // The same daemon joins through a real peer at once.
  join.init_method = absl::StrCat("tcp://", PeerAddress(d));
  join.group = "honest";
  EXPECT_TRUE(client->Join(join).ok());
}

TEST_F(PeerTest, CallsWithoutAValidMacAreRefusedAndLoggedOncePerHost) {
  const int d = StartDaemon(TokenConfig("127.0.0.1:0"));
  ASSERT_GE(d, 0);
  auto stub =
      v1::Store::NewStub(grpc::CreateChannel(PeerAddress(d), grpc::InsecureChannelCredentials()));
  v1::SetRequest request;
  request.set_key("k");
  request.set_value("v");
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext context;
    context.AddMetadata("tpd-token", kToken);  // the old scheme: the token in clear
    v1::SetResponse response;
    grpc::Status status = stub->Set(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(status.error_message(), HasSubstr("no MAC"));
  }
  grpc::ClientContext forged;
  forged.AddMetadata(
      "tpd-auth",
      absl::StrCat("tpd-mac-v1 aud=", PeerAddress(d), " ts=", absl::ToUnixMillis(absl::Now()),
                   " sender=0000000000000001 seq=1 mac=", std::string(64, '0')));
  v1::SetResponse response;
  grpc::Status status = stub->Set(&forged, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("bad MAC"));
  EXPECT_FALSE(*Connect(d)->Store().Check({"k"})) << "nothing refused was written";
  // 21 refusals within 10 s from one host: one log line.
  const std::string output = daemons_[d]->Output();
  size_t lines = 0;
  for (size_t at = output.find("refused:"); at != std::string::npos;
       at = output.find("refused:", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1) << output;
}

TEST_F(PeerTest, DaemonsDialOnlyInsideTheirDialNetworks) {
  const int server = StartDaemon(TokenConfig("127.0.0.1:0"));
  const int fenced =
      StartDaemon(absl::StrCat(TokenConfig("127.0.0.1:0"), "dial_networks = [\"10.0.0.0/8\"]\n"));
  ASSERT_GE(fenced, 0);
  const std::string url = absl::StrCat("tcp://", PeerAddress(server));
  absl::StatusOr<v1::GroupView> view = Connect(fenced)->GetGroup("g", url);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(view.status().message(),
              AllOf(HasSubstr("127.0.0.1"), HasSubstr("[peer] dial_networks")));
  // The same daemon, asked for an address its networks allow by name, resolves it first.
  absl::StatusOr<v1::GroupView> by_name =
      Connect(fenced)->GetGroup("h", absl::StrCat("tcp://localhost:", PortOf(PeerAddress(server))));
  EXPECT_EQ(by_name.status().code(), absl::StatusCode::kPermissionDenied);
  // The default networks include loopback.
  EXPECT_TRUE(Connect(server)->GetGroup("g", url).ok());
}

// With "self" decided by host names, a daemon on 127.0.0.2:P took tcp://127.0.0.1:P for itself
// and kept the group in its own store, so the group never formed.
TEST_F(PeerTest, GroupFormsBetweenDaemonsOnTwoLoopbackAddressesWithOnePort) {
  const int a = StartDaemon(TokenConfig("127.0.0.1:0"));
  ASSERT_GE(a, 0);
  const int port = PortOf(PeerAddress(a));
  const int b = StartDaemon(TokenConfig(absl::StrCat("127.0.0.2:", port)));
  ASSERT_GE(b, 0);
  ExpectFormed(JoinPair(a, b, absl::StrCat("tcp://127.0.0.1:", port), absl::Seconds(20)));
}

TEST_F(PeerTest, GroupFormsThroughADaemonListeningOnEveryAddress) {
  const int a = StartDaemon(TokenConfig("0.0.0.0:0"));
  const int b = StartDaemon(TokenConfig("0.0.0.0:0"));
  ASSERT_GE(b, 0);
  EXPECT_THAT(PeerAddress(a), HasSubstr("0.0.0.0:"));
  const std::string url = absl::StrCat("tcp://127.0.0.1:", PortOf(PeerAddress(a)));
  ExpectFormed(JoinPair(a, b, url, absl::Seconds(20)));
}

TEST_F(PeerTest, ASecondDaemonOnTheSamePeerPortRefusesToStartNamingIt) {
  const int a = StartDaemon(TokenConfig("127.0.0.1:0"));
  ASSERT_GE(a, 0);
  const int port = PortOf(PeerAddress(a));
  const std::string config = dir_.WriteFile(
      "second.toml", absl::StrCat("[peer]\n", TokenConfig(absl::StrCat("127.0.0.1:", port))));
  absl::StatusOr<std::unique_ptr<DaemonProcess>> second =
      DaemonProcess::Start(absl::StrCat(dir_.path(), "/second.sock"), {"--config", config});
  ASSERT_FALSE(second.ok()) << "a second daemon started on peer port " << port;
  EXPECT_THAT(second.status().message(),
              AllOf(HasSubstr(absl::StrCat("port ", port)), HasSubstr("in use")));
}

TEST_F(PeerTest, ThePeerPortServesNeitherReflectionNorHealth) {
  const int d = StartDaemon(TokenConfig("127.0.0.1:0"));
  ASSERT_GE(d, 0);
  auto channel = grpc::CreateChannel(PeerAddress(d), grpc::InsecureChannelCredentials());
  auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);
  grpc::ClientContext context;
  auto stream = reflection->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("");
  stream->Write(request);
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);

  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext health_context;
  grpc::health::v1::HealthCheckResponse health_response;
  EXPECT_EQ(health->Check(&health_context, {}, &health_response).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// grpcurl resolves a service through reflection before calling it: every service listed on the
// unix socket must be describable (grpc.health.v1.Health was listed but "Symbol not found").
TEST_F(PeerTest, ReflectionOnTheSocketDescribesEveryServiceItLists) {
  const int d = StartDaemon(TokenConfig("127.0.0.1:0"));
  ASSERT_GE(d, 0);
  auto channel =
      grpc::CreateChannel(absl::StrCat("unix:", sockets_[d]), grpc::InsecureChannelCredentials());
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_TRUE(stream->Write(list));
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> names;
  for (const auto& service : response.list_services_response().service()) {
    names.push_back(service.name());
  }
  EXPECT_THAT(names, ::testing::IsSupersetOf({"tpd.v1.Store", "tpd.v1.Admin", "tpd.v1.Control",
                                              "grpc.health.v1.Health"}));
  for (const std::string& name : names) {
    grpc::reflection::v1alpha::ServerReflectionRequest describe;
    describe.set_file_containing_symbol(name);
    ASSERT_TRUE(stream->Write(describe));
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_TRUE(response.has_file_descriptor_response())
        << name << ": " << response.error_response().error_message();
    EXPECT_GT(response.file_descriptor_response().file_descriptor_proto_size(), 0) << name;
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// Mutual TLS: a CA and one certificate for 127.0.0.1, made with the openssl command.
class PeerTlsTest : public PeerTest {
 protected:
  void SetUp() override {
    if (access("/usr/bin/openssl", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/openssl";
    const std::string d = dir_.path();
    dir_.WriteFile("ext.cnf",
                   "subjectAltName = IP:127.0.0.1\nextendedKeyUsage = serverAuth, clientAuth\n");
    const std::vector<std::vector<std::string>> commands = {
        {"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", d + "/ca.key", "-out", d + "/ca.crt",
         "-days", "2", "-subj", "/CN=tpd test CA"},
        {"/usr/bin/openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", d + "/node.key", "-out", d + "/node.csr", "-subj", "/CN=tpd node"},
        {"/usr/bin/openssl", "x509", "-req", "-in", d + "/node.csr", "-CA", d + "/ca.crt", "-CAkey",
         d + "/ca.key", "-CAcreateserial", "-out", d + "/node.crt", "-days", "2", "-extfile",
         d + "/ext.cnf"},
    };
    for (const std::vector<std::string>& command : commands) {
      testing::ProcessResult result = RunProcess(command);
      ASSERT_EQ(result.exit_code, 0) << command[1] << ": " << result.output;
    }
  }

  std::string TlsConfig(const std::string& listen) {
    const std::string d = dir_.path();
    return absl::StrCat(TokenConfig(listen), "tls_cert_file = \"", d, "/node.crt\"\n",
                        "tls_key_file = \"", d, "/node.key\"\ntls_ca_file = \"", d, "/ca.crt\"\n");
  }
};

TEST_F(PeerTlsTest, TwoDaemonsFormAGroupOverMutualTls) {
  const int a = StartDaemon(TlsConfig("127.0.0.1:0"));
  const int b = StartDaemon(TlsConfig("127.0.0.1:0"));
  ASSERT_GE(b, 0);
  EXPECT_THAT(daemons_[a]->Output(), HasSubstr("mutual TLS"));
  ExpectFormed(JoinPair(a, b, absl::StrCat("tcp://", PeerAddress(a)), absl::Seconds(20)));
}

TEST_F(PeerTlsTest, ADaemonWithoutACertificateIsRefused) {
  const int a = StartDaemon(TlsConfig("127.0.0.1:0"));
  const int plain = StartDaemon(TokenConfig("127.0.0.1:0"));
  ASSERT_GE(plain, 0);
  JoinOptions join;
  join.group = "g";
  join.name = "w0";
  join.rank = 0;
  join.world_size = 2;
  join.init_method = absl::StrCat("tcp://", PeerAddress(a));
  join.timeout = absl::Seconds(3);
  absl::StatusOr<v1::JoinResponse> joined = Connect(plain)->Join(join);
  EXPECT_FALSE(joined.ok());
  // And a plain gRPC client, with the right method and no certificate, gets no answer at all.
  auto stub =
      v1::Store::NewStub(grpc::CreateChannel(PeerAddress(a), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  v1::NumKeysResponse response;
  EXPECT_EQ(stub->NumKeys(&context, {}, &response).error_code(), grpc::StatusCode::UNAVAILABLE);
  // Nothing of the refused daemon reached a's store.
  absl::StatusOr<v1::GroupView> view = Connect(a)->GetGroup("g", join.init_method);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->members_size(), 0);
}

TEST_F(PeerTlsTest, UnreadableCertificateStopsTheDaemonNamingTheField) {
  const std::string d = dir_.path();
  const std::string config = dir_.WriteFile(
      "bad.toml", absl::StrCat("[peer]\n", TokenConfig("127.0.0.1:0"), "tls_cert_file = \"", d,
                               "/missing.crt\"\ntls_key_file = \"", d, "/node.key\"\n",
                               "tls_ca_file = \"", d, "/ca.crt\"\n"));
  absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
      DaemonProcess::Start(absl::StrCat(d, "/bad.sock"), {"--config", config});
  ASSERT_FALSE(daemon.ok());
  EXPECT_THAT(daemon.status().message(), HasSubstr("peer.tls_cert_file"));
}

}  // namespace
}  // namespace tpd
