// LoadEtcdCredentials: the [etcd] files read into EtcdCredentials; a password file open to
// every user refused; every error naming the setting and never the password.

#include "store/etcd/etcd_credentials.h"

#include <sys/stat.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"

namespace tpd::store {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kPem[] = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

TEST(EtcdCredentialsTest, ReadsThePasswordLessItsNewlineAndThePemFiles) {
  ::tpd::testing::TempDir dir;
  const std::string password = dir.WriteFile("password", "s3cret\n");
  ASSERT_EQ(chmod(password.c_str(), 0600), 0);
  EtcdCredentialFiles files;
  files.user = "tpd";
  files.password_file = password;
  files.ca_file = dir.WriteFile("ca.pem", kPem);
  files.cert_file = dir.WriteFile("cert.pem", kPem);
  files.key_file = dir.WriteFile("key.pem", "-----BEGIN PRIVATE KEY-----\n");
  absl::StatusOr<EtcdCredentials> credentials = LoadEtcdCredentials(files);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->user, "tpd");
  EXPECT_EQ(credentials->password, "s3cret");
  EXPECT_EQ(credentials->root_certs, kPem);
  EXPECT_EQ(credentials->cert_chain, kPem);
  EXPECT_TRUE(credentials->tls());

  // Group-readable is the operator's choice (a tpd group); nothing set is no credentials.
  ASSERT_EQ(chmod(password.c_str(), 0640), 0);
  EXPECT_TRUE(LoadEtcdCredentials(files).ok());
  absl::StatusOr<EtcdCredentials> none = LoadEtcdCredentials(EtcdCredentialFiles());
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(EtcdCredentialsTest, APasswordFileEveryUserCanReadIsRefusedWithoutEchoingIt) {
  ::tpd::testing::TempDir dir;
  const std::string password = dir.WriteFile("password", "s3cret");
  ASSERT_EQ(chmod(password.c_str(), 0644), 0);
  EtcdCredentialFiles files;
  files.user = "tpd";
  files.password_file = password;
  absl::Status status = LoadEtcdCredentials(files).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("etcd.password_file"), HasSubstr("0644"),
                                      HasSubstr("chmod 600"), Not(HasSubstr("s3cret"))));
}

TEST(EtcdCredentialsTest, BadFilesNameTheSetting) {
  ::tpd::testing::TempDir dir;
  const std::string empty = dir.WriteFile("empty", "\n");
  ASSERT_EQ(chmod(empty.c_str(), 0600), 0);
  struct Case {
    EtcdCredentialFiles files;
    const char* message;
  };
  const Case cases[] = {
      {{"tpd", "/nonexistent/pw", "", "", ""}, "etcd.password_file: cannot read"},
      {{"tpd", empty, "", "", ""}, "etcd.password_file: \""},
      {{"tpd", dir.path(), "", "", ""}, "is not a regular file"},
      {{"", "", dir.WriteFile("ca.txt", "not pem"), "", ""}, "etcd.ca_file: "},
      {{"", "", "", "/nonexistent/c", "/nonexistent/k"}, "etcd.cert_file: cannot read"},
      {{"tpd", "", "", "", ""}, "etcd.password_file must be set with etcd.user"},
      {{"", "", "", "", dir.WriteFile("k.pem", kPem)}, "etcd.cert_file must be set"},
  };
  for (const Case& c : cases) {
    absl::Status status = LoadEtcdCredentials(c.files).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace tpd::store
