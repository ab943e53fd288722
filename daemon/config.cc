#include "daemon/config.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/dial_networks.h"
#include "store/file/path_policy.h"

// Errors are values here too: toml++ reports parse failures in its result instead of throwing.
#define TOML_EXCEPTIONS 0
#include "toml++/toml.h"

namespace tpd {
namespace {

// agent::kMaxAcceptNetworks (agent/listen_guard.h; the config does not depend on the agent).
constexpr size_t kMaxAgentAcceptNetworks = 256;

// Reads the field `key` of `table` into `out` when present, and remembers it as known.
class TableReader {
 public:
  TableReader(const toml::table& table, std::string name, std::string source)
      : table_(table), name_(std::move(name)), source_(std::move(source)) {}

  absl::Status String(const char* key, std::string* out) {
    known_.insert(key);
    const toml::node* node = table_.get(key);
    if (node == nullptr) return absl::OkStatus();
    std::optional<std::string> value = node->value<std::string>();
    if (!value) return TypeError(key, "a string");
    *out = *value;
    return absl::OkStatus();
  }

  absl::Status StringList(const char* key, std::vector<std::string>* out) {
    known_.insert(key);
    const toml::node* node = table_.get(key);
    if (node == nullptr) return absl::OkStatus();
    const toml::array* array = node->as_array();
    if (array == nullptr) return TypeError(key, "an array of strings");
    std::vector<std::string> values;
    for (const toml::node& element : *array) {
      std::optional<std::string> value = element.value<std::string>();
      if (!value) return TypeError(key, "an array of strings");
      values.push_back(*std::move(value));
    }
    *out = std::move(values);
    return absl::OkStatus();
  }

  absl::Status Int(const char* key, int64_t* out) {
    known_.insert(key);
    const toml::node* node = table_.get(key);
    if (node == nullptr) return absl::OkStatus();
    if (!node->is_integer()) return TypeError(key, "an integer");
    *out = *node->value<int64_t>();
    return absl::OkStatus();
  }

  absl::Status Bool(const char* key, bool* out) {
    known_.insert(key);
    const toml::node* node = table_.get(key);
    if (node == nullptr) return absl::OkStatus();
    if (!node->is_boolean()) return TypeError(key, "true or false");
    *out = *node->value<bool>();
    return absl::OkStatus();
  }

  absl::Status Millis(const char* key, absl::Duration* out) {
    int64_t ms = absl::ToInt64Milliseconds(*out);
    if (absl::Status status = Int(key, &ms); !status.ok()) return status;
    *out = absl::Milliseconds(ms);
    return absl::OkStatus();
  }

  // Fails on any key the caller did not read: most likely a typo.
  absl::Status NoUnknownKeys() const {
    for (const auto& [key, node] : table_) {
      if (!known_.contains(std::string(key.str()))) {
        return absl::InvalidArgumentError(absl::StrCat(
            source_, ": unknown key \"", std::string(key.str()), "\" in [", name_, "]"));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status TypeError(const char* key, const char* want) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": [", name_, "] ", key, " must be ", want));
  }

  const toml::table& table_;
  const std::string name_;
  const std::string source_;
  absl::flat_hash_set<std::string> known_;
};

// Checks "host:port" / "[v6]:port" with port 0..65535; INVALID_ARGUMENT naming `field`.
absl::Status ValidateHostPort(const char* field, const std::string& value) {
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be host:port (IPv6 in brackets, e.g. \"[::]:29400\"), got \"",
                     value, "\": ", why));
  };
  std::string host;
  std::string port;
  if (!value.empty() && value[0] == '[') {
    const size_t close = value.find(']');
    if (close == std::string::npos) return invalid("no ']' after the IPv6 address");
    host = value.substr(1, close - 1);
    if (host.empty() || host.find(':') == std::string::npos) {
      return invalid("brackets are for IPv6 addresses");
    }
    if (value.size() == close + 1 || value[close + 1] != ':') return invalid("no :port");
    port = value.substr(close + 2);
  } else {
    const size_t colon = value.rfind(':');
    if (colon == std::string::npos) return invalid("no :port");
    host = value.substr(0, colon);
    if (host.find(':') != std::string::npos) return invalid("an IPv6 address needs brackets");
    port = value.substr(colon + 1);
  }
  if (host.empty()) return invalid("no host (\"0.0.0.0\" listens on every IPv4 address)");
  if (host.find_first_of(" \t/@") != std::string::npos) return invalid("not a host");
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
    return invalid("the port must be a number 0..65535");
  }
  return absl::OkStatus();
}

// civetweb binds IP literals only: a name would be resolved by no one.
absl::Status ValidateMetricsAddress(const std::string& value) {
  if (absl::Status status = ValidateHostPort("metrics.listen_address", value); !status.ok()) {
    return status;
  }
  const bool v6 = value[0] == '[';
  const std::string host =
      v6 ? value.substr(1, value.find(']') - 1) : value.substr(0, value.rfind(':'));
  unsigned char address[sizeof(in6_addr)];
  if (inet_pton(v6 ? AF_INET6 : AF_INET, host.c_str(), address) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics.listen_address must name an IP address, not a host name (\"127.0.0.1:9477\", "
        "\"[::1]:9477\"), got \"",
        value, "\""));
  }
  return absl::OkStatus();
}

const toml::table* SubTable(const toml::table& root, const char* name) {
  const toml::node* node = root.get(name);
  return node == nullptr ? nullptr : node->as_table();
}

}  // namespace

absl::StatusOr<Config> ParseConfig(absl::string_view toml_text, absl::string_view source) {
  toml::parse_result parsed = toml::parse(std::string_view(toml_text.data(), toml_text.size()),
                                          std::string_view(source.data(), source.size()));
  if (!parsed) {
    const toml::parse_error& error = parsed.error();
    return absl::InvalidArgumentError(
        absl::StrFormat("%s:%d:%d: %s", source, error.source().begin.line,
                        error.source().begin.column, std::string(error.description())));
  }
  const toml::table& root = parsed.table();
  for (const auto& [key, node] : root) {
    const std::string table(key.str());
    if (table != "daemon" && table != "store" && table != "peer" && table != "group" &&
        table != "data" && table != "agent" && table != "etcd" && table != "metrics") {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": unknown table [", table,
          "]; known: [daemon], [store], [peer], [group], [data], [agent], [etcd], [metrics]"));
    }
    if (!node.is_table()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", std::string(key.str()), " must be a table"));
    }
  }

  Config config;
  config.config_path = std::string(source);
  if (const toml::table* daemon = SubTable(root, "daemon")) {
    TableReader reader(*daemon, "daemon", std::string(source));
    std::string mode = absl::StrFormat("%04o", config.socket_mode);
    for (absl::Status status :
         {reader.String("socket", &config.socket_path), reader.String("socket_mode", &mode),
          reader.String("socket_group", &config.socket_group),
          reader.String("operator_socket", &config.operator_socket),
          reader.String("operator_group", &config.operator_group),
          reader.String("log_level", &config.log_level),
          reader.Millis("shutdown_grace_ms", &config.shutdown_grace), reader.NoUnknownKeys()}) {
      if (!status.ok()) return status;
    }
    if (mode.empty() || mode.size() > 4 ||
        mode.find_first_not_of("01234567") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": [daemon] socket_mode must be octal permission bits such as \"0660\", got \"",
          mode, "\""));
    }
    config.socket_mode = static_cast<mode_t>(std::strtoul(mode.c_str(), nullptr, 8));
  }
  if (const toml::table* store = SubTable(root, "store")) {
    TableReader reader(*store, "store", std::string(source));
    StoreConfig& s = config.store;
    for (absl::Status status :
         {reader.Millis("default_timeout_ms", &s.default_timeout),
          reader.Int("max_key_bytes", &s.max_key_bytes),
          reader.Int("max_value_bytes", &s.max_value_bytes),
          reader.Int("max_keys_per_request", &s.max_keys_per_request),
          reader.Int("max_waiters", &s.max_waiters),
          reader.Int("max_total_bytes", &s.max_total_bytes), reader.Int("max_keys", &s.max_keys),
          reader.Int("max_bytes_per_uid", &s.max_bytes_per_uid),
          reader.Int("max_keys_per_uid", &s.max_keys_per_uid),
          reader.Int("max_waiters_per_uid", &s.max_waiters_per_uid),
          reader.Int("max_bytes_without_session", &s.max_bytes_without_session),
          reader.Int("max_keys_without_session", &s.max_keys_without_session),
          reader.Int("max_waiters_without_session", &s.max_waiters_without_session),
          reader.Int("max_namespace_bytes", &s.max_namespace_bytes), reader.NoUnknownKeys()}) {
      if (!status.ok()) return status;
    }
  }
  if (const toml::table* peer = SubTable(root, "peer")) {
    TableReader reader(*peer, "peer", std::string(source));
    for (absl::Status status :
         {reader.String("listen_address", &config.peer.listen_address),
          reader.String("token", &config.peer.token),
          reader.String("node_name", &config.peer.node_name),
          reader.Millis("heartbeat_interval_ms", &config.peer.heartbeat_interval),
          reader.Millis("heartbeat_timeout_ms", &config.peer.heartbeat_timeout),
          reader.Millis("auth_max_skew_ms", &config.peer.auth_max_skew),
          reader.StringList("dial_networks", &config.peer.dial_networks),
          reader.String("tls_cert_file", &config.peer.tls_cert_file),
          reader.String("tls_key_file", &config.peer.tls_key_file),
          reader.String("tls_ca_file", &config.peer.tls_ca_file), reader.NoUnknownKeys()}) {
      if (!status.ok()) return status;
    }
  }
  if (const toml::table* group = SubTable(root, "group")) {
    TableReader reader(*group, "group", std::string(source));
    for (absl::Status status :
         {reader.Millis("default_join_timeout_ms", &config.group.default_join_timeout),
          reader.Int("cuda_device_count", &config.group.cuda_device_count),
          reader.Int("max_groups", &config.group.max_groups),
          reader.Int("max_unattributed_groups", &config.group.max_unattributed_groups),
          reader.Int("max_groups_per_uid", &config.group.max_groups_per_uid),
          reader.Int("max_groups_per_session", &config.group.max_groups_per_session),
          reader.Millis("idle_group_release_ms", &config.group.idle_group_release),
          reader.StringList("file_rendezvous_dirs", &config.group.file_rendezvous_dirs),
          reader.Int("max_world_size", &config.group.max_world_size),
          reader.Int("max_transports", &config.group.max_transports),
          reader.Int("max_channels", &config.group.max_channels),
          reader.Int("max_devices", &config.group.max_devices),
          reader.Int("max_device_map_entries", &config.group.max_device_map_entries),
          reader.Int("max_env_entries", &config.group.max_env_entries),
          reader.Int("max_option_bytes", &config.group.max_option_bytes), reader.NoUnknownKeys()}) {
      if (!status.ok()) return status;
    }
  }
  if (const toml::table* data = SubTable(root, "data")) {
    TableReader reader(*data, "data", std::string(source));
    for (absl::Status status :
         {reader.String("socket", &config.data.socket_path),
          reader.Int("arena_bytes", &config.data.arena_bytes),
          reader.Int("max_sessions", &config.data.max_sessions),
          reader.Int("max_sessions_per_uid", &config.data.max_sessions_per_uid),
          reader.Int("max_shared_memory_bytes", &config.data.max_shared_memory_bytes),
          reader.Int("sessions_kept_free", &config.data.sessions_kept_free),
          reader.Int("max_open_sessions", &config.data.max_open_sessions),
          reader.Int("max_open_sessions_per_uid", &config.data.max_open_sessions_per_uid),
          reader.Int("max_unidentified_sessions", &config.data.max_unidentified_sessions),
          reader.Millis("session_identify_timeout_ms", &config.data.session_identify_timeout),
          reader.String("device_dir", &config.data.device_dir),
          reader.Int("max_calls_in_flight", &config.data.max_calls_in_flight),
          reader.Bool("share_memory", &config.data.share_memory), reader.NoUnknownKeys()}) {
      if (!status.ok()) return status;
    }
  }
  if (const toml::table* agent = SubTable(root, "agent")) {
    TableReader reader(*agent, "agent", std::string(source));
    std::vector<std::string> accept_networks;
    for (absl::Status status :
         {reader.String("listen_address", &config.agent.listen_address),
          reader.StringList("transports", &config.agent.transports),
          reader.StringList("channels", &config.agent.channels),
          reader.Int("mpt_lanes", &config.agent.mpt_lanes),
          reader.Int("max_message_bytes", &config.agent.max_message_bytes),
          reader.Int("cuda_chunk_bytes", &config.agent.cuda_chunk_bytes),
          reader.StringList("accept_networks", &accept_networks), reader.NoUnknownKeys()}) {
      if (!status.ok()) return status;
    }
    if (agent->get("accept_networks") != nullptr) config.agent.accept_networks = accept_networks;
  }
  if (const toml::table* metrics = SubTable(root, "metrics")) {
    TableReader reader(*metrics, "metrics", std::string(source));
    for (absl::Status status : {reader.String("listen_address", &config.metrics.listen_address),
                                reader.NoUnknownKeys()}) {
      if (!status.ok()) return status;
    }
  }
  if (const toml::table* etcd = SubTable(root, "etcd")) {
    if (etcd->get("password") != nullptr) {
      // Not echoed: it may well be the password.
      return absl::InvalidArgumentError(
          absl::StrCat(source,
                       ": [etcd] password is not a setting: put the password in a file only the "
                       "daemon's user can read and name it in [etcd] password_file"));
    }
    TableReader reader(*etcd, "etcd", std::string(source));
    EtcdConfig& e = config.etcd;
    for (absl::Status status :
         {reader.String("user", &e.user), reader.String("password_file", &e.password_file),
          reader.String("ca_file", &e.ca_file), reader.String("cert_file", &e.cert_file),
          reader.String("key_file", &e.key_file), reader.Millis("call_timeout_ms", &e.call_timeout),
          reader.Millis("connect_timeout_ms", &e.connect_timeout), reader.NoUnknownKeys()}) {
      if (!status.ok()) return status;
    }
  }
  return config;
}

absl::StatusOr<Config> LoadConfig(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  }
  // Read with istream::read, which sets badbit on a read error. Copying file.rdbuf() into a
  // stringstream swallowed the error, so a directory (which opens fine but fails with EISDIR
  // on read) or a file whose read failed parsed as empty text and silently ran on defaults.
  std::string text;
  char chunk[4096];
  do {
    file.read(chunk, sizeof(chunk));
    text.append(chunk, static_cast<size_t>(file.gcount()));
  } while (file);
  if (file.bad()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read config file ", path, ": read failed (is it a directory?)"));
  }
  return ParseConfig(text, path);
}

namespace {

// [store] max_namespace_bytes and the [group] limits on what a local client may send
// (issue 6; docs/security.md).
absl::Status ValidateClientLimits(const Config& config) {
  struct Limit {
    const char* field;
    int64_t value;
    int64_t cap;
    // 0 is allowed where it means "derived from the machine" (data.max_sessions,
    // max_shared_memory_bytes: daemon/session_limits.h), "no cap" or "none kept".
    int64_t min = 1;
  };
  const GroupConfig& g = config.group;
  const Limit limits[] = {
      {"store.max_namespace_bytes", config.store.max_namespace_bytes, int64_t{1} << 20},
      {"group.max_world_size", g.max_world_size, int64_t{1} << 24},
      {"group.max_transports", g.max_transports, 1024},
      {"group.max_channels", g.max_channels, 1024},
      {"group.max_devices", g.max_devices, int64_t{1} << 16},
      {"group.max_device_map_entries", g.max_device_map_entries, int64_t{1} << 16},
      {"group.max_env_entries", g.max_env_entries, 4096},
      {"group.max_option_bytes", g.max_option_bytes, 65536},
      {"data.max_sessions", config.data.max_sessions, 65536, 0},
      {"data.max_sessions_per_uid", config.data.max_sessions_per_uid, 65536, 0},
      {"data.sessions_kept_free", config.data.sessions_kept_free, 65536, 0},
      {"data.max_shared_memory_bytes", config.data.max_shared_memory_bytes, int64_t{1} << 50, 0},
      {"data.max_open_sessions", config.data.max_open_sessions, 1 << 20},
      {"data.max_open_sessions_per_uid", config.data.max_open_sessions_per_uid, 1 << 20},
      {"data.max_unidentified_sessions", config.data.max_unidentified_sessions, 1 << 20},
      {"data.max_calls_in_flight", config.data.max_calls_in_flight, 1 << 20},
      {"agent.mpt_lanes", config.agent.mpt_lanes, 64},
      {"agent.max_message_bytes", config.agent.max_message_bytes, int64_t{1} << 40},
  };
  for (const Limit& limit : limits) {
    if (limit.value < limit.min || limit.value > limit.cap) {
      return absl::InvalidArgumentError(absl::StrCat(limit.field, " must be ", limit.min, "..",
                                                     limit.cap, ", got ", limit.value));
    }
  }
  for (const std::string& dir : g.file_rendezvous_dirs) {
    if (absl::Status status = store::ValidateRendezvousDir(dir); !status.ok()) return status;
  }
  if (config.agent.cuda_chunk_bytes != 0 && (config.agent.cuda_chunk_bytes < (int64_t{1} << 20) ||
                                             config.agent.cuda_chunk_bytes > (int64_t{1} << 30))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "agent.cuda_chunk_bytes must be 0 (whole tensors) or 1048576 (1 MiB)..1073741824 "
        "(1 GiB), got ",
        config.agent.cuda_chunk_bytes));
  }
  if (config.data.arena_bytes < (int64_t{64} << 10) ||
      config.data.arena_bytes > (int64_t{16} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.arena_bytes must be 65536 (64 KiB)..17179869184 (16 GiB), got ",
                     config.data.arena_bytes));
  }
  return absl::OkStatus();
}

// [etcd]: which settings go together, and the timeouts' ranges. The files are read at start.
absl::Status ValidateEtcd(const EtcdConfig& etcd) {
  if (etcd.user.empty() != etcd.password_file.empty()) {
    return absl::InvalidArgumentError(
        etcd.user.empty()
            ? "etcd.user must be set with etcd.password_file"
            : "etcd.password_file must be set with etcd.user: a file holding the password "
              "(never the password in the config)");
  }
  if (etcd.cert_file.empty() != etcd.key_file.empty()) {
    return absl::InvalidArgumentError(
        etcd.cert_file.empty()
            ? "etcd.cert_file must be set with etcd.key_file: a client certificate and its key"
            : "etcd.key_file must be set with etcd.cert_file: a client certificate and its key");
  }
  const int64_t call_ms = absl::ToInt64Milliseconds(etcd.call_timeout);
  if (call_ms < 1 || call_ms > 3600000) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd.call_timeout_ms must be 1..3600000 (1 hour), got ", call_ms));
  }
  const int64_t connect_ms = absl::ToInt64Milliseconds(etcd.connect_timeout);
  if (connect_ms < 1 || connect_ms > call_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd.connect_timeout_ms must be 1..etcd.call_timeout_ms (", call_ms,
                     "), got ", connect_ms));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateConfig(const Config& config) {
  if (absl::Status status = ValidateClientLimits(config); !status.ok()) return status;
  if (!absl::StartsWith(config.data.device_dir, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.device_dir must be an absolute path, got \"",
                     absl::CEscape(config.data.device_dir), "\""));
  }
  auto positive = [](const char* field, int64_t value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(field, " must be > 0, got ", value));
  };
  const StoreConfig& s = config.store;
  for (absl::Status status :
       {positive("store.default_timeout_ms", absl::ToInt64Milliseconds(s.default_timeout)),
        positive("store.max_key_bytes", s.max_key_bytes),
        positive("store.max_value_bytes", s.max_value_bytes),
        positive("store.max_total_bytes", s.max_total_bytes),
        positive("store.max_keys", s.max_keys),
        positive("store.max_keys_per_request", s.max_keys_per_request),
        positive("store.max_waiters", s.max_waiters),
        positive("peer.heartbeat_interval_ms",
                 absl::ToInt64Milliseconds(config.peer.heartbeat_interval)),
        positive("group.default_join_timeout_ms",
                 absl::ToInt64Milliseconds(config.group.default_join_timeout)),
        positive("group.max_groups", config.group.max_groups),
        positive("group.max_unattributed_groups", config.group.max_unattributed_groups),
        positive("group.max_groups_per_uid", config.group.max_groups_per_uid),
        positive("group.max_groups_per_session", config.group.max_groups_per_session),
        positive("group.idle_group_release_ms",
                 absl::ToInt64Milliseconds(config.group.idle_group_release)),
        positive("data.session_identify_timeout_ms",
                 absl::ToInt64Milliseconds(config.data.session_identify_timeout))}) {
    if (!status.ok()) return status;
  }
  // A share of 0 leaves that writer bounded by the totals only.
  for (const auto& [field, value] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"store.max_bytes_per_uid", s.max_bytes_per_uid},
           {"store.max_keys_per_uid", s.max_keys_per_uid},
           {"store.max_waiters_per_uid", s.max_waiters_per_uid},
           {"store.max_bytes_without_session", s.max_bytes_without_session},
           {"store.max_keys_without_session", s.max_keys_without_session},
           {"store.max_waiters_without_session", s.max_waiters_without_session}}) {
    if (value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " must be >= 0 (0: bounded by the store's totals only), got ", value));
    }
  }
  // gRPC's own message limit is derived from these, so they are capped well below overflow.
  auto at_most = [](const char* field, int64_t value, int64_t cap, const char* cap_text) {
    if (value <= cap) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be <= ", cap_text, ", got ", value));
  };
  for (absl::Status status :
       {at_most("store.max_value_bytes", s.max_value_bytes, int64_t{1} << 30, "1 GiB"),
        at_most("store.max_key_bytes", s.max_key_bytes, int64_t{1} << 20, "1 MiB"),
        at_most("store.max_keys_per_request", s.max_keys_per_request, int64_t{1} << 20,
                "1048576")}) {
    if (!status.ok()) return status;
  }
  if (!config.peer.listen_address.empty()) {
    if (absl::Status status = ValidateHostPort("peer.listen_address", config.peer.listen_address);
        !status.ok()) {
      return status;
    }
  }
  if (!config.metrics.listen_address.empty()) {
    if (absl::Status status = ValidateMetricsAddress(config.metrics.listen_address); !status.ok()) {
      return status;
    }
  }
  if (!config.agent.listen_address.empty()) {
    if (config.peer.listen_address.empty()) {
      return absl::InvalidArgumentError(
          "agent.listen_address is set but peer.listen_address is not: the agent serves only "
          "daemons that share the peer token");
    }
    if (absl::Status status = ValidateHostPort("agent.listen_address", config.agent.listen_address);
        !status.ok()) {
      return status;
    }
  }
  const int64_t skew_ms = absl::ToInt64Milliseconds(config.peer.auth_max_skew);
  if (skew_ms < 1 || skew_ms > 3600000) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer.auth_max_skew_ms must be 1..3600000 (1 hour), got ", skew_ms));
  }
  if (absl::StatusOr<NetworkList> networks = NetworkList::Parse(config.peer.dial_networks);
      !networks.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer.dial_networks: ", networks.status().message()));
  }
  if (config.agent.accept_networks.has_value()) {
    if (absl::StatusOr<NetworkList> networks = NetworkList::Parse(*config.agent.accept_networks);
        !networks.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("agent.accept_networks: ", networks.status().message()));
    }
  }
  if (!config.peer.listen_address.empty()) {
    // The agent runs: its socket filter needs at least one network and fits at most
    // agent::kMaxAcceptNetworks (agent/listen_guard.h).
    const std::vector<std::string>& accept = AgentAcceptNetworks(config);
    const char* field = config.agent.accept_networks.has_value()
                            ? "agent.accept_networks"
                            : "agent.accept_networks (unset: peer.dial_networks)";
    if (accept.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field,
          " is empty, so no peer daemon could connect to the agent: set "
          "agent.accept_networks to the cluster's networks (\"0.0.0.0/0\" and \"::/0\" "
          "admit every host)"));
    }
    if (accept.size() > kMaxAgentAcceptNetworks) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " has ", accept.size(), " networks; at most ", kMaxAgentAcceptNetworks,
          " fit the agent's socket filter: merge them into fewer, wider networks"));
    }
  }
  const std::pair<const char*, const std::string*> tls_files[] = {
      {"peer.tls_cert_file", &config.peer.tls_cert_file},
      {"peer.tls_key_file", &config.peer.tls_key_file},
      {"peer.tls_ca_file", &config.peer.tls_ca_file}};
  const bool any_tls = !config.peer.tls_cert_file.empty() || !config.peer.tls_key_file.empty() ||
                       !config.peer.tls_ca_file.empty();
  for (const auto& [field, value] : tls_files) {
    if (any_tls && value->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       " must be set: mutual TLS needs peer.tls_cert_file, peer.tls_key_file and "
                       "peer.tls_ca_file together (or none of them)"));
    }
  }
  if (absl::Status status = ValidateEtcd(config.etcd); !status.ok()) return status;
  if (!config.peer.listen_address.empty() && config.peer.token.empty()) {
    return absl::InvalidArgumentError(
        "peer.token must be set when peer.listen_address is: the peer port never serves "
        "unauthenticated calls");
  }
  if (config.peer.heartbeat_timeout < 2 * config.peer.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer.heartbeat_timeout_ms must be at least twice peer.heartbeat_interval_ms, got ",
        absl::ToInt64Milliseconds(config.peer.heartbeat_timeout), " and ",
        absl::ToInt64Milliseconds(config.peer.heartbeat_interval)));
  }
  if (config.group.cuda_device_count < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("group.cuda_device_count must be -1 (detect) or >= 0, got ",
                     config.group.cuda_device_count));
  }
  if (config.shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("daemon.shutdown_grace_ms must be >= 0");
  }
  if (config.socket_mode & ~0777) {
    return absl::InvalidArgumentError(
        absl::StrFormat("daemon.socket_mode must be within 0777, got %04o", config.socket_mode));
  }
  static const absl::flat_hash_set<std::string> kLevels = {"trace", "debug",    "info", "warn",
                                                           "error", "critical", "off"};
  if (!kLevels.contains(config.log_level)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "daemon.log_level must be one of trace, debug, info, warn, error, critical, off; got \"",
        config.log_level, "\""));
  }
  return absl::OkStatus();
}

const std::vector<std::string>& AgentAcceptNetworks(const Config& config) {
  return config.agent.accept_networks.has_value() ? *config.agent.accept_networks
                                                  : config.peer.dial_networks;
}

}  // namespace tpd
