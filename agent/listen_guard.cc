#include "agent/listen_guard.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/dial_networks.h"

namespace tpd::agent {
namespace {

constexpr uint32_t kDrop = 0;
constexpr uint32_t kKeep = 0xffffffff;
// Offsets from the start of the IP header.
constexpr uint32_t kIpv4Source = 12;
constexpr uint32_t kIpv6Source = 8;
// Where a v4-mapped address's IPv4 address starts.
constexpr uint32_t kV4MappedPrefixBytes = 12;

using Network = NetworkList::Network;

sock_filter Statement(uint16_t code, uint32_t k) { return sock_filter{code, 0, 0, k}; }
sock_filter Jump(uint16_t code, uint32_t k, uint8_t jt, uint8_t jf) {
  return sock_filter{code, jt, jf, k};
}

// Appends the test of one network: keep the packet when the source address (at `source` past
// the IP header) lies inside it, otherwise fall through past the block. Each 32-bit word the
// prefix touches costs a load, a mask and a compare; every jump stays inside the block.
void AppendNetwork(const Network& network, uint32_t source, std::vector<sock_filter>* program) {
  std::vector<std::pair<uint32_t, uint32_t>> words;  // (offset, mask), then value below
  std::vector<uint32_t> values;
  for (int word = 0; word * 32 < network.prefix; ++word) {
    const int bits = std::min(32, network.prefix - word * 32);
    const uint32_t mask = bits == 32 ? 0xffffffffu : ~(0xffffffffu >> bits);
    uint32_t value = 0;
    std::memcpy(&value, network.bytes.data() + 4 * word, 4);
    words.emplace_back(source + 4 * word, mask);
    values.push_back(ntohl(value) & mask);  // BPF_W|BPF_ABS loads in network byte order
  }
  for (size_t i = 0; i < words.size(); ++i) {
    const size_t left = 3 * (words.size() - 1 - i) + 1;  // the rest of the block, ret included
    program->push_back(
        Statement(BPF_LD | BPF_W | BPF_ABS, static_cast<uint32_t>(SKF_NET_OFF) + words[i].first));
    program->push_back(Statement(BPF_ALU | BPF_AND | BPF_K, words[i].second));
    program->push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, values[i], 0, static_cast<uint8_t>(left)));
  }
  program->push_back(Statement(BPF_RET | BPF_K, kKeep));
}

// Raw system calls on fds owned by TensorPipe's threads: under ThreadSanitizer, libc's
// interceptors would track fd numbers that TensorPipe's uninstrumented libuv closes and
// reuses on its own threads, and report our look at them as races (see
// tests/agent/agent_hostile_test.cc).
int RawDup(int fd) { return static_cast<int>(syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 0)); }
void RawClose(int fd) { syscall(SYS_close, fd); }
bool RawIntOption(int fd, int option, int* value) {
  socklen_t length = sizeof(*value);
  return syscall(SYS_getsockopt, fd, SOL_SOCKET, option, value, &length) == 0;
}

}  // namespace

const std::vector<std::string>& DefaultAcceptNetworks() {
  static const auto* networks =
      new std::vector<std::string>{"127.0.0.0/8",    "::1/128",  "10.0.0.0/8", "172.16.0.0/12",
                                   "192.168.0.0/16", "fc00::/7", "fe80::/10"};
  return *networks;
}

absl::StatusOr<ListenGuard> ListenGuard::Create(const std::vector<std::string>& networks) {
  if (networks.empty()) {
    return absl::InvalidArgumentError(
        "accept_networks is empty, which would admit no peer: list the cluster's networks "
        "(or \"0.0.0.0/0\" and \"::/0\" to admit every host)");
  }
  if (networks.size() > kMaxAcceptNetworks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "accept_networks has ", networks.size(), " networks; at most ", kMaxAcceptNetworks,
        " fit one socket filter: merge them into fewer, wider networks"));
  }
  // The same CIDR rules as [peer] dial_networks, by the same parser.
  absl::StatusOr<NetworkList> list = NetworkList::Parse(networks);
  if (!list.ok()) return list.status();
  std::vector<Network> v4;
  std::vector<Network> v6;
  for (const Network& network : list->networks()) {
    (network.family == AF_INET ? v4 : v6).push_back(network);
  }
  std::vector<sock_filter> v4_block;
  for (const Network& network : v4) AppendNetwork(network, kIpv4Source, &v4_block);
  v4_block.push_back(Statement(BPF_RET | BPF_K, kDrop));
  // An IPv6 source that is v4-mapped (::ffff:a.b.c.d) is judged by the IPv4 networks, as
  // NetworkList::Contains judges it (Linux drops such packets on input anyway).
  std::vector<sock_filter> mapped_block;
  for (const Network& network : v4) {
    AppendNetwork(network, kIpv6Source + kV4MappedPrefixBytes, &mapped_block);
  }
  mapped_block.push_back(Statement(BPF_RET | BPF_K, kDrop));
  std::vector<sock_filter> v6_block;
  const uint32_t mapped_prefix[] = {0, 0, 0xffff};
  for (uint32_t word = 0; word < 3; ++word) {
    const uint32_t after_ja = static_cast<uint32_t>(v6_block.size()) + 3;
    const uint32_t native = 9 + static_cast<uint32_t>(mapped_block.size());
    v6_block.push_back(Statement(BPF_LD | BPF_W | BPF_ABS,
                                 static_cast<uint32_t>(SKF_NET_OFF) + kIpv6Source + 4 * word));
    v6_block.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, mapped_prefix[word], 1, 0));
    v6_block.push_back(Statement(BPF_JMP | BPF_JA, native - after_ja));  // -> native IPv6
  }
  v6_block.insert(v6_block.end(), mapped_block.begin(), mapped_block.end());
  for (const Network& network : v6) AppendNetwork(network, kIpv6Source, &v6_block);
  v6_block.push_back(Statement(BPF_RET | BPF_K, kDrop));

  // Dispatch on the IP version (the high nibble of the header's first byte). The blocks can
  // be longer than a conditional jump reaches (255), so each branch takes an unconditional
  // one (32-bit offset).
  ListenGuard guard;
  std::vector<sock_filter>& p = guard.program_;
  p.push_back(Statement(BPF_LD | BPF_B | BPF_ABS, static_cast<uint32_t>(SKF_NET_OFF)));
  p.push_back(Statement(BPF_ALU | BPF_AND | BPF_K, 0xf0));
  p.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, 0x40, 0, 1));
  p.push_back(Statement(BPF_JMP | BPF_JA, 3));  // -> the IPv4 block, after the next three
  p.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, 0x60, 0, 1));
  p.push_back(Statement(BPF_JMP | BPF_JA, 1 + static_cast<uint32_t>(v4_block.size())));
  p.push_back(Statement(BPF_RET | BPF_K, kDrop));  // neither IPv4 nor IPv6
  p.insert(p.end(), v4_block.begin(), v4_block.end());
  p.insert(p.end(), v6_block.begin(), v6_block.end());
  // 7 + 9 + 3 + per IPv4 network 8, per IPv6 network at most 13: kMaxAcceptNetworks keeps it
  // inside the limit.
  TPD_DCHECK(p.size() <= BPF_MAXINSNS);
  guard.text_ = list->ToString();
  return guard;
}

absl::Status ListenGuard::Attach(int fd) const {
  sock_fprog fprog{};
  fprog.len = static_cast<unsigned short>(program_.size());
  fprog.filter = const_cast<sock_filter*>(program_.data());
  if (syscall(SYS_setsockopt, fd, SOL_SOCKET, SO_ATTACH_FILTER, &fprog, sizeof(fprog)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot attach the accept_networks filter: setsockopt(SO_ATTACH_FILTER): ",
                     std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ForEachListeningTcpSocket(const std::function<void(const ListeningSocket&)>& fn) {
  const int dir = static_cast<int>(
      syscall(SYS_openat, AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot list this process's sockets: /proc/self/fd: ", std::strerror(errno)));
  }
  // Read every entry first: the fds this loop dups must not show up in what it reads next.
  std::vector<int> fds;
  alignas(8) char buffer[8192];
  while (true) {
    const long n = syscall(SYS_getdents64, dir, buffer, sizeof(buffer));
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      // struct linux_dirent64: d_ino u64, d_off s64, d_reclen u16, d_type u8, d_name[].
      uint16_t reclen;
      std::memcpy(&reclen, buffer + at + 16, sizeof(reclen));
      int fd = -1;
      if (absl::SimpleAtoi(buffer + at + 19, &fd) && fd != dir) fds.push_back(fd);
      at += reclen;
    }
  }
  RawClose(dir);
  for (int fd : fds) {
    // Judge and use the socket through our own reference: the number may be closed and
    // reused by another thread at any moment, the duplicate cannot.
    const int dup = RawDup(fd);
    if (dup < 0) continue;
    struct stat st {};
    int type = 0;
    int protocol = 0;
    int listening = 0;
    sockaddr_storage storage{};
    socklen_t length = sizeof(storage);
    if (syscall(SYS_fstat, dup, &st) == 0 && S_ISSOCK(st.st_mode) &&
        RawIntOption(dup, SO_TYPE, &type) && type == SOCK_STREAM &&
        RawIntOption(dup, SO_PROTOCOL, &protocol) && protocol == IPPROTO_TCP &&
        RawIntOption(dup, SO_ACCEPTCONN, &listening) && listening == 1 &&
        syscall(SYS_getsockname, dup, &storage, &length) == 0) {
      ListeningSocket socket;
      socket.fd = dup;
      socket.inode = st.st_ino;
      socket.family = storage.ss_family;
      if (storage.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
        std::memcpy(socket.address.data(), &in->sin_addr, 4);
        socket.port = ntohs(in->sin_port);
        fn(socket);
      } else if (storage.ss_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
        std::memcpy(socket.address.data(), &in6->sin6_addr, 16);
        socket.port = ntohs(in6->sin6_port);
        fn(socket);
      }
    }
    RawClose(dup);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> GuardListeningSockets(const ListenGuard& guard, int family,
                                                       const std::array<unsigned char, 16>& address,
                                                       const absl::flat_hash_set<int>& ports) {
  std::vector<int> guarded;
  absl::Status failed;
  absl::Status listed = ForEachListeningTcpSocket([&](const ListeningSocket& socket) {
    if (socket.family != family || socket.address != address || !ports.contains(socket.port)) {
      return;
    }
    if (absl::Status s = guard.Attach(socket.fd); !s.ok()) {
      if (failed.ok())
        failed = absl::Status(s.code(), absl::StrCat(s.message(), " (port ", socket.port, ")"));
      return;
    }
    guarded.push_back(socket.port);
  });
  if (!listed.ok()) return listed;
  if (!failed.ok()) return failed;
  return guarded;
}

}  // namespace tpd::agent
