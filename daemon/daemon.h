// The tpd daemon: its store, its gRPC services and the unix socket they are served on.
// main() builds one from a validated Config; integration tests and benchmarks build the
// same object in-process.
//
// Thread safety: Start, Shutdown and the destructor are called from one thread (main's);
// the services run on gRPC's threads.

#ifndef TPD_DAEMON_DAEMON_H_
#define TPD_DAEMON_DAEMON_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "cuda/discovery.h"
#include "daemon/admin_service.h"
#include "daemon/call_stats.h"
#include "daemon/client_store.h"
#include "daemon/config.h"
#include "daemon/control_service.h"
#include "daemon/drain.h"
#include "daemon/group/group_manager.h"
#include "daemon/in_flight.h"
#include "daemon/metrics.h"
#include "daemon/operator_service.h"
#include "daemon/peer_auth.h"
#include "daemon/router/call_router.h"
#include "daemon/router/data_socket.h"
#include "daemon/socket_lock.h"
#include "daemon/store_service.h"
#include "grpcpp/server.h"
#include "store/memory/memory_store.h"

namespace tpd {

class Daemon {
 public:
  // Takes the socket (refusing one owned by a live daemon, reclaiming a stale one), starts
  // serving Store, Admin, grpc.health.v1.Health and reflection on it, and, when
  // config.peer.listen_address is set, the MAC-authenticated Store (only) on the peer port,
  // with mutual TLS when configured; returns once both accept calls. A peer port another
  // process holds is an error naming it (no SO_REUSEPORT sharing). REQUIRES:
  // ValidateConfig(config).ok().
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const Config& config);

  // Shuts down if Shutdown() was not called.
  ~Daemon();

  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Graceful stop: health turns NOT_SERVING, pending store waits end with UNAVAILABLE (no
  // one can set their keys any more), other in-flight calls get config.shutdown_grace to
  // finish and are cancelled after it, then connections close and the socket file is
  // removed. Idempotent.
  void Shutdown();

  const std::string& socket_path() const { return socket_path_; }
  // The data socket through which sessions attach to shared memory ([data] socket).
  const std::string& data_socket_path() const { return data_socket_->path(); }
  // "host:port" of the peer port actually bound (port 0 resolved); empty without one.
  const std::string& peer_address() const { return peer_address_; }
  bool serving() const { return serving_.load(); }

 private:
  Daemon(const Config& config, std::string socket_path, std::unique_ptr<SocketLock> lock);
  // Reads the peer TLS files the config names (none: plaintext); errors name the field.
  absl::Status LoadPeerTls();
  absl::Status Serve();
  // The operator socket: Admin (Status, Drain) for root, the daemon's user and
  // [daemon] operator_group. REQUIRES: admin_service_ built.
  absl::Status ServeOperators();
  // NodeDrain's steps over this daemon's parts; `requested_by` "SIGTERM" is a stop.
  NodeDrain::Steps DrainSteps();
  absl::Status ServePeers();
  // Starts the TensorPipe agent beside the peer port (none without one).
  absl::Status StartAgent();
  // Starts the data socket; REQUIRES: control_service_ built.
  absl::Status ServeData();

  const Config config_;
  const std::string socket_path_;
  std::unique_ptr<SocketLock> lock_;
  const absl::Time start_time_;
  std::atomic<bool> serving_{false};
  // This node's GPUs, asked of the NVIDIA driver once at start (none without one, with the
  // reason); the CUDA device count groups see unless [group] cuda_device_count overrides it.
  const cuda::GpuDiscovery gpus_;

  store::MemoryStore store_;
  // store_ as local clients reach it through the Store service: without the daemon's keys
  // (each caller's writes charged to its share: StoreService::set_charging).
  ClientStore client_store_;
  // store_ as peers write it (group records, group stores): charged in all, with no share.
  std::unique_ptr<store::Store> peer_writes_;
  CallStats store_calls_;
  CallStats control_calls_;
  InFlightCalls in_flight_;
  StoreService store_service_;
  PeerAuth peer_auth_;
  StoreService peer_store_service_;  // the same store, for peers whose calls pass peer_auth_
  // Built once the peer port is bound: groups need its address.
  std::unique_ptr<group::GroupManager> groups_;
  std::unique_ptr<ControlService> control_service_;
  std::unique_ptr<AdminService> admin_service_;
  // /metrics ([metrics] listen_address; null when off): reads what admin_service_ reads, so
  // it stops in Shutdown before the data socket and the router do.
  std::unique_ptr<MetricsServer> metrics_;
  // Copies of CUDA tensors; null without GPUs (cuda_unavailable_ says why). Outlives calls_.
  std::unique_ptr<CudaCopies> cuda_copies_;
  std::string cuda_unavailable_;
  // Calls between this daemon's sessions; outlives data_socket_, which detaches into it.
  std::unique_ptr<CallRouter> calls_;
  // Carries calls to other daemons; null without a peer port. Stopped (reset) after calls_
  // stops calling into it, before calls_ goes.
  std::unique_ptr<agent::Agent> agent_;
  // Started before the gRPC server, stopped after it; kept until destruction so late
  // session-end hooks find it (a no-op then).
  std::unique_ptr<DataSocket> data_socket_;
  std::unique_ptr<grpc::Server> server_;
  // The operator socket's server (Admin with Drain allowed) and its service.
  std::string operator_socket_;
  std::unique_ptr<OperatorService> operator_service_;
  std::unique_ptr<grpc::Server> operator_server_;
  std::unique_ptr<grpc::Server> peer_server_;
  std::string peer_address_;
  // PEM text of [peer] tls_cert_file, tls_key_file and tls_ca_file; empty without TLS.
  std::string tls_cert_;
  std::string tls_key_;
  std::string tls_ca_;
  // Admin.Drain and SIGTERM; its steps use the members above, so it goes first.
  std::unique_ptr<NodeDrain> drain_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_DAEMON_H_
