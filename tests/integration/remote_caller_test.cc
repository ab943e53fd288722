// Who may call a worker across daemons (docs/security.md, "Who may call a worker"): a group is
// its store and its name, and a daemon serves a call from another daemon only when its own
// view of that group has the caller, on the calling node, in the incarnation the caller's
// daemon named.
//
// The attack this stops, on real daemons: a socket user of node na joins a group of the same
// name as a real group through a store of its own (here the daemon nc, standing for a store
// that accepts na's calls), appends to that store a valid version listing the real group's
// worker of node nb, keeps nb's heartbeat fresh there, and calls that worker. na routes the
// call to nb, whose view of the real group has no such caller.

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "daemon/group/group_log.h"
#include "daemon/group/heartbeat.h"
#include "daemon/group/membership.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/prefix_store.h"
#include "store/remote/remote_store.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WaitUntil;

class RemoteCallerTest : public ::testing::Test {
 protected:
  static constexpr int kNodes = 3;  // na, nb: the cluster; nc: the attacker's store

  void SetUp() override {
    const char* names[kNodes] = {"na", "nb", "nc"};
    for (int i = 0; i < kNodes; ++i) {
      sockets_[i] = absl::StrCat(dirs_[i].path(), "/tpd.sock");
      const std::string config = dirs_[i].WriteFile(
          "tpd.toml", absl::StrCat("[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"secret\"\n",
                                   "node_name = \"", names[i], "\"\n",
                                   "heartbeat_interval_ms = 200\nheartbeat_timeout_ms = 2000\n",
                                   "[data]\narena_bytes = ", 4 << 20, "\n"));
      auto daemon = DaemonProcess::Start(sockets_[i], {"--config", config});
      ASSERT_TRUE(daemon.ok()) << daemon.status();
      daemons_[i] = *std::move(daemon);
      std::unique_ptr<Client> probe = Connect(i);
      ASSERT_NE(probe, nullptr);
      status_[i] = *probe->Status();
    }
  }

  std::unique_ptr<Client> Connect(int i) {
    auto client = Client::Connect(sockets_[i]);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::string InitMethod(int i) { return absl::StrCat("tcp://", status_[i].peer_address()); }

  TempDir dirs_[kNodes];
  std::string sockets_[kNodes];
  std::unique_ptr<DaemonProcess> daemons_[kNodes];
  v1::StatusResponse status_[kNodes];
};

TEST_F(RemoteCallerTest, AWorkerServesNoCallerThatItsDaemonDoesNotKnowInItsGroup) {
  // The real group g, in nb's store: w of nb alone, static, formed. w counts its calls.
  std::atomic<int> served{0};
  std::unique_ptr<Client> w = Connect(1);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->Handle("echo", [&](const Message& request) -> absl::StatusOr<Message> {
                 ++served;
                 return request;
               }).ok());
  JoinOptions real;
  real.group = "g";
  real.name = "w";
  real.rank = 0;
  real.world_size = 1;
  real.init_method = InitMethod(1);
  ASSERT_TRUE(w->Join(real).ok());

  // The attacker on na joins a group named g through its own store.
  std::unique_ptr<Client> x = Connect(0);
  ASSERT_NE(x, nullptr);
  JoinOptions fake;
  fake.group = "g";
  fake.name = "x";
  fake.init_method = InitMethod(2);
  ASSERT_TRUE(x->Join(fake).ok());

  // It appends a valid version listing w of nb to its store's log of g ...
  store::RemoteStoreOptions options;
  options.token = "secret";
  auto remote = store::RemoteStore::Create(status_[2].peer_address(), options);
  ASSERT_TRUE(remote.ok()) << remote.status();
  store::PrefixStore group_store("tpd/group/g", remote->get());
  group::GroupLog log(&group_store, "g");
  absl::StatusOr<v1::GroupRecord> latest = log.Latest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_EQ(latest->view().members_size(), 1);
  const v1::MemberOptionsRecord& xs = latest->options().at("x");
  group::JoinSpec spec;
  spec.name = "w";
  spec.node = "nb";
  spec.incarnation = status_[1].node().incarnation();
  spec.since_unix_ms = absl::ToUnixMillis(absl::Now());
  spec.agent_address = status_[1].agent().address();
  spec.node_transports.assign(xs.node_transports().begin(), xs.node_transports().end());
  spec.node_channels.assign(xs.node_channels().begin(), xs.node_channels().end());
  spec.uid = 0;
  v1::GroupRecord next = *latest;
  ASSERT_TRUE(group::AddMember(&next, spec).ok());
  next.mutable_view()->set_version(latest->view().version() + 1);
  absl::StatusOr<bool> appended = log.TryAppend(next);
  ASSERT_TRUE(appended.ok() && *appended) << appended.status();
  // ... and keeps nb's heartbeat fresh there, so na does not evict w.
  std::atomic<bool> stop{false};
  std::thread beats([&] {
    for (int64_t n = 1; !stop; ++n) {
      (void)(*remote)->Set(group::HeartbeatKey("nb"),
                           group::HeartbeatValue(status_[1].node().incarnation(), n));
      absl::SleepFor(absl::Milliseconds(100));
    }
  });

  // na now believes w of nb is in x's group g.
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<v1::GroupView> view = x->GetGroup("g");
        return view.ok() && view->members_size() == 2;
      },
      absl::Seconds(10)));

  // The call reaches nb, which does not serve it.
  absl::StatusOr<Message> reply = x->Call("g", "w", "echo", "pwn", {}, absl::Seconds(20));
  stop = true;
  beats.join();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kPermissionDenied) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("is not a member of group 'g' as node nb"));
  EXPECT_EQ(served.load(), 0) << "w ran its handler for a caller outside its group";

  // w's own group is untouched and serves its member.
  absl::StatusOr<Message> own = w->Call("g", "w", "echo", "mine", {}, absl::Seconds(10));
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(served.load(), 1);
}

}  // namespace
}  // namespace tpd
