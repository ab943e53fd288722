#include "daemon/daemon.h"

#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/hmac.h"
#include "base/random_bytes.h"
#include "base/status.h"
#include "daemon/agent_address.h"
#include "daemon/logging.h"
#include "daemon/session_limits.h"
#include "daemon/version.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "shm/attach.h"
#include "shm/layout.h"
#include "store/etcd/etcd_credentials.h"
#include "store/file/path_policy.h"

namespace tpd {
namespace {

// The key of Control.UserSecret. Derived from the cluster token, under a label no peer MAC
// uses, so every daemon of the cluster gives a uid the same secrets while no secret given
// out helps forge a peer call. Without a token (a daemon alone), a key of this run.
std::string UserSecretKey(const std::string& token) {
  if (!token.empty()) return HmacSha256(token, "tpd-user-secret-key-v1");
  return RandomBytes(32);
}

store::MemoryStoreOptions StoreOptions(const StoreConfig& config) {
  store::MemoryStoreOptions options;
  options.max_waiters = config.max_waiters;
  options.max_value_bytes = config.max_value_bytes;
  options.max_total_bytes = config.max_total_bytes;
  options.max_keys = config.max_keys;
  return options;
}

// gRPC's own cap on a request: room for the largest value plus a full list of keys, so the
// store's limits, which name the setting to change, are the ones users meet.
int MaxMessageBytes(const StoreConfig& config) {
  const int64_t bytes = config.max_value_bytes +
                        config.max_keys_per_request * (config.max_key_bytes + 16) + (1 << 20);
  return static_cast<int>(std::min<int64_t>(bytes, INT_MAX));
}

// The node name groups know this daemon by (see PeerConfig::node_name).
std::string NodeName(const Config& config, const std::string& peer_address) {
  if (!config.peer.node_name.empty()) return config.peer.node_name;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  if (peer_address.empty()) return host;
  return absl::StrCat(host, ":", peer_address.substr(peer_address.rfind(':') + 1));
}

// The port of a validated "host:port" / "[v6]:port".
int PortOf(const std::string& address) {
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) return 0;
  return port;
}

PeerAuthOptions PeerAuthFor(const PeerConfig& config) {
  PeerAuthOptions options;
  options.token = config.token;
  options.port = config.listen_address.empty() ? 0 : PortOf(config.listen_address);
  options.max_skew = config.auth_max_skew;
  return options;
}

// Reads the PEM file `path` that the option `field` names.
absl::StatusOr<std::string> ReadPem(const char* field, const std::string& path) {
  errno = 0;
  std::ifstream file(path);
  std::stringstream text;
  if (file) text << file.rdbuf();
  if (!file || text.str().empty()) {
    const int error = errno;
    return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read \"", path, "\"",
                                                   error != 0 ? ": " : " (empty?)",
                                                   error != 0 ? std::strerror(error) : ""));
  }
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"", path, "\" holds no PEM block (-----BEGIN ...)"));
  }
  return text.str();
}

// Takes the reflection plugin (which registers itself with every ServerBuilder once its
// library is linked) out of a builder: the peer port serves the Store only.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
                                    return plugin->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

// CUDA devices this node reports to groups: the configured count, or the driver's (0 without
// a driver).
int64_t CudaDeviceCount(const GroupConfig& config, const cuda::GpuDiscovery& gpus) {
  if (config.cuda_device_count >= 0) return config.cuda_device_count;
  return static_cast<int64_t>(gpus.gpus.size());
}

// Once per daemon, at start: what the driver reported, and an override of its count.
void LogGpus(const cuda::GpuDiscovery& gpus, const GroupConfig& config) {
  spdlog::logger& log = CudaLog();
  if (gpus.gpus.empty()) {
    log.info("[node] no GPUs: {}", gpus.unavailable_reason.empty()
                                       ? absl::StrCat("the NVIDIA driver (CUDA ",
                                                      cuda::DriverVersionText(gpus.driver_version),
                                                      ") reports no devices")
                                       : gpus.unavailable_reason);
  } else {
    log.info("[node] NVIDIA driver for CUDA {}: {} GPUs",
             cuda::DriverVersionText(gpus.driver_version), gpus.gpus.size());
    for (const cuda::Gpu& gpu : gpus.gpus) {
      log.info("[cuda:{}] {}, {} MiB, compute capability {}.{}, PCI {}, {}", gpu.index, gpu.name,
               gpu.total_memory_bytes >> 20, gpu.compute_capability_major,
               gpu.compute_capability_minor, gpu.pci_bus_id, gpu.uuid);
    }
  }
  if (config.cuda_device_count >= 0 &&
      config.cuda_device_count != static_cast<int64_t>(gpus.gpus.size())) {
    log.info("[node] group.cuda_device_count = {} overrides the driver's count ({}) in groups",
             config.cuda_device_count, gpus.gpus.size());
  }
}

}  // namespace

Daemon::Daemon(const Config& config, std::string socket_path, std::unique_ptr<SocketLock> lock)
    : config_(config),
      socket_path_(std::move(socket_path)),
      lock_(std::move(lock)),
      start_time_(absl::Now()),
      gpus_(cuda::DiscoverGpus()),
      store_(StoreOptions(config.store)),
      client_store_(&store_),
      peer_writes_(store_.ChargedTo({"peer daemons"})),
      store_service_(&client_store_, config_.store, &store_calls_),
      peer_auth_(PeerAuthFor(config_.peer), start_time_),
      peer_store_service_(peer_writes_.get(), config_.store, &store_calls_, &peer_auth_) {}

absl::Status Daemon::LoadPeerTls() {
  const PeerConfig& peer = config_.peer;
  if (peer.tls_cert_file.empty()) return absl::OkStatus();
  for (auto [field, path, out] :
       {std::make_tuple("peer.tls_cert_file", &peer.tls_cert_file, &tls_cert_),
        std::make_tuple("peer.tls_key_file", &peer.tls_key_file, &tls_key_),
        std::make_tuple("peer.tls_ca_file", &peer.tls_ca_file, &tls_ca_)}) {
    absl::StatusOr<std::string> pem = ReadPem(field, *path);
    if (!pem.ok()) return pem.status();
    *out = *std::move(pem);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const Config& config) {
  std::string socket_path =
      config.socket_path.empty() ? DefaultDaemonSocketPath() : config.socket_path;
  absl::StatusOr<std::unique_ptr<SocketLock>> lock = SocketLock::Acquire(socket_path);
  if (!lock.ok()) return lock.status();
  if ((*lock)->reclaimed_stale_socket()) {
    DaemonLog().warn("[socket {}] removed a stale socket file left by a daemon that died",
                     socket_path);
  }
  // The data path's limits the config leaves to the machine are fixed now, once: Admin.Status
  // and every refusal name the numbers in force.
  Config resolved = config;
  shm::SegmentLimits segment;
  segment.tx_heap_bytes = segment.rx_heap_bytes = static_cast<uint64_t>(config.data.arena_bytes);
  absl::StatusOr<shm::Layout> layout = shm::ComputeLayout(segment);
  if (!layout.ok()) return layout.status();
  std::string derived;
  RaiseOpenFileLimit();
  resolved.data =
      ResolveSessionLimits(config.data, layout->total_bytes, ReadMachineFacts(), &derived);
  if (!derived.empty()) DaemonLog().info("[node] derived from this machine: {}", derived);
  std::unique_ptr<Daemon> daemon(new Daemon(resolved, std::move(socket_path), *std::move(lock)));
  LogGpus(daemon->gpus_, config.group);
  if (absl::Status status = daemon->LoadPeerTls(); !status.ok()) return status;
  if (absl::Status status = daemon->ServePeers(); !status.ok()) return status;
  if (absl::Status status = daemon->StartAgent(); !status.ok()) return status;
  if (absl::Status status = daemon->Serve(); !status.ok()) return status;
  return daemon;
}

absl::Status Daemon::ServePeers() {
  if (config_.peer.listen_address.empty()) return absl::OkStatus();
  // Health and reflection stay off the peer port: peers get only MAC-checked services.
  grpc::EnableDefaultHealthCheckService(false);
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<WithoutReflection>());
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!tls_cert_.empty()) {
    grpc::SslServerCredentialsOptions tls(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    tls.pem_root_certs = tls_ca_;
    tls.pem_key_cert_pairs.push_back({tls_key_, tls_cert_});
    credentials = grpc::SslServerCredentials(tls);
  }
  int port = 0;
  builder.AddListeningPort(config_.peer.listen_address, credentials, &port);
  // gRPC sets SO_REUSEPORT by default: a second daemon on this port would start and take half
  // of the peer calls into its own store. Without it, the second one fails to bind.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(MaxMessageBytes(config_.store));
  builder.RegisterService(&peer_store_service_);
  in_flight_.Install(&builder);
  peer_server_ = builder.BuildAndStart();
  if (peer_server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for peers on ", config_.peer.listen_address,
                     " (peer.listen_address): port ", PortOf(config_.peer.listen_address),
                     " is in use (another tpd?) or the host is not an address of this machine"));
  }
  peer_auth_.set_port(port);
  const size_t colon = config_.peer.listen_address.rfind(':');
  peer_address_ = absl::StrCat(config_.peer.listen_address.substr(0, colon), ":", port);
  DaemonLog().info("[peer {}] listening for peer daemons (per-call MAC{})", peer_address_,
                   tls_cert_.empty() ? "" : ", mutual TLS");
  return absl::OkStatus();
}

absl::Status Daemon::StartAgent() {
  if (peer_address_.empty()) return absl::OkStatus();
  agent::AgentOptions options;
  options.id = NodeName(config_, peer_address_);
  const std::string peer_host = peer_address_.substr(0, peer_address_.rfind(':'));
  options.listen_address = config_.agent.listen_address.empty() ? absl::StrCat(peer_host, ":0")
                                                                : config_.agent.listen_address;
  options.cluster_token = config_.peer.token;
  options.transports = config_.agent.transports;
  // TensorPipe's shm transport keeps a reactor thread polling one core at 100% for as long as
  // the context lives (bench/idle_bench measures it), and it only joins daemons of one
  // machine, which a deployment of one daemon per machine never has: it is registered only
  // when agent.transports names it.
  if (options.transports.empty()) {
    for (const agent::Candidate& known : agent::Registry::KnownTransports()) {
      if (known.name != "shm") options.transports.push_back(known.name);
    }
  }
  options.channels = config_.agent.channels;
  options.mpt_lanes = static_cast<int>(config_.agent.mpt_lanes);
  options.max_message_bytes = static_cast<uint64_t>(config_.agent.max_message_bytes);
  // Only these hosts can open a connection to the agent's ports (the agent logs them).
  options.accept_networks = AgentAcceptNetworks(config_);
  absl::StatusOr<std::unique_ptr<agent::Agent>> agent = agent::Agent::Create(options);
  if (!agent.ok()) {
    return Prefixed(agent.status(), "cannot start the agent on ", options.listen_address,
                    " (agent.listen_address): ");
  }
  agent_ = *std::move(agent);
  DaemonLog().info("[agent {}] listening on {} for calls from other daemons", options.id,
                   agent_->address());
  const std::string host = options.listen_address.substr(0, options.listen_address.rfind(':'));
  if (host == "0.0.0.0" || host == "[::]") {
    DaemonLog().warn(
        "[agent {}] listening on the wildcard host {}: its URLs name that host, so "
        "only peers on this machine can dial them; set agent.listen_address to an "
        "address other nodes reach",
        options.id, host);
  }
  return absl::OkStatus();
}

absl::Status Daemon::Serve() {
  group::GroupManagerOptions groups;
  groups.node_name = NodeName(config_, peer_address_);
  groups.device_count = CudaDeviceCount(config_.group, gpus_);
  if (agent_ != nullptr) {
    groups.agent_address = agent_->address();
    for (const agent::Candidate& c : agent_->registry().transports()) {
      if (c.registered) groups.transports.push_back(c.name);
    }
    for (const agent::Candidate& c : agent_->registry().channels()) {
      if (c.registered) groups.channels.push_back(c.name);
    }
  }
  // A node the heartbeat loses fails the calls to it at once (calls_ exists before any
  // group does: groups need clients, which come after ServeData).
  groups.tracker.on_node_lost = [this](const std::string& node, const std::string& why) {
    if (calls_ != nullptr) calls_->FailNode(node, why);
  };
  store::RemoteStoreOptions& remote = groups.rendezvous.remote.store;
  remote.token = config_.peer.token;
  // A store call slower than the heartbeat window is a store this node cannot count on;
  // bounding calls by it also bounds how long shutdown waits on a vanished store.
  remote.call_timeout = config_.peer.heartbeat_timeout;
  remote.tls_root_certs = tls_ca_;
  remote.tls_cert_chain = tls_cert_;
  remote.tls_private_key = tls_key_;
  absl::StatusOr<NetworkList> networks = NetworkList::Parse(config_.peer.dial_networks);
  if (!networks.ok()) return networks.status();  // ValidateConfig checked it
  groups.rendezvous.remote.dial_networks = *std::move(networks);
  groups.default_join_timeout = config_.group.default_join_timeout;
  groups.max_groups = config_.group.max_groups;
  groups.max_unattributed_groups = config_.group.max_unattributed_groups;
  groups.max_groups_per_uid = config_.group.max_groups_per_uid;
  groups.max_groups_per_session = config_.group.max_groups_per_session;
  groups.idle_release = config_.group.idle_group_release;
  groups.max_sessions_per_uid = config_.data.max_open_sessions_per_uid;
  groups.identify_timeout = config_.data.session_identify_timeout;
  groups.max_unidentified_sessions = config_.data.max_unidentified_sessions;
  groups.user_secret_key = UserSecretKey(config_.peer.token);
  groups.rendezvous.file_dirs = config_.group.file_rendezvous_dirs;
  // etcd:// stores: [etcd]'s timeouts and credentials (files read once, here; a bad one stops
  // the daemon naming the setting), [store] max_waiters.
  store::EtcdStoreOptions& etcd = groups.rendezvous.etcd;
  etcd.call_timeout = config_.etcd.call_timeout;
  etcd.connect_timeout = config_.etcd.connect_timeout;
  etcd.max_waiters = config_.store.max_waiters;
  store::EtcdCredentialFiles etcd_files;
  etcd_files.user = config_.etcd.user;
  etcd_files.password_file = config_.etcd.password_file;
  etcd_files.ca_file = config_.etcd.ca_file;
  etcd_files.cert_file = config_.etcd.cert_file;
  etcd_files.key_file = config_.etcd.key_file;
  absl::StatusOr<store::EtcdCredentials> etcd_credentials = store::LoadEtcdCredentials(etcd_files);
  if (!etcd_credentials.ok()) return etcd_credentials.status();
  etcd.credentials = *std::move(etcd_credentials);
  // The default file:// directory is created when missing (as the unit's StateDirectory=
  // does); other listed directories are the operator's. Failing only disables file:// there.
  for (const std::string& dir : config_.group.file_rendezvous_dirs) {
    if (dir != store::kDefaultFileRendezvousDir) continue;
    if (absl::Status status = store::CreateRendezvousDir(dir); !status.ok()) {
      DaemonLog().warn("[rendezvous {}] {}; file:// rendezvous under it fails until it exists", dir,
                       std::string(status.message()));
    }
  }
  groups.tracker.heartbeat_interval = config_.peer.heartbeat_interval;
  groups.tracker.heartbeat_timeout = config_.peer.heartbeat_timeout;
  groups_ = std::make_unique<group::GroupManager>(std::move(groups));
  control_service_ = std::make_unique<ControlService>(groups_.get(), &control_calls_, config_.group,
                                                      config_.data.max_open_sessions);
  ControlService* control = control_service_.get();
  groups_->set_session_ender(
      [control](const std::string& id, const std::string& why) { control->EndSession(id, why); });
  group::GroupManager* manager = groups_.get();
  store_service_.set_group_stores([manager](const std::string& session, const std::string& group) {
    return manager->GroupStore(session, group);
  });
  store_service_.set_charging(
      [store = &store_](store::StoreShare share) -> std::shared_ptr<store::Store> {
        // The client view over the writer's charged view, which it keeps.
        struct Charged : ClientStore {
          explicit Charged(std::unique_ptr<store::Store> writer)
              : ClientStore(writer.get()), charged(std::move(writer)) {}
          const std::unique_ptr<store::Store> charged;
        };
        return std::make_shared<Charged>(store->ChargedTo(std::move(share)));
      },
      [manager](const std::string& session) { return manager->SessionUid(session); });
  // Peers' calls for their users (members' group-store keys homed here) are charged to those
  // users; the peers' own writes (records, heartbeats) to the peer daemons' account.
  peer_store_service_.set_charging(
      [store = &store_](store::StoreShare share) -> std::shared_ptr<store::Store> {
        return store->ChargedTo(std::move(share));
      });
  admin_service_ = std::make_unique<AdminService>(&config_, socket_path_, start_time_, &serving_,
                                                  &store_, &store_calls_, &control_calls_,
                                                  &in_flight_, peer_address_, groups_.get());

  if (absl::Status status = ServeData(); !status.ok()) return status;
  drain_ = std::make_unique<NodeDrain>(DrainSteps());
  admin_service_->set_drain(drain_.get());
  if (!config_.metrics.listen_address.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> metrics =
        MetricsServer::Start(config_.metrics.listen_address, [admin = admin_service_.get()] {
          v1::StatusResponse status;
          admin->Fill(&status);
          return status;
        });
    if (!metrics.ok()) return metrics.status();
    metrics_ = *std::move(metrics);
    admin_service_->set_metrics_address(metrics_->address());
    DaemonLog().info("[metrics http://{}/metrics] serving Prometheus metrics", metrics_->address());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", socket_path_), grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(MaxMessageBytes(config_.store));
  builder.RegisterService(&store_service_);
  builder.RegisterService(admin_service_.get());
  builder.RegisterService(control_service_.get());
  in_flight_.Install(&builder);

  // The socket is created with the umask's bits; keep it private until chmod below widens it
  // to socket_mode, so no one connects through a window of wrong permissions.
  const mode_t old_umask = umask(0177);
  server_ = builder.BuildAndStart();
  umask(old_umask);
  if (server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve on unix socket ", socket_path_, " (see the gRPC error above)"));
  }
  if (absl::Status status =
          SetSocketOwnership(socket_path_, config_.socket_mode, config_.socket_group);
      !status.ok()) {
    server_->Shutdown();
    return status;
  }
  if (absl::Status status = ServeOperators(); !status.ok()) {
    server_->Shutdown();
    return status;
  }
  serving_ = true;
  server_->GetHealthCheckService()->SetServingStatus(true);
  DaemonLog().info("[socket {}] tpd {} serving (pid {}, mode {:04o})", socket_path_, kVersion,
                   getpid(), config_.socket_mode);
  return absl::OkStatus();
}

absl::Status Daemon::ServeOperators() {
  operator_socket_ = config_.operator_socket.empty() ? absl::StrCat(socket_path_, ".operator")
                                                     : config_.operator_socket;
  const mode_t mode = config_.operator_group.empty() ? 0600 : 0660;
  admin_service_->set_operator_socket(operator_socket_, mode, config_.operator_group);
  // Only processes that can open the file reach this server: Drain is theirs. Its exit is
  // SIGTERM to this process, which main() waits for: the stop it would be from systemd.
  operator_service_ = std::make_unique<OperatorService>(
      admin_service_.get(), drain_.get(), config_.shutdown_grace, [] { kill(getpid(), SIGTERM); });
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", operator_socket_),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(operator_service_.get());
  in_flight_.Install(&builder);
  const mode_t old_umask = umask(0177);
  operator_server_ = builder.BuildAndStart();
  umask(old_umask);
  if (operator_server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve on the operator socket ",
                                               operator_socket_, " (see the gRPC error above)"));
  }
  if (absl::Status status = SetSocketOwnership(operator_socket_, mode, config_.operator_group);
      !status.ok()) {
    operator_server_->Shutdown();
    operator_server_.reset();
    return absl::Status(status.code(), absl::StrCat("[daemon] operator_group: ", status.message()));
  }
  return absl::OkStatus();
}

absl::Status Daemon::ServeData() {
  DataSocketOptions options;
  options.path = config_.data.socket_path.empty() ? shm::DataSocketPath(socket_path_)
                                                  : config_.data.socket_path;
  options.mode = config_.socket_mode;
  options.group = config_.socket_group;
  options.limits.tx_heap_bytes = static_cast<uint64_t>(config_.data.arena_bytes);
  options.limits.rx_heap_bytes = static_cast<uint64_t>(config_.data.arena_bytes);
  options.max_sessions = config_.data.max_sessions;
  options.max_sessions_per_uid = config_.data.max_sessions_per_uid;
  options.sessions_kept_free = config_.data.sessions_kept_free;
  options.max_shared_memory_bytes = config_.data.max_shared_memory_bytes;
  ControlService* control = control_service_.get();
  options.session_open = [control](const std::string& id) { return control->SessionOpen(id); };
  options.end_session = [control](const std::string& id, const std::string& why) {
    control->EndSession(id, why);
  };
  group::GroupManager* groups = groups_.get();
  options.bind_uid = [groups](const std::string& id, uid_t uid) {
    return groups->BindSessionUid(id, uid);
  };
  CallRouterOptions calls;
  calls.node = groups->node().name;
  calls.lookup = [groups](const std::string& group, const std::string& worker) {
    return groups->SessionOf(group, worker);
  };
  calls.member = [groups](const std::string& group, const std::string& worker, int64_t* version) {
    return groups->MemberNamed(group, worker, version);
  };
  calls.when_version = [groups](const std::string& group, int64_t version, absl::Time deadline,
                                std::function<void(bool)> done) {
    groups->WhenVersion(group, version, deadline, std::move(done));
  };
  calls.agent = agent_.get();
  absl::StatusOr<NetworkList> networks = NetworkList::Parse(config_.peer.dial_networks);
  if (!networks.ok()) return networks.status();  // ValidateConfig checked it
  calls.check_address = [networks = *std::move(networks)](const std::string& address) {
    return DialableAgentUrls(address, networks);
  };
  calls.max_calls_in_flight = config_.data.max_calls_in_flight;
  // Room for every call's answer and a release each for its request and its reply, twice
  // over: a client that reads its completions never comes near it.
  calls.max_unposted =
      static_cast<size_t>(4 * config_.data.max_calls_in_flight) + options.limits.completion_slots;
  // As many as one caller may have in flight: one program's burst of calls always fits.
  calls.max_waiting_calls = static_cast<size_t>(config_.data.max_calls_in_flight);
  calls.device_map = [groups](const std::string& group, const std::string& from,
                              const std::string& to, bool reverse) {
    return groups->DeviceMapOf(group, from, to, reverse);
  };
  if (gpus_.gpus.empty()) {
    cuda_unavailable_ = absl::StrCat(
        "node ", groups->node().name, " has no GPUs (",
        gpus_.unavailable_reason.empty() ? "the driver reports none" : gpus_.unavailable_reason,
        ")");
  } else {
    absl::StatusOr<const cuda::Driver*> driver = cuda::Driver::Load();
    absl::StatusOr<std::unique_ptr<CudaCopies>> copies =
        driver.ok() ? CudaCopies::Start(*driver, static_cast<int>(gpus_.gpus.size()))
                    : driver.status();
    if (copies.ok()) {
      cuda_copies_ = *std::move(copies);
    } else {
      cuda_unavailable_ = absl::StrCat("CUDA copies on node ", groups->node().name,
                                       " did not start: ", copies.status().message());
      CudaLog().warn("[node] {}", cuda_unavailable_);
    }
  }
  calls.cuda = cuda_copies_.get();
  calls.no_cuda = cuda_unavailable_;
  calls.device_dir = config_.data.device_dir;
  calls.share_memory = config_.data.share_memory;
  calls.store = [service = &store_service_](
                    const std::string& session, const std::string& group, const std::string& method,
                    const std::string& request,
                    absl::AnyInvocable<void(absl::Status, std::string)> done) {
    service->ServeLocal(session, group, method, request, std::move(done));
  };
  calls.cuda_chunk_bytes = static_cast<uint64_t>(config_.agent.cuda_chunk_bytes);
  calls.end_session = [control](const std::string& id, const std::string& why) {
    control->EndSession(id, absl::StrCat("the session's shared memory was misused: ", why));
  };
  calls_ = std::make_unique<CallRouter>(std::move(calls));
  CallRouter* router = calls_.get();
  options.on_attach = [router](const std::string& id, const AttachedClient& client,
                               std::shared_ptr<shm::Segment> segment) {
    return router->Attach(id, client.uid, client.gid, client.connection, std::move(segment));
  };
  if (agent_ != nullptr) agent_->SetHandler(router->AgentHandler());
  options.on_detach = [router](const std::string& id) { router->Detach(id); };
  absl::StatusOr<std::unique_ptr<DataSocket>> data = DataSocket::Start(std::move(options));
  if (!data.ok()) return data.status();
  data_socket_ = *std::move(data);
  DataSocket* socket = data_socket_.get();
  control->set_data_socket(data_socket_->path());
  admin_service_->set_data_socket(data_socket_.get());
  admin_service_->set_agent(agent_.get());
  admin_service_->set_call_router(router);
  admin_service_->set_gpus(&gpus_);
  admin_service_->set_cuda_copies(cuda_copies_.get(), cuda_unavailable_);
  control->set_session_end_hook([socket](const std::string& id) { socket->EndSession(id); });
  return absl::OkStatus();
}

NodeDrain::Steps Daemon::DrainSteps() {
  // The words of errors that refuse work meanwhile: a stop keeps those users know.
  auto why = [](const std::string& requested_by, bool calls) -> std::string {
    if (requested_by != "SIGTERM") return "is draining (tpctl drain)";
    return calls ? "is stopping" : "is shutting down";
  };
  NodeDrain::Steps steps;
  // Calls in flight are answered before members leave, so peers can still reach them; new
  // joins and calls are refused meanwhile, naming the node and why.
  steps.finish_calls = [this, why](absl::Time deadline, const std::string& requested_by) {
    serving_ = false;
    server_->GetHealthCheckService()->SetServingStatus(false);
    groups_->StopJoins(absl::StrCat("the tpd daemon on node ", groups_->node().name, " ",
                                    why(requested_by, false), " and takes no new joins"));
    return calls_->Drain(deadline, why(requested_by, true));
  };
  // Members leave explicitly (other daemons see LEFT, not a late eviction), then the streams
  // of sessions and watches end.
  steps.leave = [this, why](const std::string& requested_by) {
    const std::string reason = absl::StrCat("the tpd daemon on node ", groups_->node().name, " ",
                                            why(requested_by, false));
    groups_->Shutdown(reason);
    control_service_->CloseStreams(reason);
  };
  steps.progress = [this] {
    NodeDrain::Progress progress;
    progress.calls_in_flight = static_cast<int64_t>(calls_->CallsInFlight());
    for (const v1::GroupView& group : groups_->ListGroups()) {
      for (const v1::Member& member : group.members()) {
        if (member.node() == groups_->node().name) ++progress.members;
      }
    }
    progress.sessions_open = groups_->SessionCount();
    return progress;
  };
  return steps;
}

void Daemon::Shutdown() {
  if (server_ == nullptr) {
    if (peer_server_ != nullptr) peer_server_->Shutdown(absl::ToChronoTime(absl::Now()));
    return;
  }
  DaemonLog().info("[socket {}] shutting down: health NOT_SERVING, {} grace for in-flight calls",
                   socket_path_, absl::FormatDuration(config_.shutdown_grace));
  const absl::Time grace_end = absl::Now() + config_.shutdown_grace;
  // The drain's steps (DrainSteps), unless an Admin.Drain took them already: then this waits
  // for that drain to end.
  drain_->RequestAndWait("SIGTERM", config_.shutdown_grace);
  store_.Shutdown();
  if (!in_flight_.WaitIdle(grace_end)) {
    DaemonLog().warn("[socket {}] cancelling {} calls still in flight after the grace period",
                     socket_path_, in_flight_.count());
  }
  for (std::unique_ptr<grpc::Server>* server : {&peer_server_, &operator_server_, &server_}) {
    if (*server == nullptr) continue;
    (*server)->Shutdown(absl::ToChronoTime(absl::Now()));
    (*server)->Wait();
    server->reset();
  }
  unlink(operator_socket_.c_str());
  // Scrapes end while what they read is still there.
  metrics_.reset();
  // Sessions detach (their calls are answered UNAVAILABLE, remote callers included), the
  // router stops calling into the agent, then the agent closes its pipes.
  data_socket_->Shutdown();
  calls_->Shutdown();
  agent_.reset();
  // Copies that TensorPipe's last callbacks started finish while the router they call back
  // into is still there.
  if (cuda_copies_ != nullptr) cuda_copies_->Flush();
  lock_.reset();
  DaemonLog().info("[socket {}] stopped; socket removed", socket_path_);
}

Daemon::~Daemon() { Shutdown(); }

}  // namespace tpd
