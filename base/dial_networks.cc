#include "base/dial_networks.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/summarize.h"

namespace tpd {
namespace {

// The address bytes of `address` and their family, with IPv4-mapped IPv6 turned into IPv4.
bool AddressBytes(const sockaddr* address, int* family, std::array<unsigned char, 16>* bytes) {
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    *family = AF_INET;
    std::memcpy(bytes->data(), &in->sin_addr, 4);
    return true;
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      *family = AF_INET;
      std::memcpy(bytes->data(), in6->sin6_addr.s6_addr + 12, 4);
    } else {
      *family = AF_INET6;
      std::memcpy(bytes->data(), in6->sin6_addr.s6_addr, 16);
    }
    return true;
  }
  return false;
}

// True when the first `prefix` bits of a and b agree.
bool PrefixMatches(const unsigned char* a, const unsigned char* b, int prefix) {
  const int whole = prefix / 8;
  if (std::memcmp(a, b, whole) != 0) return false;
  const int rest = prefix % 8;
  if (rest == 0) return true;
  const unsigned char mask = static_cast<unsigned char>(0xff << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

std::string NumericHost(const sockaddr* address, socklen_t length) {
  char host[NI_MAXHOST] = {};
  if (getnameinfo(address, length, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) {
    return "?";
  }
  return host;
}

}  // namespace

absl::StatusOr<NetworkList> NetworkList::Parse(const std::vector<std::string>& cidrs) {
  NetworkList list;
  for (const std::string& cidr : cidrs) {
    Network network;
    network.text = cidr;
    const size_t slash = cidr.find('/');
    const std::string address = cidr.substr(0, slash);
    if (inet_pton(AF_INET, address.c_str(), network.bytes.data()) == 1) {
      network.family = AF_INET;
    } else if (inet_pton(AF_INET6, address.c_str(), network.bytes.data()) == 1) {
      network.family = AF_INET6;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", cidr,
                       "\" is not a network: want an IP address with an optional /prefix, such "
                       "as \"10.0.0.0/8\" or \"fe80::/10\""));
    }
    const int bits = network.family == AF_INET ? 32 : 128;
    network.prefix = bits;
    if (slash != std::string::npos &&
        (!absl::SimpleAtoi(cidr.substr(slash + 1), &network.prefix) || network.prefix < 0 ||
         network.prefix > bits ||
         cidr.substr(slash + 1).find_first_not_of("0123456789") != std::string::npos)) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", cidr, "\": the prefix length must be 0..", bits));
    }
    // Host bits below the prefix must be zero: "10.0.0.1/8" is more likely a typo than intent.
    std::array<unsigned char, 16> masked{};
    std::memcpy(masked.data(), network.bytes.data(), bits / 8);
    for (int byte = network.prefix / 8; byte < bits / 8; ++byte) masked[byte] = 0;
    if (network.prefix % 8 != 0) {
      masked[network.prefix / 8] = network.bytes[network.prefix / 8] &
                                   static_cast<unsigned char>(0xff << (8 - network.prefix % 8));
    }
    if (std::memcmp(masked.data(), network.bytes.data(), bits / 8) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", cidr, "\" has bits set past its /", network.prefix, " prefix"));
    }
    list.networks_.push_back(std::move(network));
  }
  return list;
}

bool NetworkList::Contains(const sockaddr* address) const {
  int family;
  std::array<unsigned char, 16> bytes{};
  if (!AddressBytes(address, &family, &bytes)) return false;
  for (const Network& network : networks_) {
    if (network.family == family &&
        PrefixMatches(network.bytes.data(), bytes.data(), network.prefix)) {
      return true;
    }
  }
  return false;
}

std::string NetworkList::ToString() const {
  // In messages: the first networks, then "... and N more".
  return JoinSummarized(networks_, ", ",
                        [](std::string* out, const Network& n) { out->append(n.text); });
}

absl::StatusOr<std::string> ResolveDialAddress(const std::string& host, int port,
                                               const NetworkList& allowed,
                                               absl::string_view setting) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve peer host ", host, ": ", gai_strerror(error)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owner(found, &freeaddrinfo);
  std::string first;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const std::string numeric = NumericHost(a->ai_addr, a->ai_addrlen);
    if (!allowed.Contains(a->ai_addr)) {
      return absl::PermissionDeniedError(
          absl::StrCat("will not dial ", host, ":", port,
                       host == numeric ? "" : absl::StrCat(" (resolved to ", numeric, ")"),
                       ": the address ", numeric, " is outside ", setting, " (", allowed.ToString(),
                       "); an operator can allow its network there"));
    }
    if (first.empty()) {
      first = a->ai_family == AF_INET6 ? absl::StrCat("[", numeric, "]:", port)
                                       : absl::StrCat(numeric, ":", port);
    }
  }
  if (first.empty()) {
    return absl::UnavailableError(absl::StrCat("peer host ", host, " resolves to no address"));
  }
  return first;
}

}  // namespace tpd
