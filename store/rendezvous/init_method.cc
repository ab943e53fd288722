#include "store/rendezvous/init_method.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace tpd::store {
namespace {

// URLs come from clients over gRPC; echo at most this much of one in a message.
constexpr size_t kMaxEchoBytes = 100;
// The DNS limit on a full host name; anything longer cannot resolve.
constexpr size_t kMaxHostNameBytes = 253;
// The longest IPv6 text form ("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255") and the longest
// zone, an interface name (IFNAMSIZ - 1 on Linux) or a numeric index.
constexpr size_t kMaxIpv6AddressBytes = 45;
constexpr size_t kMaxIpv6ZoneBytes = 15;
constexpr int64_t kMaxPort = 65535;

// A value as it appears in messages: quoted, escaped (so bytes the client sent cannot forge
// log lines), and cut short.
std::string Quote(absl::string_view text) {
  if (text.size() <= kMaxEchoBytes) return absl::StrCat("\"", absl::CHexEscape(text), "\"");
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kMaxEchoBytes)), "\"... (", text.size(),
                      " bytes)");
}

// The URL without quotes, for PyTorch's "The url: {url} has ..." wording.
std::string Echo(absl::string_view text) {
  if (text.size() <= kMaxEchoBytes) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, kMaxEchoBytes)), "... (", text.size(),
                      " bytes)");
}

// PyTorch's _rendezvous_error() prefix, so users find the messages they know.
absl::Status Error(InitMethodScheme scheme, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("Error initializing torch.distributed using ",
                                                 SchemeName(scheme), ":// rendezvous: ", message));
}

// The pieces of a URL as Python's urllib.parse.urlsplit cuts them. Views into the URL.
struct UrlParts {
  std::string scheme;  // lower-cased, "" when the URL has none
  absl::string_view netloc;
  absl::string_view path;
  absl::string_view query;
  bool has_fragment = false;
};

bool IsSchemeChar(char c) { return absl::ascii_isalnum(c) || c == '+' || c == '-' || c == '.'; }

// Never fails, like urlsplit: whatever does not look like a scheme or "//netloc" is path.
UrlParts SplitUrl(absl::string_view url) {
  UrlParts parts;
  const size_t colon = url.find(':');
  if (colon != absl::string_view::npos && colon > 0 && absl::ascii_isalpha(url[0])) {
    bool all_scheme_chars = true;
    for (char c : url.substr(0, colon)) all_scheme_chars = all_scheme_chars && IsSchemeChar(c);
    if (all_scheme_chars) {
      parts.scheme = absl::AsciiStrToLower(url.substr(0, colon));
      url.remove_prefix(colon + 1);
    }
  }
  if (absl::StartsWith(url, "//")) {
    url.remove_prefix(2);
    const size_t end = url.find_first_of("/?#");
    parts.netloc = url.substr(0, end);
    url = end == absl::string_view::npos ? absl::string_view() : url.substr(end);
  }
  const size_t hash = url.find('#');
  if (hash != absl::string_view::npos) {
    parts.has_fragment = true;
    url = url.substr(0, hash);
  }
  const size_t question = url.find('?');
  if (question != absl::string_view::npos) {
    parts.query = url.substr(question + 1);
    url = url.substr(0, question);
  }
  parts.path = url;
  return parts;
}

// _query_to_dict: split on '&', skip empty pieces, then split on '='. Stricter where Python
// crashes (no '=') or silently loses data (a second '=', a repeated name).
absl::StatusOr<std::map<std::string, std::string>> ParseQuery(absl::string_view query) {
  std::map<std::string, std::string> result;
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t equals = pair.find('=');
    if (equals == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("init_method query parameter ", Quote(pair),
                                                     " has no '='; write name=value"));
    }
    if (pair.find('=', equals + 1) != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("init_method query parameter ", Quote(pair), " has more than one '='"));
    }
    absl::string_view name = pair.substr(0, equals);
    if (!result.emplace(std::string(name), std::string(pair.substr(equals + 1))).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("init_method query parameter ", Quote(name), " is given twice"));
    }
  }
  return result;
}

// Whether `text` is "-"? digits, all ASCII; Python's int() is looser ("+1", " 1", "1_0").
bool IsDecimal(absl::string_view text) {
  if (absl::StartsWith(text, "-")) text.remove_prefix(1);
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return true;
}

// Parses a rank or world size; `what` names its source ("rank", "environment variable RANK").
absl::StatusOr<int64_t> ParseInteger(InitMethodScheme scheme, absl::string_view what,
                                     absl::string_view text) {
  if (!IsDecimal(text)) {
    return Error(scheme, absl::StrCat(what, " must be an integer, got ", Quote(text)));
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return Error(scheme, absl::StrCat(what, " does not fit in 64 bits, got ", Quote(text)));
  }
  return value;
}

// Parses a port; `what` is "port" for the URL's own, or the environment variable's name.
absl::StatusOr<int> ParsePort(InitMethodScheme scheme, absl::string_view what,
                              absl::string_view text) {
  // urlparse gives None for "host" and "host:", and PyTorch tests `if not result.port`, so
  // 0 is "missing" too. A daemon cannot serve a group's store on a port nobody knows.
  const std::string source =
      what == "port" ? std::string() : absl::StrCat(" (", what, " is ", Quote(text), ")");
  if (text.empty()) return Error(scheme, absl::StrCat("port number missing", source));
  if (!IsDecimal(text)) {
    return Error(scheme, absl::StrCat(what, " must be an integer, got ", Quote(text)));
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 0 || value > kMaxPort) {
    // The text, not the value: it may not fit in 64 bits.
    return Error(scheme, absl::StrCat("port must have value from 0 to 65535 but was ",
                                      text.substr(0, kMaxEchoBytes),
                                      text.size() > kMaxEchoBytes ? "..." : "", ".", source));
  }
  if (value == 0) return Error(scheme, absl::StrCat("port number missing", source));
  return static_cast<int>(value);
}

bool IsHostNameChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_'; }

// An IPv6 literal without brackets, with an optional "%zone". Only the alphabet and the
// length are checked: the resolver gives the precise verdict later, this keeps garbage (and
// megabytes of hex digits) out of logs, group state and DNS.
bool IsIpv6Literal(absl::string_view text) {
  const size_t percent = text.find('%');
  absl::string_view address = text.substr(0, percent);
  if (address.find(':') == absl::string_view::npos) return false;
  if (address.size() > kMaxIpv6AddressBytes) return false;
  for (char c : address) {
    if (!absl::ascii_isxdigit(c) && c != ':' && c != '.') return false;
  }
  if (percent == absl::string_view::npos) return true;
  absl::string_view zone = text.substr(percent + 1);
  if (zone.empty() || zone.size() > kMaxIpv6ZoneBytes) return false;
  for (char c : zone) {
    if (!IsHostNameChar(c)) return false;
  }
  return true;
}

// Checks a non-empty host and lower-cases it, like urlparse().hostname. `ipv6` says the host
// came in brackets (or, from MASTER_ADDR, has a ':'), so it must be an IPv6 literal.
absl::StatusOr<std::string> NormalizeHost(InitMethodScheme scheme, absl::string_view host,
                                          bool ipv6) {
  if (ipv6) {
    if (!IsIpv6Literal(host)) {
      return Error(scheme, absl::StrCat("host ", Quote(host), " is not an IPv6 address"));
    }
  } else {
    bool valid = host.size() <= kMaxHostNameBytes;
    for (char c : host) valid = valid && IsHostNameChar(c);
    if (!valid) {
      return Error(scheme, absl::StrCat("host ", Quote(host),
                                        " is not a valid host name (letters, digits, '.', "
                                        "'-', '_', at most 253 bytes; IPv6 in brackets)"));
    }
  }
  return absl::AsciiStrToLower(host);
}

struct HostPort {
  absl::string_view host;
  bool bracketed = false;
  absl::string_view port;  // empty when absent, as urlparse's None
};

// Splits "host", "host:port", "[v6]" or "[v6]:port".
absl::StatusOr<HostPort> SplitNetloc(InitMethodScheme scheme, absl::string_view netloc) {
  if (netloc.find('@') != absl::string_view::npos) {
    // Not echoed: what precedes '@' may be a password.
    return Error(scheme, "user information (\"user@\" before the host) is not supported");
  }
  HostPort result;
  if (absl::StartsWith(netloc, "[")) {
    const size_t close = netloc.find(']');
    if (close == absl::string_view::npos) {
      return Error(scheme, absl::StrCat("invalid IPv6 URL: no ']' in ", Quote(netloc)));
    }
    result.host = netloc.substr(1, close - 1);
    result.bracketed = true;
    absl::string_view rest = netloc.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') {
        return Error(scheme, absl::StrCat("invalid IPv6 URL: ", Quote(rest), " after ']' in ",
                                          Quote(netloc)));
      }
      result.port = rest.substr(1);
    }
    if (result.port.find_first_of("[]") != absl::string_view::npos) {
      return Error(scheme, absl::StrCat("invalid IPv6 URL: ", Quote(netloc)));
    }
    return result;
  }
  if (netloc.find_first_of("[]") != absl::string_view::npos) {
    return Error(scheme, absl::StrCat("invalid IPv6 URL: ", Quote(netloc)));
  }
  const size_t colon = netloc.find(':');
  if (colon != absl::string_view::npos && netloc.find(':', colon + 1) != absl::string_view::npos) {
    return Error(scheme, absl::StrCat("an IPv6 host must be in brackets, e.g. ", SchemeName(scheme),
                                      "://[::1]:29500; got ", Quote(netloc)));
  }
  result.host = netloc.substr(0, colon);
  if (colon != absl::string_view::npos) result.port = netloc.substr(colon + 1);
  return result;
}

// Host and port from a tcp:// or etcd:// netloc, in PyTorch's order: port, then host.
absl::Status ParseAddress(InitMethodScheme scheme, absl::string_view netloc, InitMethod* out) {
  absl::StatusOr<HostPort> host_port = SplitNetloc(scheme, netloc);
  if (!host_port.ok()) return host_port.status();
  absl::StatusOr<int> port = ParsePort(scheme, "port", host_port->port);
  if (!port.ok()) return port.status();
  if (host_port->host.empty()) return Error(scheme, "host missing");
  absl::StatusOr<std::string> host = NormalizeHost(scheme, host_port->host, host_port->bracketed);
  if (!host.ok()) return host.status();
  out->host = *std::move(host);
  out->port = *port;
  return absl::OkStatus();
}

// Takes `name` out of the query (the caller keeps the rest) and parses it.
absl::StatusOr<std::optional<int64_t>> TakeInteger(InitMethodScheme scheme, absl::string_view name,
                                                   std::map<std::string, std::string>* query) {
  auto it = query->find(std::string(name));
  if (it == query->end()) return std::nullopt;
  absl::StatusOr<int64_t> value = ParseInteger(scheme, name, it->second);
  if (!value.ok()) return value.status();
  query->erase(it);
  return *value;
}

// The dynamic-group rule and range checks shared by every scheme (see the header).
absl::Status SetMembership(InitMethodScheme scheme, std::optional<int64_t> rank,
                           std::optional<int64_t> world_size,
                           absl::string_view rank_missing_message, InitMethod* out) {
  if (world_size.has_value() && !rank.has_value()) {
    return Error(scheme, rank_missing_message);
  }
  const std::string of_world_size =
      world_size.has_value() ? absl::StrCat(" (world_size ", *world_size, ")") : "";
  if (world_size.has_value() && *world_size <= 0) {
    return Error(scheme, absl::StrCat("world_size must be at least 1, got ", *world_size, " (rank ",
                                      *rank, ")"));
  }
  if (rank.has_value() && *rank < 0) {
    return Error(scheme, absl::StrCat("rank must be non-negative, got ", *rank, of_world_size));
  }
  if (rank.has_value() && world_size.has_value() && *rank >= *world_size) {
    return Error(scheme,
                 absl::StrCat("rank ", *rank, " must be less than world_size ", *world_size));
  }
  out->rank = rank;
  out->world_size = world_size;
  return absl::OkStatus();
}

// An explicit argument wins over the query (the two never coexist: checked earlier).
absl::StatusOr<std::optional<int64_t>> ExplicitOrQuery(InitMethodScheme scheme,
                                                       absl::string_view name,
                                                       std::optional<int64_t> explicit_value,
                                                       std::map<std::string, std::string>* query) {
  if (explicit_value.has_value()) return explicit_value;
  return TakeInteger(scheme, name, query);
}

// rank and world_size for tcp://, file:// and etcd://: the explicit arguments or the query.
absl::Status MembershipFromQuery(InitMethodScheme scheme, std::optional<int64_t> rank,
                                 std::optional<int64_t> world_size, InitMethod* out) {
  absl::StatusOr<std::optional<int64_t>> r = ExplicitOrQuery(scheme, "rank", rank, &out->query);
  if (!r.ok()) return r.status();
  absl::StatusOr<std::optional<int64_t>> w =
      ExplicitOrQuery(scheme, "world_size", world_size, &out->query);
  if (!w.ok()) return w.status();
  return SetMembership(scheme, *r, *w, "rank parameter missing", out);
}

// The URL parts a scheme ignores in PyTorch are rejected here, so a user who writes them
// learns that they mean nothing instead of wondering why they had no effect.
bool IsEmptyPath(absl::string_view path) { return path.empty() || path == "/"; }

absl::Status ParseTcp(const UrlParts& parts, std::optional<int64_t> rank,
                      std::optional<int64_t> world_size, InitMethod* out) {
  const InitMethodScheme scheme = InitMethodScheme::kTcp;
  absl::Status status = ParseAddress(scheme, parts.netloc, out);
  if (!status.ok()) return status;
  if (!IsEmptyPath(parts.path)) {
    return Error(scheme, absl::StrCat("unexpected path ", Quote(parts.path),
                                      "; a tcp:// URL names only host and port"));
  }
  return MembershipFromQuery(scheme, rank, world_size, out);
}

// An environment variable as PyTorch's _get_env_or_raise reads it: empty means unset.
std::optional<std::string> GetEnv(const std::map<std::string, std::string>& env,
                                  absl::string_view name) {
  auto it = env.find(std::string(name));
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::optional<int64_t>> ExplicitOrQueryOrEnv(
    InitMethodScheme scheme, absl::string_view name, absl::string_view env_name,
    std::optional<int64_t> explicit_value, std::map<std::string, std::string>* query,
    const std::map<std::string, std::string>& env) {
  absl::StatusOr<std::optional<int64_t>> value =
      ExplicitOrQuery(scheme, name, explicit_value, query);
  if (!value.ok() || value->has_value()) return value;
  std::optional<std::string> text = GetEnv(env, env_name);
  if (!text.has_value()) return std::nullopt;
  absl::StatusOr<int64_t> parsed =
      ParseInteger(scheme, absl::StrCat("environment variable ", env_name), *text);
  if (!parsed.ok()) return parsed.status();
  return *parsed;
}

absl::Status ParseEnv(const UrlParts& parts, std::optional<int64_t> rank,
                      std::optional<int64_t> world_size,
                      const std::map<std::string, std::string>& env, InitMethod* out) {
  const InitMethodScheme scheme = InitMethodScheme::kEnv;
  if (!parts.netloc.empty()) {
    return Error(scheme, absl::StrCat("the URL names a host or port (", Quote(parts.netloc),
                                      "); env:// takes them from MASTER_ADDR and MASTER_PORT"));
  }
  if (!IsEmptyPath(parts.path)) {
    return Error(scheme, absl::StrCat("unexpected path ", Quote(parts.path),
                                      "; an env:// URL has only a query"));
  }
  absl::StatusOr<std::optional<int64_t>> r =
      ExplicitOrQueryOrEnv(scheme, "rank", "RANK", rank, &out->query, env);
  if (!r.ok()) return r.status();
  absl::StatusOr<std::optional<int64_t>> w =
      ExplicitOrQueryOrEnv(scheme, "world_size", "WORLD_SIZE", world_size, &out->query, env);
  if (!w.ok()) return w.status();
  absl::Status status =
      SetMembership(scheme, *r, *w, "environment variable RANK expected, but not set", out);
  if (!status.ok()) return status;

  std::optional<std::string> addr = GetEnv(env, "MASTER_ADDR");
  if (!addr.has_value()) {
    return Error(scheme, "environment variable MASTER_ADDR expected, but not set");
  }
  // PyTorch hands MASTER_ADDR to TCPStore as is, so a bare "::1" works there; accept the
  // bracketed URL form too.
  absl::string_view host = *addr;
  bool ipv6 = host.find(':') != absl::string_view::npos;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    ipv6 = true;
  }
  absl::StatusOr<std::string> normalized = NormalizeHost(scheme, host, ipv6);
  if (!normalized.ok()) return normalized.status();

  std::optional<std::string> port_text = GetEnv(env, "MASTER_PORT");
  if (!port_text.has_value()) {
    return Error(scheme, "environment variable MASTER_PORT expected, but not set");
  }
  absl::StatusOr<int> port = ParsePort(scheme, "environment variable MASTER_PORT", *port_text);
  if (!port.ok()) return port.status();
  out->host = *std::move(normalized);
  out->port = *port;
  return absl::OkStatus();
}

absl::Status ParseFile(const UrlParts& parts, std::optional<int64_t> rank,
                       std::optional<int64_t> world_size, InitMethod* out) {
  const InitMethodScheme scheme = InitMethodScheme::kFile;
  if (parts.path.empty()) return Error(scheme, "path missing");
  // RFC 8089: "file://localhost/p" is "file:///p". Python on Linux drops any other host
  // without a word, turning "file://tmp/x" into "/x".
  if (!parts.netloc.empty() && !absl::EqualsIgnoreCase(parts.netloc, "localhost")) {
    return Error(scheme, absl::StrCat("host ", Quote(parts.netloc),
                                      " is not supported; write file:///absolute/path"));
  }
  if (parts.path[0] != '/') {
    return Error(scheme, absl::StrCat("path ", Quote(parts.path),
                                      " must be absolute: the daemon opens it, not the client"));
  }
  out->path = std::string(parts.path);
  return MembershipFromQuery(scheme, rank, world_size, out);
}

absl::Status ParseEtcd(const UrlParts& parts, std::optional<int64_t> rank,
                       std::optional<int64_t> world_size, InitMethod* out) {
  const InitMethodScheme scheme = InitMethodScheme::kEtcd;
  // "a:2379,b:2379": the members of one cluster, as etcdctl's --endpoints lists them.
  std::vector<absl::string_view> pieces = absl::StrSplit(parts.netloc, ',');
  // A URL without "//" has a null netloc, which StrSplit turns into no pieces at all.
  if (pieces.empty()) pieces.emplace_back();
  if (pieces.size() > kMaxEtcdEndpoints) {
    return Error(scheme,
                 absl::StrCat(pieces.size(), " endpoints listed; at most ", kMaxEtcdEndpoints));
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    InitMethod endpoint;
    absl::Status status = ParseAddress(scheme, pieces[i], &endpoint);
    if (!status.ok()) {
      if (pieces.size() == 1) return status;
      // The same message, saying which endpoint it is about.
      absl::string_view message = status.message();
      absl::ConsumePrefix(&message, Error(scheme, "").message());
      // Not echoed when it holds '@': what precedes it may be a password.
      const bool secret = pieces[i].find('@') != absl::string_view::npos;
      return Error(scheme, absl::StrCat("endpoint ", i + 1, " of ", pieces.size(),
                                        secret ? "" : absl::StrCat(" (", Quote(pieces[i]), ")"),
                                        ": ", message));
    }
    InitMethodEndpoint parsed{std::move(endpoint.host), endpoint.port};
    for (const InitMethodEndpoint& earlier : out->endpoints) {
      if (earlier == parsed) {
        return Error(scheme, absl::StrCat("endpoint ", Quote(pieces[i]), " is listed twice"));
      }
    }
    out->endpoints.push_back(std::move(parsed));
  }
  out->host = out->endpoints.front().host;
  out->port = out->endpoints.front().port;
  // Trailing slashes go so that "<prefix>/<key>" never holds "//"; "" and "/" mean the
  // default, since a group's state at the root of etcd would mix with everything else.
  absl::string_view prefix = parts.path;
  while (absl::ConsumeSuffix(&prefix, "/")) {
  }
  out->path = prefix.empty() ? std::string(kDefaultEtcdPrefix) : std::string(prefix);
  return MembershipFromQuery(scheme, rank, world_size, out);
}

}  // namespace

std::string SchemeName(InitMethodScheme scheme) {
  switch (scheme) {
    case InitMethodScheme::kTcp:
      return "tcp";
    case InitMethodScheme::kEnv:
      return "env";
    case InitMethodScheme::kFile:
      return "file";
    case InitMethodScheme::kEtcd:
      return "etcd";
  }
  return absl::StrCat("InitMethodScheme(", static_cast<int>(scheme), ")");
}

absl::StatusOr<InitMethod> ParseInitMethod(absl::string_view url, std::optional<int64_t> rank,
                                           std::optional<int64_t> world_size,
                                           const std::map<std::string, std::string>& env) {
  // Python strips \t\r\n anywhere and other control characters in front; a URL that holds
  // one came out of a broken script or an attacker, so say so instead of guessing.
  for (size_t i = 0; i < url.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(url[i]);
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrFormat("init_method URL has control character 0x%02x at offset %d", c, i));
    }
  }
  // urlsplit's lstrip of leading spaces, so " tcp://..." still has its scheme.
  absl::string_view trimmed = url;
  while (absl::ConsumePrefix(&trimmed, " ")) {
  }

  const UrlParts parts = SplitUrl(trimmed);
  if (parts.has_fragment) {
    return absl::InvalidArgumentError(
        absl::StrCat("init_method URL ", Quote(url),
                     " has a '#' fragment, which would cut its path or query short"));
  }
  absl::StatusOr<std::map<std::string, std::string>> query = ParseQuery(parts.query);
  if (!query.ok()) return query.status();
  // _rendezvous_helper asserts this whenever either explicit argument is given.
  if ((rank.has_value() || world_size.has_value()) &&
      (query->count("rank") > 0 || query->count("world_size") > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "The url: ", Echo(url), " has node-specific arguments(rank, world_size) already."));
  }

  InitMethod result;
  result.query = *std::move(query);
  absl::Status status;
  if (parts.scheme == "tcp") {
    result.scheme = InitMethodScheme::kTcp;
    status = ParseTcp(parts, rank, world_size, &result);
  } else if (parts.scheme == "env") {
    result.scheme = InitMethodScheme::kEnv;
    status = ParseEnv(parts, rank, world_size, env, &result);
  } else if (parts.scheme == "file") {
    result.scheme = InitMethodScheme::kFile;
    status = ParseFile(parts, rank, world_size, &result);
  } else if (parts.scheme == "etcd") {
    result.scheme = InitMethodScheme::kEtcd;
    status = ParseEtcd(parts, rank, world_size, &result);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("No rendezvous handler for ", Echo(parts.scheme), "://"));
  }
  if (!status.ok()) return status;
  return result;
}

}  // namespace tpd::store
