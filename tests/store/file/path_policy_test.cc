// Unit tests of the file:// rendezvous path policy: which paths a client may make the daemon
// open or create, over a real file system (a fresh directory per test).

#include "store/file/path_policy.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/file/file_store.h"

namespace tpd::store {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

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

void WriteAll(const std::string& path, const std::string& text) {
  std::ofstream file(path);
  file << text;
}

class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/policy-XXXXXX");
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = pattern;
    allowed_ = absl::StrCat(root_, "/allowed");
    outside_ = absl::StrCat(root_, "/outside");
    ASSERT_EQ(mkdir(allowed_.c_str(), 0700), 0);
    ASSERT_EQ(mkdir(outside_.c_str(), 0700), 0);
    secret_ = absl::StrCat(outside_, "/secret");
    WriteAll(secret_, "root-only text\n");
  }

  void TearDown() override { std::filesystem::remove_all(root_); }

  absl::StatusOr<int> Open(const std::string& path, FileCreation creation = FileCreation::kCreate) {
    absl::StatusOr<int> fd = OpenRendezvousFile({allowed_}, path, creation);
    if (fd.ok()) fds_.push_back(*fd);
    return fd;
  }

  // The secret file outside is untouched.
  void ExpectSecretIntact() { EXPECT_EQ(ReadAll(secret_), "root-only text\n"); }

  ~PathPolicyTest() override {
    for (int fd : fds_) close(fd);
  }

  std::string root_;
  std::string allowed_;
  std::string outside_;
  std::string secret_;
  std::vector<int> fds_;
};

TEST_F(PathPolicyTest, JoinCreatesARegularFileUnderAnAllowedDirectoryWithMode0600) {
  const std::string path = absl::StrCat(allowed_, "/job1");
  absl::StatusOr<int> fd = Open(path);
  ASSERT_TRUE(fd.ok()) << fd.status();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600);
  // The descriptor is read-write and blocking.
  EXPECT_EQ(fcntl(*fd, F_GETFL) & (O_ACCMODE | O_NONBLOCK), O_RDWR);
}

TEST_F(PathPolicyTest, ExistingFileInASubdirectoryOpensWithoutCreation) {
  ASSERT_EQ(mkdir(absl::StrCat(allowed_, "/jobs").c_str(), 0700), 0);
  const std::string path = absl::StrCat(allowed_, "/jobs/j1");
  WriteAll(path, "");
  EXPECT_TRUE(Open(path, FileCreation::kMustExist).ok());
}

TEST_F(PathPolicyTest, MustExistAnswersNotFoundAndCreatesNothing) {
  const std::string path = absl::StrCat(allowed_, "/typo");
  absl::StatusOr<int> fd = Open(path, FileCreation::kMustExist);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(fd.status().message(), AllOf(HasSubstr(path), HasSubstr("only Join creates")));
  EXPECT_FALSE(Exists(path));
}

TEST_F(PathPolicyTest, MissingParentDirectoryIsNotFoundAndNothingIsCreated) {
  const std::string path = absl::StrCat(allowed_, "/no-dir/file");
  EXPECT_EQ(Open(path).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Exists(absl::StrCat(allowed_, "/no-dir")));
}

TEST_F(PathPolicyTest, PathOutsideTheAllowedDirectoriesIsPermissionDeniedNamingTheSetting) {
  for (const std::string& path :
       {secret_, std::string("/etc/passwd"), absl::StrCat(allowed_, "x/file"), allowed_,
        absl::StrCat(allowed_, "/")}) {
    absl::StatusOr<int> fd = Open(path);
    EXPECT_FALSE(fd.ok()) << path;
    if (path == allowed_ || path == absl::StrCat(allowed_, "/")) continue;
    EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(
        fd.status().message(),
        AllOf(HasSubstr(path), HasSubstr("group.file_rendezvous_dirs"), HasSubstr(allowed_)))
        << path;
  }
  EXPECT_FALSE(Exists(absl::StrCat(allowed_, "x")));
  ExpectSecretIntact();
}

TEST_F(PathPolicyTest, EmptyAllowedListRefusesEveryPath) {
  absl::StatusOr<int> fd =
      OpenRendezvousFile({}, absl::StrCat(allowed_, "/f"), FileCreation::kCreate);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(fd.status().message(), HasSubstr("file:// rendezvous is off"));
}

TEST_F(PathPolicyTest, DotDotAndNonCanonicalPathsAreInvalidArgument) {
  for (const std::string& path : {
           absl::StrCat(allowed_, "/../outside/secret"),
           absl::StrCat(allowed_, "/./f"),
           absl::StrCat(allowed_, "//f"),
           absl::StrCat(allowed_, "/sub/"),
           absl::StrCat(allowed_, "/a/.."),
       }) {
    absl::StatusOr<int> fd = Open(path);
    EXPECT_EQ(fd.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(fd.status().message(), HasSubstr("file:// rendezvous path")) << path;
  }
  ExpectSecretIntact();
}

TEST_F(PathPolicyTest, NulInThePathIsInvalidArgument) {
  const std::string path = absl::StrCat(allowed_, "/f", std::string(1, '\0'), "x");
  EXPECT_EQ(Open(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PathPolicyTest, SymlinkAsTheFileIsRefusedAndItsTargetUntouched) {
  const std::string link = absl::StrCat(allowed_, "/planted");
  ASSERT_EQ(symlink(secret_.c_str(), link.c_str()), 0);
  for (FileCreation creation : {FileCreation::kCreate, FileCreation::kMustExist}) {
    absl::StatusOr<int> fd = Open(link, creation);
    EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(fd.status().message(), AllOf(HasSubstr("symbolic link"), HasSubstr(link)));
  }
  // A dangling link must not create its target either.
  const std::string dangling = absl::StrCat(allowed_, "/dangling");
  const std::string target = absl::StrCat(outside_, "/created-through-link");
  ASSERT_EQ(symlink(target.c_str(), dangling.c_str()), 0);
  EXPECT_EQ(Open(dangling).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(Exists(target));
  ExpectSecretIntact();
}

TEST_F(PathPolicyTest, SymlinkedDirectoryBelowTheAllowedOneIsRefused) {
  const std::string link = absl::StrCat(allowed_, "/sub");
  ASSERT_EQ(symlink(outside_.c_str(), link.c_str()), 0);
  for (const std::string& path : {absl::StrCat(link, "/secret"), absl::StrCat(link, "/new")}) {
    absl::StatusOr<int> fd = Open(path);
    EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(fd.status().message(), HasSubstr("symbolic link")) << path;
  }
  EXPECT_FALSE(Exists(absl::StrCat(outside_, "/new")));
  ExpectSecretIntact();
}

TEST_F(PathPolicyTest, TheAllowedDirectoryItselfMayBeASymlink) {
  // The operator's own choice, e.g. /shared -> /mnt/nfs.
  const std::string alias = absl::StrCat(root_, "/alias");
  ASSERT_EQ(symlink(allowed_.c_str(), alias.c_str()), 0);
  absl::StatusOr<int> fd =
      OpenRendezvousFile({alias}, absl::StrCat(alias, "/f"), FileCreation::kCreate);
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  EXPECT_TRUE(Exists(absl::StrCat(allowed_, "/f")));
}

TEST_F(PathPolicyTest, TheMostSpecificAllowedDirectoryDecides) {
  // /allowed/nfs is allowed on its own, and is a link the operator set up: it is followed.
  const std::string nfs = absl::StrCat(allowed_, "/nfs");
  ASSERT_EQ(symlink(outside_.c_str(), nfs.c_str()), 0);
  absl::StatusOr<int> fd =
      OpenRendezvousFile({allowed_, nfs}, absl::StrCat(nfs, "/job"), FileCreation::kCreate);
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  EXPECT_TRUE(Exists(absl::StrCat(outside_, "/job")));
}

TEST_F(PathPolicyTest, FifoSocketDirectoryAndDeviceAreRefused) {
  const std::string fifo = absl::StrCat(allowed_, "/fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string dir = absl::StrCat(allowed_, "/dir");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string sock = absl::StrCat(allowed_, "/sock");
  const int s = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, sock.c_str(), sizeof(addr.sun_path) - 1);
  const bool have_socket = sock.size() < sizeof(addr.sun_path) &&
                           bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(s);
  std::vector<std::string> paths = {fifo, dir};
  if (have_socket) paths.push_back(sock);
  const std::string device = absl::StrCat(allowed_, "/null");
  if (mknod(device.c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0) paths.push_back(device);
  for (const std::string& path : paths) {
    for (FileCreation creation : {FileCreation::kCreate, FileCreation::kMustExist}) {
      absl::StatusOr<int> fd = Open(path, creation);
      EXPECT_FALSE(fd.ok()) << path;
      if (path == dir) continue;  // EISDIR from open() itself
      EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied) << path;
      EXPECT_THAT(fd.status().message(), HasSubstr("not a regular file")) << path;
    }
  }
}

TEST_F(PathPolicyTest, HardLinkToAFileElsewhereIsRefused) {
  const std::string hard = absl::StrCat(allowed_, "/hard");
  ASSERT_EQ(::link(secret_.c_str(), hard.c_str()), 0);
  absl::StatusOr<int> fd = Open(hard);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(fd.status().message(), HasSubstr("hard links"));
  ExpectSecretIntact();
}

// The walk used where openat2 is missing refuses the same links as openat2 does.
class OpenBeneathTest : public PathPolicyTest, public ::testing::WithParamInterface<bool> {};

TEST_P(OpenBeneathTest, RegularFileOpensAndLinksAreRefused) {
  const bool use_openat2 = GetParam();
  ASSERT_EQ(mkdir(absl::StrCat(allowed_, "/d").c_str(), 0700), 0);
  ASSERT_EQ(symlink(outside_.c_str(), absl::StrCat(allowed_, "/dirlink").c_str()), 0);
  ASSERT_EQ(symlink(secret_.c_str(), absl::StrCat(allowed_, "/d/filelink").c_str()), 0);
  const int dir_fd = open(allowed_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  const int flags = O_RDWR | O_CREAT | O_CLOEXEC;

  const int fd = path_policy_internal::OpenBeneath(dir_fd, "d/new", flags, use_openat2);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  if (fd >= 0) close(fd);
  EXPECT_TRUE(Exists(absl::StrCat(allowed_, "/d/new")));

  errno = 0;
  EXPECT_EQ(path_policy_internal::OpenBeneath(dir_fd, "dirlink/secret", flags, use_openat2), -1);
  EXPECT_EQ(errno, ELOOP);
  errno = 0;
  EXPECT_EQ(path_policy_internal::OpenBeneath(dir_fd, "dirlink/new", flags, use_openat2), -1);
  EXPECT_EQ(errno, ELOOP);
  errno = 0;
  EXPECT_EQ(path_policy_internal::OpenBeneath(dir_fd, "d/filelink", flags, use_openat2), -1);
  EXPECT_EQ(errno, ELOOP);
  errno = 0;
  EXPECT_EQ(path_policy_internal::OpenBeneath(dir_fd, "d/new/x", flags, use_openat2), -1);
  EXPECT_EQ(errno, ENOTDIR);
  close(dir_fd);
  EXPECT_FALSE(Exists(absl::StrCat(outside_, "/new")));
  ExpectSecretIntact();
}

INSTANTIATE_TEST_SUITE_P(OpenAt2AndWalk, OpenBeneathTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "openat2" : "walk";
                         });

TEST(RendezvousDirTest, ValidateAcceptsCanonicalAbsoluteDirectories) {
  for (const char* dir : {"/var/lib/tpd/rendezvous", "/shared/rdzv", "/a"}) {
    EXPECT_TRUE(ValidateRendezvousDir(dir).ok()) << dir;
  }
}

TEST(RendezvousDirTest, ValidateRefusesRelativeRootSystemAndNonCanonicalDirectories) {
  for (const char* dir : {"", "relative/dir", "/", "/proc", "/proc/self", "/sys/kernel", "/dev",
                          "/dev/shm", "/a/../b", "/a/./b", "/a//b", "/a/"}) {
    absl::Status status = ValidateRendezvousDir(dir);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << dir;
    EXPECT_THAT(status.message(), HasSubstr("group.file_rendezvous_dirs")) << dir;
  }
  // Not /dev itself, a directory merely named like it.
  EXPECT_TRUE(ValidateRendezvousDir("/devices").ok());
}

TEST_F(PathPolicyTest, CreateRendezvousDirMakesAPrivateDirectoryAndIsIdempotent) {
  const std::string dir = absl::StrCat(root_, "/state/tpd/rendezvous");
  ASSERT_TRUE(CreateRendezvousDir(dir).ok());
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700);
  EXPECT_TRUE(CreateRendezvousDir(dir).ok());
  WriteAll(absl::StrCat(root_, "/plainfile"), "");
  EXPECT_FALSE(CreateRendezvousDir(absl::StrCat(root_, "/plainfile")).ok());
}

TEST_F(PathPolicyTest, FileStoreOpenUnderServesTheStoreAndRefusesOutsidePaths) {
  const std::string path = absl::StrCat(allowed_, "/store");
  absl::StatusOr<std::unique_ptr<FileStore>> missing =
      FileStore::OpenUnder({allowed_}, path, FileCreation::kMustExist);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Exists(path));

  absl::StatusOr<std::unique_ptr<FileStore>> store =
      FileStore::OpenUnder({allowed_}, path, FileCreation::kCreate);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v").ok());
  absl::StatusOr<std::unique_ptr<FileStore>> again =
      FileStore::OpenUnder({allowed_}, path, FileCreation::kMustExist);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*(*again)->Check({"k"}));

  EXPECT_EQ(FileStore::OpenUnder({allowed_}, secret_, FileCreation::kCreate).status().code(),
            absl::StatusCode::kPermissionDenied);
  ExpectSecretIntact();
}

}  // namespace
}  // namespace tpd::store
