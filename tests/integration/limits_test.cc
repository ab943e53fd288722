// What a local socket user can send, through the real daemon: every input is bounded by a
// limit that names itself, every error message stays small, file:// rendezvous stays inside
// the allowed directories, and the daemon keeps serving afterwards (issue 6).

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/one_daemon.h"

namespace tpd {
namespace {

using ::testing::AllOf;
using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::TempDir;

// Far below gRPC's 8 KiB default metadata limit, which carries the status message.
constexpr size_t kSmallMessage = 2048;

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

std::string ReadAll(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

class LimitsTest : public testing::OneDaemonTest {
 protected:
  void SetUp() override {
    rendezvous_ = absl::StrCat(dir_.path(), "/rendezvous");
    outside_ = absl::StrCat(dir_.path(), "/outside");
    ASSERT_EQ(mkdir(rendezvous_.c_str(), 0700), 0);
    ASSERT_EQ(mkdir(outside_.c_str(), 0700), 0);
    secret_ = dir_.WriteFile("outside/secret", "root-only text\n");
    testing::OneDaemonConfig config;
    config.node_name = "limits";
    config.arena_bytes = 64 << 20;  // the daemon's default
    config.daemon_section = "shutdown_grace_ms = 600000\n";
    config.more_sections =
        absl::StrCat("[group]\nfile_rendezvous_dirs = [\"", rendezvous_, "\"]\n");
    StartDaemon(config);
    if (HasFatalFailure()) return;
    client_ = Connect();
    ASSERT_NE(client_, nullptr);
    absl::StatusOr<v1::StatusResponse> status = client_->Status();
    ASSERT_TRUE(status.ok()) << status.status();
    init_method_ = absl::StrCat("tcp://", status->peer_address());
  }

  JoinOptions Dynamic(const std::string& group, const std::string& name) {
    JoinOptions options;
    options.group = group;
    options.name = name;
    options.init_method = init_method_;
    options.timeout = absl::Seconds(30);
    return options;
  }

  // The daemon still answers health, store and group calls.
  void ExpectStillServing() {
    std::unique_ptr<Client> fresh = Connect();
    ASSERT_NE(fresh, nullptr);
    absl::StatusOr<bool> serving = fresh->Serving();
    ASSERT_TRUE(serving.ok()) << serving.status();
    EXPECT_TRUE(*serving);
    ASSERT_TRUE(fresh->Store().Set("after", "1").ok());
    EXPECT_EQ(*fresh->Store().Get("after", absl::Seconds(5)), "1");
    absl::StatusOr<v1::JoinResponse> joined = fresh->Join(Dynamic("still-serving", "probe"));
    EXPECT_TRUE(joined.ok()) << joined.status();
  }

  std::string rendezvous_;
  std::string outside_;
  std::string secret_;
  std::unique_ptr<Client> client_;
};

TEST_F(LimitsTest, WorldSizeTwoToTheFortyIsRefusedNamingTheLimitAndTheDaemonKeepsServing) {
  JoinOptions options = Dynamic("huge", "w0");
  options.rank = 0;
  options.world_size = int64_t{1} << 40;
  options.timeout = absl::Seconds(1);
  absl::StatusOr<v1::JoinResponse> joined = client_->Join(options);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(joined.status().message(),
              AllOf(HasSubstr("1099511627776"), HasSubstr("group.max_world_size 65536")));
  // The same through the URL's query.
  options.rank.reset();
  options.world_size.reset();
  options.init_method = absl::StrCat(init_method_, "?rank=0&world_size=1099511627776");
  EXPECT_EQ(client_->Join(options).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectStillServing();
}

TEST_F(LimitsTest, SessionSurvivesAJoinWithTwoThousandTransports) {
  absl::StatusOr<v1::JoinResponse> first = client_->Join(Dynamic("g", "w0"));
  ASSERT_TRUE(first.ok()) << first.status();
  const int64_t version = first->group().version();

  JoinOptions bad = Dynamic("g", "w1");
  for (int i = 0; i < 2000; ++i) {
    bad.options.add_transports(absl::StrCat("transport-with-a-long-name-", i));
  }
  absl::StatusOr<v1::JoinResponse> refused = client_->Join(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("JoinRequest.options.transports"), HasSubstr("2000"),
                    HasSubstr("group.max_transports is 64")));
  EXPECT_LT(refused.status().message().size(), kSmallMessage);

  // The session stream on the same channel is alive: w0 is still a member, and the same
  // client joins again without opening a new session.
  absl::StatusOr<v1::JoinResponse> second = client_->Join(Dynamic("g", "w2"));
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<v1::GroupView> view = client_->GetGroup("g");
  ASSERT_TRUE(view.ok()) << view.status();
  std::vector<std::string> names;
  for (const v1::Member& member : view->members()) names.push_back(member.name());
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("w0", "w2"));
  EXPECT_EQ(view->version(), version + 1) << "nothing but w2's join happened";
}

TEST_F(LimitsTest, UnknownTransportsAreEchoedAtMostTenAtATime) {
  // Within the count limit, every name unknown: the negotiation error lists a few.
  JoinOptions options = Dynamic("g", "w0");
  for (int i = 0; i < 64; ++i) options.options.add_transports(absl::StrCat("nope", i));
  absl::StatusOr<v1::JoinResponse> refused = client_->Join(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("more"));
  EXPECT_LT(refused.status().message().size(), kSmallMessage);
}

TEST_F(LimitsTest, EnvAndOptionStringsAreBounded) {
  JoinOptions env = Dynamic("g", "w0");
  for (int i = 0; i < 1000; ++i) env.env[absl::StrCat("VAR", i)] = "x";
  absl::StatusOr<v1::JoinResponse> refused = client_->Join(env);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("group.max_env_entries is 64"));

  JoinOptions device = Dynamic("g", "w0");
  device.options.add_devices(std::string(1 << 20, 'd'));
  refused = client_->Join(device);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("group.max_option_bytes is 256"));
  EXPECT_LT(refused.status().message().size(), kSmallMessage);
  ExpectStillServing();
}

TEST_F(LimitsTest, LongNamespaceOnAThousandKeyMultiSetIsRefusedAndStoresNothing) {
  absl::StatusOr<int64_t> before = client_->Store().NumKeys();
  ASSERT_TRUE(before.ok()) << before.status();
  ClientOptions options;
  options.name_space = std::string(512 << 10, 'n');
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::vector<std::string> keys;
  std::vector<std::string> values;
  for (int i = 0; i < 1024; ++i) {
    keys.push_back(absl::StrCat("k", i));
    values.push_back("v");
  }
  absl::Status status = client->Store().MultiSet(keys, values);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("524288 bytes"), HasSubstr("store.max_namespace_bytes is 1024")));
  EXPECT_LT(status.message().size(), kSmallMessage);
  // None of the 1024 keys was stored (the daemon may add a heartbeat key meanwhile).
  EXPECT_LT(*client_->Store().NumKeys() - *before, 10);
}

TEST_F(LimitsTest, TwentyMiBNamespaceOnCheckIsRefusedAndTheDaemonKeepsServing) {
  ClientOptions options;
  options.name_space = std::string(20 << 20, 'n');
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<bool> ready = client->Store().Check({"k"});
  EXPECT_EQ(ready.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ready.status().message(), HasSubstr("store.max_namespace_bytes"));
  ExpectStillServing();
}

TEST_F(LimitsTest, NamespaceWithANewlineIsRefusedOnEveryCall) {
  ClientOptions options;
  options.name_space = "job\nforged";
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_NE(client, nullptr);
  for (absl::Status status :
       {client->Store().Set("k", "v"), client->Store().Get("k", absl::Milliseconds(10)).status(),
        client->Store().Add("k", 1).status(), client->Store().CompareSet("k", "", "v").status(),
        client->Store().Wait({"k"}, absl::Milliseconds(10)), client->Store().Check({"k"}).status(),
        client->Store().DeleteKey("k").status(), client->Store().NumKeys().status(),
        client->Store().MultiGet({"k"}, absl::Milliseconds(10)).status(),
        client->Store().MultiSet({"k"}, {"v"}), client->Store().Append("k", "v")}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("control characters")) << status;
  }
}

TEST_F(LimitsTest, GroupAndWorkerNamesAreValidatedNamingTheField) {
  JoinOptions group = Dynamic("evil\ngroup", "w0");
  absl::StatusOr<v1::JoinResponse> refused = client_->Join(group);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("JoinRequest.group"), HasSubstr("'\\n' at byte 4")));

  refused = client_->Join(Dynamic("g", "w 0"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("JoinRequest.name"), HasSubstr("Worker name must match")));

  absl::StatusOr<v1::GroupView> view = client_->GetGroup(std::string(1000, 'g'), init_method_);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(view.status().message(), HasSubstr("GetGroupRequest.group"));

  std::unique_ptr<GroupWatch> watch = client_->Watch("a/b", init_method_);
  v1::GroupEvent event;
  EXPECT_FALSE(watch->Next(&event));
  absl::Status finished = watch->Finish();
  EXPECT_EQ(finished.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(finished.message(), HasSubstr("WatchGroupRequest.group"));
}

TEST_F(LimitsTest, FileRendezvousUnderTheAllowedDirectoryWorks) {
  const std::string path = absl::StrCat(rendezvous_, "/job1");
  JoinOptions options = Dynamic("filegroup", "w0");
  options.init_method = absl::StrCat("file://", path);
  absl::StatusOr<v1::JoinResponse> joined = client_->Join(options);
  ASSERT_TRUE(joined.ok()) << joined.status();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600);
}

TEST_F(LimitsTest, FileRendezvousOutsideTheAllowedDirectoriesIsRefusedAndCreatesNothing) {
  for (const std::string& path :
       {absl::StrCat(outside_, "/planted"), std::string("/etc/tpd-issue6-probe"),
        absl::StrCat(rendezvous_, "x/f")}) {
    JoinOptions options = Dynamic("g", "w0");
    options.init_method = absl::StrCat("file://", path);
    absl::StatusOr<v1::JoinResponse> refused = client_->Join(options);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(refused.status().message(),
                AllOf(HasSubstr(path), HasSubstr("group.file_rendezvous_dirs")))
        << path;
    EXPECT_FALSE(Exists(path)) << path;
  }
  JoinOptions dotdot = Dynamic("g", "w0");
  dotdot.init_method = absl::StrCat("file://", rendezvous_, "/../outside/secret");
  EXPECT_EQ(client_->Join(dotdot).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadAll(secret_), "root-only text\n");
}

TEST_F(LimitsTest, FileRendezvousThroughASymlinkIsRefusedAndTheTargetUntouched) {
  const std::string link = absl::StrCat(rendezvous_, "/link");
  ASSERT_EQ(symlink(secret_.c_str(), link.c_str()), 0);
  JoinOptions options = Dynamic("g", "w0");
  options.init_method = absl::StrCat("file://", link);
  absl::StatusOr<v1::JoinResponse> refused = client_->Join(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("symbolic link"));
  absl::StatusOr<v1::GroupView> view = client_->GetGroup("g2", absl::StrCat("file://", link));
  EXPECT_EQ(view.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ReadAll(secret_), "root-only text\n");
}

TEST_F(LimitsTest, GetGroupOnAMissingRendezvousFileIsNotFoundAndCreatesNothing) {
  const std::string path = absl::StrCat(rendezvous_, "/typo");
  absl::StatusOr<v1::GroupView> view = client_->GetGroup("train", absl::StrCat("file://", path));
  EXPECT_EQ(view.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(view.status().message(), AllOf(HasSubstr(path), HasSubstr("only Join creates")));
  EXPECT_FALSE(Exists(path));
  // A watch neither.
  std::unique_ptr<GroupWatch> watch = client_->Watch("train", absl::StrCat("file://", path));
  v1::GroupEvent event;
  EXPECT_FALSE(watch->Next(&event));
  EXPECT_EQ(watch->Finish().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Exists(path));
}

// Past a raised list limit, the negotiation's own error (unknown transports) is what must
// stay small: it lists ten names, then "... and N more".
TEST(LimitsConfigTest, SessionSurvivesTwoThousandUnknownTransportsUnderAHighLimit) {
  TempDir dir;
  const std::string socket = absl::StrCat(dir.path(), "/tpd.sock");
  const std::string config = dir.WriteFile(
      "tpd.toml",
      "[daemon]\nshutdown_grace_ms = 600000\n[peer]\nlisten_address = \"127.0.0.1:0\"\n"
      "token = \"t\"\n[group]\nmax_transports = 1024\n");
  auto daemon = DaemonProcess::Start(socket, {"--config", config});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect(socket);
  ASSERT_TRUE(client.ok()) << client.status();
  JoinOptions options;
  options.group = "g";
  options.name = "w0";
  options.init_method = absl::StrCat("tcp://", (*client)->Status()->peer_address());
  ASSERT_TRUE((*client)->Join(options).ok());

  options.name = "w1";
  for (int i = 0; i < 1000; ++i) {
    options.options.add_transports(absl::StrCat("unknown-transport-", std::string(200, 'x'), i));
  }
  absl::StatusOr<v1::JoinResponse> refused = (*client)->Join(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("... and 990 more"));
  EXPECT_LT(refused.status().message().size(), 8192u);

  options.name = "w2";
  options.options.clear_transports();
  ASSERT_TRUE((*client)->Join(options).ok());
  absl::StatusOr<v1::GroupView> view = (*client)->GetGroup("g");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->members_size(), 2) << "w0 stayed: its session stream survived";
}

// docs/security.md, "Per-user bounds": the daemon's store holds at most store.max_total_bytes
// whoever writes, and what deleted keys held goes back to the system (a socket user's 80
// values of 16 MiB kept 833 MB of the daemon's memory after the deletes).
TEST(LimitsConfigTest, TheStoreHoldsAtMostMaxTotalBytesAndGivesDeletedValuesBack) {
  TempDir dir;
  const std::string socket = absl::StrCat(dir.path(), "/tpd.sock");
  const std::string config =
      dir.WriteFile("tpd.toml", absl::StrCat("[store]\nmax_total_bytes = ", 256 << 20, "\n"));
  auto daemon = DaemonProcess::Start(socket, {"--config", config});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect(socket);
  ASSERT_TRUE(client.ok()) << client.status();
  auto rss_kib = [&] {
    std::ifstream status(absl::StrCat("/proc/", (*daemon)->pid(), "/status"));
    std::string line;
    while (std::getline(status, line)) {
      if (absl::StartsWith(line, "VmRSS:")) return int64_t{std::stoll(line.substr(6))};
    }
    return int64_t{-1};
  };
  ASSERT_TRUE((*client)->Store().Set("warm", "x").ok());
  const int64_t before = rss_kib();
  const std::string value(16 << 20, 'v');
  int stored = 0;
  absl::Status refused;
  for (int i = 0; i < 40 && refused.ok(); ++i) {
    refused = (*client)->Store().Set(absl::StrCat("big", i), value);
    if (refused.ok()) ++stored;
  }
  EXPECT_EQ(stored, 15) << "16 MiB values and their keys within 256 MiB";
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("store.max_total_bytes is 268435456"));
  for (int i = 0; i < stored; ++i)
    ASSERT_TRUE(*(*client)->Store().DeleteKey(absl::StrCat("big", i)));
  const int64_t after = rss_kib();
  EXPECT_LT(after - before, 64 << 10) << "KiB kept after the deletes: " << after - before;
  EXPECT_TRUE((*client)->Store().Set("after", "1").ok());
}

TEST(LimitsConfigTest, LimitsComeFromTheConfigFile) {
  TempDir dir;
  const std::string socket = absl::StrCat(dir.path(), "/tpd.sock");
  const std::string config = dir.WriteFile(
      "tpd.toml",
      "[daemon]\nshutdown_grace_ms = 600000\n[peer]\nlisten_address = \"127.0.0.1:0\"\n"
      "token = \"t\"\n[store]\nmax_namespace_bytes = 4\n[group]\nmax_world_size = 4\n"
      "max_transports = 1\nfile_rendezvous_dirs = []\n");
  auto daemon = DaemonProcess::Start(socket, {"--config", config});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect(socket);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string init_method = absl::StrCat("tcp://", (*client)->Status()->peer_address());

  JoinOptions options;
  options.group = "g";
  options.name = "w0";
  options.rank = 0;
  options.world_size = 5;
  options.init_method = init_method;
  EXPECT_THAT((*client)->Join(options).status().message(), HasSubstr("group.max_world_size 4"));
  options.world_size.reset();
  options.rank.reset();
  options.options.add_transports("uv");
  options.options.add_transports("shm");
  EXPECT_THAT((*client)->Join(options).status().message(), HasSubstr("group.max_transports is 1"));
  options.options.clear_transports();
  options.init_method = absl::StrCat("file://", dir.path(), "/f");
  absl::StatusOr<v1::JoinResponse> off = (*client)->Join(options);
  EXPECT_EQ(off.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(off.status().message(), HasSubstr("file:// rendezvous is off"));

  ClientOptions long_ns;
  long_ns.name_space = "12345";
  auto namespaced = Client::Connect(socket, long_ns);
  ASSERT_TRUE(namespaced.ok());
  EXPECT_THAT((*namespaced)->Store().Set("k", "v").message(),
              HasSubstr("store.max_namespace_bytes is 4"));
}

}  // namespace
}  // namespace tpd
