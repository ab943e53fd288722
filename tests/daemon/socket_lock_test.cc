// Unit tests of SocketLock's trust in the socket's directory and lock file: what another
// local user could plant there before the daemon starts.

#include "daemon/socket_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/socket_path.h"

namespace tpd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// An unprivileged uid to give files away to (nobody).
constexpr uid_t kOtherUid = 65534;

std::string ReadAll(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 07777;
}

class SocketLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Under /tmp: unix socket paths must stay short.
    char pattern[] = "/tmp/tpd-lock-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr) << std::strerror(errno);
    root_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string root_;
};

TEST_F(SocketLockTest, MissingDirectoryIsCreatedAndTheLockTaken) {
  const std::string socket = absl::StrCat(root_, "/run/tpd.sock");
  absl::StatusOr<std::unique_ptr<SocketLock>> lock = SocketLock::Acquire(socket);
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_EQ(ModeOf(absl::StrCat(root_, "/run")), 0755);
  EXPECT_EQ(ReadAll(absl::StrCat(socket, ".lock")), absl::StrCat(getpid(), "\n"));
  // A second daemon on the same socket is refused.
  EXPECT_EQ(SocketLock::Acquire(socket).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SocketLockTest, PerUserDirectoryIsCreatedPrivate) {
  const char* old = std::getenv("XDG_RUNTIME_DIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("XDG_RUNTIME_DIR", root_.c_str(), 1);
  EXPECT_EQ(PerUserSocketDir(), absl::StrCat(root_, "/tpd"));
  EXPECT_EQ(PerUserSocketPath(), absl::StrCat(root_, "/tpd/tpd.sock"));
  absl::StatusOr<std::unique_ptr<SocketLock>> lock = SocketLock::Acquire(PerUserSocketPath());
  EXPECT_TRUE(lock.ok()) << lock.status();
  EXPECT_EQ(ModeOf(PerUserSocketDir()), 0700);
  if (old != nullptr) {
    setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
  } else {
    unsetenv("XDG_RUNTIME_DIR");
  }
}

TEST_F(SocketLockTest, PerUserDirectoryWithoutXdgRuntimeDirIsTmpTpdUid) {
  const char* old = std::getenv("XDG_RUNTIME_DIR");
  const std::string saved = old != nullptr ? old : "";
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(PerUserSocketDir(), absl::StrCat("/tmp/tpd-", geteuid()));
  if (old != nullptr) setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
}

TEST_F(SocketLockTest, DirectoryOthersMayWriteIsRefusedNamingOwnerAndMode) {
  for (mode_t mode : {mode_t{0777}, mode_t{0770}, mode_t{0722}, mode_t{01777}}) {
    const std::string dir = absl::StrCat(root_, "/open", mode);
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
    ASSERT_EQ(chmod(dir.c_str(), mode), 0);
    absl::StatusOr<std::unique_ptr<SocketLock>> lock =
        SocketLock::Acquire(absl::StrCat(dir, "/tpd.sock"));
    EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition) << mode;
    EXPECT_THAT(lock.status().message(),
                AllOf(HasSubstr(dir), HasSubstr(absl::StrCat("uid ", getuid())),
                      HasSubstr("group or others may write it")))
        << mode;
    // Nothing was created in it.
    EXPECT_FALSE(std::filesystem::exists(absl::StrCat(dir, "/tpd.sock.lock")));
  }
}

TEST_F(SocketLockTest, DirectoryOwnedByAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  // As another user would have pre-created /tmp/tpd-<uid>.
  const std::string dir = absl::StrCat(root_, "/squatted");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chown(dir.c_str(), kOtherUid, kOtherUid), 0);
  absl::StatusOr<std::unique_ptr<SocketLock>> lock =
      SocketLock::Acquire(absl::StrCat(dir, "/tpd.sock"));
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lock.status().message(),
              AllOf(HasSubstr(dir), HasSubstr(absl::StrCat("uid ", kOtherUid)),
                    HasSubstr("mode 0700"), HasSubstr("belongs to another user")));
}

TEST_F(SocketLockTest, DirectoryUnderAnotherUsersDirectoryIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  // As with /tmp/tpd-<uid> pre-created by someone else, with our directory made inside it:
  // its owner could rename ours away.
  const std::string theirs = absl::StrCat(root_, "/theirs");
  ASSERT_EQ(mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(chown(theirs.c_str(), kOtherUid, kOtherUid), 0);
  const std::string ours = absl::StrCat(theirs, "/tpd");
  ASSERT_EQ(mkdir(ours.c_str(), 0700), 0);
  absl::StatusOr<std::unique_ptr<SocketLock>> lock =
      SocketLock::Acquire(absl::StrCat(ours, "/tpd.sock"));
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lock.status().message(),
              AllOf(HasSubstr(theirs), HasSubstr(absl::StrCat("uid ", kOtherUid))));
}

TEST_F(SocketLockTest, WorldWritableParentWithoutStickyBitIsRefusedWithItAccepted) {
  const std::string open_dir = absl::StrCat(root_, "/open");
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  const std::string ours = absl::StrCat(open_dir, "/tpd");
  ASSERT_EQ(mkdir(ours.c_str(), 0700), 0);
  EXPECT_EQ(SocketLock::Acquire(absl::StrCat(ours, "/tpd.sock")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Sticky, like /tmp: others cannot rename our directory.
  ASSERT_EQ(chmod(open_dir.c_str(), 01777), 0);
  absl::StatusOr<std::unique_ptr<SocketLock>> lock =
      SocketLock::Acquire(absl::StrCat(ours, "/tpd.sock"));
  EXPECT_TRUE(lock.ok()) << lock.status();
}

TEST_F(SocketLockTest, SymlinkedDirectoryIsRefused) {
  const std::string real = absl::StrCat(root_, "/real");
  const std::string link = absl::StrCat(root_, "/link");
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  absl::StatusOr<std::unique_ptr<SocketLock>> lock =
      SocketLock::Acquire(absl::StrCat(link, "/tpd.sock"));
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lock.status().message(), AllOf(HasSubstr(link), HasSubstr("symbolic link")));
}

TEST_F(SocketLockTest, LockFilePlantedAsASymlinkIsRefusedAndItsTargetUntouched) {
  const std::string victim = absl::StrCat(root_, "/victim");
  {
    std::ofstream file(victim);
    file << "precious\n";
  }
  const std::string dir = absl::StrCat(root_, "/run");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string socket = absl::StrCat(dir, "/tpd.sock");
  ASSERT_EQ(symlink(victim.c_str(), absl::StrCat(socket, ".lock").c_str()), 0);
  absl::StatusOr<std::unique_ptr<SocketLock>> lock = SocketLock::Acquire(socket);
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lock.status().message(), HasSubstr("symbolic link"));
  EXPECT_EQ(ReadAll(victim), "precious\n");
}

TEST_F(SocketLockTest, LockFilePlantedAsAFifoIsRefusedWithoutHanging) {
  const std::string socket = absl::StrCat(root_, "/tpd.sock");
  ASSERT_EQ(mkfifo(absl::StrCat(socket, ".lock").c_str(), 0600), 0);
  absl::StatusOr<std::unique_ptr<SocketLock>> lock = SocketLock::Acquire(socket);
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lock.status().message(), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace tpd
