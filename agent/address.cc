#include "agent/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tpd::agent {

absl::Status SplitHostPort(absl::string_view address, std::string* host, std::string* port,
                           int* family) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("\"", address, "\" is not host:port"));
  }
  absl::string_view h = address.substr(0, colon);
  absl::string_view p = address.substr(colon + 1);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  int port_number = 0;
  if (!absl::SimpleAtoi(p, &port_number) || port_number < 0 || port_number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("\"", address, "\": the port must be 0..65535"));
  }
  unsigned char buf[sizeof(in6_addr)];
  const std::string host_string(h);
  if (inet_pton(AF_INET, host_string.c_str(), buf) == 1) {
    *family = AF_INET;
  } else if (inet_pton(AF_INET6, host_string.c_str(), buf) == 1) {
    *family = AF_INET6;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", address, "\": the host must be an IP address (TensorPipe resolves no names)"));
  }
  *host = host_string;
  *port = std::string(p);
  return absl::OkStatus();
}

bool UrlIsSafe(absl::string_view url) {
  if (absl::ConsumePrefix(&url, "shm://")) return !url.empty() && url.size() < 100;
  if (!absl::ConsumePrefix(&url, "uv://") && !absl::ConsumePrefix(&url, "ibv://")) return false;
  std::string host, port;
  int family = 0;
  if (SplitHostPort(url, &host, &port, &family).ok()) return true;
  unsigned char buf[sizeof(in6_addr)];
  const std::string bare(url);
  return inet_pton(AF_INET, bare.c_str(), buf) == 1;
}

// A port taken between this check and TensorPipe's bind still aborts; a fixed port is the
// operator's to keep free.
absl::Status CheckBindable(const std::string& host, const std::string& port, int family,
                           const std::string& option_text) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", option_text, ": socket: ", std::strerror(errno)));
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_storage storage{};
  socklen_t length = 0;
  const int port_number = std::stoi(port);
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&storage);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port_number));
    inet_pton(AF_INET, host.c_str(), &in->sin_addr);
    length = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port_number));
    inet_pton(AF_INET6, host.c_str(), &in6->sin6_addr);
    length = sizeof(sockaddr_in6);
  }
  int rc = bind(fd, reinterpret_cast<sockaddr*>(&storage), length);
  if (rc == 0) rc = listen(fd, 1);
  const int saved = errno;
  close(fd);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", option_text, ": ",
                                               std::strerror(saved),
                                               saved == EADDRINUSE ? " (another tpd?)" : ""));
  }
  return absl::OkStatus();
}

}  // namespace tpd::agent
