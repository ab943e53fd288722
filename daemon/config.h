// The daemon's configuration: read once from TOML (deploy/tpd.toml documents every field),
// overridden by flags, validated, then passed around as a const struct.

#ifndef TPD_DAEMON_CONFIG_H_
#define TPD_DAEMON_CONFIG_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tpd {

struct StoreConfig {
  // Timeout for Get/Wait/MultiGet calls that pass timeout_ms = 0 (c10d's default is 300 s).
  absl::Duration default_timeout = absl::Seconds(300);
  // Longest key accepted (INVALID_ARGUMENT past it).
  int64_t max_key_bytes = 4096;
  // Largest value accepted, also after Append (RESOURCE_EXHAUSTED past it).
  int64_t max_value_bytes = 16 << 20;
  // Most keys one Wait, MultiGet, MultiSet or Check may name (INVALID_ARGUMENT past it).
  int64_t max_keys_per_request = 1024;
  // Most calls waiting on keys at once, daemon-wide (RESOURCE_EXHAUSTED past it).
  int64_t max_waiters = 100000;
  // Most bytes of keys and values, and most keys, the daemon's store holds, all writers
  // together (RESOURCE_EXHAUSTED past it).
  int64_t max_total_bytes = int64_t{1} << 30;
  int64_t max_keys = int64_t{1} << 20;
  // The share of one uid (store calls of its sessions, over gRPC or shared memory) and of all
  // callers without a session together: bytes and keys charged to it (a key to its last
  // writer) and store calls waiting at once. 0: bounded by the totals only.
  int64_t max_bytes_per_uid = int64_t{256} << 20;
  int64_t max_keys_per_uid = int64_t{1} << 18;
  int64_t max_waiters_per_uid = 25000;
  int64_t max_bytes_without_session = int64_t{64} << 20;
  int64_t max_keys_without_session = int64_t{1} << 16;
  int64_t max_waiters_without_session = 4096;
  // Longest namespace a store call may name (INVALID_ARGUMENT past it). The namespace is
  // copied into every key of the call, so namespace + key stays within this plus
  // max_key_bytes. Namespaces are printable text: no control characters (NUL, newline).
  int64_t max_namespace_bytes = 1024;
};

struct PeerConfig {
  // host:port of the TCP port other daemons use (remote store access, later membership);
  // IPv6 hosts in brackets ("[::]:29400"), port 0..65535. Empty: no peer port, the daemon
  // serves local clients only. Port 0 picks a free port.
  std::string listen_address;
  // Shared cluster secret; required when listen_address is set. It never travels: every peer
  // call carries an HMAC-SHA256 keyed by it (store/peer_mac.h). Calls without a valid
  // one answer UNAUTHENTICATED.
  std::string token;
  // Largest difference, either way, between a peer call's timestamp and this daemon's clock;
  // a call outside it is refused ("stale timestamp"). 1 ms .. 1 hour.
  absl::Duration auth_max_skew = absl::Seconds(30);
  // Networks (CIDR) this daemon dials for tcp:// and env:// rendezvous: every address the
  // URL's host resolves to must lie inside one (PERMISSION_DENIED otherwise).
  std::vector<std::string> dial_networks = {"127.0.0.0/8",   "::1/128",        "10.0.0.0/8",
                                            "172.16.0.0/12", "192.168.0.0/16", "fc00::/7",
                                            "fe80::/10"};
  // Mutual TLS on the peer port, all three or none (PEM files): this daemon's certificate
  // and key, and the CA that signs every daemon's certificate. With them the peer port
  // accepts only clients with a certificate the CA signed, and this daemon dials peers with
  // its own certificate. The per-call MAC stays on.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  // This daemon's node name in groups; unique in the cluster. Empty: the host name, with
  // ":<peer port>" appended when there is a peer port.
  std::string node_name;
  // How often the daemon writes its heartbeat into every rendezvous store it uses.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // A node whose heartbeat has not changed for this long is evicted with all its members.
  absl::Duration heartbeat_timeout = absl::Seconds(5);
};

struct GroupConfig {
  // How long a static Join waits for the other ranks when the request says 0.
  absl::Duration default_join_timeout = absl::Seconds(300);
  // CUDA devices this node reports to groups; -1 asks the NVIDIA driver (0 without one,
  // cuda/discovery.h). Set it on CPU-only machines to test device-map validation.
  int64_t cuda_device_count = -1;
  // Groups this daemon follows at once (each costs memory and its store's attention; each
  // distinct store a thread for its groups, one for heartbeats and a connection); past it
  // GetGroup/WatchGroup/Join of a new group answer RESOURCE_EXHAUSTED.
  int64_t max_groups = 1024;
  // Shares of max_groups: the groups lookups and watches (GetGroup, WatchGroup: no session,
  // so no user to count them against) made the daemon follow, together; and those one uid's
  // joins did. RESOURCE_EXHAUSTED past either.
  int64_t max_unattributed_groups = 64;
  int64_t max_groups_per_uid = 512;
  // Groups one client session may hold members in at once (RESOURCE_EXHAUSTED past it).
  int64_t max_groups_per_session = 64;
  // A group with no local member, watcher or call in progress for this long is released.
  absl::Duration idle_group_release = absl::Seconds(60);

  // What a local client may ask of groups (issue 6). Every limit answers INVALID_ARGUMENT
  // naming the setting; see deploy/tpd.toml and docs/security.md.
  //
  // Absolute directories under which file:// rendezvous may open (and Join create) files;
  // nothing outside them, no symbolic links, only regular files (store/file/path_policy.h).
  // Empty: no file:// rendezvous at all. The default one is created (0700) at start when
  // missing; other listed directories must exist.
  std::vector<std::string> file_rendezvous_dirs = {"/var/lib/tpd/rendezvous"};
  // Largest world_size a Join may ask for.
  int64_t max_world_size = 65536;
  // Most entries in a Join's options.transports, options.channels and options.devices, and
  // in all its device maps together (source devices counted over every target worker).
  int64_t max_transports = 64;
  int64_t max_channels = 64;
  int64_t max_devices = 1024;
  int64_t max_device_map_entries = 1024;
  // Most entries in a Join's env map (env:// reads four of them).
  int64_t max_env_entries = 64;
  // Longest string in a Join's options (transport, channel and device names, device-map
  // keys) and env (names and values).
  int64_t max_option_bytes = 256;
};

// The local data path (docs/data_plane.md, "Attaching a session").
struct DataConfig {
  // Unix socket through which sessions receive their shared memory; empty means the gRPC
  // socket's path + ".data". Same mode and group as the gRPC socket.
  std::string socket_path;
  // Bytes of each of a session's two heaps (what it sends, what it receives), so a
  // session's segment is about twice this. Range 64 KiB..16 GiB.
  int64_t arena_bytes = int64_t{64} << 20;
  // Sessions attached at once; one more is refused RESOURCE_EXHAUSTED naming this setting.
  // 0: derived from the machine at start (daemon/session_limits.h): as many segments as
  // max_shared_memory_bytes holds, at most 64 per core.
  int64_t max_sessions = 0;
  // Bytes of segments attached at once: each session's is about 2 * arena_bytes, committed
  // only as it is used. 0: half the machine's memory (as /dev/shm's default size).
  int64_t max_shared_memory_bytes = 0;
  // Places kept free for other users: a uid holding this many attached sessions or more takes
  // another only while this many places stay free after it, so a job of the node's one user
  // may use the node and a second user still attaches. At most half of max_sessions.
  int64_t sessions_kept_free = 32;
  // A fixed cap on one uid's attached sessions; 0: none (sessions_kept_free shares).
  int64_t max_sessions_per_uid = 0;
  // Control.OpenSession streams open at once, attached or not; one more is RESOURCE_EXHAUSTED.
  int64_t max_open_sessions = 4096;
  // Sessions of one uid open at once (a session's uid is known once it identified itself on
  // the data socket); one more identify or attach is RESOURCE_EXHAUSTED. Half of
  // max_open_sessions, so one user's job cannot take every place.
  int64_t max_open_sessions_per_uid = 2048;
  // A session that has not identified its user by then is ended: it could only hold a place
  // among max_open_sessions. The client library identifies at once.
  absl::Duration session_identify_timeout = absl::Seconds(10);
  // Sessions that have not identified their user, at once: one more ends the oldest of them,
  // so sessions that never identify cannot fill max_open_sessions.
  int64_t max_unidentified_sessions = 1024;
  // Where the NVIDIA device nodes are (nvidiactl, nvidia<N>): the daemon opens CUDA memory for
  // a session only if its user could open these itself (docs/security.md). Absolute.
  std::string device_dir = "/dev";
  // Calls one session may have waiting for replies; one more is RESOURCE_EXHAUSTED.
  int64_t max_calls_in_flight = 1024;
  // Host tensors of 64 KiB or more between two sessions of the same uid and gid are not
  // copied: the receiver's client maps the sender's segment read-only and reads them there
  // (docs/security.md, "Memory shared between sessions"). false: every message is copied.
  bool share_memory = true;
};

// The TensorPipe agent carrying calls to other daemons (docs/data_plane.md, "Calls between
// nodes"). It runs only when peer.listen_address is set, and shares its token.
struct AgentConfig {
  // host:port it listens on; empty: the peer port's host and a free port. Its URLs go into
  // the group records, so peers dial the host given here: on a multi-homed machine name the
  // address peers reach (a wildcard host only works for peers on this machine).
  std::string listen_address;
  // Transports and channels it may register, PyTorch's names; empty: every one this build
  // and machine can use, except the shm transport for transports (its reactor polls a core
  // at 100% while the daemon runs, and it only links daemons of one machine: name it to
  // have it). Groups are offered only what was registered.
  std::vector<std::string> transports;
  std::vector<std::string> channels;
  // Connections of the mpt_uv channel per pipe.
  int64_t mpt_lanes = 4;
  // Largest payload plus tensors of one message either way (a peer sending more is cut off).
  int64_t max_message_bytes = int64_t{2} << 30;
  // CUDA tensors larger than this go to other nodes in chunks of this size, so that the
  // device-to-host copy of one chunk, the transfer of another and the host-to-device copy on
  // the receiver of a third overlap (docs/cuda.md, "Between nodes"); 0 sends each tensor
  // whole. 0 or 1 MiB..1 GiB.
  int64_t cuda_chunk_bytes = int64_t{4} << 20;
  // Networks (CIDRs or single addresses, as peer.dial_networks) whose hosts may open a TCP
  // connection to the agent's ports (uv's and each mpt_uv lane's): the kernel drops every
  // other host's SYN (agent/listen_guard.h), because Debian's TensorPipe aborts the daemon on
  // some bytes sent there before any handshake (docs/security.md, "Agent pipes"). Unset: the
  // same as peer.dial_networks (see AgentAcceptNetworks). 1..256 entries when the agent runs.
  std::optional<std::vector<std::string>> accept_networks;
};

// etcd:// rendezvous stores (docs/etcd.md): who the daemon is to etcd and how long its calls
// may take. Credentials come only from here, never from an etcd:// URL; the daemon reads the
// files once at start (store/etcd/etcd_credentials.h) and logs neither password nor token.
struct EtcdConfig {
  // etcd user, with password_file (both or neither): the daemon authenticates and sends
  // etcd's token with every call.
  std::string user;
  // File holding the user's password (one trailing newline ignored); never the password
  // itself in the config. Refused when every user of the machine may read or write it.
  std::string password_file;
  // TLS to every etcd endpoint, on when ca_file or cert_file is set (PEM files): the CA that
  // signed the members' certificates (empty: the system's roots), and a client certificate
  // with its key (both or neither) for members run with --client-cert-auth.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // Bound on each etcd store call, every endpoint and retry included. 1 ms .. 1 hour.
  absl::Duration call_timeout = absl::Seconds(10);
  // How long a call waits for one endpoint's connection before trying the next;
  // 1 ms .. call_timeout.
  absl::Duration connect_timeout = absl::Seconds(2);
};

// Prometheus metrics (daemon/metrics.h, docs/operations.md "Monitor"). Off by default: a
// node's daemon opens no TCP port it was not asked to (docs/security.md "Metrics").
struct MetricsConfig {
  // IP literal and port where /metrics is served over plain HTTP, "127.0.0.1:9477" or
  // "[::1]:9477" (port 0 picks a free one; Admin.Status says which). Empty: no listener.
  std::string listen_address;
};

struct Config {
  // The TOML file this came from; empty when running on defaults.
  std::string config_path;
  // Unix socket to serve; empty means DefaultDaemonSocketPath().
  std::string socket_path;
  // Permission bits of the socket file. 0660: the owner and the group may connect.
  mode_t socket_mode = 0660;
  // Group that owns the socket file, so its members may connect; empty keeps the daemon's.
  std::string socket_group;
  // The operator socket, where Admin.Drain is served (and Status, for operators): empty
  // means the socket's path with ".operator" appended. Mode 0600 (root and the daemon's
  // user), 0660 with operator_group, which then owns it.
  std::string operator_socket;
  std::string operator_group;
  // spdlog level name: trace, debug, info, warn, error, critical, off.
  std::string log_level = "info";
  // How long in-flight calls get to finish after SIGTERM before they are cancelled.
  absl::Duration shutdown_grace = absl::Seconds(5);
  StoreConfig store;
  PeerConfig peer;
  GroupConfig group;
  DataConfig data;
  AgentConfig agent;
  EtcdConfig etcd;
  MetricsConfig metrics;
};

// Parses TOML text; `source` names it in error messages. Unknown tables and keys are
// errors, so a typo never silently leaves a default in force.
absl::StatusOr<Config> ParseConfig(absl::string_view toml_text, absl::string_view source);

// Reads and parses the file at `path`.
absl::StatusOr<Config> LoadConfig(const std::string& path);

// Checks ranges and consistency; INVALID_ARGUMENT naming the field.
absl::Status ValidateConfig(const Config& config);

// agent.accept_networks, or peer.dial_networks when it is unset.
const std::vector<std::string>& AgentAcceptNetworks(const Config& config);

}  // namespace tpd

#endif  // TPD_DAEMON_CONFIG_H_
