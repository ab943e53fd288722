// EtcdStore against a real etcd with authentication on (users and roles made through etcd's
// Auth API, as etcdctl does): the conformance suite as a user whose role grants readwrite on
// the test prefix; a wrong password, no user and a key outside the role refused, naming the
// endpoint and never the password; an expired simple token and a JWT token older than an
// auth change renewed by authenticating again, for calls and for the watch stream alike. Skips,
// saying why, without etcd.

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "store/etcd/etcd_store.h"
#include "tests/store/etcd/etcd_cluster.h"
#include "tests/store/etcd/shared_cluster.h"
#include "tests/store/store_conformance.h"
#include "tests/testing/daemon_process.h"

namespace tpd::store {
namespace {

using ::testing::AllOf;
using testing::EtcdBinary;
using testing::EtcdCluster;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kRootPassword[] = "root-secret-0";
constexpr char kUser[] = "tpd";
constexpr char kPassword[] = "tpd-secret-1";
// The role of kUser grants readwrite on every key under this (the test stores' prefixes).
constexpr char kGrantedPrefix[] = "/tpd-test/";

using AuthStub = etcdserverpb::Auth::Stub;

// One call of etcd's Auth API with `token` (empty before auth is on); the call's error
// otherwise.
template <typename Request, typename Response>
absl::Status AuthCall(AuthStub& stub,
                      grpc::Status (AuthStub::*method)(grpc::ClientContext*, const Request&,
                                                       Response*),
                      const Request& request, const std::string& token = "") {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (!token.empty()) context.AddMetadata("token", token);
  Response response;
  const grpc::Status status = (stub.*method)(&context, request, &response);
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

std::unique_ptr<AuthStub> AuthAt(const std::string& address) {
  return etcdserverpb::Auth::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

absl::Status AddUser(AuthStub& auth, const std::string& name, const std::string& password,
                     const std::string& token = "") {
  etcdserverpb::AuthUserAddRequest request;
  request.set_name(name);
  request.set_password(password);
  return AuthCall(auth, &AuthStub::UserAdd, request, token);
}

// What `etcdctl user add root; role add root; user grant-role root root; user add tpd; role
// add tpd-rw; role grant-permission tpd-rw readwrite --prefix /tpd-test/; user grant-role tpd
// tpd-rw; auth enable` does.
absl::Status EnableAuth(const std::string& address) {
  std::unique_ptr<AuthStub> auth = AuthAt(address);
  etcdserverpb::AuthRoleAddRequest root_role;
  root_role.set_name("root");
  etcdserverpb::AuthUserGrantRoleRequest root_grant;
  root_grant.set_user("root");
  root_grant.set_role("root");
  etcdserverpb::AuthRoleAddRequest role;
  role.set_name("tpd-rw");
  etcdserverpb::AuthRoleGrantPermissionRequest permission;
  permission.set_name("tpd-rw");
  permission.mutable_perm()->set_permtype(authpb::Permission::READWRITE);
  permission.mutable_perm()->set_key(kGrantedPrefix);
  std::string end = kGrantedPrefix;
  end.back() = static_cast<char>(end.back() + 1);
  permission.mutable_perm()->set_range_end(end);
  etcdserverpb::AuthUserGrantRoleRequest grant;
  grant.set_user(kUser);
  grant.set_role("tpd-rw");
  for (absl::Status status :
       {AddUser(*auth, "root", kRootPassword), AuthCall(*auth, &AuthStub::RoleAdd, root_role),
        AuthCall(*auth, &AuthStub::UserGrantRole, root_grant), AddUser(*auth, kUser, kPassword),
        AuthCall(*auth, &AuthStub::RoleAdd, role),
        AuthCall(*auth, &AuthStub::RoleGrantPermission, permission),
        AuthCall(*auth, &AuthStub::UserGrantRole, grant),
        AuthCall(*auth, &AuthStub::AuthEnable, etcdserverpb::AuthEnableRequest())}) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// Root's token, for changing users once auth is on.
absl::StatusOr<std::string> RootToken(AuthStub& auth) {
  etcdserverpb::AuthenticateRequest request;
  request.set_name("root");
  request.set_password(kRootPassword);
  etcdserverpb::AuthenticateResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  const grpc::Status status = auth.Authenticate(&context, request, &response);
  if (!status.ok()) return absl::InternalError(status.error_message());
  return response.token();
}

// A cluster of one member with auth on.
absl::StatusOr<std::unique_ptr<EtcdCluster>> StartWithAuth(std::vector<std::string> flags = {}) {
  testing::EtcdClusterOptions options;
  options.extra_flags = std::move(flags);
  absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster =
      EtcdCluster::Start(1, absl::Seconds(30), options);
  if (!cluster.ok()) return cluster.status();
  if (absl::Status status = EnableAuth((*cluster)->ClientAddress(0)); !status.ok()) {
    return status;
  }
  return cluster;
}

// One cluster for the whole test binary (tests/store/etcd/shared_cluster.h).
EtcdCluster* SharedCluster() {
  return testing::SharedCluster([] { return StartWithAuth(); });
}

// Under the prefix the test user's role may write.
std::string FreshPrefix() { return testing::FreshPrefix(kGrantedPrefix); }

EtcdStoreOptions AsUser(const std::string& user, const std::string& password) {
  EtcdStoreOptions options;
  options.credentials.user = user;
  options.credentials.password = password;
  return options;
}

std::unique_ptr<EtcdStore> MakeStore(EtcdCluster& cluster, const std::string& prefix,
                                     EtcdStoreOptions options = AsUser(kUser, kPassword)) {
  absl::StatusOr<std::unique_ptr<EtcdStore>> store =
      EtcdStore::Create(cluster.ClientAddresses(), prefix, std::move(options));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

class AuthenticatedEtcd : public StoreUnderTest {
 public:
  static std::unique_ptr<StoreUnderTest> Make(int64_t max_waiters) {
    EtcdCluster* cluster = SharedCluster();
    if (cluster == nullptr) return nullptr;
    EtcdStoreOptions options = AsUser(kUser, kPassword);
    options.max_waiters = max_waiters;
    auto under_test = std::make_unique<AuthenticatedEtcd>();
    under_test->store_ = MakeStore(*cluster, FreshPrefix(), options);
    if (under_test->store_ == nullptr) return nullptr;
    return under_test;
  }

  Store& store() override { return *store_; }
  int64_t waiters() override { return store_->Stats().waiters; }

 private:
  std::unique_ptr<EtcdStore> store_;
};

// Without etcd the suite has no instance; this test says why.
TEST(EtcdAuthInstalledTest, EtcdIsInstalled) {
  if (EtcdBinary().empty()) GTEST_SKIP() << testing::kNoEtcdMessage;
}

std::vector<StoreFactory> Factories() {
  if (EtcdBinary().empty()) return {};
  return {StoreFactory(AuthenticatedEtcd::Make)};
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StoreConformanceTest);
INSTANTIATE_TEST_SUITE_P(EtcdStoreWithAuth, StoreConformanceTest, ::testing::ValuesIn(Factories()));

class EtcdAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdBinary().empty()) GTEST_SKIP() << testing::kNoEtcdMessage;
    cluster_ = SharedCluster();
    ASSERT_NE(cluster_, nullptr);
  }

  EtcdCluster* cluster_ = nullptr;
};

TEST_F(EtcdAuthTest, AWrongPasswordIsUnauthenticatedNamingTheEndpointAndUserNotThePassword) {
  std::unique_ptr<EtcdStore> store =
      MakeStore(*cluster_, FreshPrefix(), AsUser(kUser, "not-the-password"));
  ASSERT_NE(store, nullptr);
  for (absl::Status status : {store->Set("k", "v"), store->Get("k", LongDeadline()).status(),
                              store->Add("n", 1).status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
    EXPECT_THAT(
        status.message(),
        AllOf(HasSubstr(cluster_->ClientAddress(0)), HasSubstr("user \"tpd\""),
              HasSubstr("[etcd] user and password_file"), Not(HasSubstr("not-the-password"))));
  }
}

TEST_F(EtcdAuthTest, NoCredentialsIsUnauthenticatedAndSaysWhatToSet) {
  std::unique_ptr<EtcdStore> store = MakeStore(*cluster_, FreshPrefix(), EtcdStoreOptions());
  ASSERT_NE(store, nullptr);
  absl::Status status = store->Set("k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(cluster_->ClientAddress(0)), HasSubstr("user name is empty"),
                    HasSubstr("[etcd] user and password_file")));
  EXPECT_EQ(store->Get("k", LongDeadline()).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(EtcdAuthTest, LeasesWorkAsTheUserAndKeysBoundToThemNeedOne) {
  const std::string prefix = FreshPrefix();
  std::unique_ptr<EtcdStore> store = MakeStore(*cluster_, prefix);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<Leases::Grant> grant = store->GrantLease(absl::Seconds(5));
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_TRUE(store->SetLeased("alive", "1", grant->id).ok());
  EXPECT_TRUE(store->KeepLeaseAlive(grant->id).ok());
  EXPECT_TRUE(store->RevokeLease(grant->id).ok());
  EXPECT_EQ(store->Check({"alive"}).value_or(true), false);
  // etcd 3.4 grants leases to anyone; binding a key to one is a write like any other.
  std::unique_ptr<EtcdStore> anonymous = MakeStore(*cluster_, prefix, EtcdStoreOptions());
  ASSERT_NE(anonymous, nullptr);
  absl::StatusOr<Leases::Grant> theirs = anonymous->GrantLease(absl::Seconds(5));
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  EXPECT_EQ(anonymous->SetLeased("alive", "1", theirs->id).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(store->RevokeLease(theirs->id).ok());
}

TEST_F(EtcdAuthTest, AKeyOutsideTheUsersRoleIsPermissionDenied) {
  std::unique_ptr<EtcdStore> store = MakeStore(*cluster_, "/not-granted");
  ASSERT_NE(store, nullptr);
  absl::Status status = store->Set("k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(cluster_->ClientAddress(0)), HasSubstr("readwrite")));
}

// A change of users or roles through `cluster`'s root, between two waits and writes of
// stores that authenticated before it. Returns the waiting store's watch streams opened.
int64_t GoOnAcrossAnAuthChange(EtcdCluster& cluster) {
  const std::string prefix = FreshPrefix();
  std::unique_ptr<EtcdStore> waiter = MakeStore(cluster, prefix);
  std::unique_ptr<EtcdStore> writer = MakeStore(cluster, prefix);
  if (waiter == nullptr || writer == nullptr) return -1;
  WaitResult first;
  EXPECT_TRUE(waiter->WaitAsync({"a"}, LongDeadline(), first.Callback()).ok());
  EXPECT_TRUE(writer->Set("a", "1").ok());
  EXPECT_TRUE(first.Await());
  EXPECT_EQ(waiter->Stats().watch_streams_opened, 1);

  std::unique_ptr<AuthStub> auth = AuthAt(cluster.ClientAddress(0));
  absl::StatusOr<std::string> root = RootToken(*auth);
  EXPECT_TRUE(root.ok()) << root.status();
  if (!root.ok()) return -1;
  static std::atomic<int> next{0};
  EXPECT_TRUE(AddUser(*auth, absl::StrCat("other-", getpid(), "-", next++), "x", *root).ok());

  // The read that starts the wait, and the watch on the stream opened with the old token.
  WaitResult second;
  EXPECT_TRUE(waiter->WaitAsync({"b"}, LongDeadline(), second.Callback()).ok());
  absl::Status set = writer->Set("b", "2");
  EXPECT_TRUE(set.ok()) << set;
  EXPECT_TRUE(second.Await());
  if (second.HasRun()) {
    EXPECT_TRUE(second.result().ok()) << second.result().status();
    if (second.result().ok()) {
      EXPECT_THAT(*second.result(), ::testing::ElementsAre("2"));
    }
  }
  absl::StatusOr<int64_t> added = writer->Add("n", 5);
  EXPECT_TRUE(added.ok()) << added.status();
  if (added.ok()) {
    EXPECT_EQ(*added, 5);
  }
  return waiter->Stats().watch_streams_opened;
}

// A simple token (etcd's default) takes the current auth revision whenever it is used, so
// only a write racing the change is refused; the store goes on either way.
TEST_F(EtcdAuthTest, AStoreGoesOnAcrossAnAuthChange) { GoOnAcrossAnAuthChange(*cluster_); }

// A JWT token carries the auth revision it was issued at: after a change of users or roles
// etcd refuses it ("revision of auth store is old") for reads, writes and new watches alike;
// the stores authenticate again, and the waiting one reopens its watch stream once.
TEST(EtcdAuthJwtTest, AJwtTokenStaleAfterAnAuthChangeIsRenewedForCallsAndWatches) {
  if (EtcdBinary().empty()) GTEST_SKIP() << testing::kNoEtcdMessage;
  if (access("/usr/bin/openssl", X_OK) != 0) {
    GTEST_SKIP() << "no /usr/bin/openssl to make etcd's JWT signing key";
  }
  ::tpd::testing::TempDir dir;
  const std::string key = absl::StrCat(dir.path(), "/jwt.key");
  const std::string pub = absl::StrCat(dir.path(), "/jwt.pub");
  ASSERT_EQ(std::system(absl::StrCat("/usr/bin/openssl genrsa -out ", key,
                                     " 2048 2>/dev/null && /usr/bin/openssl rsa -in ", key,
                                     " -pubout -out ", pub, " 2>/dev/null")
                            .c_str()),
            0);
  absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster =
      StartWithAuth({"--auth-token", absl::StrCat("jwt,pub-key=", pub, ",priv-key=", key,
                                                  ",sign-method=RS256,ttl=10m")});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(GoOnAcrossAnAuthChange(**cluster), 2);
}

// etcd forgets a simple token unused for --auth-token-ttl ("invalid auth token").
TEST(EtcdAuthTokenTest, AnExpiredTokenIsRenewedForCallsAndWatches) {
  if (EtcdBinary().empty()) GTEST_SKIP() << testing::kNoEtcdMessage;
  absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = StartWithAuth({"--auth-token-ttl", "1"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string prefix = FreshPrefix();
  std::unique_ptr<EtcdStore> waiter = MakeStore(**cluster, prefix);
  std::unique_ptr<EtcdStore> writer = MakeStore(**cluster, prefix);
  ASSERT_NE(waiter, nullptr);
  ASSERT_NE(writer, nullptr);
  WaitResult first;
  ASSERT_TRUE(waiter->WaitAsync({"a"}, LongDeadline(), first.Callback()).ok());
  ASSERT_TRUE(writer->Set("a", "1").ok());
  ASSERT_TRUE(first.Await());

  // No condition to await: the tokens expire with time (etcd checks them each second).
  absl::SleepFor(absl::Seconds(3));
  WaitResult second;
  ASSERT_TRUE(waiter->WaitAsync({"b"}, LongDeadline(), second.Callback()).ok());
  ASSERT_TRUE(writer->Set("b", "2").ok());
  ASSERT_TRUE(second.Await());
  ASSERT_TRUE(second.result().ok()) << second.result().status();
  EXPECT_THAT(*second.result(), ::testing::ElementsAre("2"));
  EXPECT_EQ(waiter->Stats().watch_streams_opened, 2);
}

TEST(EtcdAuthCreateTest, CreateRefusesHalfCredentials) {
  EtcdStoreOptions options;
  options.credentials.user = "tpd";
  EXPECT_EQ(EtcdStore::Create({"127.0.0.1:2379"}, "/tpd", options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = EtcdStoreOptions();
  options.credentials.password = "pw";
  absl::Status status = EtcdStore::Create({"127.0.0.1:2379"}, "/tpd", options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), Not(HasSubstr("pw")));
  options = EtcdStoreOptions();
  options.credentials.cert_chain = "-----BEGIN CERTIFICATE-----";
  EXPECT_EQ(EtcdStore::Create({"127.0.0.1:2379"}, "/tpd", options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tpd::store
