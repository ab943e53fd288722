// Unit tests of the client's trust in the socket it connects to.

#include "client/socket_path.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uid_t kOtherUid = 65534;  // nobody

class SocketOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tpd-client-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr) << std::strerror(errno);
    root_ = pattern;
    socket_ = absl::StrCat(root_, "/tpd.sock");
    // A listening socket, as some other program would leave there.
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(listen(fd_, 4), 0);
  }
  void TearDown() override {
    close(fd_);
    std::filesystem::remove_all(root_);
  }

  std::string root_;
  std::string socket_;
  int fd_ = -1;
};

TEST_F(SocketOwnerTest, OwnSocketIsTrusted) { EXPECT_TRUE(CheckSocketOwner(socket_).ok()); }

TEST_F(SocketOwnerTest, MissingSocketIsNotFound) {
  EXPECT_EQ(CheckSocketOwner(absl::StrCat(root_, "/none.sock")).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SocketOwnerTest, AnotherUsersSocketIsRefusedNamingSocketAndOwner) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a socket away";
  ASSERT_EQ(chown(socket_.c_str(), kOtherUid, kOtherUid), 0);
  absl::Status status = CheckSocketOwner(socket_);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(socket_), HasSubstr(absl::StrCat("uid ", kOtherUid))));
  // Connect refuses it before talking to whatever listens there.
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket_);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(client.status().message(), HasSubstr(socket_));
}

TEST_F(SocketOwnerTest, DataSocketOfTheDaemonsUserIsTrustedAnotherUsersIsNot) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give sockets away";
  const std::string data = absl::StrCat(socket_, ".data");
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, data.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_TRUE(CheckDataSocketOwner(data, socket_).ok());
  // Another user's data socket beside a socket this user trusts: refused, naming both.
  ASSERT_EQ(chown(data.c_str(), kOtherUid, kOtherUid), 0);
  absl::Status status = CheckDataSocketOwner(data, socket_);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(data), HasSubstr(absl::StrCat("uid ", kOtherUid))));
  EXPECT_EQ(CheckDataSocketOwner(absl::StrCat(root_, "/none"), socket_).code(),
            absl::StatusCode::kNotFound);
  close(fd);
}

}  // namespace
}  // namespace tpd
