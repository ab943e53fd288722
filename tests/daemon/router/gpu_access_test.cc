#include "daemon/router/gpu_access.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kNobody = 65534;

// A directory of fake NVIDIA device nodes (plain files: only their modes and owners matter).
class GpuAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tpd-gpu-access-XXXXXX";
    dir_ = mkdtemp(pattern);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Node(const std::string& name, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << "";
    chmod(path.c_str(), mode);
  }

  std::string dir_;
};

TEST_F(GpuAccessTest, ANodeWithoutDeviceNodesHasNothingToGuard) {
  EXPECT_TRUE(CheckGpuAccess(kNobody, dir_).ok());
  EXPECT_TRUE(CheckGpuAccess(kNobody, dir_ + "/missing").ok());
}

TEST_F(GpuAccessTest, AUserOutsideTheDevicesGroupIsRefusedNamingTheNode) {
  if (geteuid() != 0) GTEST_SKIP() << "the fake nodes must belong to root to judge another uid";
  Node("nvidiactl", 0660);
  Node("nvidia0", 0660);
  absl::Status refused = CheckGpuAccess(kNobody, dir_);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("uid 65534 may not open the node's GPUs itself"));
  EXPECT_THAT(refused.message(), HasSubstr("nvidia"));
  EXPECT_THAT(refused.message(), HasSubstr("mode 0660, owner 0"));
  EXPECT_TRUE(CheckGpuAccess(0, dir_).ok()) << "root may always";
}

TEST_F(GpuAccessTest, NodesOpenToEveryoneAdmitEveryone) {
  Node("nvidiactl", 0666);
  Node("nvidia0", 0666);
  Node("nvidia1", 0666);
  EXPECT_TRUE(CheckGpuAccess(kNobody, dir_).ok());
}

TEST_F(GpuAccessTest, EveryDeviceNodeCountsAndOthersAreIgnored) {
  if (geteuid() != 0) GTEST_SKIP() << "the fake nodes must belong to root to judge another uid";
  Node("nvidiactl", 0666);
  Node("nvidia0", 0666);
  Node("nvidia1", 0600);     // one GPU closed: the user may not open every GPU
  Node("nvidia-uvm", 0600);  // not a GPU node: ignored
  absl::Status refused = CheckGpuAccess(kNobody, dir_);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr("nvidia1"));
  chmod((dir_ + "/nvidia1").c_str(), 0666);
  EXPECT_TRUE(CheckGpuAccess(kNobody, dir_).ok()) << "nvidia-uvm is not judged";
}

TEST_F(GpuAccessTest, TheOwnerOfTheNodesMayOpenThem) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give the nodes to another uid";
  Node("nvidiactl", 0600);
  ASSERT_EQ(chown((dir_ + "/nvidiactl").c_str(), kNobody, kNobody), 0);
  EXPECT_TRUE(CheckGpuAccess(kNobody, dir_).ok());
  EXPECT_FALSE(CheckGpuAccess(65533, dir_).ok());
}

}  // namespace
}  // namespace tpd
