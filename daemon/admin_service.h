// tpd.v1.Admin: what an operator reads with `grpcurl ... tpd.v1.Admin/Status` or
// `tpctl status`.
//
// Thread safety: thread-safe; reads only thread-safe sources. Status takes no lock of its own;
// each source copies its counters under its own lock. Agent::Stats never waits on a peer;
// CallRouter::Stats takes each session's lock, which the router holds for up to a second
// while it waits for room in a completion ring its client does not read (a known delay).

#ifndef TPD_DAEMON_ADMIN_SERVICE_H_
#define TPD_DAEMON_ADMIN_SERVICE_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "cuda/discovery.h"
#include "daemon/call_stats.h"
#include "daemon/config.h"
#include "daemon/drain.h"
#include "daemon/group/group_manager.h"
#include "daemon/in_flight.h"
#include "daemon/router/call_router.h"
#include "daemon/router/cuda_copies.h"
#include "daemon/router/data_socket.h"
#include "daemon/shared_probe.h"
#include "proto/admin.grpc.pb.h"
#include "store/memory/memory_store.h"

namespace tpd {

class AdminService final : public v1::Admin::CallbackService {
 public:
  // Every pointer must outlive the service. `serving` turns false when shutdown begins.
  AdminService(const Config* config, std::string socket_path, absl::Time start_time,
               const std::atomic<bool>* serving, store::MemoryStore* store,
               const CallStats* store_calls, const CallStats* control_calls,
               const InFlightCalls* in_flight, std::string peer_address,
               group::GroupManager* groups);
  // Waits for a store probe still running.
  ~AdminService() override;

  // The data socket whose attached sessions Status lists; set before serving, outlives this.
  void set_data_socket(const DataSocket* data_socket) { data_socket_ = data_socket; }
  // The agent Status reports as `agent` (none without a peer port: the field stays unset);
  // set before serving, outlives the gRPC server.
  void set_agent(agent::Agent* agent) { agent_ = agent; }
  // The router whose per-session calls in flight and rx heap use Status adds to each attached
  // session; set before serving, outlives the gRPC server.
  void set_call_router(CallRouter* calls) { calls_ = calls; }
  // The node's GPUs, discovered once at start, that Status reports as `gpus`; set before
  // serving, never changed, outlives the gRPC server. Unset: the section stays empty.
  void set_gpus(const cuda::GpuDiscovery* gpus) { gpus_ = gpus; }
  // `cuda` null: `unavailable` says why calls with CUDA tensors cannot be served.
  void set_cuda_copies(CudaCopies* cuda, std::string unavailable) {
    cuda_ = cuda;
    cuda_unavailable_ = std::move(unavailable);
  }

  // The snapshot Status answers with; also what /metrics is built from (daemon/metrics.h).
  void Fill(v1::StatusResponse* response) const;

  // The node's drain, whose progress Status shows; set before serving, outlives this.
  void set_drain(NodeDrain* drain) { drain_ = drain; }
  // The operator socket (Status names it; Drain here refuses, pointing there).
  void set_operator_socket(std::string path, mode_t mode, std::string group) {
    operator_socket_ = std::move(path);
    operator_socket_mode_ = mode;
    operator_group_ = std::move(group);
  }
  // Where /metrics is served (empty: metrics off); set before serving.
  void set_metrics_address(std::string address) { metrics_address_ = std::move(address); }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const v1::StatusRequest* request,
                                   v1::StatusResponse* response) override;
  // Pings the agent's peers (one probe at a time, at most one a second; later calls share its
  // answers).
  grpc::ServerUnaryReactor* ProbePeers(grpc::CallbackServerContext* context,
                                       const v1::ProbePeersRequest* request,
                                       v1::ProbePeersResponse* response) override;
  // The same, for OperatorService: `done` gets the answers.
  void Probe(std::function<void(const v1::ProbePeersResponse&)> done);
  // Asks the clusters behind the rendezvous stores in use (etcd) how their members are (one
  // probe at a time, at most one a second; later calls share its answers).
  grpc::ServerUnaryReactor* ProbeStores(grpc::CallbackServerContext* context,
                                        const v1::ProbeStoresRequest* request,
                                        v1::ProbeStoresResponse* response) override;
  // The same, for OperatorService.
  void ProbeStoreClusters(std::function<void(const v1::ProbeStoresResponse&)> done);

  // PERMISSION_DENIED: drains are served on the operator socket only (OperatorService).
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const v1::DrainRequest* request,
                                  v1::DrainResponse* response) override;

 private:
  const Config* const config_;
  const std::string socket_path_;
  const absl::Time start_time_;
  const std::atomic<bool>* const serving_;
  store::MemoryStore* const store_;
  const CallStats* const store_calls_;
  const CallStats* const control_calls_;
  const InFlightCalls* const in_flight_;
  const std::string peer_address_;
  group::GroupManager* const groups_;
  const DataSocket* data_socket_ = nullptr;
  agent::Agent* agent_ = nullptr;  // Probe pings through it
  CallRouter* calls_ = nullptr;    // Stats() is not const, but only reads
  const cuda::GpuDiscovery* gpus_ = nullptr;
  CudaCopies* cuda_ = nullptr;
  std::string cuda_unavailable_;
  std::string metrics_address_;
  NodeDrain* drain_ = nullptr;
  std::string operator_socket_;
  mode_t operator_socket_mode_ = 0600;
  std::string operator_group_;
  // Admin.ProbePeers: pings every peer the agent knows; `finish` gets the answers once the
  // last ping ends.
  void PingPeers(std::function<void(v1::ProbePeersResponse)> finish);
  // Admin.ProbeStores: asks the stores' clusters on a thread of its own (store_prober_; the
  // answers take round trips to etcd, which gRPC's callback threads must not wait for).
  void AskStoreClusters(std::function<void(v1::ProbeStoresResponse)> finish);
  v1::ProbeStoresResponse StoreClusters();

  SharedProbe<v1::ProbePeersResponse> peer_probe_;
  SharedProbe<v1::ProbeStoresResponse> store_probe_;
  absl::Mutex store_prober_mu_;
  // The last store probe's thread: joined by the next probe and by the destructor.
  std::thread store_prober_ ABSL_GUARDED_BY(store_prober_mu_);
};

}  // namespace tpd

#endif  // TPD_DAEMON_ADMIN_SERVICE_H_
