// Unit tests of the daemon's config: TOML parsing, validation, loading, and the shipped
// example deploy/tpd.toml.

#include "daemon/config.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The socket the example config names: the system path the systemd unit serves.
constexpr char kSystemSocketPath[] = "/run/tpd/tpd.sock";

// Every option ParseConfig accepts, as "table.key".
const std::vector<std::string>& AllOptions() {
  static const auto* options = new std::vector<std::string>{
      "daemon.socket",
      "daemon.socket_mode",
      "daemon.socket_group",
      "daemon.operator_socket",
      "daemon.operator_group",
      "daemon.log_level",
      "daemon.shutdown_grace_ms",
      "store.default_timeout_ms",
      "store.max_key_bytes",
      "store.max_value_bytes",
      "store.max_keys_per_request",
      "store.max_waiters",
      "store.max_total_bytes",
      "store.max_keys",
      "store.max_bytes_per_uid",
      "store.max_keys_per_uid",
      "store.max_waiters_per_uid",
      "store.max_bytes_without_session",
      "store.max_keys_without_session",
      "store.max_waiters_without_session",
      "store.max_namespace_bytes",
      "peer.listen_address",
      "peer.token",
      "peer.node_name",
      "peer.heartbeat_interval_ms",
      "peer.heartbeat_timeout_ms",
      "peer.auth_max_skew_ms",
      "peer.dial_networks",
      "peer.tls_cert_file",
      "peer.tls_key_file",
      "peer.tls_ca_file",
      "group.default_join_timeout_ms",
      "group.cuda_device_count",
      "group.max_groups",
      "group.max_unattributed_groups",
      "group.max_groups_per_uid",
      "group.max_groups_per_session",
      "group.idle_group_release_ms",
      "group.file_rendezvous_dirs",
      "group.max_world_size",
      "group.max_transports",
      "group.max_channels",
      "group.max_devices",
      "group.max_device_map_entries",
      "group.max_env_entries",
      "group.max_option_bytes",
      "data.socket",
      "data.arena_bytes",
      "data.max_sessions",
      "data.max_sessions_per_uid",
      "data.max_shared_memory_bytes",
      "data.sessions_kept_free",
      "data.max_open_sessions",
      "data.max_open_sessions_per_uid",
      "data.session_identify_timeout_ms",
      "data.max_unidentified_sessions",
      "data.device_dir",
      "data.share_memory",
      "etcd.user",
      "etcd.password_file",
      "etcd.ca_file",
      "etcd.cert_file",
      "etcd.key_file",
      "etcd.call_timeout_ms",
      "etcd.connect_timeout_ms",
      "metrics.listen_address",
  };
  return *options;
}

std::string ExampleConfigPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return "deploy/tpd.toml";
  return absl::StrCat(srcdir, "/", workspace, "/deploy/tpd.toml");
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// Expects `config` to hold the defaults in every field but config_path and socket_path.
void ExpectDefaultsExceptPaths(const Config& config) {
  const Config defaults;
  EXPECT_EQ(config.socket_mode, defaults.socket_mode);
  EXPECT_EQ(config.socket_group, defaults.socket_group);
  EXPECT_EQ(config.log_level, defaults.log_level);
  EXPECT_EQ(config.shutdown_grace, defaults.shutdown_grace);
  EXPECT_EQ(config.store.default_timeout, defaults.store.default_timeout);
  EXPECT_EQ(config.store.max_key_bytes, defaults.store.max_key_bytes);
  EXPECT_EQ(config.store.max_value_bytes, defaults.store.max_value_bytes);
  EXPECT_EQ(config.store.max_keys_per_request, defaults.store.max_keys_per_request);
  EXPECT_EQ(config.store.max_waiters, defaults.store.max_waiters);
  EXPECT_EQ(config.store.max_namespace_bytes, defaults.store.max_namespace_bytes);
  EXPECT_EQ(config.group.file_rendezvous_dirs, defaults.group.file_rendezvous_dirs);
  EXPECT_EQ(config.group.max_world_size, defaults.group.max_world_size);
  EXPECT_EQ(config.group.max_transports, defaults.group.max_transports);
  EXPECT_EQ(config.group.max_channels, defaults.group.max_channels);
  EXPECT_EQ(config.group.max_devices, defaults.group.max_devices);
  EXPECT_EQ(config.group.max_device_map_entries, defaults.group.max_device_map_entries);
  EXPECT_EQ(config.group.max_env_entries, defaults.group.max_env_entries);
  EXPECT_EQ(config.group.max_option_bytes, defaults.group.max_option_bytes);
  EXPECT_EQ(config.peer.auth_max_skew, defaults.peer.auth_max_skew);
  EXPECT_EQ(config.peer.dial_networks, defaults.peer.dial_networks);
  EXPECT_EQ(config.peer.tls_cert_file, defaults.peer.tls_cert_file);
  EXPECT_EQ(config.peer.tls_key_file, defaults.peer.tls_key_file);
  EXPECT_EQ(config.peer.tls_ca_file, defaults.peer.tls_ca_file);
  EXPECT_EQ(config.data.socket_path, defaults.data.socket_path);
  EXPECT_EQ(config.data.arena_bytes, defaults.data.arena_bytes);
  EXPECT_EQ(config.data.max_sessions, defaults.data.max_sessions);
  EXPECT_EQ(config.data.max_sessions_per_uid, defaults.data.max_sessions_per_uid);
  EXPECT_EQ(config.data.max_open_sessions, defaults.data.max_open_sessions);
  EXPECT_EQ(config.data.max_open_sessions_per_uid, defaults.data.max_open_sessions_per_uid);
  EXPECT_EQ(config.data.session_identify_timeout, defaults.data.session_identify_timeout);
  EXPECT_EQ(config.data.device_dir, defaults.data.device_dir);
  EXPECT_EQ(config.data.share_memory, defaults.data.share_memory);
  EXPECT_EQ(config.etcd.user, defaults.etcd.user);
  EXPECT_EQ(config.etcd.password_file, defaults.etcd.password_file);
  EXPECT_EQ(config.etcd.ca_file, defaults.etcd.ca_file);
  EXPECT_EQ(config.etcd.cert_file, defaults.etcd.cert_file);
  EXPECT_EQ(config.etcd.key_file, defaults.etcd.key_file);
  EXPECT_EQ(config.etcd.call_timeout, defaults.etcd.call_timeout);
  EXPECT_EQ(config.etcd.connect_timeout, defaults.etcd.connect_timeout);
}

TEST(ConfigTest, EmptyTextGivesDocumentedDefaults) {
  absl::StatusOr<Config> config = ParseConfig("", "empty.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->config_path, "empty.toml");
  EXPECT_EQ(config->socket_path, "");
  ExpectDefaultsExceptPaths(*config);
  // The values deploy/tpd.toml documents.
  EXPECT_EQ(config->socket_mode, 0660u);
  EXPECT_EQ(config->socket_group, "");
  EXPECT_EQ(config->log_level, "info");
  EXPECT_EQ(config->shutdown_grace, absl::Seconds(5));
  EXPECT_EQ(config->store.default_timeout, absl::Seconds(300));
  EXPECT_EQ(config->store.max_key_bytes, 4096);
  EXPECT_EQ(config->store.max_value_bytes, 16 << 20);
  EXPECT_EQ(config->store.max_keys_per_request, 1024);
  EXPECT_EQ(config->store.max_waiters, 100000);
  EXPECT_TRUE(ValidateConfig(*config).ok());
}

TEST(ConfigTest, EmptyTablesGiveDefaults) {
  absl::StatusOr<Config> config = ParseConfig("[daemon]\n[store]\n", "tables.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->socket_path, "");
  ExpectDefaultsExceptPaths(*config);
}

TEST(ConfigTest, ExampleFileParsesToDefaultsAndValidates) {
  const std::string path = ExampleConfigPath();
  const std::string text = ReadFile(path);
  ASSERT_FALSE(text.empty()) << "cannot read the example config at " << path;
  absl::StatusOr<Config> config = ParseConfig(text, path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->config_path, path);
  EXPECT_EQ(config->socket_path, kSystemSocketPath);
  ExpectDefaultsExceptPaths(*config);
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);
}

TEST(ConfigTest, ExampleFileLoadsWithLoadConfig) {
  const std::string path = ExampleConfigPath();
  absl::StatusOr<Config> config = LoadConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->config_path, path);
  EXPECT_EQ(config->socket_path, kSystemSocketPath);
  ExpectDefaultsExceptPaths(*config);
}

// Parsing to defaults alone would not notice an option missing from the example; this does.
TEST(ConfigTest, ExampleFileSetsEveryOptionInItsTable) {
  const std::string text = ReadFile(ExampleConfigPath());
  ASSERT_FALSE(text.empty());
  for (const std::string& option : AllOptions()) {
    const size_t dot = option.find('.');
    const std::string table = absl::StrCat("\n[", option.substr(0, dot), "]\n");
    const std::string line = absl::StrCat("\n", option.substr(dot + 1), " = ");
    const size_t table_at = text.find(table);
    ASSERT_NE(table_at, std::string::npos) << table;
    const size_t line_at = text.find(line, table_at);
    EXPECT_NE(line_at, std::string::npos) << "deploy/tpd.toml does not set " << option;
    const size_t next_table = text.find("\n[", table_at + table.size());
    EXPECT_LT(line_at, next_table) << option << " is set outside its table";
  }
}

TEST(ConfigTest, EachFieldOverridesItsDefault) {
  absl::StatusOr<Config> config = ParseConfig(R"(
[daemon]
socket = "/tmp/tpd-test/tpd.sock"
socket_mode = "0600"
socket_group = "tpd"
log_level = "debug"
shutdown_grace_ms = 1500

[store]
default_timeout_ms = 2500
max_key_bytes = 100
max_value_bytes = 2000
max_keys_per_request = 30
max_waiters = 40
)",
                                              "override.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->config_path, "override.toml");
  EXPECT_EQ(config->socket_path, "/tmp/tpd-test/tpd.sock");
  EXPECT_EQ(config->socket_mode, 0600u);
  EXPECT_EQ(config->socket_group, "tpd");
  EXPECT_EQ(config->log_level, "debug");
  EXPECT_EQ(config->shutdown_grace, absl::Milliseconds(1500));
  EXPECT_EQ(config->store.default_timeout, absl::Milliseconds(2500));
  EXPECT_EQ(config->store.max_key_bytes, 100);
  EXPECT_EQ(config->store.max_value_bytes, 2000);
  EXPECT_EQ(config->store.max_keys_per_request, 30);
  EXPECT_EQ(config->store.max_waiters, 40);
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);
}

TEST(ConfigTest, StoreSharesAreReadAndMayNotBeNegative) {
  absl::StatusOr<Config> config = ParseConfig(
      "[store]\nmax_keys = 9\nmax_bytes_per_uid = 0\nmax_keys_per_uid = 5\n"
      "max_waiters_per_uid = 6\nmax_bytes_without_session = 7\n"
      "max_keys_without_session = 8\nmax_waiters_without_session = 3\n",
      "shares.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->store.max_keys, 9);
  EXPECT_EQ(config->store.max_bytes_per_uid, 0);  // bounded by the totals only
  EXPECT_EQ(config->store.max_keys_per_uid, 5);
  EXPECT_EQ(config->store.max_waiters_per_uid, 6);
  EXPECT_EQ(config->store.max_bytes_without_session, 7);
  EXPECT_EQ(config->store.max_keys_without_session, 8);
  EXPECT_EQ(config->store.max_waiters_without_session, 3);
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);
  config->store.max_waiters_without_session = -1;
  absl::Status refused = ValidateConfig(*config);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              ::testing::HasSubstr("store.max_waiters_without_session must be >= 0"));
  config->store.max_waiters_without_session = 1;
  config->store.max_keys = 0;
  EXPECT_THAT(ValidateConfig(*config).message(),
              ::testing::HasSubstr("store.max_keys must be > 0"));
}

TEST(ConfigTest, ShareMemoryIsOnUnlessTurnedOff) {
  EXPECT_TRUE(Config{}.data.share_memory);
  absl::StatusOr<Config> config = ParseConfig("[data]\nshare_memory = false\n", "off.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->data.share_memory);
}

TEST(ConfigTest, OneFieldOverriddenLeavesTheOthersAtDefaults) {
  absl::StatusOr<Config> config = ParseConfig("[store]\nmax_waiters = 7\n", "one.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->store.max_waiters, 7);
  Config expected;
  expected.store.max_waiters = 7;
  EXPECT_EQ(config->store.max_key_bytes, expected.store.max_key_bytes);
  EXPECT_EQ(config->socket_mode, expected.socket_mode);
  EXPECT_EQ(config->log_level, expected.log_level);
}

TEST(ConfigTest, UnknownTableIsInvalidArgumentNamingTable) {
  absl::StatusOr<Config> config = ParseConfig("[agent]\nthreads = 4\n", "t.toml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), AllOf(HasSubstr("t.toml"), HasSubstr("[agent]")));
}

TEST(ConfigTest, TopLevelKeyOutsideAnyTableIsInvalidArgument) {
  // A key written above [daemon] lands at the root: refused, not silently ignored.
  absl::StatusOr<Config> config = ParseConfig("socket = \"/x.sock\"\n", "t.toml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("socket"));
}

TEST(ConfigTest, KnownTableNameThatIsNotATableIsInvalidArgument) {
  absl::StatusOr<Config> config = ParseConfig("daemon = 5\n", "t.toml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("daemon must be a table"));
}

TEST(ConfigTest, UnknownKeyIsInvalidArgumentNamingKeyAndTable) {
  absl::StatusOr<Config> daemon = ParseConfig("[daemon]\nsokcet = \"/x.sock\"\n", "k.toml");
  EXPECT_EQ(daemon.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(daemon.status().message(),
              AllOf(HasSubstr("k.toml"), HasSubstr("\"sokcet\""), HasSubstr("[daemon]")));

  absl::StatusOr<Config> store = ParseConfig("[store]\nmax_value_byte = 1\n", "k.toml");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(),
              AllOf(HasSubstr("\"max_value_byte\""), HasSubstr("[store]")));
}

TEST(ConfigTest, NestedTableInsideKnownTableIsAnUnknownKey) {
  absl::StatusOr<Config> config = ParseConfig("[daemon.tls]\ncert = \"x\"\n", "n.toml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), AllOf(HasSubstr("\"tls\""), HasSubstr("[daemon]")));
}

TEST(ConfigTest, WrongTypeIsInvalidArgumentNamingField) {
  struct Case {
    const char* text;
    const char* field;
  };
  const Case cases[] = {
      {"[daemon]\nsocket = 5\n", "socket"},
      {"[daemon]\nsocket_mode = 660\n", "socket_mode"},
      {"[daemon]\nsocket_group = [\"a\"]\n", "socket_group"},
      {"[daemon]\nlog_level = true\n", "log_level"},
      {"[daemon]\nshutdown_grace_ms = \"5000\"\n", "shutdown_grace_ms"},
      {"[store]\ndefault_timeout_ms = 1.5\n", "default_timeout_ms"},
      {"[store]\nmax_key_bytes = \"4096\"\n", "max_key_bytes"},
      {"[store]\nmax_value_bytes = 16.0\n", "max_value_bytes"},
      {"[store]\nmax_keys_per_request = false\n", "max_keys_per_request"},
      {"[store]\nmax_waiters = { n = 1 }\n", "max_waiters"},
      {"[data]\nshare_memory = 1\n", "share_memory must be true or false"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Config> config = ParseConfig(c.text, "w.toml");
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(config.status().message(), AllOf(HasSubstr("w.toml"), HasSubstr(c.field)))
        << c.text;
  }
}

TEST(ConfigTest, SocketModeIsReadAsOctal) {
  for (const auto& [text, mode] : std::vector<std::pair<std::string, mode_t>>{
           {"0600", 0600}, {"660", 0660}, {"0777", 0777}, {"0", 0}}) {
    absl::StatusOr<Config> config =
        ParseConfig(absl::StrCat("[daemon]\nsocket_mode = \"", text, "\"\n"), "m.toml");
    ASSERT_TRUE(config.ok()) << text << ": " << config.status();
    EXPECT_EQ(config->socket_mode, mode) << text;
  }
}

TEST(ConfigTest, BadSocketModeIsInvalidArgument) {
  for (const char* mode : {"0999", "abc", "77777", "", "-660", "0x1b6", " 660"}) {
    absl::StatusOr<Config> config =
        ParseConfig(absl::StrCat("[daemon]\nsocket_mode = \"", mode, "\"\n"), "m.toml");
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << mode;
    EXPECT_THAT(config.status().message(), HasSubstr("socket_mode")) << mode;
  }
}

TEST(ConfigTest, SocketModeWithSpecialBitsFailsValidationNamingField) {
  absl::StatusOr<Config> config = ParseConfig("[daemon]\nsocket_mode = \"4660\"\n", "m.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::Status status = ValidateConfig(*config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("daemon.socket_mode"));
}

TEST(ConfigTest, SyntaxErrorNamesSourceAndLine) {
  absl::StatusOr<Config> config =
      ParseConfig("[daemon]\nlog_level = \"info\"\nsocket = \n", "/etc/tpd/broken.toml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("/etc/tpd/broken.toml:3:"));
}

TEST(ConfigTest, DuplicateKeyIsASyntaxError) {
  absl::StatusOr<Config> config =
      ParseConfig("[store]\nmax_waiters = 1\nmax_waiters = 2\n", "dup.toml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("dup.toml:3:"));
}

TEST(ConfigTest, ValidateRejectsNonPositiveLimitsNamingField) {
  struct Case {
    const char* field;
    void (*set)(Config*, int64_t);
  };
  const Case cases[] = {
      {"store.default_timeout_ms",
       [](Config* c, int64_t v) { c->store.default_timeout = absl::Milliseconds(v); }},
      {"store.max_key_bytes", [](Config* c, int64_t v) { c->store.max_key_bytes = v; }},
      {"store.max_value_bytes", [](Config* c, int64_t v) { c->store.max_value_bytes = v; }},
      {"store.max_keys_per_request",
       [](Config* c, int64_t v) { c->store.max_keys_per_request = v; }},
      {"store.max_waiters", [](Config* c, int64_t v) { c->store.max_waiters = v; }},
      {"store.max_total_bytes", [](Config* c, int64_t v) { c->store.max_total_bytes = v; }},
      {"group.max_unattributed_groups",
       [](Config* c, int64_t v) { c->group.max_unattributed_groups = v; }},
      {"group.max_groups_per_uid", [](Config* c, int64_t v) { c->group.max_groups_per_uid = v; }},
      {"data.max_unidentified_sessions",
       [](Config* c, int64_t v) { c->data.max_unidentified_sessions = v; }},
  };
  for (const Case& c : cases) {
    for (int64_t value : {int64_t{0}, int64_t{-1}}) {
      Config config;
      c.set(&config, value);
      absl::Status status = ValidateConfig(config);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field << " = " << value;
      EXPECT_THAT(status.message(), HasSubstr(c.field)) << c.field << " = " << value;
    }
    Config config;
    c.set(&config, 1);
    EXPECT_TRUE(ValidateConfig(config).ok()) << c.field << " = 1";
  }
}

TEST(ConfigTest, ValidateRejectsUnknownLogLevelNamingField) {
  for (const char* level : {"verbose", "INFO", "", "warning"}) {
    Config config;
    config.log_level = level;
    absl::Status status = ValidateConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << level;
    EXPECT_THAT(status.message(), HasSubstr("log_level")) << level;
  }
  for (const char* level : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    Config config;
    config.log_level = level;
    EXPECT_TRUE(ValidateConfig(config).ok()) << level;
  }
}

TEST(ConfigTest, ValidateRejectsMaxValueBytesAboveOneGiB) {
  Config config;
  config.store.max_value_bytes = (int64_t{1} << 30) + 1;
  absl::Status status = ValidateConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("store.max_value_bytes"));

  config.store.max_value_bytes = int64_t{1} << 30;
  EXPECT_TRUE(ValidateConfig(config).ok());
}

TEST(ConfigTest, ValidateRejectsNegativeShutdownGraceAndAcceptsZero) {
  Config config;
  config.shutdown_grace = absl::Milliseconds(-1);
  absl::Status status = ValidateConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("daemon.shutdown_grace_ms"));

  config.shutdown_grace = absl::ZeroDuration();
  EXPECT_TRUE(ValidateConfig(config).ok());
}

TEST(ConfigTest, NegativeShutdownGraceFromFileParsesThenFailsValidation) {
  absl::StatusOr<Config> config = ParseConfig("[daemon]\nshutdown_grace_ms = -5\n", "g.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(ValidateConfig(*config).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, LoadConfigOnMissingFileIsNotFoundNamingPath) {
  const std::string path = absl::StrCat(
      std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp", "/no-such-dir/tpd.toml");
  absl::StatusOr<Config> config = LoadConfig(path);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr(path));
}

// A directory opens as a stream but reads fail; it must not run the daemon on defaults.
TEST(ConfigTest, LoadConfigOnDirectoryIsAnErrorNamingPath) {
  const char* tmpdir = std::getenv("TEST_TMPDIR");
  const std::string path = tmpdir != nullptr ? tmpdir : "/tmp";
  absl::StatusOr<Config> config = LoadConfig(path);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(config.status().message(), HasSubstr(path));
}

TEST(ConfigTest, LoadConfigReportsErrorsWithThePath) {
  const char* tmpdir = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmpdir != nullptr ? tmpdir : "/tmp", "/typo.toml");
  {
    std::ofstream file(path);
    file << "[daemon]\nlog_levle = \"debug\"\n";
  }
  absl::StatusOr<Config> config = LoadConfig(path);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), AllOf(HasSubstr(path), HasSubstr("log_levle")));
}

}  // namespace
}  // namespace tpd

namespace tpd {
namespace {

TEST(ConfigTest, PeerTableSetsListenAddressAndToken) {
  absl::StatusOr<Config> config =
      ParseConfig("[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"s3cret\"\n", "t.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->peer.listen_address, "127.0.0.1:0");
  EXPECT_EQ(config->peer.token, "s3cret");
  EXPECT_TRUE(ValidateConfig(*config).ok());
}

TEST(ConfigTest, ListenAddressMustBeHostAndAPortUpTo65535) {
  for (const char* good : {"127.0.0.1:0", "0.0.0.0:29400", "[::]:29400", "[::1]:65535",
                           "node-a.example:1", "localhost:80"}) {
    Config config;
    config.peer.listen_address = good;
    config.peer.token = "t";
    EXPECT_TRUE(ValidateConfig(config).ok()) << good << ": " << ValidateConfig(config);
  }
  for (const char* bad : {"127.0.0.1:65536", "127.0.0.1:4294967297", "127.0.0.1:-1", "127.0.0.1",
                          "127.0.0.1:", ":29400", "::1:29400", "[::1]29400", "[::1", "[]:1",
                          "[10.0.0.1]:1", "127.0.0.1:29400x", "127.0.0.1: 1", "a b:1"}) {
    Config config;
    config.peer.listen_address = bad;
    config.peer.token = "t";
    absl::Status status = ValidateConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("peer.listen_address")) << bad;
  }
}

TEST(ConfigTest, MetricsAreOffByDefaultAndListenOnlyAtAnIpAndPort) {
  EXPECT_EQ(Config().metrics.listen_address, "") << "no HTTP port unless asked for";
  absl::StatusOr<Config> config =
      ParseConfig("[metrics]\nlisten_address = \"127.0.0.1:9477\"\n", "t.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->metrics.listen_address, "127.0.0.1:9477");
  for (const char* good : {"127.0.0.1:0", "0.0.0.0:9477", "[::1]:9477", "[::]:9477"}) {
    Config c;
    c.metrics.listen_address = good;
    EXPECT_TRUE(ValidateConfig(c).ok()) << good << ": " << ValidateConfig(c);
  }
  for (const char* bad : {"localhost:9477", "node-a.example:9477", "127.0.0.1", "127.0.0.1:70000",
                          "[::1]9477", "300.1.1.1:9477"}) {
    Config c;
    c.metrics.listen_address = bad;
    absl::Status status = ValidateConfig(c);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("metrics.listen_address")) << bad;
    EXPECT_THAT(status.message(), HasSubstr(bad));
  }
  EXPECT_THAT(ParseConfig("[metrics]\nport = 9477\n", "t.toml").status().message(),
              HasSubstr("port"));
}

TEST(ConfigTest, PeerTrustOptionsParseAndDefault) {
  Config defaults;
  EXPECT_EQ(defaults.peer.auth_max_skew, absl::Seconds(30));
  EXPECT_THAT(defaults.peer.dial_networks,
              ::testing::ElementsAre("127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12",
                                     "192.168.0.0/16", "fc00::/7", "fe80::/10"));
  EXPECT_TRUE(defaults.peer.tls_cert_file.empty());
  absl::StatusOr<Config> config = ParseConfig(R"([peer]
auth_max_skew_ms = 5000
dial_networks = ["10.1.0.0/16", "fd12::/16"]
tls_cert_file = "/etc/tpd/node.crt"
tls_key_file = "/etc/tpd/node.key"
tls_ca_file = "/etc/tpd/ca.crt"
)",
                                              "p.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->peer.auth_max_skew, absl::Seconds(5));
  EXPECT_THAT(config->peer.dial_networks, ::testing::ElementsAre("10.1.0.0/16", "fd12::/16"));
  EXPECT_EQ(config->peer.tls_cert_file, "/etc/tpd/node.crt");
  EXPECT_EQ(config->peer.tls_key_file, "/etc/tpd/node.key");
  EXPECT_EQ(config->peer.tls_ca_file, "/etc/tpd/ca.crt");
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);
  absl::StatusOr<Config> none = ParseConfig("[peer]\ndial_networks = []\n", "p.toml");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->peer.dial_networks.empty());
}

TEST(ConfigTest, BadPeerTrustOptionsNameTheField) {
  struct Case {
    const char* text;
    const char* field;
  };
  const Case cases[] = {
      {"[peer]\ndial_networks = \"10.0.0.0/8\"\n", "dial_networks"},
      {"[peer]\ndial_networks = [1]\n", "dial_networks"},
      {"[peer]\ndial_networks = [\"10.0.0.0/33\"]\n", "peer.dial_networks"},
      {"[peer]\ndial_networks = [\"10.0.0.1/8\"]\n", "peer.dial_networks"},
      {"[peer]\nauth_max_skew_ms = 0\n", "peer.auth_max_skew_ms"},
      {"[peer]\nauth_max_skew_ms = 3600001\n", "peer.auth_max_skew_ms"},
      {"[peer]\ntls_cert_file = \"a\"\n", "peer.tls_key_file"},
      {"[peer]\ntls_cert_file = \"a\"\ntls_key_file = \"b\"\n", "peer.tls_ca_file"},
      {"[peer]\ntls_ca_file = \"c\"\n", "peer.tls_cert_file"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Config> config = ParseConfig(c.text, "p.toml");
    absl::Status status = config.ok() ? ValidateConfig(*config) : config.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(status.message(), HasSubstr(c.field)) << c.text;
  }
}

TEST(ConfigTest, AgentAcceptNetworksDefaultToDialNetworks) {
  Config defaults;
  EXPECT_FALSE(defaults.agent.accept_networks.has_value());
  EXPECT_EQ(AgentAcceptNetworks(defaults), defaults.peer.dial_networks);
  absl::StatusOr<Config> dial_only =
      ParseConfig("[peer]\ndial_networks = [\"10.1.0.0/16\"]\n", "a.toml");
  ASSERT_TRUE(dial_only.ok()) << dial_only.status();
  EXPECT_THAT(AgentAcceptNetworks(*dial_only), ::testing::ElementsAre("10.1.0.0/16"));
  absl::StatusOr<Config> config = ParseConfig(R"([peer]
listen_address = "127.0.0.1:0"
token = "t"
dial_networks = ["10.0.0.0/8"]

[agent]
accept_networks = ["10.1.2.0/24", "fd12::/16", "127.0.0.1"]
)",
                                              "a.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->agent.accept_networks.has_value());
  EXPECT_THAT(AgentAcceptNetworks(*config),
              ::testing::ElementsAre("10.1.2.0/24", "fd12::/16", "127.0.0.1"));
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);
}

TEST(ConfigTest, BadAgentAcceptNetworksNameTheField) {
  struct Case {
    const char* text;
    const char* message;
  };
  const std::string too_many = [] {
    std::string list;
    for (int i = 0; i < 257; ++i) {
      absl::StrAppend(&list, i == 0 ? "" : ", ", "\"10.0.0.", i % 256, "\"");
    }
    return absl::StrCat("[agent]\naccept_networks = [", list, "]\n");
  }();
  const Case cases[] = {
      {"[agent]\naccept_networks = \"10.0.0.0/8\"\n", "accept_networks"},
      {"[agent]\naccept_networks = [\"10.0.0.0/33\"]\n", "agent.accept_networks"},
      {"[agent]\naccept_networks = [\"10.0.0.1/8\"]\n", "agent.accept_networks"},
      {"[agent]\naccept_networks = [\"cluster.example\"]\n", "agent.accept_networks"},
      {"[agent]\naccept_networks = []\n", "agent.accept_networks is empty"},
      {"[peer]\ndial_networks = []\n",
       "agent.accept_networks (unset: peer.dial_networks) is empty"},
      {too_many.c_str(), "agent.accept_networks has 257 networks; at most 256"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Config> config = ParseConfig(c.text, "a.toml");
    absl::Status status = config.status();
    if (config.ok()) {
      // The agent runs only with a peer port; the list's size is checked then.
      config->peer.listen_address = "127.0.0.1:0";
      config->peer.token = "t";
      status = ValidateConfig(*config);
    }
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.text;
  }
  // Without a peer port no agent runs: an empty list is no error then.
  absl::StatusOr<Config> no_agent = ParseConfig("[agent]\naccept_networks = []\n", "a.toml");
  ASSERT_TRUE(no_agent.ok());
  EXPECT_TRUE(ValidateConfig(*no_agent).ok());
}

TEST(ConfigTest, EtcdTableHasTheDocumentedDefaultsAndIsRead) {
  const Config defaults;
  EXPECT_EQ(defaults.etcd.user, "");
  EXPECT_EQ(defaults.etcd.password_file, "");
  EXPECT_EQ(defaults.etcd.call_timeout, absl::Seconds(10));
  EXPECT_EQ(defaults.etcd.connect_timeout, absl::Seconds(2));
  absl::StatusOr<Config> config = ParseConfig(R"([etcd]
user = "tpd"
password_file = "/etc/tpd/etcd-password"
ca_file = "/etc/tpd/etcd-ca.pem"
cert_file = "/etc/tpd/etcd-client.pem"
key_file = "/etc/tpd/etcd-client-key.pem"
call_timeout_ms = 4000
connect_timeout_ms = 500
)",
                                              "etcd.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->etcd.user, "tpd");
  EXPECT_EQ(config->etcd.password_file, "/etc/tpd/etcd-password");
  EXPECT_EQ(config->etcd.ca_file, "/etc/tpd/etcd-ca.pem");
  EXPECT_EQ(config->etcd.cert_file, "/etc/tpd/etcd-client.pem");
  EXPECT_EQ(config->etcd.key_file, "/etc/tpd/etcd-client-key.pem");
  EXPECT_EQ(config->etcd.call_timeout, absl::Seconds(4));
  EXPECT_EQ(config->etcd.connect_timeout, absl::Milliseconds(500));
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);
}

TEST(ConfigTest, BadEtcdSettingsNameTheField) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"[etcd]\nuser = \"tpd\"\n", "etcd.password_file must be set with etcd.user"},
      {"[etcd]\npassword_file = \"/p\"\n", "etcd.user must be set with etcd.password_file"},
      {"[etcd]\ncert_file = \"/c\"\n", "etcd.key_file must be set with etcd.cert_file"},
      {"[etcd]\nkey_file = \"/k\"\n", "etcd.cert_file must be set with etcd.key_file"},
      {"[etcd]\ncall_timeout_ms = 0\n", "etcd.call_timeout_ms must be 1..3600000"},
      {"[etcd]\nconnect_timeout_ms = 20000\n",
       "etcd.connect_timeout_ms must be 1..etcd.call_timeout_ms"},
      {"[etcd]\nuser = 3\n", "[etcd] user must be a string"},
      {"[etcd]\nendpoints = \"a\"\n", "unknown key \"endpoints\" in [etcd]"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Config> config = ParseConfig(c.text, "a.toml");
    absl::Status status = config.ok() ? ValidateConfig(*config) : config.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.text;
  }
}

TEST(ConfigTest, AnEtcdPasswordInTheConfigIsRefusedWithoutEchoingIt) {
  absl::StatusOr<Config> config =
      ParseConfig("[etcd]\nuser = \"tpd\"\npassword = \"hunter2\"\n", "a.toml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(),
              AllOf(HasSubstr("[etcd] password is not a setting"), HasSubstr("password_file"),
                    ::testing::Not(HasSubstr("hunter2"))));
}

TEST(ConfigTest, PeerPortWithoutTokenIsInvalidArgument) {
  Config config;
  config.peer.listen_address = "127.0.0.1:0";
  absl::Status status = ValidateConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("peer.token must be set"));
}

}  // namespace
}  // namespace tpd

// What a local client may send: the namespace limit, the file:// directories and the Join
// limits (issue 6).
namespace tpd {
namespace {

TEST(ConfigTest, ClientLimitsHaveTheDocumentedDefaults) {
  const Config defaults;
  EXPECT_EQ(defaults.store.max_namespace_bytes, 1024);
  EXPECT_THAT(defaults.group.file_rendezvous_dirs,
              ::testing::ElementsAre("/var/lib/tpd/rendezvous"));
  EXPECT_EQ(defaults.group.max_world_size, 65536);
  EXPECT_EQ(defaults.group.max_transports, 64);
  EXPECT_EQ(defaults.group.max_channels, 64);
  EXPECT_EQ(defaults.group.max_devices, 1024);
  EXPECT_EQ(defaults.group.max_device_map_entries, 1024);
  EXPECT_EQ(defaults.group.max_env_entries, 64);
  EXPECT_EQ(defaults.group.max_option_bytes, 256);
  EXPECT_TRUE(ValidateConfig(defaults).ok());
}

TEST(ConfigTest, ClientLimitsAreReadFromTheFile) {
  absl::StatusOr<Config> config = ParseConfig(R"([store]
max_namespace_bytes = 64

[group]
file_rendezvous_dirs = ["/shared/rdzv", "/var/lib/tpd/rendezvous"]
max_world_size = 8
max_transports = 3
max_channels = 4
max_devices = 5
max_device_map_entries = 6
max_env_entries = 7
max_option_bytes = 9
)",
                                              "limits.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->store.max_namespace_bytes, 64);
  EXPECT_THAT(config->group.file_rendezvous_dirs,
              ::testing::ElementsAre("/shared/rdzv", "/var/lib/tpd/rendezvous"));
  EXPECT_EQ(config->group.max_world_size, 8);
  EXPECT_EQ(config->group.max_transports, 3);
  EXPECT_EQ(config->group.max_channels, 4);
  EXPECT_EQ(config->group.max_devices, 5);
  EXPECT_EQ(config->group.max_device_map_entries, 6);
  EXPECT_EQ(config->group.max_env_entries, 7);
  EXPECT_EQ(config->group.max_option_bytes, 9);
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);

  absl::StatusOr<Config> off = ParseConfig("[group]\nfile_rendezvous_dirs = []\n", "off.toml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_TRUE(off->group.file_rendezvous_dirs.empty());
  EXPECT_TRUE(ValidateConfig(*off).ok());
}

TEST(ConfigTest, DataTableHasTheDocumentedDefaultsAndIsRead) {
  const Config defaults;
  EXPECT_EQ(defaults.data.socket_path, "");
  EXPECT_EQ(defaults.data.arena_bytes, 64 << 20);
  // 0: derived from the machine at start (session_limits_test), or no fixed cap.
  EXPECT_EQ(defaults.data.max_sessions, 0);
  EXPECT_EQ(defaults.data.max_shared_memory_bytes, 0);
  EXPECT_EQ(defaults.data.max_sessions_per_uid, 0);
  EXPECT_EQ(defaults.data.sessions_kept_free, 32);
  EXPECT_EQ(defaults.data.max_open_sessions, 4096);
  EXPECT_EQ(defaults.data.max_open_sessions_per_uid, 2048);
  EXPECT_TRUE(ValidateConfig(defaults).ok());
  absl::StatusOr<Config> config = ParseConfig(
      "[data]\nsocket = \"/tmp/x/d.sock\"\narena_bytes = 1048576\nmax_sessions = 3\n"
      "max_sessions_per_uid = 2\nmax_open_sessions = 10\nmax_shared_memory_bytes = 1073741824\n"
      "sessions_kept_free = 1\n",
      "d.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->data.socket_path, "/tmp/x/d.sock");
  EXPECT_EQ(config->data.arena_bytes, 1 << 20);
  EXPECT_EQ(config->data.max_sessions, 3);
  EXPECT_EQ(config->data.max_sessions_per_uid, 2);
  EXPECT_EQ(config->data.max_open_sessions, 10);
  EXPECT_EQ(config->data.max_shared_memory_bytes, int64_t{1} << 30);
  EXPECT_EQ(config->data.sessions_kept_free, 1);
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);
}

TEST(ConfigTest, CudaChunkBytesDefaultsToFourMiBAndZeroSendsWholeTensors) {
  EXPECT_EQ(Config().agent.cuda_chunk_bytes, 4 << 20);
  for (const char* text :
       {"[agent]\ncuda_chunk_bytes = 0\n", "[agent]\ncuda_chunk_bytes = 1048576\n",
        "[agent]\ncuda_chunk_bytes = 1073741824\n"}) {
    absl::StatusOr<Config> config = ParseConfig(text, "c.toml");
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_TRUE(ValidateConfig(*config).ok()) << text << ValidateConfig(*config);
  }
}

TEST(ConfigTest, ClientLimitsOutOfRangeNameTheField) {
  struct Case {
    const char* text;
    const char* field;
  };
  const Case cases[] = {
      {"[store]\nmax_namespace_bytes = 0\n", "store.max_namespace_bytes"},
      {"[store]\nmax_namespace_bytes = 1048577\n", "store.max_namespace_bytes"},
      {"[group]\nmax_world_size = 0\n", "group.max_world_size"},
      {"[group]\nmax_world_size = 1099511627776\n", "group.max_world_size"},
      {"[group]\nmax_transports = -1\n", "group.max_transports"},
      {"[group]\nmax_channels = 0\n", "group.max_channels"},
      {"[group]\nmax_devices = 0\n", "group.max_devices"},
      {"[group]\nmax_device_map_entries = 0\n", "group.max_device_map_entries"},
      {"[group]\nmax_env_entries = 0\n", "group.max_env_entries"},
      {"[group]\nmax_option_bytes = 0\n", "group.max_option_bytes"},
      {"[group]\nfile_rendezvous_dirs = \"/var/lib/tpd\"\n", "file_rendezvous_dirs"},
      {"[group]\nfile_rendezvous_dirs = [\"relative\"]\n", "group.file_rendezvous_dirs"},
      {"[group]\nfile_rendezvous_dirs = [\"/\"]\n", "group.file_rendezvous_dirs"},
      {"[group]\nfile_rendezvous_dirs = [\"/proc/self\"]\n", "group.file_rendezvous_dirs"},
      {"[group]\nfile_rendezvous_dirs = [\"/a/../etc\"]\n", "group.file_rendezvous_dirs"},
      {"[group]\nfile_rendezvous_dirs = [\"/a/\"]\n", "group.file_rendezvous_dirs"},
      {"[data]\narena_bytes = 4096\n", "data.arena_bytes"},
      {"[data]\narena_bytes = 17179869185\n", "data.arena_bytes"},
      {"[data]\nmax_sessions = -1\n", "data.max_sessions"},
      {"[data]\nmax_sessions = 65537\n", "data.max_sessions"},
      {"[data]\nmax_sessions_per_uid = -1\n", "data.max_sessions_per_uid"},
      {"[data]\nsessions_kept_free = -1\n", "data.sessions_kept_free"},
      {"[data]\nmax_shared_memory_bytes = -1\n", "data.max_shared_memory_bytes"},
      {"[data]\nmax_open_sessions = 0\n", "data.max_open_sessions"},
      {"[data]\nmax_open_sessions_per_uid = 0\n", "data.max_open_sessions_per_uid"},
      {"[data]\nsession_identify_timeout_ms = 0\n", "data.session_identify_timeout_ms"},
      {"[data]\ndevice_dir = \"dev\"\n", "data.device_dir"},
      {"[data]\nsessions = 1\n", "sessions"},
      {"[agent]\ncuda_chunk_bytes = 1048575\n", "agent.cuda_chunk_bytes"},
      {"[agent]\ncuda_chunk_bytes = 1073741825\n", "agent.cuda_chunk_bytes"},
      {"[agent]\ncuda_chunk_bytes = -1\n", "agent.cuda_chunk_bytes"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Config> config = ParseConfig(c.text, "l.toml");
    absl::Status status = config.ok() ? ValidateConfig(*config) : config.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(status.message(), HasSubstr(c.field)) << c.text;
  }
}

}  // namespace
}  // namespace tpd
