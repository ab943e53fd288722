// Two daemons on two "hosts": network namespaces joined by a veth pair, each daemon's peer
// port on its own address. Partitioning the link longer than the heartbeat window evicts the
// far node, breaks the static group, and on healing the far node learns it was evicted.
// Needs root and iproute2 (CI runs as root); skips, saying why, where namespaces can't be made.

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
    const int subnet = getpid() % 250 + 1;
    addr_a_ = absl::StrCat("10.231.", subnet, ".1");
    addr_b_ = absl::StrCat("10.231.", subnet, ".2");
    if (geteuid() != 0 || access(kIp, X_OK) != 0 || !Ip({"netns", "add", ns_a_})) {
      GTEST_SKIP() << "needs root and `ip netns` (iproute2) to build two network namespaces";
    }
    made_ = true;
    const std::string veth_a = absl::StrCat("va", id);
    const std::string veth_b = absl::StrCat("vb", id);
    veth_a_ = veth_a;
    ASSERT_TRUE(Ip({"netns", "add", ns_b_}));
    ASSERT_TRUE(Ip({"link", "add", veth_a, "type", "veth", "peer", "name", veth_b}));
    ASSERT_TRUE(Ip({"link", "set", veth_a, "netns", ns_a_}));
    ASSERT_TRUE(Ip({"link", "set", veth_b, "netns", ns_b_}));
    for (const auto& [ns, veth, addr] :
         {std::tuple(ns_a_, veth_a, addr_a_), std::tuple(ns_b_, veth_b, addr_b_)}) {
      ASSERT_TRUE(Ip({"-n", ns, "addr", "add", absl::StrCat(addr, "/24"), "dev", veth}));
      ASSERT_TRUE(Ip({"-n", ns, "link", "set", veth, "up"}));
      ASSERT_TRUE(Ip({"-n", ns, "link", "set", "lo", "up"}));
    }
    socket_a_ = StartDaemon("node-a", ns_a_, addr_a_, &daemon_a_);
    socket_b_ = StartDaemon("node-b", ns_b_, addr_b_, &daemon_b_);
  }

  void TearDown() override {
    daemon_a_.reset();
    daemon_b_.reset();
    if (made_) {
      Ip({"netns", "del", ns_a_});
      Ip({"netns", "del", ns_b_});
    }
  }

  std::string StartDaemon(const std::string& node, const std::string& ns, const std::string& addr,
                          std::unique_ptr<DaemonProcess>* out) {
    const std::string socket = absl::StrCat(dir_.path(), "/", node, ".sock");
    const std::string config = dir_.WriteFile(
        absl::StrCat(node, ".toml"),
        absl::StrCat("[peer]\nlisten_address = \"", addr, ":29400\"\ntoken = \"secret\"\n",
                     "node_name = \"", node, "\"\nheartbeat_interval_ms = 100\n",
                     "heartbeat_timeout_ms = 1000\n"));
    auto daemon = DaemonProcess::Start(socket, {"--config", config}, {kIp, "netns", "exec", ns});
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    if (daemon.ok()) *out = *std::move(daemon);
    return socket;
  }

  TempDir dir_;
  bool made_ = false;
  std::string ns_a_, ns_b_, addr_a_, addr_b_, veth_a_, socket_a_, socket_b_;
  std::unique_ptr<DaemonProcess> daemon_a_, daemon_b_;
};

TEST_F(NetnsTest, PartitionLongerThanTheWindowEvictsAndTheFarNodeLearnsOnHeal) {
  ASSERT_TRUE(daemon_a_ && daemon_b_);
  auto a = Client::Connect(socket_a_);
  auto b = Client::Connect(socket_b_);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string init_method = absl::StrCat("tcp://", addr_a_, ":29400");
  JoinOptions w0;
  w0.group = "cross";
  w0.name = "w0";
  w0.rank = 0;
  w0.world_size = 2;
  w0.init_method = init_method;
  w0.timeout = absl::Seconds(30);
  JoinOptions w1 = w0;
  w1.name = "w1";
  w1.rank = 1;
  absl::StatusOr<v1::JoinResponse> joined_b;
  std::thread join_b([&] { joined_b = (*b)->Join(w1); });
  absl::StatusOr<v1::JoinResponse> joined_a = (*a)->Join(w0);
  join_b.join();
  ASSERT_TRUE(joined_a.ok()) << joined_a.status();
  ASSERT_TRUE(joined_b.ok()) << joined_b.status();
  EXPECT_EQ(joined_b->group().phase(), "FORMED");
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

}  // namespace
}  // namespace tpd
