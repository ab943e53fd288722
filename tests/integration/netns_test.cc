// Daemons on three "hosts": network namespaces joined by veth pairs, each daemon's peer port
// on its own address. A and B are the cluster (one token); C is another host on the network,
// linked to A, whose daemon has another token. Partitioning A from B longer than the heartbeat
// window evicts the far node, breaks the static group, and on healing the far node learns it
// was evicted. C can neither join the cluster's job nor get a daemon of it to follow a store
// C serves, and the job's calls go on meanwhile (docs/security.md, "Answers are authenticated
// too"). Needs root and iproute2 (CI runs as root); skips, saying why, where namespaces can't
// be made.

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/impostor_store.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::RunProcess;
using testing::TempDir;

constexpr char kIp[] = "/usr/sbin/ip";

bool Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kIp};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProcess(argv, absl::Seconds(10)).exit_code == 0;
}

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Unique per test process: parallel runs must not share namespaces or addresses.
    const std::string id = absl::StrCat(getpid() % 100000);
    ns_a_ = absl::StrCat("tpd-a-", id);
    ns_b_ = absl::StrCat("tpd-b-", id);
    ns_c_ = absl::StrCat("tpd-c-", id);
    const int subnet = getpid() % 250 + 1;
    addr_a_ = absl::StrCat("10.231.", subnet, ".1");
    addr_b_ = absl::StrCat("10.231.", subnet, ".2");
    const std::string addr_a_toward_c = absl::StrCat("10.232.", subnet, ".1");
    addr_c_ = absl::StrCat("10.232.", subnet, ".2");
    if (geteuid() != 0 || access(kIp, X_OK) != 0 || !Ip({"netns", "add", ns_a_})) {
      GTEST_SKIP() << "needs root and `ip netns` (iproute2) to build two network namespaces";
    }
    made_ = true;
    const std::string veth_a = absl::StrCat("va", id);
    const std::string veth_b = absl::StrCat("vb", id);
    veth_a_ = veth_a;
    ASSERT_TRUE(Ip({"netns", "add", ns_b_}));
    ASSERT_TRUE(Ip({"netns", "add", ns_c_}));
    // C reaches A's peer address through A's second link.
    const std::string veth_ac = absl::StrCat("wa", id);
    const std::string veth_c = absl::StrCat("wc", id);
    for (const auto& [one, other] : {std::pair(veth_a, veth_b), std::pair(veth_ac, veth_c)}) {
      ASSERT_TRUE(Ip({"link", "add", one, "type", "veth", "peer", "name", other}));
    }
    for (const auto& [ns, veth, addr] :
         {std::tuple(ns_a_, veth_a, addr_a_), std::tuple(ns_b_, veth_b, addr_b_),
          std::tuple(ns_a_, veth_ac, addr_a_toward_c), std::tuple(ns_c_, veth_c, addr_c_)}) {
      ASSERT_TRUE(Ip({"link", "set", veth, "netns", ns}));
      ASSERT_TRUE(Ip({"-n", ns, "addr", "add", absl::StrCat(addr, "/24"), "dev", veth}));
      ASSERT_TRUE(Ip({"-n", ns, "link", "set", veth, "up"}));
      ASSERT_TRUE(Ip({"-n", ns, "link", "set", "lo", "up"}));
    }
    ASSERT_TRUE(Ip({"-n", ns_c_, "route", "add", "default", "via", addr_a_toward_c}));
    socket_a_ = StartDaemon("node-a", ns_a_, addr_a_, "secret", &daemon_a_);
    socket_b_ = StartDaemon("node-b", ns_b_, addr_b_, "secret", &daemon_b_);
    socket_c_ = StartDaemon("host-c", ns_c_, addr_c_, "not-the-token", &daemon_c_);
  }

  void TearDown() override {
    daemon_a_.reset();
    daemon_b_.reset();
    daemon_c_.reset();
    if (made_) {
      for (const std::string& ns : {ns_a_, ns_b_, ns_c_}) Ip({"netns", "del", ns});
    }
  }

  std::string StartDaemon(const std::string& node, const std::string& ns, const std::string& addr,
                          const std::string& token, std::unique_ptr<DaemonProcess>* out) {
    const std::string socket = absl::StrCat(dir_.path(), "/", node, ".sock");
    const std::string config = dir_.WriteFile(
        absl::StrCat(node, ".toml"),
        absl::StrCat("[peer]\nlisten_address = \"", addr, ":29400\"\ntoken = \"", token, "\"\n",
                     "node_name = \"", node, "\"\nheartbeat_interval_ms = 100\n",
                     "heartbeat_timeout_ms = 1000\n"));
    auto daemon = DaemonProcess::Start(socket, {"--config", config}, {kIp, "netns", "exec", ns});
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    if (daemon.ok()) *out = *std::move(daemon);
    return socket;
  }

  // What `make` returns, made with this thread in network namespace `ns` (sockets it opens
  // stay there); nullptr when the namespace cannot be entered.
  template <typename Make>
  static auto InNamespace(const std::string& ns, Make make) -> decltype(make()) {
    const int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    const int there = open(absl::StrCat("/run/netns/", ns).c_str(), O_RDONLY | O_CLOEXEC);
    decltype(make()) made = nullptr;
    if (home >= 0 && there >= 0 && setns(there, CLONE_NEWNET) == 0) {
      made = make();
      if (setns(home, CLONE_NEWNET) != 0) std::abort();  // the test would run in the wrong place
    }
    if (home >= 0) close(home);
    if (there >= 0) close(there);
    return made;
  }

  // Joins w0 on `a` and w1 on `b` to the static group `group` homed at A.
  void FormAcross(Client* a, Client* b, const std::string& group) {
    JoinOptions w0;
    w0.group = group;
    w0.name = "w0";
    w0.rank = 0;
    w0.world_size = 2;
    w0.init_method = absl::StrCat("tcp://", addr_a_, ":29400");
    w0.secret = "job-secret";
    w0.timeout = absl::Seconds(30);
    JoinOptions w1 = w0;
    w1.name = "w1";
    w1.rank = 1;
    absl::StatusOr<v1::JoinResponse> joined_b;
    std::thread join_b([&] { joined_b = b->Join(w1); });
    absl::StatusOr<v1::JoinResponse> joined_a = a->Join(w0);
    join_b.join();
    ASSERT_TRUE(joined_a.ok()) << joined_a.status();
    ASSERT_TRUE(joined_b.ok()) << joined_b.status();
    EXPECT_EQ(joined_b->group().phase(), "FORMED");
  }

  TempDir dir_;
  bool made_ = false;
  std::string ns_a_, ns_b_, ns_c_, addr_a_, addr_b_, addr_c_, veth_a_;
  std::string socket_a_, socket_b_, socket_c_;
  std::unique_ptr<DaemonProcess> daemon_a_, daemon_b_, daemon_c_;
};

TEST_F(NetnsTest, PartitionLongerThanTheWindowEvictsAndTheFarNodeLearnsOnHeal) {
  ASSERT_TRUE(daemon_a_ && daemon_b_ && daemon_c_);
  auto a = Client::Connect(socket_a_);
  auto b = Client::Connect(socket_b_);
  ASSERT_TRUE(a.ok() && b.ok());
  FormAcross(a->get(), b->get(), "cross");
  if (HasFatalFailure()) return;
  const uint64_t incarnation_b = (*b)->Status()->node().incarnation();

  // Cut the link for longer than the 1 s heartbeat window.
  ASSERT_TRUE(Ip({"-n", ns_a_, "link", "set", veth_a_, "down"}));
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  v1::GroupView on_a = *(*a)->GetGroup("cross");
  while (on_a.phase() != "BROKEN" && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    on_a = *(*a)->GetGroup("cross");
  }
  EXPECT_EQ(on_a.phase(), "BROKEN");
  EXPECT_THAT(on_a.reason(), HasSubstr("node node-b sent no heartbeat"));

  // Heal: node b catches up with the versions it missed and takes a new incarnation.
  ASSERT_TRUE(Ip({"-n", ns_a_, "link", "set", veth_a_, "up"}));
  deadline = absl::Now() + absl::Seconds(30);
  v1::GroupView on_b = *(*b)->GetGroup("cross");
  while (on_b.phase() != "BROKEN" && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    on_b = *(*b)->GetGroup("cross");
  }
  EXPECT_EQ(on_b.phase(), "BROKEN");
  for (const v1::Member& member : on_b.members()) EXPECT_NE(member.node(), "node-b");
  EXPECT_NE((*b)->Status()->node().incarnation(), incarnation_b);
  // Its old member is gone for good: acting on it is refused.
  absl::Status barrier = (*b)->Barrier("cross", "w1", absl::Seconds(5));
  EXPECT_EQ(barrier.code(), absl::StatusCode::kFailedPrecondition) << barrier;
}

TEST_F(NetnsTest, AHostOnTheNetworkWithoutTheTokenNeitherJoinsTheJobNorIsFollowed) {
  ASSERT_TRUE(daemon_a_ && daemon_b_ && daemon_c_);
  auto a = Client::Connect(socket_a_);
  auto b = Client::Connect(socket_b_);
  auto c = Client::Connect(socket_c_);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  FormAcross(a->get(), b->get(), "job");
  if (HasFatalFailure()) return;
  ASSERT_TRUE(
      (*b)->Handle("echo",
                   [](const Message& request) -> absl::StatusOr<Message> { return request; })
          .ok());

  // C's daemon reaches A's peer port, but its calls prove another token: nothing it asks is
  // served, so it learns nothing of the job and joins nothing, secret or not.
  JoinOptions intruder;
  intruder.group = "job";
  intruder.name = "x";
  intruder.init_method = absl::StrCat("tcp://", addr_a_, ":29400");
  intruder.secret = "job-secret";
  intruder.timeout = absl::Seconds(10);
  absl::StatusOr<v1::JoinResponse> refused = (*c)->Join(intruder);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("bad MAC"));

  // A store served on C, named to A's daemon (a local user's URL, or a forged bootstrap): a
  // daemon of another cluster refuses A's calls; a server that answers every call with
  // success, as a host on the path would, is not followed either, its answers proving no
  // cluster token.
  auto join_a_through = [&](const std::string& address) {
    JoinOptions lured;
    lured.group = absl::StrCat("lure-", address);  // a group follows one store at a time
    lured.name = "y";
    lured.init_method = absl::StrCat("tcp://", address);
    lured.timeout = absl::Seconds(10);
    return (*a)->Join(lured).status();
  };
  absl::Status followed = join_a_through(absl::StrCat(addr_c_, ":29400"));
  EXPECT_EQ(followed.code(), absl::StatusCode::kUnauthenticated) << followed;
  EXPECT_THAT(followed.message(), HasSubstr("bad MAC"));
  std::unique_ptr<testing::ImpostorStore> impostor = InNamespace(
      ns_c_, [&] { return std::make_unique<testing::ImpostorStore>("not-the-token", addr_c_); });
  ASSERT_NE(impostor, nullptr);
  followed = join_a_through(impostor->address());
  EXPECT_EQ(followed.code(), absl::StatusCode::kUnauthenticated) << followed;
  EXPECT_THAT(followed.message(), HasSubstr("did not prove the cluster token"));
  EXPECT_THAT(followed.message(), HasSubstr(impostor->address()));

  // The job goes on as before: every call answered, both members still its only ones.
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<Message> reply =
        (*a)->Call("job", "w1", "echo", absl::StrCat("m", i), {}, absl::Seconds(10));
    ASSERT_TRUE(reply.ok()) << i << ": " << reply.status();
    EXPECT_EQ(reply->payload, absl::StrCat("m", i));
  }
  absl::StatusOr<v1::GroupView> view = (*a)->GetGroup("job");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->phase(), "FORMED");
  EXPECT_EQ(view->members_size(), 2);
}

}  // namespace
}  // namespace tpd
