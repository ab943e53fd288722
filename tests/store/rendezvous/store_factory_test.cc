// The rendezvous store factory: each scheme opens its own backend, and tcp:// hosts and etcd://
// endpoints are dialed only inside the allowed networks.

#include "store/rendezvous/store_factory.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd::store {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

InitMethod Parse(const std::string& url) {
  absl::StatusOr<InitMethod> method = ParseInitMethod(url, std::nullopt, std::nullopt, {});
  EXPECT_TRUE(method.ok()) << url << ": " << method.status();
  return *method;
}

RendezvousOptions Options(const std::vector<std::string>& networks) {
  RendezvousOptions options;
  options.remote.dial_networks = *NetworkList::Parse(networks);
  options.remote.store.token = "t";
  return options;
}

TEST(StoreFactoryTest, NamesOneStorePerAddressOrPath) {
  EXPECT_EQ(RendezvousStoreName(Parse("tcp://10.0.0.1:29400")), "tcp://10.0.0.1:29400");
  EXPECT_EQ(RendezvousStoreName(Parse("tcp://[::1]:29400")), "tcp://[::1]:29400");
  EXPECT_EQ(RendezvousStoreName(Parse("file:///tmp/x")), "file:///tmp/x");
  EXPECT_EQ(RendezvousStoreName(Parse("etcd://a:2379,[::1]:2379/jobs")),
            "etcd://a:2379,[::1]:2379/jobs");
}

TEST(StoreFactoryTest, EtcdEndpointOutsideTheDialNetworksIsPermissionDenied) {
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenRendezvousStore(Parse("etcd://127.0.0.1:2379,10.1.2.3:2379/p"), Options({"127.0.0.0/8"}));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(store.status().message(),
              AllOf(HasSubstr("10.1.2.3"), HasSubstr("[peer] dial_networks")));
}

TEST(StoreFactoryTest, EtcdInsideOpensAnEtcdStoreLazily) {
  // Nothing listens there: opening succeeds, the first call is UNAVAILABLE naming both.
  RendezvousOptions options = Options({"127.0.0.0/8"});
  options.etcd.connect_timeout = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenRendezvousStore(Parse("etcd://127.0.0.1:1,localhost:2/p"), options);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::Status status = (*store)->Set("k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("127.0.0.1:1"), HasSubstr("127.0.0.1:2")));
}

TEST(StoreFactoryTest, TcpOutsideTheDialNetworksIsPermissionDenied) {
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenRendezvousStore(Parse("tcp://127.0.0.1:29400"), Options({"10.0.0.0/8"}));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(store.status().message(),
              AllOf(HasSubstr("127.0.0.1"), HasSubstr("[peer] dial_networks")));
}

TEST(StoreFactoryTest, TcpInsideOpensARemoteStoreLazily) {
  // Nothing listens there: opening succeeds, the first call is UNAVAILABLE.
  RendezvousOptions options = Options({"127.0.0.0/8"});
  options.remote.store.call_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenRendezvousStore(Parse("tcp://127.0.0.1:1"), options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Set("k", "v").code(), absl::StatusCode::kUnavailable);
}

TEST(StoreFactoryTest, FileOpensAFileStoreUnderTheAllowedDirectories) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const std::string path = absl::StrCat(dir, "/factory-", getpid());
  RendezvousOptions options = Options({});
  options.file_dirs = {dir};
  // Only a Join creates the file.
  EXPECT_EQ(OpenRendezvousStore(Parse(absl::StrCat("file://", path)), options).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenRendezvousStore(Parse(absl::StrCat("file://", path)), options, FileCreation::kCreate);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v").ok());
  unlink(path.c_str());
  // Outside them: refused, naming the setting.
  options.file_dirs = {absl::StrCat(dir, "/elsewhere")};
  absl::StatusOr<std::unique_ptr<Store>> outside =
      OpenRendezvousStore(Parse(absl::StrCat("file://", path)), options, FileCreation::kCreate);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(outside.status().message(), HasSubstr("group.file_rendezvous_dirs"));
}

}  // namespace
}  // namespace tpd::store
