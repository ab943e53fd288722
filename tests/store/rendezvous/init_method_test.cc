// Unit tests of ParseInitMethod against PyTorch's torch/distributed/rendezvous.py: the URL
// forms it accepts, its error wording, and the tpd deviations that init_method.h documents.

#include "store/rendezvous/init_method.h"

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd::store {

// Lets failing matchers show a result instead of its bytes. Outside the anonymous namespace so
// that argument-dependent lookup finds it through StatusOr's template argument.
void PrintTo(const absl::StatusOr<InitMethod>& m, std::ostream* os) {
  if (!m.ok()) {
    *os << m.status();
    return;
  }
  *os << SchemeName(m->scheme) << " host=\"" << m->host << "\" port=" << m->port << " path=\""
      << m->path << "\" rank=" << (m->rank ? absl::StrCat(*m->rank) : "none")
      << " world_size=" << (m->world_size ? absl::StrCat(*m->world_size) : "none");
}

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Optional;
using ::testing::Pair;

using Env = std::map<std::string, std::string>;

constexpr absl::string_view kTcpError =
    "Error initializing torch.distributed using tcp:// rendezvous: ";
constexpr absl::string_view kEnvError =
    "Error initializing torch.distributed using env:// rendezvous: ";
constexpr absl::string_view kFileError =
    "Error initializing torch.distributed using file:// rendezvous: ";
constexpr absl::string_view kEtcdError =
    "Error initializing torch.distributed using etcd:// rendezvous: ";

absl::StatusOr<InitMethod> Parse(absl::string_view url, std::optional<int64_t> rank = std::nullopt,
                                 std::optional<int64_t> world_size = std::nullopt,
                                 const Env& env = {}) {
  return ParseInitMethod(url, rank, world_size, env);
}

// A complete env:// environment, as torchrun would set it.
Env FullEnv() {
  return {{"MASTER_ADDR", "node-a"}, {"MASTER_PORT", "29500"}, {"RANK", "1"}, {"WORLD_SIZE", "4"}};
}

MATCHER_P(FailsWith, text, "is INVALID_ARGUMENT with a message containing the text") {
  if (arg.ok()) {
    *result_listener << "parsed fine";
    return false;
  }
  return arg.status().code() == absl::StatusCode::kInvalidArgument &&
         absl::StrContains(arg.status().message(), text);
}

// --- tcp:// ---

TEST(InitMethodTest, TcpParsesHostPortRankAndWorldSize) {
  absl::StatusOr<InitMethod> m = Parse("tcp://node-a:29500?rank=1&world_size=4");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->scheme, InitMethodScheme::kTcp);
  EXPECT_EQ(m->host, "node-a");
  EXPECT_EQ(m->port, 29500);
  EXPECT_THAT(m->rank, Optional(1));
  EXPECT_THAT(m->world_size, Optional(4));
  EXPECT_THAT(m->query, IsEmpty());
  EXPECT_EQ(m->path, "");
}

TEST(InitMethodTest, TcpBracketedIpv6HostLosesItsBrackets) {
  absl::StatusOr<InitMethod> m = Parse("tcp://[::1]:29500?rank=0&world_size=1");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->host, "::1");
  EXPECT_EQ(m->port, 29500);
}

TEST(InitMethodTest, TcpIpv6HostWithZoneIsAccepted) {
  absl::StatusOr<InitMethod> m = Parse("tcp://[fe80::1%eth0]:29500");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->host, "fe80::1%eth0");
}

TEST(InitMethodTest, TcpHostAndSchemeAreLowerCasedLikeUrlparse) {
  absl::StatusOr<InitMethod> m = Parse("TCP://Node-A.Example:1");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->scheme, InitMethodScheme::kTcp);
  EXPECT_EQ(m->host, "node-a.example");
}

TEST(InitMethodTest, TcpWithoutRankOrWorldSizeIsDynamicWithAssignedRank) {
  absl::StatusOr<InitMethod> m = Parse("tcp://node-a:29500");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->rank, std::nullopt);
  EXPECT_EQ(m->world_size, std::nullopt);
}

TEST(InitMethodTest, TcpRankWithoutWorldSizeIsDynamicWithRequestedRank) {
  absl::StatusOr<InitMethod> m = Parse("tcp://node-a:29500?rank=3");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->rank, Optional(3));
  EXPECT_EQ(m->world_size, std::nullopt);
}

TEST(InitMethodTest, TcpKeepsOtherQueryParametersVerbatim) {
  absl::StatusOr<InitMethod> m = Parse("tcp://h:1?use_libuv=0&rank=0&world_size=2&x=a%20b");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->query, ElementsAre(Pair("use_libuv", "0"), Pair("x", "a%20b")));
}

TEST(InitMethodTest, TcpAcceptsTrailingSlash) {
  absl::StatusOr<InitMethod> m = Parse("tcp://h:1/?rank=0&world_size=1");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->port, 1);
}

TEST(InitMethodTest, TcpAcceptsPortBounds) {
  EXPECT_TRUE(Parse("tcp://h:1").ok());
  absl::StatusOr<InitMethod> m = Parse("tcp://h:65535");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->port, 65535);
}

TEST(InitMethodTest, LeadingSpacesAreIgnoredLikeUrlsplit) {
  absl::StatusOr<InitMethod> m = Parse("  tcp://h:1");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->host, "h");
}

TEST(InitMethodTest, QueryEmptyPairsAreSkippedLikeQueryToDict) {
  absl::StatusOr<InitMethod> m = Parse("tcp://h:1?&&rank=0&&world_size=2&");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->rank, Optional(0));
  EXPECT_THAT(m->world_size, Optional(2));
}

TEST(InitMethodTest, TcpPortMissingWithoutPort) {
  EXPECT_THAT(Parse("tcp://node-a"), FailsWith(absl::StrCat(kTcpError, "port number missing")));
}

TEST(InitMethodTest, TcpPortMissingWithEmptyPort) {
  EXPECT_THAT(Parse("tcp://node-a:?rank=0&world_size=1"),
              FailsWith(absl::StrCat(kTcpError, "port number missing")));
}

TEST(InitMethodTest, TcpPortZeroIsMissingBecauseUrlparsePortIsFalsy) {
  EXPECT_THAT(Parse("tcp://node-a:0"), FailsWith(absl::StrCat(kTcpError, "port number missing")));
}

TEST(InitMethodTest, TcpPortAboveRangeUsesCreateC10dStoreWording) {
  EXPECT_THAT(Parse("tcp://host:99999"),
              FailsWith("port must have value from 0 to 65535 but was 99999."));
}

TEST(InitMethodTest, TcpPortBeyondInt64IsOutOfRangeNotACrash) {
  EXPECT_THAT(Parse("tcp://host:123456789012345678901234567890"),
              FailsWith("port must have value from 0 to 65535 but was "
                        "123456789012345678901234567890."));
}

TEST(InitMethodTest, TcpNegativePortIsOutOfRange) {
  EXPECT_THAT(Parse("tcp://host:-1"),
              FailsWith("port must have value from 0 to 65535 but was -1."));
}

TEST(InitMethodTest, TcpNonIntegerPortNamesTheValue) {
  EXPECT_THAT(Parse("tcp://host:http"),
              FailsWith(absl::StrCat(kTcpError, "port must be an integer, got \"http\"")));
  EXPECT_THAT(Parse("tcp://host:+80"), FailsWith("port must be an integer, got \"+80\""));
}

TEST(InitMethodTest, TcpHostMissing) {
  EXPECT_THAT(Parse("tcp://:29500"), FailsWith(absl::StrCat(kTcpError, "host missing")));
}

TEST(InitMethodTest, TcpWorldSizeWithoutRankIsRankParameterMissing) {
  EXPECT_THAT(Parse("tcp://h:1?world_size=2"),
              FailsWith(absl::StrCat(kTcpError, "rank parameter missing")));
}

TEST(InitMethodTest, TcpNonIntegerRankNamesTheValue) {
  EXPECT_THAT(Parse("tcp://h:1?rank=abc&world_size=2"),
              FailsWith(absl::StrCat(kTcpError, "rank must be an integer, got \"abc\"")));
}

TEST(InitMethodTest, TcpEmptyRankIsNotAnInteger) {
  EXPECT_THAT(Parse("tcp://h:1?rank=&world_size=2"),
              FailsWith("rank must be an integer, got \"\""));
}

TEST(InitMethodTest, TcpNonIntegerWorldSizeNamesTheValue) {
  EXPECT_THAT(Parse("tcp://h:1?rank=0&world_size=2.5"),
              FailsWith(absl::StrCat(kTcpError, "world_size must be an integer, got \"2.5\"")));
}

TEST(InitMethodTest, RankBeyondInt64IsRejected) {
  EXPECT_THAT(Parse("tcp://h:1?rank=99999999999999999999"),
              FailsWith("rank does not fit in 64 bits, got \"99999999999999999999\""));
}

TEST(InitMethodTest, NegativeRankIsRejectedWithBothValues) {
  EXPECT_THAT(Parse("tcp://h:1?rank=-1&world_size=2"),
              FailsWith("rank must be non-negative, got -1 (world_size 2)"));
}

TEST(InitMethodTest, NegativeRankWithoutWorldSizeIsRejected) {
  EXPECT_THAT(Parse("tcp://h:1?rank=-2"), FailsWith("rank must be non-negative, got -2"));
}

TEST(InitMethodTest, ZeroWorldSizeIsRejectedWithBothValues) {
  EXPECT_THAT(Parse("tcp://h:1?rank=0&world_size=0"),
              FailsWith("world_size must be at least 1, got 0 (rank 0)"));
}

TEST(InitMethodTest, PytorchDynamicMarkerWorldSizeMinusOneIsRejected) {
  EXPECT_THAT(Parse("tcp://h:1?rank=0&world_size=-1"),
              FailsWith("world_size must be at least 1, got -1 (rank 0)"));
}

TEST(InitMethodTest, RankNotBelowWorldSizeIsRejectedWithBothValues) {
  EXPECT_THAT(Parse("tcp://h:1?rank=2&world_size=2"),
              FailsWith(absl::StrCat(kTcpError, "rank 2 must be less than world_size 2")));
}

TEST(InitMethodTest, TcpUnbracketedIpv6IsRejected) {
  EXPECT_THAT(Parse("tcp://::1:29500"),
              FailsWith("an IPv6 host must be in brackets, e.g. tcp://[::1]:29500"));
}

TEST(InitMethodTest, TcpUnclosedBracketIsInvalidIpv6Url) {
  EXPECT_THAT(Parse("tcp://[::1"), FailsWith(absl::StrCat(kTcpError, "invalid IPv6 URL")));
}

TEST(InitMethodTest, TcpTextBetweenBracketAndPortIsInvalidIpv6Url) {
  EXPECT_THAT(Parse("tcp://[::1]x:1"), FailsWith("invalid IPv6 URL: \"x:1\" after ']'"));
}

TEST(InitMethodTest, TcpStrayBracketIsInvalidIpv6Url) {
  EXPECT_THAT(Parse("tcp://h]:1"), FailsWith("invalid IPv6 URL"));
}

TEST(InitMethodTest, TcpBracketedNonAddressIsRejected) {
  EXPECT_THAT(Parse("tcp://[node-a]:1"), FailsWith("host \"node-a\" is not an IPv6 address"));
  EXPECT_THAT(Parse("tcp://[]:1"), FailsWith(absl::StrCat(kTcpError, "host missing")));
}

// Found by init_method_fuzz_test: only the alphabet of a bracketed host was checked, so a
// megabyte of hex digits and colons was a valid "IPv6 address" that went on into the group's
// state, messages and the resolver.
TEST(InitMethodTest, Ipv6HostLongerThanAnyAddressIsRejected) {
  const std::string longest = "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255";  // 45 bytes
  EXPECT_TRUE(Parse(absl::StrCat("tcp://[", longest, "]:1")).ok());
  EXPECT_TRUE(Parse(absl::StrCat("tcp://[", longest, "%enp129s0f1np1]:1")).ok());
  EXPECT_THAT(Parse(absl::StrCat("tcp://[", longest, "0]:1")), FailsWith("is not an IPv6 address"));
  EXPECT_THAT(Parse(absl::StrCat("tcp://[::", std::string(1 << 20, 'f'), "]:1")),
              FailsWith("is not an IPv6 address"));
  EXPECT_THAT(Parse("etcd://[fe80::1%a-zone-name-longer-than-ifnamsiz]:2379"),
              FailsWith("is not an IPv6 address"));
  Env env = FullEnv();
  env["MASTER_ADDR"] = absl::StrCat("::", std::string(100, '1'));
  EXPECT_THAT(Parse("env://", std::nullopt, std::nullopt, env),
              FailsWith("is not an IPv6 address"));
}

TEST(InitMethodTest, TcpHostNameWithBadCharactersIsRejected) {
  EXPECT_THAT(Parse("tcp://no de:1"), FailsWith("host \"no de\" is not a valid host name"));
  EXPECT_THAT(Parse("tcp://a%2Fb:1"), FailsWith("host \"a%2Fb\" is not a valid host name"));
}

TEST(InitMethodTest, TcpHostNameLongerThanDnsAllowsIsRejected) {
  EXPECT_THAT(Parse(absl::StrCat("tcp://", std::string(254, 'a'), ":1")),
              FailsWith("is not a valid host name"));
  EXPECT_TRUE(Parse(absl::StrCat("tcp://", std::string(253, 'a'), ":1")).ok());
}

TEST(InitMethodTest, TcpUserInfoIsRejectedWithoutEchoingIt) {
  absl::StatusOr<InitMethod> m = Parse("tcp://alice:s3cret@h:1");
  EXPECT_THAT(m, FailsWith(absl::StrCat(kTcpError, "user information")));
  EXPECT_THAT(m.status().message(), Not(HasSubstr("s3cret")));
}

TEST(InitMethodTest, TcpPathIsRejectedInsteadOfIgnored) {
  EXPECT_THAT(Parse("tcp://h:1/group"),
              FailsWith(absl::StrCat(kTcpError, "unexpected path \"/group\"")));
}

// --- parts shared by every scheme ---

TEST(InitMethodTest, UnknownSchemeHasNoRendezvousHandler) {
  absl::StatusOr<InitMethod> m = Parse("foo://h:1");
  EXPECT_THAT(m, FailsWith("No rendezvous handler for foo://"));
  EXPECT_EQ(m.status().message(), "No rendezvous handler for foo://");
}

TEST(InitMethodTest, UrlWithoutSchemeHasNoRendezvousHandlerForEmptyScheme) {
  EXPECT_EQ(Parse("/tmp/store").status().message(), "No rendezvous handler for ://");
  EXPECT_EQ(Parse("").status().message(), "No rendezvous handler for ://");
  EXPECT_EQ(Parse("://").status().message(), "No rendezvous handler for ://");
}

TEST(InitMethodTest, HostPortWithoutSchemeIsReadAsSchemeLikeUrlparse) {
  EXPECT_THAT(Parse("localhost:29500"), FailsWith("No rendezvous handler for localhost://"));
}

TEST(InitMethodTest, QueryPairWithoutEqualsIsRejected) {
  EXPECT_THAT(Parse("tcp://h:1?rank"),
              FailsWith("init_method query parameter \"rank\" has no '='; write name=value"));
}

TEST(InitMethodTest, QueryPairWithTwoEqualsIsRejected) {
  EXPECT_THAT(Parse("tcp://h:1?token=a=b"),
              FailsWith("init_method query parameter \"token=a=b\" has more than one '='"));
}

TEST(InitMethodTest, QueryNameGivenTwiceIsRejected) {
  EXPECT_THAT(Parse("tcp://h:1?rank=0&rank=1"),
              FailsWith("init_method query parameter \"rank\" is given twice"));
}

TEST(InitMethodTest, FragmentIsRejected) {
  EXPECT_THAT(Parse("file:///tmp/a#b?rank=0"), FailsWith("has a '#' fragment"));
}

TEST(InitMethodTest, ControlCharactersAreRejectedWithTheirOffset) {
  EXPECT_THAT(Parse(absl::string_view("tcp://h\0:1", 10)),
              FailsWith("init_method URL has control character 0x00 at offset 7"));
  EXPECT_THAT(Parse("tcp://h:1\n"),
              FailsWith("init_method URL has control character 0x0a at offset 9"));
}

TEST(InitMethodTest, ExplicitRankAndWorldSizeAreMergedIntoTheUrl) {
  absl::StatusOr<InitMethod> m = Parse("tcp://h:1?use_libuv=1", 2, 3);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->rank, Optional(2));
  EXPECT_THAT(m->world_size, Optional(3));
  EXPECT_THAT(m->query, ElementsAre(Pair("use_libuv", "1")));
}

TEST(InitMethodTest, ExplicitRankAloneIsDynamicWithRequestedRank) {
  absl::StatusOr<InitMethod> m = Parse("tcp://h:1", 5, std::nullopt);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->rank, Optional(5));
  EXPECT_EQ(m->world_size, std::nullopt);
}

TEST(InitMethodTest, ExplicitWorldSizeAloneIsRankParameterMissing) {
  EXPECT_THAT(Parse("tcp://h:1", std::nullopt, 4),
              FailsWith(absl::StrCat(kTcpError, "rank parameter missing")));
}

TEST(InitMethodTest, ExplicitArgumentsConflictWithUrlRankAndWorldSize) {
  EXPECT_THAT(Parse("tcp://h:1?rank=0&world_size=2", 0, 2),
              FailsWith("The url: tcp://h:1?rank=0&world_size=2 has node-specific "
                        "arguments(rank, world_size) already."));
}

TEST(InitMethodTest, ExplicitRankConflictsWithUrlWorldSizeAsInRendezvousHelper) {
  EXPECT_THAT(Parse("tcp://h:1?world_size=2", 0, std::nullopt),
              FailsWith("has node-specific arguments(rank, world_size) already."));
}

TEST(InitMethodTest, ExplicitWorldSizeConflictsWithUrlRank) {
  EXPECT_THAT(Parse("env://?rank=1", std::nullopt, 2, FullEnv()),
              FailsWith("has node-specific arguments(rank, world_size) already."));
}

TEST(InitMethodTest, ExplicitNegativeRankIsRejectedNotTreatedAsAbsent) {
  EXPECT_THAT(Parse("tcp://h:1", -1, 2),
              FailsWith("rank must be non-negative, got -1 (world_size 2)"));
}

TEST(InitMethodTest, SchemeNameMatchesTheUrlScheme) {
  EXPECT_EQ(SchemeName(InitMethodScheme::kTcp), "tcp");
  EXPECT_EQ(SchemeName(InitMethodScheme::kEnv), "env");
  EXPECT_EQ(SchemeName(InitMethodScheme::kFile), "file");
  EXPECT_EQ(SchemeName(InitMethodScheme::kEtcd), "etcd");
}

// --- env:// ---

TEST(InitMethodTest, EnvReadsMasterAddrMasterPortRankAndWorldSizeFromClientEnv) {
  absl::StatusOr<InitMethod> m = Parse("env://", std::nullopt, std::nullopt, FullEnv());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->scheme, InitMethodScheme::kEnv);
  EXPECT_EQ(m->host, "node-a");
  EXPECT_EQ(m->port, 29500);
  EXPECT_THAT(m->rank, Optional(1));
  EXPECT_THAT(m->world_size, Optional(4));
}

TEST(InitMethodTest, EnvQueryRankWinsOverRankVariable) {
  absl::StatusOr<InitMethod> m = Parse("env://?rank=3", std::nullopt, std::nullopt, FullEnv());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->rank, Optional(3));
  EXPECT_THAT(m->world_size, Optional(4));
}

TEST(InitMethodTest, EnvExplicitArgumentsWinOverVariables) {
  absl::StatusOr<InitMethod> m = Parse("env://", 0, 8, FullEnv());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->rank, Optional(0));
  EXPECT_THAT(m->world_size, Optional(8));
}

TEST(InitMethodTest, EnvWithoutRankOrWorldSizeIsDynamic) {
  absl::StatusOr<InitMethod> m = Parse("env://", std::nullopt, std::nullopt,
                                       {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->rank, std::nullopt);
  EXPECT_EQ(m->world_size, std::nullopt);
  EXPECT_EQ(m->host, "10.0.0.1");
}

TEST(InitMethodTest, EnvEmptyVariableCountsAsUnset) {
  absl::StatusOr<InitMethod> m =
      Parse("env://", std::nullopt, std::nullopt,
            {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}, {"RANK", ""}, {"WORLD_SIZE", ""}});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->rank, std::nullopt);
  EXPECT_EQ(m->world_size, std::nullopt);
}

TEST(InitMethodTest, EnvMasterAddrMayBeBareOrBracketedIpv6) {
  Env env = FullEnv();
  env["MASTER_ADDR"] = "::1";
  absl::StatusOr<InitMethod> bare = Parse("env://", std::nullopt, std::nullopt, env);
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->host, "::1");
  env["MASTER_ADDR"] = "[FE80::1]";
  absl::StatusOr<InitMethod> bracketed = Parse("env://", std::nullopt, std::nullopt, env);
  ASSERT_TRUE(bracketed.ok()) << bracketed.status();
  EXPECT_EQ(bracketed->host, "fe80::1");
}

TEST(InitMethodTest, EnvKeepsOtherQueryParameters) {
  absl::StatusOr<InitMethod> m = Parse("env://?use_libuv=0", std::nullopt, std::nullopt, FullEnv());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->query, ElementsAre(Pair("use_libuv", "0")));
}

TEST(InitMethodTest, EnvMasterAddrMissing) {
  Env env = FullEnv();
  env.erase("MASTER_ADDR");
  EXPECT_THAT(
      Parse("env://", std::nullopt, std::nullopt, env),
      FailsWith(absl::StrCat(kEnvError, "environment variable MASTER_ADDR expected, but not set")));
}

TEST(InitMethodTest, EnvEmptyMasterAddrIsMissing) {
  Env env = FullEnv();
  env["MASTER_ADDR"] = "";
  EXPECT_THAT(Parse("env://", std::nullopt, std::nullopt, env),
              FailsWith("environment variable MASTER_ADDR expected, but not set"));
}

TEST(InitMethodTest, EnvMasterPortMissing) {
  Env env = FullEnv();
  env.erase("MASTER_PORT");
  EXPECT_THAT(
      Parse("env://", std::nullopt, std::nullopt, env),
      FailsWith(absl::StrCat(kEnvError, "environment variable MASTER_PORT expected, but not set")));
}

TEST(InitMethodTest, EnvWorldSizeWithoutRankExpectsRankVariable) {
  Env env = FullEnv();
  env.erase("RANK");
  EXPECT_THAT(
      Parse("env://", std::nullopt, std::nullopt, env),
      FailsWith(absl::StrCat(kEnvError, "environment variable RANK expected, but not set")));
}

TEST(InitMethodTest, EnvNonIntegerRankVariableNamesTheVariable) {
  Env env = FullEnv();
  env["RANK"] = "one";
  EXPECT_THAT(Parse("env://", std::nullopt, std::nullopt, env),
              FailsWith("environment variable RANK must be an integer, got \"one\""));
}

TEST(InitMethodTest, EnvNonIntegerWorldSizeVariableNamesTheVariable) {
  Env env = FullEnv();
  env["WORLD_SIZE"] = "4 ";
  EXPECT_THAT(Parse("env://", std::nullopt, std::nullopt, env),
              FailsWith("environment variable WORLD_SIZE must be an integer, got \"4 \""));
}

TEST(InitMethodTest, EnvRankVariableNotBelowWorldSizeIsRejected) {
  Env env = FullEnv();
  env["RANK"] = "4";
  EXPECT_THAT(Parse("env://", std::nullopt, std::nullopt, env),
              FailsWith("rank 4 must be less than world_size 4"));
}

TEST(InitMethodTest, EnvNonIntegerMasterPortNamesTheVariable) {
  Env env = FullEnv();
  env["MASTER_PORT"] = "x";
  EXPECT_THAT(Parse("env://", std::nullopt, std::nullopt, env),
              FailsWith("environment variable MASTER_PORT must be an integer, got \"x\""));
}

TEST(InitMethodTest, EnvMasterPortOutOfRangeUsesCreateC10dStoreWording) {
  Env env = FullEnv();
  env["MASTER_PORT"] = "70000";
  EXPECT_THAT(Parse("env://", std::nullopt, std::nullopt, env),
              FailsWith("port must have value from 0 to 65535 but was 70000."));
}

TEST(InitMethodTest, EnvMasterPortZeroIsMissing) {
  Env env = FullEnv();
  env["MASTER_PORT"] = "0";
  EXPECT_THAT(Parse("env://", std::nullopt, std::nullopt, env),
              FailsWith(absl::StrCat(kEnvError, "port number missing")));
}

TEST(InitMethodTest, EnvInvalidMasterAddrIsRejected) {
  Env env = FullEnv();
  env["MASTER_ADDR"] = "bad host";
  EXPECT_THAT(Parse("env://", std::nullopt, std::nullopt, env),
              FailsWith("host \"bad host\" is not a valid host name"));
}

TEST(InitMethodTest, EnvHostInUrlIsRejectedInsteadOfIgnored) {
  EXPECT_THAT(
      Parse("env://node-a:29500", std::nullopt, std::nullopt, FullEnv()),
      FailsWith(absl::StrCat(kEnvError, "the URL names a host or port (\"node-a:29500\")")));
}

TEST(InitMethodTest, EnvPathInUrlIsRejectedInsteadOfIgnored) {
  EXPECT_THAT(Parse("env:///x", std::nullopt, std::nullopt, FullEnv()),
              FailsWith(absl::StrCat(kEnvError, "unexpected path \"/x\"")));
}

TEST(InitMethodTest, EnvNeverReadsVariablesMissingFromTheClientMap) {
  // The daemon's own environment must not leak in, whatever it holds.
  EXPECT_THAT(Parse("env://", std::nullopt, std::nullopt, {}),
              FailsWith("environment variable MASTER_ADDR expected, but not set"));
}

// --- file:// ---

TEST(InitMethodTest, FileParsesAbsolutePathAndQuery) {
  absl::StatusOr<InitMethod> m = Parse("file:///mnt/shared/store?rank=0&world_size=2");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->scheme, InitMethodScheme::kFile);
  EXPECT_EQ(m->path, "/mnt/shared/store");
  EXPECT_THAT(m->rank, Optional(0));
  EXPECT_THAT(m->world_size, Optional(2));
  EXPECT_EQ(m->host, "");
  EXPECT_EQ(m->port, 0);
}

TEST(InitMethodTest, FileWithoutRankOrWorldSizeIsDynamic) {
  absl::StatusOr<InitMethod> m = Parse("file:///tmp/s");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->rank, std::nullopt);
  EXPECT_EQ(m->world_size, std::nullopt);
}

TEST(InitMethodTest, FileLocalhostHostMeansThisMachine) {
  absl::StatusOr<InitMethod> m = Parse("file://localhost/tmp/s");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->path, "/tmp/s");
}

TEST(InitMethodTest, FileWithoutAuthorityIsAccepted) {
  absl::StatusOr<InitMethod> m = Parse("file:/tmp/s");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->path, "/tmp/s");
}

TEST(InitMethodTest, FilePathIsNotPercentDecodedLikePytorchOnLinux) {
  absl::StatusOr<InitMethod> m = Parse("file:///tmp/a%20b;c");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->path, "/tmp/a%20b;c");
}

TEST(InitMethodTest, FilePathMissing) {
  EXPECT_THAT(Parse("file://"), FailsWith(absl::StrCat(kFileError, "path missing")));
  EXPECT_THAT(Parse("file:"), FailsWith(absl::StrCat(kFileError, "path missing")));
  EXPECT_THAT(Parse("file://?rank=0&world_size=1"),
              FailsWith(absl::StrCat(kFileError, "path missing")));
  EXPECT_THAT(Parse("file://localhost"), FailsWith(absl::StrCat(kFileError, "path missing")));
}

TEST(InitMethodTest, FileHostOtherThanLocalhostIsRejected) {
  EXPECT_THAT(Parse("file://tmp/store"),
              FailsWith(absl::StrCat(kFileError, "host \"tmp\" is not supported")));
}

TEST(InitMethodTest, FileRelativePathIsRejected) {
  EXPECT_THAT(Parse("file:tmp/store"),
              FailsWith(absl::StrCat(kFileError, "path \"tmp/store\" must be absolute")));
}

TEST(InitMethodTest, FileWorldSizeWithoutRankIsRankParameterMissing) {
  EXPECT_THAT(Parse("file:///tmp/s?world_size=2"),
              FailsWith(absl::StrCat(kFileError, "rank parameter missing")));
}

// --- etcd:// ---

TEST(InitMethodTest, EtcdParsesHostPortAndPrefix) {
  absl::StatusOr<InitMethod> m = Parse("etcd://etcd-1:2379/jobs/42?rank=0&world_size=2");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->scheme, InitMethodScheme::kEtcd);
  EXPECT_EQ(m->host, "etcd-1");
  EXPECT_EQ(m->port, 2379);
  EXPECT_EQ(m->path, "/jobs/42");
  EXPECT_THAT(m->rank, Optional(0));
}

TEST(InitMethodTest, EtcdWithoutPrefixUsesDefaultPrefix) {
  for (absl::string_view url : {"etcd://h:2379", "etcd://h:2379/", "etcd://h:2379//?rank=0"}) {
    absl::StatusOr<InitMethod> m = Parse(url);
    ASSERT_TRUE(m.ok()) << url << ": " << m.status();
    EXPECT_EQ(m->path, kDefaultEtcdPrefix) << url;
  }
}

TEST(InitMethodTest, EtcdPrefixLosesTrailingSlashes) {
  absl::StatusOr<InitMethod> m = Parse("etcd://h:2379/a/b//");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->path, "/a/b");
}

TEST(InitMethodTest, EtcdPortMissing) {
  EXPECT_THAT(Parse("etcd://h/prefix"), FailsWith(absl::StrCat(kEtcdError, "port number missing")));
}

TEST(InitMethodTest, EtcdHostMissing) {
  EXPECT_THAT(Parse("etcd://:2379/prefix"), FailsWith(absl::StrCat(kEtcdError, "host missing")));
}

TEST(InitMethodTest, EtcdWorldSizeWithoutRankIsRankParameterMissing) {
  EXPECT_THAT(Parse("etcd://h:2379?world_size=3"),
              FailsWith(absl::StrCat(kEtcdError, "rank parameter missing")));
}

// --- garbage ---

// Checks what every result must satisfy, OK or not.
void ExpectWellFormed(absl::string_view url, const absl::StatusOr<InitMethod>& m) {
  if (!m.ok()) {
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
    // Messages are escaped and bounded, so client bytes never reach logs raw or whole.
    for (char c : m.status().message()) {
      ASSERT_GE(static_cast<unsigned char>(c), 0x20) << "raw control byte in message";
    }
    EXPECT_LE(m.status().message().size(), 1024u);
    return;
  }
  if (m->world_size.has_value()) {
    EXPECT_GE(*m->world_size, 1);
    ASSERT_TRUE(m->rank.has_value());
    EXPECT_LT(*m->rank, *m->world_size);
  }
  if (m->rank.has_value()) {
    EXPECT_GE(*m->rank, 0);
  }
  if (m->scheme == InitMethodScheme::kFile) {
    EXPECT_TRUE(absl::StartsWith(m->path, "/")) << url;
  } else {
    EXPECT_FALSE(m->host.empty()) << url;
    EXPECT_GE(m->port, 1);
    EXPECT_LE(m->port, 65535);
  }
}

TEST(InitMethodTest, MalformedInputsReturnStatusNeverCrash) {
  const std::vector<std::string> urls = {
      "",
      "://",
      ":",
      "tcp:",
      "tcp:/",
      "tcp://",
      "tcp://:",
      "tcp://:0",
      "tcp://host:99999",
      "tcp://host:-1",
      "tcp://host:-",
      "tcp://host:1:2",
      "tcp://[",
      "tcp://]",
      "tcp://[::1",
      "tcp://[::1]]:1",
      "tcp://[[::1]]:1",
      "tcp://[::1]:",
      "tcp://[::1]:x",
      "tcp://@",
      "tcp://@:1",
      "tcp://h:1?",
      "tcp://h:1?&",
      "tcp://h:1?=",
      "tcp://h:1?==",
      "tcp://h:1?rank=-",
      "tcp://h:1?rank=--1",
      "tcp://h:1?rank=1-",
      "tcp://h:1?rank=0&world_size=9223372036854775807",
      "tcp://h:1?rank=-9223372036854775808",
      "tcp://h:1?rank=0&world_size=-9223372036854775808",
      "tcp://h:1#",
      "tcp://h:1?#",
      "env:",
      "env://",
      "env://?",
      "env://?rank",
      "env://[",
      "file://",
      "file:///",
      "file://?",
      "file://#",
      "file:////",
      "etcd://",
      "etcd://[::1]:2379",
      "etcd://h:2379/%",
      "1tcp://h:1",
      "t c p://h:1",
      "\xff\xfe://h:1",
      "tcp://\xff:1",
      std::string("tcp://h:1\0", 10),
      std::string("\0", 1),
      std::string("file:///tmp/\0x", 14),
      std::string(100000, ':'),
      std::string(100000, '['),
      absl::StrCat("tcp://", std::string(1 << 20, 'a'), ":1"),
      absl::StrCat("tcp://h:", std::string(1 << 20, '9')),
      absl::StrCat("tcp://h:1?", std::string(1 << 20, '&')),
      absl::StrCat("tcp://h:1?rank=", std::string(1 << 20, '1')),
      absl::StrCat("file:///", std::string(1 << 20, '/')),
      absl::StrCat(std::string(1 << 20, 'x'), "://"),
  };
  for (const std::string& url : urls) {
    SCOPED_TRACE(absl::StrCat("url of ", url.size(), " bytes: ", url.substr(0, 60)));
    ExpectWellFormed(url, Parse(url));
    ExpectWellFormed(url, Parse(url, 0, 1));
    ExpectWellFormed(url, Parse(url, std::nullopt, std::nullopt, FullEnv()));
  }
}

TEST(InitMethodTest, RandomlyMutatedUrlsReturnStatusNeverCrash) {
  const std::vector<std::string> seeds = {
      "tcp://node-a:29500?rank=1&world_size=4",
      "tcp://[::1]:29500?rank=0&world_size=1",
      "file:///tmp/s?rank=0&world_size=2",
      "env://?rank=1",
      "etcd://h:2379/prefix?rank=0",
  };
  static constexpr char kAlphabet[] = "tcpenvfiled:/?&=[]@#%-.0123456789 \xff\x7f\n\0";
  const std::string alphabet(kAlphabet, sizeof(kAlphabet) - 1);  // keeps the inner NUL
  std::mt19937 rng(20240601);                                    // fixed: a failure must reproduce
  for (int i = 0; i < 20000; ++i) {
    std::string url = seeds[rng() % seeds.size()];
    const int edits = 1 + rng() % 4;
    for (int e = 0; e < edits; ++e) {
      const size_t at = url.empty() ? 0 : rng() % (url.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          url.insert(at, 1, c);
          break;
        case 1:
          if (at < url.size()) url.erase(at, 1);
          break;
        default:
          if (at < url.size()) url[at] = c;
          break;
      }
    }
    SCOPED_TRACE(absl::CHexEscape(url));
    ExpectWellFormed(url, Parse(url, std::nullopt, std::nullopt, FullEnv()));
    if (HasFailure()) return;  // one reproducer is enough
  }
}

}  // namespace
}  // namespace tpd::store
