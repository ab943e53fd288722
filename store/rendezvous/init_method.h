// Parsing of rendezvous init_method URLs (tcp://, env://, file://, etcd://), after PyTorch's
// torch/distributed/rendezvous.py: the same forms, the same error wording where users know it
// ("port number missing", "rank parameter missing", ...), but as INVALID_ARGUMENT statuses and
// with no I/O: nothing here opens a socket or a file, so the daemon can validate a Join
// request before it touches any store.
//
// Thread safety: pure functions of their arguments; call them from any thread.
//
// Where tpd departs from PyTorch, and why:
//  - Dynamic groups. PyTorch's tcp:// and file:// handlers demand both rank and world_size,
//    and env:// demands RANK and WORLD_SIZE. tpd lets world_size be absent: the member joins
//    a dynamic group, and a missing rank is assigned by the daemon. A rank without a
//    world_size asks for that rank in a dynamic group. A world_size without a rank is still
//    an error ("rank parameter missing", or "environment variable RANK expected, but not
//    set" for env://), because a member of a static group must know its rank.
//  - Ranges are checked here: rank >= 0, world_size >= 1, rank < world_size, port 1..65535.
//    PyTorch's internal "world_size=-1 means dynamic" query value is not accepted; leave
//    world_size out instead. Integers are plain ASCII decimal ("-" allowed, then digits);
//    Python's int() would also take "+1", " 1 " and "1_0".
//  - Inputs PyTorch would crash on or silently misread are INVALID_ARGUMENT naming the
//    culprit: a query pair without '=' (Python: IndexError), a pair with two '=' (Python
//    drops the tail), a repeated query name (Python keeps the last), control characters
//    (Python strips \t\r\n and leading ones), a '#' fragment (Python cuts the path or query
//    there), user information ("user:pw@host", which Python ignores), a tcp:// path
//    ("/x", ignored by Python), an env:// host, port or path (ignored by Python: MASTER_ADDR
//    and MASTER_PORT are used), a file:// host other than "localhost" ("file://tmp/x" is
//    "/x" to Python on Linux), a relative file path (the daemon, not the client, opens the
//    file, so the client's working directory means nothing there), unbracketed IPv6
//    hosts or host names with characters outside [A-Za-z0-9._-], and bracketed hosts that
//    cannot be an IPv6 address (hex digits, ':' and '.', at most 45 bytes, then an optional
//    "%zone" of at most 15).
//  - Precedence of rank and world_size for env://: explicit argument or URL query, then the
//    client's RANK / WORLD_SIZE. (PyTorch's dynamic-RPC path lets RANK override an explicit
//    rank; its static path, like tpd, prefers the explicit one.)
//  - Nothing is percent-decoded, as in PyTorch on Linux: "file:///a%20b" is the path
//    "/a%20b".

#ifndef TPD_STORE_RENDEZVOUS_INIT_METHOD_H_
#define TPD_STORE_RENDEZVOUS_INIT_METHOD_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpd::store {

enum class InitMethodScheme { kTcp, kEnv, kFile, kEtcd };

// The etcd key prefix used when an etcd:// URL names none ("etcd://host:2379").
inline constexpr absl::string_view kDefaultEtcdPrefix = "/tpd";

// The most endpoints an etcd:// URL may list ("etcd://a:2379,b:2379,c:2379/prefix"); each is
// resolved by the daemon, and a URL comes from a client.
inline constexpr size_t kMaxEtcdEndpoints = 16;

// One host:port of an etcd:// URL, host as InitMethod::host.
struct InitMethodEndpoint {
  std::string host;
  int port = 0;
  bool operator==(const InitMethodEndpoint& other) const {
    return host == other.host && port == other.port;
  }
};

// A parsed init_method. Which fields are set depends on `scheme`:
//   tcp   host, port           (the daemon that serves the group's store)
//   env   host, port           (from MASTER_ADDR, MASTER_PORT)
//   file  path                 (absolute; a file store on a shared file system)
//   etcd  endpoints, path      (every host:port listed, in order, at least one, no
//                               repeats; host and port are the first; path is the key
//                               prefix, never empty, no trailing '/')
// rank and world_size apply to every scheme.
struct InitMethod {
  InitMethodScheme scheme = InitMethodScheme::kTcp;
  // Lower-cased, as Python's urlparse().hostname. IPv6 literals are kept without brackets
  // ("::1"); add them back when formatting host:port.
  std::string host;
  int port = 0;
  // etcd:// only: every endpoint, the first being host:port.
  std::vector<InitMethodEndpoint> endpoints;
  std::string path;
  // The member's rank; absent = the daemon assigns one (dynamic groups only).
  std::optional<int64_t> rank;
  // Size of a static group; absent = dynamic group. When set, rank is set and below it.
  std::optional<int64_t> world_size;
  // Query parameters other than rank and world_size (e.g. use_libuv), values verbatim.
  std::map<std::string, std::string> query;
};

// Parses `url` the way torch.distributed.rendezvous(url, rank, world_size) would, without
// rendezvousing.
//
// `rank` and `world_size` are the explicit arguments of the Join call (nullopt = not given;
// -1 is not a "not given" marker here, it is an invalid rank). As in PyTorch's
// _rendezvous_helper, explicit values are merged into the URL's query, and it is an error for
// the URL to carry rank or world_size as well when either one is given explicitly.
//
// `env` is the environment of the JOINING CLIENT, sent in its Join request; env:// reads
// MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from it (an empty value counts as unset, as
// in PyTorch). The daemon's own environment is never consulted.
//
// Returns INVALID_ARGUMENT with PyTorch's message where PyTorch has one, e.g.
// "No rendezvous handler for foo://" or "Error initializing torch.distributed using tcp://
// rendezvous: port number missing". Never crashes on malformed input.
absl::StatusOr<InitMethod> ParseInitMethod(absl::string_view url, std::optional<int64_t> rank,
                                           std::optional<int64_t> world_size,
                                           const std::map<std::string, std::string>& env);

// "tcp", "env", "file" or "etcd": the URL scheme, without "://".
std::string SchemeName(InitMethodScheme scheme);

}  // namespace tpd::store

#endif  // TPD_STORE_RENDEZVOUS_INIT_METHOD_H_
