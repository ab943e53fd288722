// [peer] dial_networks: CIDR parsing and matching, and resolving a host only into addresses
// inside the allowed networks.

#include "base/dial_networks.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::vector<std::string> kDefaults = {"127.0.0.0/8",   "::1/128",        "10.0.0.0/8",
                                            "172.16.0.0/12", "192.168.0.0/16", "fc00::/7",
                                            "fe80::/10"};

bool Contains(const NetworkList& list, const std::string& ip) {
  sockaddr_in in = {};
  sockaddr_in6 in6 = {};
  if (inet_pton(AF_INET, ip.c_str(), &in.sin_addr) == 1) {
    in.sin_family = AF_INET;
    return list.Contains(reinterpret_cast<sockaddr*>(&in));
  }
  EXPECT_EQ(inet_pton(AF_INET6, ip.c_str(), &in6.sin6_addr), 1) << ip;
  in6.sin6_family = AF_INET6;
  return list.Contains(reinterpret_cast<sockaddr*>(&in6));
}

TEST(DialNetworksTest, DefaultsAreLoopbackAndPrivateNetworks) {
  absl::StatusOr<NetworkList> list = NetworkList::Parse(kDefaults);
  ASSERT_TRUE(list.ok()) << list.status();
  for (const char* inside :
       {"127.0.0.1", "127.0.0.2", "::1", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1",
        "fd00::1", "fe80::1", "::ffff:10.0.0.1"}) {
    EXPECT_TRUE(Contains(*list, inside)) << inside;
  }
  for (const char* outside : {"8.8.8.8", "172.32.0.1", "172.15.255.255", "192.169.0.1", "0.0.0.0",
                              "2001:db8::1", "::2", "::ffff:8.8.8.8", "100.64.0.1"}) {
    EXPECT_FALSE(Contains(*list, outside)) << outside;
  }
}

TEST(DialNetworksTest, SingleAddressesAndOddPrefixes) {
  absl::StatusOr<NetworkList> list = NetworkList::Parse({"203.0.113.7", "198.51.100.128/25"});
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(Contains(*list, "203.0.113.7"));
  EXPECT_FALSE(Contains(*list, "203.0.113.8"));
  EXPECT_TRUE(Contains(*list, "198.51.100.200"));
  EXPECT_FALSE(Contains(*list, "198.51.100.127"));
  EXPECT_TRUE(NetworkList::Parse({}).ok()) << "an empty list dials no one";
  EXPECT_FALSE(Contains(*NetworkList::Parse({}), "127.0.0.1"));
}

TEST(DialNetworksTest, BadEntriesNameTheEntry) {
  for (const char* bad :
       {"10.0.0.0/33", "10.0.0.1/8", "example.com/8", "10.0.0.0/", "::/129", "10.0.0.0/8x", ""}) {
    absl::StatusOr<NetworkList> list = NetworkList::Parse({bad});
    EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(list.status().message(), HasSubstr(absl::StrCat("\"", bad, "\""))) << bad;
  }
}

TEST(DialNetworksTest, ResolvesLiteralsInsideToThemselves) {
  NetworkList list = *NetworkList::Parse(kDefaults);
  EXPECT_EQ(*ResolveDialAddress("127.0.0.1", 29400, list, "[peer] dial_networks"),
            "127.0.0.1:29400");
  EXPECT_EQ(*ResolveDialAddress("::1", 29400, list, "[peer] dial_networks"), "[::1]:29400");
}

TEST(DialNetworksTest, AddressOutsideIsPermissionDeniedNamingItAndTheSetting) {
  NetworkList list = *NetworkList::Parse({"10.0.0.0/8"});
  absl::StatusOr<std::string> address =
      ResolveDialAddress("127.0.0.1", 29400, list, "[peer] dial_networks");
  EXPECT_EQ(address.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(
      address.status().message(),
      AllOf(HasSubstr("127.0.0.1"), HasSubstr("[peer] dial_networks"), HasSubstr("10.0.0.0/8")));
}

TEST(DialNetworksTest, NamesResolveOnceAndEveryAddressMustBeInside) {
  // "localhost" resolves to loopback addresses only (from /etc/hosts).
  NetworkList loopback = *NetworkList::Parse({"127.0.0.0/8", "::1/128"});
  absl::StatusOr<std::string> address =
      ResolveDialAddress("localhost", 5, loopback, "[peer] dial_networks");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_TRUE(*address == "127.0.0.1:5" || *address == "[::1]:5") << *address;
  NetworkList v4_only = *NetworkList::Parse({"127.0.0.0/8"});
  absl::StatusOr<std::string> partial =
      ResolveDialAddress("localhost", 5, v4_only, "[peer] dial_networks");
  if (!partial.ok()) {  // localhost also resolves to ::1 here
    EXPECT_EQ(partial.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(partial.status().message(), HasSubstr("resolved to ::1"));
  }
  EXPECT_EQ(ResolveDialAddress("no-such-host.invalid", 5, loopback, "x").status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tpd
