// Groups do not outlive their use: a daemon asked about many groups follows at most
// group.max_groups at once (RESOURCE_EXHAUSTED past it, and it keeps serving), releases each
// once nothing local uses it, and its threads and file descriptors return to where they were.

#include <dirent.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WaitUntil;

// Entries of /proc/<pid>/<what> ("task": threads, "fd": open files).
int CountEntries(pid_t pid, const char* what) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/", what).c_str());
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

class LifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = absl::StrCat(dir_.path(), "/tpd.sock");
    const std::string config = dir_.WriteFile(
        "tpd.toml", absl::StrCat("[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"secret\"\n",
                                 "heartbeat_interval_ms = 50\n",
                                 "[group]\nmax_groups = 4\nmax_groups_per_session = 2\n",
                                 "idle_group_release_ms = 300\n"));
    auto daemon = DaemonProcess::Start(socket_, {"--config", config});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    auto client = Client::Connect(socket_);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    init_method_ = absl::StrCat("tcp://", client_->Status()->peer_address());
  }

  TempDir dir_;
  std::string socket_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::string init_method_;
};

TEST_F(LifecycleTest, GroupsAreCappedAndReleasedAndResourcesReturnToBaseline) {
  // Warm up gRPC's own threads and the peer connection once before taking the baseline.
  ASSERT_TRUE(client_->GetGroup("warmup", init_method_).ok());
  ASSERT_TRUE(WaitUntil([&] { return client_->ListGroups()->empty(); }))
      << "the warm-up group was never released";
  const int threads = CountEntries(daemon_->pid(), "task");
  const int fds = CountEntries(daemon_->pid(), "fd");
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
  // Workers and heartbeat threads stop, store connections close (gRPC may keep a spare
  // thread or two of its own, hence the small allowance).
  EXPECT_TRUE(WaitUntil([&] { return CountEntries(daemon_->pid(), "task") <= threads + 2; }))
      << "threads: " << CountEntries(daemon_->pid(), "task") << " after, " << threads << " before";
  EXPECT_TRUE(WaitUntil([&] { return CountEntries(daemon_->pid(), "fd") <= fds + 2; }))
      << "fds: " << CountEntries(daemon_->pid(), "fd") << " after, " << fds << " before";
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

}  // namespace
}  // namespace tpd
