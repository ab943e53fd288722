// The daemon as users meet it: the real tpd binary on a temporary unix socket, driven by the
// client library, by tpctl, and by plain gRPC (reflection, health).

#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "proto/store.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using ::testing::IsSupersetOf;
using testing::RunfilePath;
using testing::RunProcess;
using testing::TempDir;
using testing::WaitUntil;

// Calls waiting in the daemon right now; -1 when Status fails.
int64_t Waiters(Client* client) {
  absl::StatusOr<v1::StatusResponse> status = client->Status();
  return status.ok() ? status->store().waiters() : -1;
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = absl::StrCat(dir_.path(), "/run/tpd.sock");
    // A grace period far longer than any test waits, so a shutdown that sat out the grace
    // instead of draining shows up as a test timeout, not a slow pass.
    config_ = dir_.WriteFile("tpd.toml", "[daemon]\nshutdown_grace_ms = 600000\n");
    StartDaemon();
  }

  void StartDaemon() {
    absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
        DaemonProcess::Start(socket_, {"--config", config_});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
  }

  std::unique_ptr<Client> Connect() {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket_);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  testing::ProcessResult Tpctl(std::vector<std::string> args) {
    args.insert(args.begin(), {RunfilePath("client/tpctl"), "--socket", socket_});
    return RunProcess(args);
  }

  TempDir dir_;
  std::string socket_;
  std::string config_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(DaemonTest, ReflectionListsEveryService) {
  auto channel =
      grpc::CreateChannel(absl::StrCat("unix:", socket_), grpc::InsecureChannelCredentials());
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("");
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> names;
  for (const auto& service : response.list_services_response().service()) {
    names.push_back(service.name());
  }
  EXPECT_THAT(names, IsSupersetOf({"tpd.v1.Store", "tpd.v1.Admin", "grpc.health.v1.Health",
                                   "grpc.reflection.v1alpha.ServerReflection"}));
}

TEST_F(DaemonTest, HealthIsServing) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<bool> serving = client->Serving();
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
}

TEST_F(DaemonTest, SocketHasTheDefaultMode0660) {
  struct stat st;
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660);
}

TEST_F(DaemonTest, ClientLibraryStoreCallsHaveC10dSemantics) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Store().Set("k", "v1").ok());
  EXPECT_EQ(*client->Store().Get("k", absl::Seconds(1)), "v1");
  EXPECT_EQ(*client->Store().Add("n", 5), 5);
  EXPECT_EQ(*client->Store().Add("n", -2), 3);
  EXPECT_EQ(*client->Store().CompareSet("k", "v1", "v2"), "v2");
  EXPECT_EQ(*client->Store().CompareSet("k", "nope", "v3"), "v2");
  EXPECT_EQ(*client->Store().CompareSet("fresh", "", "made"), "made");
  EXPECT_EQ(*client->Store().CompareSet("absent", "x", "y"), "x");
  EXPECT_FALSE(*client->Store().Check({"absent"}));
  ASSERT_TRUE(client->Store().MultiSet({"a", "b"}, {"1", "2"}).ok());
  EXPECT_THAT(*client->Store().MultiGet({"b", "a"}, absl::Seconds(1)),
              ::testing::ElementsAre("2", "1"));
  ASSERT_TRUE(client->Store().Append("b", "+").ok());
  EXPECT_EQ(*client->Store().Get("b"), "2+");
  EXPECT_TRUE(*client->Store().Check({"a", "b", "k"}));
  EXPECT_EQ(*client->Store().NumKeys(), 5);  // k, n, fresh, a, b
  EXPECT_TRUE(*client->Store().DeleteKey("a"));
  EXPECT_FALSE(*client->Store().DeleteKey("a"));
  EXPECT_EQ(*client->Store().NumKeys(), 4);
}

TEST_F(DaemonTest, NamespacesKeepKeysApart) {
  ClientOptions group_a;
  group_a.name_space = "group-a";
  ClientOptions group_b;
  group_b.name_space = "group-b";
  auto a = Client::Connect(socket_, group_a);
  auto b = Client::Connect(socket_, group_b);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Store().Set("rank0", "A").ok());
  ASSERT_TRUE((*b)->Store().Set("rank0", "B").ok());
  EXPECT_EQ(*(*a)->Store().Get("rank0"), "A");
  EXPECT_EQ(*(*b)->Store().Get("rank0"), "B");
  EXPECT_EQ(*(*a)->Store().NumKeys(), 1);
}

TEST_F(DaemonTest, GetWaitsForAKeySetByAnotherClient) {
  auto waiter = Connect();
  auto setter = Connect();
  ASSERT_TRUE(waiter && setter);
  std::thread set_later([&] {
    // Set only once the daemon reports the Get parked as a waiter.
    EXPECT_TRUE(WaitUntil([&] { return Waiters(setter.get()) == 1; }))
        << "the Get never parked as a waiter";
    EXPECT_TRUE(setter->Store().Set("late", "here").ok());
  });
  absl::StatusOr<std::string> value = waiter->Store().Get("late", absl::Seconds(20));
  set_later.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "here");
}

TEST_F(DaemonTest, WaitTimeoutIsDeadlineExceededNamingTheKeyAndClientKeepsWorking) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  absl::Status status = client->Store().Wait({"never"}, absl::Milliseconds(100));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("\"never\""));
  ASSERT_TRUE(client->Store().Set("after", "ok").ok());
  EXPECT_EQ(*client->Store().Get("after"), "ok");
  EXPECT_EQ(client->Status()->store().waiters(), 0);
}

TEST_F(DaemonTest, BadRequestsAnswerSpecificCodesAndTheDaemonKeepsServing) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);

  absl::Status empty_key = client->Store().Set("", "v");
  EXPECT_EQ(empty_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty_key.message(), HasSubstr("key must not be empty"));

  absl::Status long_key = client->Store().Set(std::string(5000, 'k'), "v");
  EXPECT_EQ(long_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_key.message(), HasSubstr("store.max_key_bytes"));

  absl::Status big_value = client->Store().Set("big", std::string((16 << 20) + 1, 'x'));
  EXPECT_EQ(big_value.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big_value.message(), HasSubstr("store.max_value_bytes"));

  absl::StatusOr<std::string> negative = client->Store().Get("k", absl::Milliseconds(-5));
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(), HasSubstr("timeout_ms"));

  std::vector<std::string> many(1025, "k");
  absl::Status too_many = client->Store().Wait(many, absl::Milliseconds(10));
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_many.message(), HasSubstr("store.max_keys_per_request"));

  absl::Status mismatched = client->Store().MultiSet({"a", "b"}, {"1"});
  EXPECT_EQ(mismatched.code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(client->Store().Set("text", "abc").ok());
  EXPECT_EQ(client->Store().Add("text", 1).status().code(), absl::StatusCode::kFailedPrecondition);

  // Still serving, and nothing partial was stored.
  EXPECT_TRUE(*client->Serving());
  EXPECT_FALSE(*client->Store().Check({"big"}));
  EXPECT_FALSE(*client->Store().Check({"a"}));
  EXPECT_EQ(*client->Store().Get("text"), "abc");
}

TEST_F(DaemonTest, SixtyFourConcurrentClientsLoseNoUpdate) {
  constexpr int kClients = 64;
  constexpr int kAddsPerClient = 50;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(Connect());
    ASSERT_NE(clients.back(), nullptr);
  }
  std::atomic<int64_t> acknowledged{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < kAddsPerClient; ++j) {
        const int64_t delta = i + j + 1;
        if (clients[i]->Store().Add("counter", delta).ok()) {
          acknowledged += delta;
        } else {
          ++errors;
        }
        const std::string key = absl::StrCat("client", i);
        if (!clients[i]->Store().Set(key, absl::StrCat(j)).ok()) ++errors;
        absl::StatusOr<std::string> got = clients[i]->Store().Get(key, absl::Seconds(10));
        if (!got.ok() || *got != absl::StrCat(j)) ++errors;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(*clients[0]->Store().Add("counter", 0), acknowledged.load());
}

TEST_F(DaemonTest, TpctlDrivesTheStoreAndPrintsStatus) {
  EXPECT_EQ(Tpctl({"store", "set", "greeting", "hello"}).exit_code, 0);
  testing::ProcessResult get = Tpctl({"store", "get", "greeting"});
  EXPECT_EQ(get.exit_code, 0);
  EXPECT_EQ(get.output, "hello\n");
  EXPECT_EQ(Tpctl({"store", "add", "n", "41"}).output, "41\n");
  EXPECT_EQ(Tpctl({"store", "add", "n", "1"}).output, "42\n");
  EXPECT_EQ(Tpctl({"--json", "store", "get", "greeting"}).output,
            "{\"key\": \"greeting\", \"value\": \"hello\"}\n");
  EXPECT_EQ(Tpctl({"store", "check", "greeting", "nope"}).output, "false\n");
  EXPECT_EQ(Tpctl({"store", "keys"}).output, "2\n");
  EXPECT_EQ(Tpctl({"store", "delete", "greeting"}).output, "deleted\n");
  EXPECT_EQ(Tpctl({"health"}).output, "SERVING\n");

  testing::ProcessResult timeout = Tpctl({"--timeout_ms", "50", "store", "wait", "missing"});
  EXPECT_EQ(timeout.exit_code, 1);
  EXPECT_THAT(timeout.output, HasSubstr("DEADLINE_EXCEEDED"));
  EXPECT_THAT(timeout.output, HasSubstr("\"missing\""));

  testing::ProcessResult status = Tpctl({"status"});
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_THAT(status.output, HasSubstr("SERVING"));
  EXPECT_THAT(status.output, HasSubstr(socket_));
  testing::ProcessResult json = Tpctl({"--json", "status"});
  EXPECT_THAT(json.output, HasSubstr("\"serving_status\": \"SERVING\""));
  EXPECT_THAT(json.output, HasSubstr("\"num_keys\": \"1\""));

  EXPECT_EQ(Tpctl({"bogus"}).exit_code, 2);
}

TEST_F(DaemonTest, TpctlReportsAMissingDaemonClearly) {
  testing::ProcessResult result = RunProcess(
      {RunfilePath("client/tpctl"), "--socket", absl::StrCat(dir_.path(), "/none.sock"), "health"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.output, HasSubstr("UNAVAILABLE"));
  EXPECT_THAT(result.output, HasSubstr("none.sock"));
}

TEST_F(DaemonTest, SecondDaemonOnTheSameSocketIsRefusedAndTheFirstKeepsServing) {
  testing::ProcessResult second =
      RunProcess({RunfilePath("daemon/tpd"), "--socket", socket_}, absl::Seconds(20));
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_THAT(second.output, HasSubstr(absl::StrCat("another tpd (pid ", daemon_->pid(), ")")));
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Store().Set("still", "here").ok());
  EXPECT_EQ(*client->Store().Get("still"), "here");
}

TEST_F(DaemonTest, SigtermExitsZeroAndRemovesTheSocket) {
  auto client = Connect();  // an idle connection must not hold shutdown back
  ASSERT_NE(client, nullptr);
  daemon_->Signal(SIGTERM);
  EXPECT_EQ(daemon_->WaitExit(absl::Seconds(60)), 0);
  struct stat st;
  EXPECT_NE(stat(socket_.c_str(), &st), 0);
  EXPECT_THAT(daemon_->Output(), HasSubstr("shutting down"));
}

TEST_F(DaemonTest, SigtermEndsPendingWaitsWithUnavailable) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  absl::Status status;
  std::thread waiter([&] { status = client->Store().Wait({"never"}, absl::Seconds(60)); });
  EXPECT_TRUE(WaitUntil([&] { return Waiters(client.get()) == 1; }))
      << "the Wait never parked as a waiter";
  daemon_->Signal(SIGTERM);
  waiter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("shutting down"));
  // The client's connection stays open: shutdown must not wait for it to go away.
  EXPECT_EQ(daemon_->WaitExit(absl::Seconds(60)), 0);
}

TEST_F(DaemonTest, StaleSocketFileIsReclaimed) {
  daemon_->Signal(SIGKILL);
  daemon_->WaitExit(absl::Seconds(10));
  struct stat st;
  ASSERT_EQ(stat(socket_.c_str(), &st), 0) << "SIGKILL leaves the socket file behind";
  StartDaemon();
  EXPECT_THAT(daemon_->Output(), HasSubstr("removed a stale socket file"));
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->Store().Set("k", "v").ok());
}

TEST_F(DaemonTest, KilledWaitingClientIsReclaimed) {
  // A tpctl blocked in Wait is SIGKILLed; its waiter must not linger in the daemon.
  const pid_t child = fork();
  if (child == 0) {
    const std::string tpctl = RunfilePath("client/tpctl");
    execl(tpctl.c_str(), tpctl.c_str(), "--socket", socket_.c_str(), "store", "wait", "never",
          nullptr);
    _exit(127);
  }
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const bool parked = WaitUntil([&] { return Waiters(client.get()) == 1; });
  if (!parked) kill(child, SIGKILL);
  ASSERT_TRUE(parked) << "tpctl's Wait never parked as a waiter";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(WaitUntil([&] { return Waiters(client.get()) == 0; }))
      << "the killed client's waiter was not reclaimed";
}

// systemd's notify protocol, with this test standing in for systemd: a datagram socket
// named by NOTIFY_SOCKET receives READY=1 once the daemon serves, STOPPING=1 on SIGTERM, and
// WATCHDOG=1 pings when WATCHDOG_USEC asks for them.
TEST(DaemonSystemdTest, NotifiesReadyWatchdogAndStopping) {
  TempDir dir;
  const std::string notify_path = absl::StrCat(dir.path(), "/notify");
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, notify_path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval timeout{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setenv("NOTIFY_SOCKET", notify_path.c_str(), 1);
  setenv("WATCHDOG_USEC", "200000", 1);  // ping every 100 ms
  auto daemon = DaemonProcess::Start(absl::StrCat(dir.path(), "/tpd.sock"));
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  ASSERT_TRUE(daemon.ok()) << daemon.status();

  auto receive = [fd]() {
    char buf[512] = {};
    const ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
    return n > 0 ? std::string(buf, n) : std::string();
  };
  EXPECT_THAT(receive(), HasSubstr("READY=1"));
  EXPECT_EQ(receive(), "WATCHDOG=1");
  (*daemon)->Signal(SIGTERM);
  // Watchdog pings may still come first; STOPPING=1 must follow within the bound.
  std::string message;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  do {
    message = receive();
  } while (message == "WATCHDOG=1" && absl::Now() < deadline);
  EXPECT_THAT(message, HasSubstr("STOPPING=1")) << "awaited STOPPING=1 after SIGTERM";
  EXPECT_EQ((*daemon)->WaitExit(absl::Seconds(60)), 0);
  close(fd);
}

TEST(DaemonConfigTest, SocketModeAndLimitsComeFromTheConfigFile) {
  TempDir dir;
  const std::string socket = absl::StrCat(dir.path(), "/tpd.sock");
  const std::string config = dir.WriteFile("tpd.toml", R"(
[daemon]
socket_mode = "0600"
[store]
max_value_bytes = 1024
)");
  auto daemon = DaemonProcess::Start(socket, {"--config", config});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  struct stat st;
  ASSERT_EQ(stat(socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  auto client = Client::Connect(socket);
  ASSERT_TRUE(client.ok());
  absl::Status status = (*client)->Store().Set("k", std::string(1025, 'x'));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("the limit store.max_value_bytes is 1024"));
  EXPECT_EQ((*client)->Status()->config().config_path(), config);
}

TEST(DaemonConfigTest, InvalidConfigRefusesToStartNamingTheField) {
  TempDir dir;
  const std::string config = dir.WriteFile("tpd.toml", "[store]\nmax_waiters = 0\n");
  testing::ProcessResult result =
      RunProcess({RunfilePath("daemon/tpd"), "--socket", absl::StrCat(dir.path(), "/s.sock"),
                  "--config", config});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.output, HasSubstr("store.max_waiters must be > 0"));
}

// A daemon on a config of its own, for the promises of one option.
class DaemonOptionTest : public ::testing::Test {
 protected:
  void Start(const std::string& toml) {
    socket_ = absl::StrCat(dir_.path(), "/tpd.sock");
    const std::string config = dir_.WriteFile("tpd.toml", toml);
    auto daemon = DaemonProcess::Start(socket_, {"--config", config});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    auto client = Client::Connect(socket_);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  TempDir dir_;
  std::string socket_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(DaemonOptionTest, MaxKeysPerRequestBoundsEveryMultiKeyCall) {
  ASSERT_NO_FATAL_FAILURE(Start("[store]\nmax_keys_per_request = 3\n"));
  const std::vector<std::string> four = {"a", "b", "c", "d"};
  const std::vector<std::string> three = {"a", "b", "c"};
  auto expect_refused = [](const absl::Status& status, const char* call) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << call << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("the limit store.max_keys_per_request is 3")) << call;
  };
  expect_refused(client_->Store().MultiSet(four, {"1", "2", "3", "4"}), "MultiSet");
  expect_refused(client_->Store().Wait(four, absl::Seconds(5)), "Wait");
  expect_refused(client_->Store().MultiGet(four, absl::Seconds(5)).status(), "MultiGet");
  expect_refused(client_->Store().Check(four).status(), "Check");
  // Nothing of the refused MultiSet was stored; at the limit every call works.
  EXPECT_EQ(*client_->Store().NumKeys(), 0);
  ASSERT_TRUE(client_->Store().MultiSet(three, {"1", "2", "3"}).ok());
  EXPECT_TRUE(client_->Store().Wait(three, absl::Seconds(5)).ok());
  EXPECT_THAT(*client_->Store().MultiGet(three, absl::Seconds(5)),
              ::testing::ElementsAre("1", "2", "3"));
  EXPECT_TRUE(*client_->Store().Check(three));
}

TEST_F(DaemonOptionTest, MaxWaitersRefusesTheWaitPastTheLimitNamingIt) {
  ASSERT_NO_FATAL_FAILURE(Start("[store]\nmax_waiters = 2\n"));
  absl::StatusOr<std::string> got;
  absl::Status waited;
  std::thread get([&] { got = client_->Store().Get("x", absl::Seconds(30)); });
  std::thread wait([&] { waited = client_->Store().Wait({"y"}, absl::Seconds(30)); });
  ASSERT_TRUE(WaitUntil([&] { return Waiters(client_.get()) == 2; }))
      << "the Get and the Wait never both parked";
  // The limit is reached: every further waiting call is refused at once, naming it...
  for (const absl::Status& refused :
       {client_->Store().Wait({"z"}, absl::Seconds(30)),
        client_->Store().Get("z", absl::Seconds(30)).status(),
        client_->Store().MultiGet({"z"}, absl::Seconds(30)).status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("store.max_waiters = 2"));
  }
  // ...while calls that need not wait go on, and release the two waiters.
  EXPECT_TRUE(*client_->Serving());
  ASSERT_TRUE(client_->Store().MultiSet({"x", "y"}, {"1", "2"}).ok());
  get.join();
  wait.join();
  EXPECT_EQ(got.value_or("failed"), "1") << got.status();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_EQ(Waiters(client_.get()), 0);
  // Below the limit again, a call may wait.
  std::thread again([&] { got = client_->Store().Get("later", absl::Seconds(30)); });
  ASSERT_TRUE(WaitUntil([&] { return Waiters(client_.get()) == 1; }))
      << "a Get after the waiters left never parked";
  ASSERT_TRUE(client_->Store().Set("later", "3").ok());
  again.join();
  EXPECT_EQ(got.value_or("failed"), "3") << got.status();
}

TEST_F(DaemonOptionTest, DefaultTimeoutAppliesToWaitsThatPassZero) {
  ASSERT_NO_FATAL_FAILURE(Start("[store]\ndefault_timeout_ms = 300\n"));
  // Raw calls with timeout_ms = 0 and an RPC deadline of 20 s: only the daemon's default,
  // 300 ms, can end them early, with its own message naming the key.
  auto stub = v1::Store::NewStub(
      grpc::CreateChannel(absl::StrCat("unix:", socket_), grpc::InsecureChannelCredentials()));
  auto call = [&](auto method, auto request, auto response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    const absl::Time start = absl::Now();
    grpc::Status status = ((*stub).*method)(&context, request, &response);
    return std::make_pair(status, absl::Now() - start);
  };
  v1::GetRequest get;
  get.set_key("never-get");
  v1::WaitRequest wait;
  wait.add_keys("never-wait");
  v1::MultiGetRequest multi_get;
  multi_get.add_keys("never-multi");
  for (const auto& [result, key] :
       {std::make_pair(call(&v1::Store::Stub::Get, get, v1::GetResponse()), "never-get"),
        std::make_pair(call(&v1::Store::Stub::Wait, wait, v1::WaitResponse()), "never-wait"),
        std::make_pair(call(&v1::Store::Stub::MultiGet, multi_get, v1::MultiGetResponse()),
                       "never-multi")}) {
    const auto& [status, took] = result;
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << key;
    EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat("\"", key, "\""))) << key;
    EXPECT_GE(took, absl::Milliseconds(290)) << key;
    EXPECT_LT(took, absl::Seconds(10)) << key;
  }
  EXPECT_EQ(client_->Status()->config().store_default_timeout_ms(), 300);
}

TEST_F(DaemonOptionTest, AppendPastMaxValueBytesIsRefusedAndKeepsTheValue) {
  ASSERT_NO_FATAL_FAILURE(Start("[store]\nmax_value_bytes = 1024\n"));
  ASSERT_TRUE(client_->Store().Set("k", std::string(1000, 'a')).ok());
  ASSERT_TRUE(client_->Store().Append("k", std::string(24, 'b')).ok())
      << "exactly the limit is allowed";
  absl::Status grown = client_->Store().Append("k", "c");
  EXPECT_EQ(grown.code(), absl::StatusCode::kResourceExhausted) << grown;
  EXPECT_THAT(grown.message(), HasSubstr("the limit store.max_value_bytes is 1024"));
  EXPECT_EQ(*client_->Store().Get("k"), std::string(1000, 'a') + std::string(24, 'b'));
  // A fresh key appended past the limit is not created.
  absl::Status fresh = client_->Store().Append("fresh", std::string(1025, 'x'));
  EXPECT_EQ(fresh.code(), absl::StatusCode::kResourceExhausted) << fresh;
  EXPECT_FALSE(*client_->Store().Check({"fresh"}));
}

// A group the test may give the socket to: one of this process's supplementary groups other
// than its own, else "daemon" (Debian's); root may give a file to any group.
std::optional<std::pair<std::string, gid_t>> SomeOtherGroup() {
  gid_t groups[64];
  const int count = getgroups(64, groups);
  for (int i = 0; i < count; ++i) {
    if (groups[i] == getegid()) continue;
    if (struct group* entry = getgrgid(groups[i])) return std::make_pair(entry->gr_name, groups[i]);
  }
  if (geteuid() == 0) {
    if (struct group* entry = getgrnam("daemon")) {
      return std::make_pair(std::string(entry->gr_name), entry->gr_gid);
    }
  }
  return std::nullopt;
}

TEST_F(DaemonOptionTest, SocketGroupOwnsTheSocket) {
  std::optional<std::pair<std::string, gid_t>> group = SomeOtherGroup();
  if (!group) GTEST_SKIP() << "no group other than the test's own to give the socket to";
  ASSERT_NO_FATAL_FAILURE(Start(absl::StrCat("[daemon]\nsocket_group = \"", group->first, "\"\n")));
  struct stat st;
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, group->second) << "socket_group " << group->first;
  EXPECT_EQ(st.st_mode & 0777, 0660);
}

TEST(DaemonConfigTest, UnknownSocketGroupRefusesToStartNamingIt) {
  TempDir dir;
  const std::string config =
      dir.WriteFile("tpd.toml", "[daemon]\nsocket_group = \"no-such-group-tpd\"\n");
  testing::ProcessResult result =
      RunProcess({RunfilePath("daemon/tpd"), "--socket", absl::StrCat(dir.path(), "/s.sock"),
                  "--config", config});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.output, HasSubstr("daemon.socket_group \"no-such-group-tpd\""));
}

// Sets (or, with nullptr, unsets) an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// tpctl (through the client library) finds its daemon by --socket, then $TPD_SOCKET, then
// the system socket /run/tpd/tpd.sock, then the per-user path ($XDG_RUNTIME_DIR/tpd/tpd.sock).
TEST(ClientSocketLookupTest, FlagThenEnvironmentThenSystemThenPerUser) {
  TempDir dir;
  const std::string flag_socket = absl::StrCat(dir.path(), "/flag.sock");
  const std::string env_socket = absl::StrCat(dir.path(), "/env.sock");
  const std::string xdg = absl::StrCat(dir.path(), "/xdg");
  ASSERT_EQ(mkdir(xdg.c_str(), 0700), 0);
  const std::string user_socket = absl::StrCat(xdg, "/tpd/tpd.sock");
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  for (const std::string& socket : {flag_socket, env_socket, user_socket}) {
    auto daemon = DaemonProcess::Start(socket);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemons.push_back(*std::move(daemon));
  }
  // Which daemon a tpctl with `args` reaches: `tpctl status` prints the socket it serves.
  auto reached = [](std::vector<std::string> args) {
    args.insert(args.begin(), RunfilePath("client/tpctl"));
    args.push_back("status");
    return RunProcess(args).output;
  };
  ScopedEnv runtime_dir("XDG_RUNTIME_DIR", xdg.c_str());
  {
    ScopedEnv env("TPD_SOCKET", env_socket.c_str());
    EXPECT_THAT(reached({"--socket", flag_socket}), HasSubstr(flag_socket)) << "--socket first";
    EXPECT_THAT(reached({}), HasSubstr(env_socket)) << "then $TPD_SOCKET";
  }
  ScopedEnv no_env("TPD_SOCKET", nullptr);
  struct stat st;
  const bool system_socket_exists = stat("/run/tpd/tpd.sock", &st) == 0;
  if (!system_socket_exists) {
    EXPECT_THAT(reached({}), HasSubstr(user_socket)) << "the per-user path last";
  }
  // The system socket wins over the per-user path. Made here only where this test may and
  // nobody else serves it; a daemon already there (a real one) is enough to check the order.
  std::unique_ptr<DaemonProcess> system_daemon;
  bool made_run_tpd = false;
  if (!system_socket_exists) {
    if (geteuid() != 0) {
      GTEST_SKIP() << "the system socket /run/tpd/tpd.sock needs root to create";
    }
    made_run_tpd = mkdir("/run/tpd", 0755) == 0;
    auto daemon = DaemonProcess::Start("/run/tpd/tpd.sock");
    // Refused only if another tpd took the system socket meanwhile, which serves as well.
    ASSERT_TRUE(daemon.ok() || stat("/run/tpd/tpd.sock", &st) == 0) << daemon.status();
    if (daemon.ok()) system_daemon = *std::move(daemon);
  }
  EXPECT_THAT(reached({}), HasSubstr("/run/tpd/tpd.sock"))
      << "the system socket before the per-user path";
  if (system_daemon != nullptr) {
    system_daemon->Signal(SIGTERM);  // removes its socket
    EXPECT_EQ(system_daemon->WaitExit(absl::Seconds(60)), 0);
    if (made_run_tpd) {
      unlink("/run/tpd/tpd.sock.lock");  // the daemon's lock file stays behind by design
      rmdir("/run/tpd");
    }
  }
}

}  // namespace
}  // namespace tpd
