// Groups do not outlive their use (and a soak of sessions, groups, watches and bad requests
// leaves nothing behind): a daemon asked about many groups follows at most
// group.max_groups at once (RESOURCE_EXHAUSTED past it, and it keeps serving), releases each
// once nothing local uses it, and its threads and file descriptors return to where they were.

#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/one_daemon.h"
#include "tests/testing/proc_counts.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using testing::CountFds;
using testing::CountThreadsOutsideGrpcPools;
using testing::DaemonProcess;
using testing::DescribeThreadsAndMemfds;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WaitUntil;

class LifecycleTest : public testing::OneDaemonTest {
 protected:
  void SetUp() override {
    testing::OneDaemonConfig config;
    config.peer_lines = "heartbeat_interval_ms = 50\n";
    config.more_sections =
        "[group]\nmax_groups = 4\nmax_groups_per_session = 2\nidle_group_release_ms = 300\n";
    StartDaemon(config);
    if (HasFatalFailure()) return;
    client_ = Connect();
    ASSERT_NE(client_, nullptr);
    init_method_ = InitMethod(client_.get());
  }

  std::unique_ptr<Client> client_;
};

TEST_F(LifecycleTest, GroupsAreCappedAndReleasedAndResourcesReturnToBaseline) {
  // Warm up gRPC's own threads and the peer connection once before taking the baseline.
  ASSERT_TRUE(client_->GetGroup("warmup", init_method_).ok());
  ASSERT_TRUE(WaitUntil([&] { return client_->ListGroups()->empty(); }))
      << "the warm-up group was never released";
  const int threads = CountThreadsOutsideGrpcPools(daemon_->pid());
  const int fds = CountFds(daemon_->pid());
  ASSERT_GT(threads, 0);

  int refused = 0;
  for (int round = 0; round < 30; ++round) {
    for (int i = 0; i < 10; ++i) {
      absl::StatusOr<v1::GroupView> view =
          client_->GetGroup(absl::StrCat("g", round, "-", i), init_method_);
      if (view.ok()) continue;
      ++refused;
      EXPECT_EQ(view.status().code(), absl::StatusCode::kResourceExhausted) << view.status();
      EXPECT_THAT(view.status().message(), HasSubstr("group.max_groups is 4"));
    }
    EXPECT_LE(client_->ListGroups()->size(), 4u);
  }
  EXPECT_GT(refused, 0) << "300 quick lookups never reached group.max_groups";
  EXPECT_TRUE(client_->Serving().value_or(false));

  ASSERT_TRUE(WaitUntil([&] { return client_->ListGroups()->empty(); }))
      << "idle groups were never released";
  // Workers and heartbeat threads stop, store connections close.
  EXPECT_TRUE(WaitUntil([&] { return CountThreadsOutsideGrpcPools(daemon_->pid()) <= threads; }))
      << "threads: " << CountThreadsOutsideGrpcPools(daemon_->pid()) << " after, " << threads
      << " before";
  EXPECT_TRUE(WaitUntil([&] { return CountFds(daemon_->pid()) <= fds + 2; }))
      << "fds: " << CountFds(daemon_->pid()) << " after, " << fds << " before";
}

// docs/security.md, "Groups": lookups and watches carry no session, so the groups they make the
// daemon follow share group.max_unattributed_groups; a user's jobs keep the rest of the table.
TEST(LifecycleShareTest, LookupsOfMadeUpNamesCannotKeepJobsOut) {
  TempDir dir;
  const std::string socket = absl::StrCat(dir.path(), "/tpd.sock");
  const std::string config = dir.WriteFile(
      "tpd.toml",
      "[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"t\"\n"
      "[group]\nmax_groups = 8\nmax_unattributed_groups = 3\nmax_groups_per_uid = 4\n");
  auto daemon = DaemonProcess::Start(socket, {"--config", config});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect(socket);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string init_method = absl::StrCat("tcp://", (*client)->Status()->peer_address());
  std::vector<std::unique_ptr<GroupWatch>> watches;
  for (int i = 0; i < 10; ++i) {
    watches.push_back((*client)->Watch(absl::StrCat("made-up-", i), init_method));
  }
  ASSERT_TRUE(WaitUntil([&] { return (*client)->ListGroups()->size() == 3; }))
      << "the watches made the daemon follow " << (*client)->ListGroups()->size() << " groups";
  absl::StatusOr<v1::GroupView> one_more = (*client)->GetGroup("made-up-x", init_method);
  EXPECT_EQ(one_more.status().code(), absl::StatusCode::kResourceExhausted) << one_more.status();
  EXPECT_THAT(one_more.status().message(), HasSubstr("group.max_unattributed_groups is 3"));
  // A job's groups are counted against its user: 4 of them fit, the fifth is refused.
  for (int i = 0; i < 5; ++i) {
    auto member = Client::Connect(socket);
    ASSERT_TRUE(member.ok()) << member.status();
    JoinOptions options;
    options.group = absl::StrCat("job-", i);
    options.name = "w0";
    options.init_method = init_method;
    absl::StatusOr<v1::JoinResponse> joined = (*member)->Join(options);
    if (i < 4) {
      EXPECT_TRUE(joined.ok()) << i << ": " << joined.status();
    } else {
      EXPECT_EQ(joined.status().code(), absl::StatusCode::kResourceExhausted) << joined.status();
      EXPECT_THAT(joined.status().message(), HasSubstr("group.max_groups_per_uid is 4"));
    }
  }
}

TEST_F(LifecycleTest, AMistypedLookupDoesNotSquatTheGroupName) {
  absl::StatusOr<v1::GroupView> typo = client_->GetGroup("train", "tcp://127.0.0.1:1");
  EXPECT_FALSE(typo.ok());
  // Until it is released, the name is taken through the other store...
  absl::StatusOr<v1::GroupView> now = client_->GetGroup("train", init_method_);
  if (!now.ok()) {
    EXPECT_EQ(now.status().code(), absl::StatusCode::kInvalidArgument) << now.status();
    // ...and after that it is free again.
    ASSERT_TRUE(WaitUntil([&] { return client_->GetGroup("train", init_method_).ok(); }))
        << "the mistyped group kept the name";
  }
}

TEST_F(LifecycleTest, ASessionHoldsMembersInAtMostMaxGroupsPerSession) {
  auto join = [&](const std::string& group) {
    JoinOptions options;
    options.group = group;
    options.name = "w0";
    options.init_method = init_method_;
    return client_->Join(options);
  };
  ASSERT_TRUE(join("a").ok());
  ASSERT_TRUE(join("b").ok());
  absl::StatusOr<v1::JoinResponse> third = join("c");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_THAT(third.status().message(), HasSubstr("group.max_groups_per_session is 2"));
  // Leaving one makes room.
  ASSERT_TRUE(client_->Leave("a", "w0").ok());
  EXPECT_TRUE(join("c").ok());
}

// Resident memory of `pid` in KiB (VmRSS), or -1.
int64_t RssKib(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    int64_t kib = 0;
    if (absl::StartsWith(line, "VmRSS:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(line.substr(6), "kB")),
                         &kib)) {
      return kib;
    }
  }
  return -1;
}

TEST_F(LifecycleTest, SoakOfSessionsGroupsWatchesAndBadRequestsLeavesNothingBehind) {
  ASSERT_TRUE(client_->GetGroup("warmup", init_method_).ok());
  ASSERT_TRUE(WaitUntil([&] { return client_->ListGroups()->empty(); }));
  const int threads = CountThreadsOutsideGrpcPools(daemon_->pid());
  const int fds = CountFds(daemon_->pid());
  [[maybe_unused]] const int64_t rss = RssKib(daemon_->pid());  // unused under ASan

  // Eight clients for a bounded time: each round a new process-like session joins a group,
  // watches it, sends requests the daemon must refuse, and goes away without leaving.
  const absl::Time end = absl::Now() + absl::Seconds(8);
  std::vector<std::thread> clients;
  std::atomic<int> rounds{0};
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      for (int round = 0; absl::Now() < end; ++round) {
        auto client = Client::Connect(socket_);
        if (!client.ok()) continue;
        JoinOptions options;
        options.group = absl::StrCat("soak", c % 3);
        options.name = absl::StrCat("c", c, "-", round);
        options.init_method = init_method_;
        EXPECT_TRUE((*client)->Join(options).ok());
        std::unique_ptr<GroupWatch> watch = (*client)->Watch(options.group);
        v1::GroupEvent event;
        EXPECT_TRUE(watch->Next(&event));
        EXPECT_FALSE((*client)->GetGroup("bad", "tcp://no-port").ok());
        EXPECT_FALSE((*client)->Store().Set(std::string(1 << 20, 'k'), "v").ok());
        EXPECT_FALSE((*client)->Store().Set("tpd/node/x", "1:1").ok());
        options.world_size = int64_t{1} << 40;
        options.rank = 0;
        options.group = "huge";
        EXPECT_FALSE((*client)->Join(options).ok());
        watch->Cancel();
        while (watch->Next(&event)) {
        }
        (void)watch->Finish();  // CANCELLED: this client ended it
        ++rounds;
      }
    });
  }
  for (std::thread& thread : clients) thread.join();
  EXPECT_GT(rounds.load(), 8);
  EXPECT_TRUE(client_->Serving().value_or(false));

  ASSERT_TRUE(WaitUntil([&] { return client_->ListGroups()->empty(); }))
      << "groups of ended sessions were never released";
  EXPECT_TRUE(WaitUntil([&] { return CountThreadsOutsideGrpcPools(daemon_->pid()) <= threads; }))
      << "threads: " << CountThreadsOutsideGrpcPools(daemon_->pid()) << " after, " << threads
      << " before: " << DescribeThreadsAndMemfds(daemon_->pid());
  EXPECT_TRUE(WaitUntil([&] { return CountFds(daemon_->pid()) <= fds + 2; }))
      << "fds: " << CountFds(daemon_->pid()) << " after, " << fds << " before";
#if !defined(__SANITIZE_ADDRESS__)
  // The allocator keeps some freed memory; a leak of every round would show far above this.
  // (Not under AddressSanitizer, whose quarantine keeps freed memory on purpose; it reports
  // leaks itself.)
  EXPECT_LT(RssKib(daemon_->pid()) - rss, 32 * 1024)
      << "RSS " << RssKib(daemon_->pid()) << " KiB after, " << rss << " before";
#endif
  // The groups' stores are the daemon's own over its peer port (tcp://), where a cancelled
  // wait ends when the cancel arrives, after the group is gone.
  EXPECT_TRUE(WaitUntil([&] { return client_->Status()->store().waiters() == 0; }))
      << "store waits left behind: " << client_->Status()->store().waiters();
}

}  // namespace
}  // namespace tpd
