// Taking a node out of service (Admin.Drain, `tpctl drain`; docs/operations.md "Drain")
// against real daemons: node0 drains while a call from it to node1 runs. New calls and joins
// on node0 are refused UNAVAILABLE naming the drain, the running call finishes, node0's
// members leave so node1's view shows them gone, and Status and `tpctl status` say drained.
// Drain is refused on the clients' socket, and the operator socket refuses a second user
// unless [daemon] operator_group lets that user's group in. `tpctl drain --exit` stops the
// daemon (exit 0, sockets removed).

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <future>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "proto/admin.grpc.pb.h"
#include "tests/testing/daemon_nodes.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/second_user.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;
using testing::RunfilePath;
using testing::RunProcess;
using testing::WaitUntil;

constexpr absl::Duration kSlowCall = absl::Seconds(2);

std::unique_ptr<v1::Admin::Stub> AdminAt(const std::string& socket) {
  return v1::Admin::NewStub(
      grpc::CreateChannel(absl::StrCat("unix:", socket), grpc::InsecureChannelCredentials()));
}

// Runs tpctl, copied into `dir`, as `uid`:`gid` (the second user cannot read the test's
// runfiles).
testing::ProcessResult TpctlAs(const std::string& dir, uid_t uid, gid_t gid,
                               const std::vector<std::string>& args) {
  const std::string tpctl = dir + "/tpctl";
  std::error_code ignored;
  if (!std::filesystem::exists(tpctl, ignored)) {
    std::filesystem::copy_file(RunfilePath("client/tpctl"), tpctl, ignored);
    chmod(tpctl.c_str(), 0755);
  }
  std::vector<std::string> argv = {"/usr/bin/setpriv", absl::StrCat("--reuid=", uid),
                                   absl::StrCat("--regid=", gid), "--clear-groups", tpctl};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProcess(argv);
}

class DrainTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(nodes_.StartAll()); }

  // a (node0) and b (node1) in group "g" of two; b handles "slow" (kSlowCall) and "echo".
  void StartPair() {
    a_ = nodes_.Connect(0);
    b_ = nodes_.Connect(1);
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    ASSERT_TRUE(b_->Handle("slow", [](const Message& request) -> absl::StatusOr<Message> {
                    absl::SleepFor(kSlowCall);
                    return request;
                  }).ok());
    ASSERT_TRUE(b_->Handle("echo", [](const Message& request) -> absl::StatusOr<Message> {
                    return request;
                  }).ok());
    auto join = [this](Client* client, const char* name, int rank) {
      JoinOptions options;
      options.group = "g";
      options.name = name;
      options.rank = rank;
      options.world_size = 2;
      options.init_method = nodes_.init_method();
      options.timeout = absl::Seconds(30);
      return client->Join(options).status();
    };
    auto b = std::async(std::launch::async, [&] { return join(b_.get(), "b", 1); });
    ASSERT_TRUE(join(a_.get(), "a", 0).ok());
    ASSERT_TRUE(b.get().ok());
  }

  std::string OperatorSocket(int i) const { return nodes_.socket(i) + ".operator"; }

  testing::DaemonNodes nodes_{
      {"node0", "node1"}, [](int) {
        return std::string("heartbeat_interval_ms = 200\nheartbeat_timeout_ms = 2000\n");
      }};
  std::unique_ptr<Client> a_;
  std::unique_ptr<Client> b_;
};

TEST_F(DrainTest, RunningCallsFinishNewOnesAreRefusedAndMembersLeave) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  auto slow = std::async(std::launch::async, [&] { return a_->Call("g", "b", "slow", "x"); });
  ASSERT_TRUE(WaitUntil([&] {
    absl::StatusOr<v1::StatusResponse> status = a_->Status();
    return status.ok() && status->agent().calls_pending() == 1;
  })) << "the slow call is in flight";

  auto drained = std::async(std::launch::async, [&] {
    return RunProcess({RunfilePath("client/tpctl"), "--socket", nodes_.socket(0), "drain",
                       "--timeout_ms", "30000"},
                      absl::Seconds(60));
  });
  ASSERT_TRUE(WaitUntil([&] {
    absl::StatusOr<v1::StatusResponse> node0 = a_->Status();
    return node0.ok() && node0->drain().state() == "draining";
  }));
  absl::StatusOr<v1::StatusResponse> during = a_->Status();
  ASSERT_TRUE(during.ok());
  EXPECT_EQ(during->serving_status(), "NOT_SERVING");
  EXPECT_EQ(during->drain().requested_by(), "Admin.Drain");
  EXPECT_EQ(during->drain().calls_in_flight(), 1) << "the slow call, still running";

  const absl::Status refused = a_->Call("g", "b", "echo", "x").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("node0 is draining (tpctl drain)"));
  std::unique_ptr<Client> late = nodes_.Connect(0);
  ASSERT_NE(late, nullptr);
  JoinOptions options;
  options.group = "other";
  options.name = "late";
  options.init_method = nodes_.init_method();
  const absl::Status join = late->Join(options).status();
  EXPECT_EQ(join.code(), absl::StatusCode::kUnavailable) << join;
  EXPECT_THAT(join.message(), HasSubstr("node0 is draining (tpctl drain) and takes no new joins"));

  absl::StatusOr<Message> reply = slow.get();
  EXPECT_TRUE(reply.ok()) << "a call in flight finishes: " << reply.status();
  const testing::ProcessResult tpctl = drained.get();
  EXPECT_EQ(tpctl.exit_code, 0) << tpctl.output;
  EXPECT_THAT(tpctl.output, HasSubstr("drained (asked by Admin.Drain)"));

  // node1 is told: a left the group (explicitly, not by a late eviction).
  absl::StatusOr<v1::GroupView> view;
  ASSERT_TRUE(WaitUntil([&] {
    view = b_->GetGroup("g", nodes_.init_method());
    if (!view.ok()) return false;
    for (const v1::Member& member : view->members()) {
      if (member.name() == "a") return false;
    }
    return true;
  })) << (view.ok() ? view->DebugString() : view.status().ToString());

  v1::StatusResponse node0;
  grpc::ClientContext context;
  ASSERT_TRUE(AdminAt(OperatorSocket(0))->Status(&context, v1::StatusRequest(), &node0).ok())
      << "Status is served on the operator socket too";
  EXPECT_EQ(node0.drain().state(), "drained");
  EXPECT_EQ(node0.drain().calls_cut_off(), 0);
  EXPECT_EQ(node0.drain().calls_in_flight(), 0);
  EXPECT_EQ(node0.drain().members(), 0) << "its members left";
  for (const v1::GroupView& group : node0.groups()) {
    for (const v1::Member& member : group.members()) EXPECT_NE(member.node(), "node0");
  }
  EXPECT_GE(node0.drain().drained_unix_ms(), node0.drain().started_unix_ms());
  const testing::ProcessResult status =
      RunProcess({RunfilePath("client/tpctl"), "--socket", nodes_.socket(0), "status"});
  EXPECT_THAT(status.output, HasSubstr("drain:   drained (asked by Admin.Drain)"));
  EXPECT_THAT(status.output, HasSubstr("NOT_SERVING"));
  const testing::ProcessResult doctor =
      RunProcess({RunfilePath("client/tpctl"), "--socket", nodes_.socket(0), "doctor"});
  EXPECT_EQ(doctor.exit_code, 1) << "a drained node is a problem: " << doctor.output;
  EXPECT_THAT(doctor.output, HasSubstr("PROBLEM  serving"));
}

TEST_F(DrainTest, TheClientsSocketRefusesDrainNamingTheOperatorSocket) {
  v1::DrainResponse response;
  grpc::ClientContext context;
  const grpc::Status status =
      AdminAt(nodes_.socket(0))->Drain(&context, v1::DrainRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr(OperatorSocket(0)));
  std::unique_ptr<Client> client = nodes_.Connect(0);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::StatusResponse> after = client->Status();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->serving_status(), "SERVING") << "nothing was drained";
  EXPECT_EQ(after->drain().state(), "serving");
  EXPECT_EQ(after->operator_socket(), OperatorSocket(0));

  grpc::ClientContext bad_context;
  v1::DrainRequest bad;
  bad.set_timeout_ms(-1);
  const grpc::Status invalid = AdminAt(OperatorSocket(0))->Drain(&bad_context, bad, &response);
  EXPECT_EQ(invalid.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(invalid.error_message(), HasSubstr("timeout_ms"));
}

TEST_F(DrainTest, ASecondUserCannotReachTheOperatorSocket) {
  if (std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  struct stat st {};
  ASSERT_EQ(stat(OperatorSocket(0).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "root and the daemon's user only";
  testing::OpenDirToSecondUser(nodes_.dir(0).path());
  absl::StatusOr<std::unique_ptr<testing::SecondUserConnections>> connections =
      testing::SecondUserConnections::Open(OperatorSocket(0), 1);
  ASSERT_TRUE(connections.ok()) << connections.status();
  EXPECT_EQ((*connections)->connected(), 0) << "the kernel refuses the connection";
  testing::TempDir dir;
  testing::OpenDirToSecondUser(dir.path());
  const testing::ProcessResult tpctl = TpctlAs(dir.path(), testing::kSecondUid, testing::kSecondGid,
                                               {"--socket", nodes_.socket(0), "drain"});
  EXPECT_EQ(tpctl.exit_code, 1) << tpctl.output;
  EXPECT_THAT(tpctl.output, HasSubstr("PERMISSION_DENIED"));
  std::unique_ptr<Client> client = nodes_.Connect(0);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->Status()->drain().state(), "serving");
}

TEST(DrainOperatorGroupTest, MembersOfTheOperatorGroupMayDrainAndExitStopsTheDaemon) {
  if (std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;
  testing::OpenDirToSecondUser(dir.path());
  // The second user's own group (nogroup, 65534) operates this daemon.
  const std::string config = dir.WriteFile("tpd.toml", "[daemon]\noperator_group = \"nogroup\"\n");
  const std::string socket = dir.path() + "/tpd.sock";
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> daemon =
      testing::DaemonProcess::Start(socket, {"--config", config});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  struct stat st {};
  ASSERT_EQ(stat((socket + ".operator").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, testing::kSecondGid);

  const testing::ProcessResult tpctl =
      TpctlAs(dir.path(), testing::kSecondUid, testing::kSecondGid,
              {"--socket", socket, "drain", "--exit", "--timeout_ms", "1000"});
  EXPECT_EQ(tpctl.exit_code, 0) << tpctl.output;
  EXPECT_THAT(tpctl.output, HasSubstr("the daemon is stopping"));
  EXPECT_EQ((*daemon)->WaitExit(absl::Seconds(30)), 0) << (*daemon)->Output();
  EXPECT_NE(stat(socket.c_str(), &st), 0) << "the socket is removed";
  EXPECT_NE(stat((socket + ".operator").c_str(), &st), 0) << "the operator socket too";
  EXPECT_THAT((*daemon)->Output(), HasSubstr("[drain] exiting, as the drain request asked"));
}

}  // namespace
}  // namespace tpd
