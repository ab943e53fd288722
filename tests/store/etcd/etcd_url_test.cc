// etcd:// init_method URLs with several endpoints ("etcd://a:2379,b:2379/prefix"): every
// endpoint kept in order, the first as host:port, and torch-style errors that say which
// endpoint is wrong. The single-endpoint forms are covered with the other schemes in
// tests/store/rendezvous/init_method_test.cc.

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/rendezvous/init_method.h"

namespace tpd::store {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::string_view kEtcdError =
    "Error initializing torch.distributed using etcd:// rendezvous: ";

absl::StatusOr<InitMethod> Parse(absl::string_view url) {
  return ParseInitMethod(url, std::nullopt, std::nullopt, {});
}

std::string Message(absl::string_view url) {
  absl::StatusOr<InitMethod> method = Parse(url);
  EXPECT_FALSE(method.ok()) << url;
  EXPECT_EQ(method.status().code(), absl::StatusCode::kInvalidArgument) << method.status();
  return std::string(method.status().message());
}

MATCHER_P2(IsEndpoint, host, port, "") { return arg.host == host && arg.port == port; }

TEST(EtcdUrlTest, ListsEveryEndpointInOrderWithTheFirstAsHostAndPort) {
  absl::StatusOr<InitMethod> m = Parse("etcd://etcd-0:2379,ETCD-1:2380,[::1]:2381/jobs/7?rank=0");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->scheme, InitMethodScheme::kEtcd);
  EXPECT_THAT(m->endpoints, ElementsAre(IsEndpoint("etcd-0", 2379), IsEndpoint("etcd-1", 2380),
                                        IsEndpoint("::1", 2381)));
  EXPECT_EQ(m->host, "etcd-0");
  EXPECT_EQ(m->port, 2379);
  EXPECT_EQ(m->path, "/jobs/7");
  EXPECT_EQ(m->rank, 0);
}

TEST(EtcdUrlTest, OneEndpointIsAListOfOne) {
  absl::StatusOr<InitMethod> m = Parse("etcd://h:2379");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->endpoints, ElementsAre(IsEndpoint("h", 2379)));
  EXPECT_EQ(m->path, kDefaultEtcdPrefix);
}

TEST(EtcdUrlTest, AnEmptyEndpointIsNamedByPosition) {
  EXPECT_EQ(Message("etcd://a:1,,b:2/p"),
            absl::StrCat(kEtcdError, "endpoint 2 of 3 (\"\"): port number missing"));
  EXPECT_EQ(Message("etcd://a:1,/p"),
            absl::StrCat(kEtcdError, "endpoint 2 of 2 (\"\"): port number missing"));
}

TEST(EtcdUrlTest, AnEndpointWithoutPortOrHostSaysWhichAndWhat) {
  EXPECT_EQ(Message("etcd://a:1,b/p"),
            absl::StrCat(kEtcdError, "endpoint 2 of 2 (\"b\"): port number missing"));
  EXPECT_EQ(Message("etcd://:1,b:2/p"),
            absl::StrCat(kEtcdError, "endpoint 1 of 2 (\":1\"): host missing"));
  EXPECT_THAT(Message("etcd://a:1,b:99999"),
              HasSubstr("endpoint 2 of 2 (\"b:99999\"): port must have value from 0 to 65535"));
  EXPECT_THAT(Message("etcd://a:1,::1:2"), HasSubstr("an IPv6 host must be in brackets"));
}

TEST(EtcdUrlTest, TheSameEndpointTwiceIsAnError) {
  EXPECT_EQ(Message("etcd://a:1,A:1/p"),
            absl::StrCat(kEtcdError, "endpoint \"A:1\" is listed twice"));
  EXPECT_TRUE(Parse("etcd://a:1,a:2/p").ok());
}

TEST(EtcdUrlTest, AtMostSixteenEndpoints) {
  std::vector<std::string> endpoints;
  for (int i = 0; i < 17; ++i) endpoints.push_back(absl::StrCat("h", i, ":2379"));
  EXPECT_EQ(Message(absl::StrCat("etcd://", absl::StrJoin(endpoints, ","), "/p")),
            absl::StrCat(kEtcdError, "17 endpoints listed; at most 16"));
  endpoints.pop_back();
  absl::StatusOr<InitMethod> m =
      Parse(absl::StrCat("etcd://", absl::StrJoin(endpoints, ","), "/p"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->endpoints.size(), 16u);
}

TEST(EtcdUrlTest, CredentialsInAnyEndpointAreRefusedWithoutEchoingThem) {
  for (absl::string_view url :
       {"etcd://user:hunter2@a:2379/p", "etcd://a:2379,user:hunter2@b:2379/p"}) {
    const std::string message = Message(url);
    EXPECT_THAT(message, HasSubstr("user information")) << url;
    EXPECT_THAT(message, Not(HasSubstr("hunter2"))) << url;
  }
}

TEST(EtcdUrlTest, ANullNetlocIsPortNumberMissing) {
  EXPECT_EQ(Message("etcd:/p"), absl::StrCat(kEtcdError, "port number missing"));
  EXPECT_EQ(Message("etcd:"), absl::StrCat(kEtcdError, "port number missing"));
}

}  // namespace
}  // namespace tpd::store
