#include "daemon/metrics.h"

#include <algorithm>
#include <exception>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tpd {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// Builds the families in the order they are first named.
class Families {
 public:
  // The family `name`, created with `help` and `type` the first time.
  MetricFamily& Family(const std::string& name, const std::string& help, MetricType type) {
    auto [it, added] = index_.emplace(name, families_.size());
    if (added) families_.push_back(MetricFamily{name, help, type, {}});
    return families_[it->second];
  }
  void Gauge(const std::string& name, const std::string& help, double value, Labels labels = {}) {
    ClientMetric metric;
    metric.label = std::move(labels);
    metric.gauge.value = value;
    Family(name, help, MetricType::Gauge).metric.push_back(std::move(metric));
  }
  void Counter(const std::string& name, const std::string& help, double value, Labels labels = {}) {
    ClientMetric metric;
    metric.label = std::move(labels);
    metric.counter.value = value;
    Family(name, help, MetricType::Counter).metric.push_back(std::move(metric));
  }
  std::vector<MetricFamily> Take() { return std::move(families_); }

 private:
  std::map<std::string, size_t> index_;
  std::vector<MetricFamily> families_;
};

Labels Label(const char* name, std::string value) { return {{name, std::move(value)}}; }

void AddStageHistograms(const v1::StatusResponse& status, Families* out) {
  const std::vector<double>& bounds = StageBucketBounds();
  for (const v1::CallLatency& stage : status.call_latency()) {
    ClientMetric metric;
    metric.label = Label("stage", stage.stage());
    std::vector<uint64_t> counts(bounds.size(), 0);
    for (const v1::LatencyBucket& bucket : stage.buckets()) {
      const double le = bucket.le_us() / 1e6;
      const auto at = std::lower_bound(bounds.begin(), bounds.end(), le);
      // Past the last bound the count appears only in +Inf (sample_count).
      if (at != bounds.end()) counts[at - bounds.begin()] += bucket.count();
    }
    uint64_t cumulative = 0;
    for (size_t i = 0; i < bounds.size(); ++i) {
      cumulative += counts[i];
      metric.histogram.bucket.push_back({cumulative, bounds[i]});
    }
    metric.histogram.sample_count = stage.count();
    metric.histogram.sample_sum = stage.mean_us() * static_cast<double>(stage.count()) / 1e6;
    out->Family("tpd_call_stage_seconds",
                "Time calls spent in each stage inside this daemon (local.deliver, "
                "remote.wait, inbound.callee, ...; README \"Where a call's time goes\")",
                MetricType::Histogram)
        .metric.push_back(std::move(metric));
  }
}

void AddSessions(const v1::StatusResponse& status, Families* out) {
  out->Gauge("tpd_sessions_open", "Control.OpenSession streams open now, attached or not",
             static_cast<double>(status.open_session_count()));
  out->Gauge("tpd_sessions_attached", "Sessions attached to shared memory now",
             static_cast<double>(status.attached_session_count()));
  out->Gauge("tpd_sessions_max", "[data] max_sessions in force",
             static_cast<double>(status.config().data_max_sessions()));
  struct Use {
    double sessions = 0, segment_bytes = 0, pending = 0, calls_in_flight = 0, rx_used = 0;
    double rx_bytes = 0, calls = 0, bytes_sent = 0, errors = 0;
  };
  std::map<int64_t, Use> by_uid;
  for (const v1::UidUse& use : status.uid_use()) {
    Use& u = by_uid[use.uid()];
    u.sessions = static_cast<double>(use.attached_sessions());
    u.segment_bytes = static_cast<double>(use.segment_bytes());
    u.pending = static_cast<double>(use.pending_connections());
    u.calls_in_flight = static_cast<double>(use.calls_in_flight());
    u.calls = static_cast<double>(use.calls());
    u.bytes_sent = static_cast<double>(use.bytes_sent());
    u.errors = static_cast<double>(use.call_errors());
  }
  for (const v1::AttachedSession& session : status.attached_sessions()) {
    Use& u = by_uid[session.uid()];
    u.rx_used += static_cast<double>(session.rx_heap_used());
    u.rx_bytes += static_cast<double>(session.rx_heap_bytes());
  }
  for (const auto& [uid, u] : by_uid) {
    const std::string id = absl::StrCat(uid);
    out->Gauge("tpd_uid_sessions_attached", "Attached sessions of each local user", u.sessions,
               Label("uid", id));
    out->Gauge("tpd_uid_shared_memory_bytes",
               "Shared memory of each local user's attached sessions (their segments)",
               u.segment_bytes, Label("uid", id));
    out->Gauge("tpd_uid_pending_connections",
               "Each local user's data connections that have not attached yet", u.pending,
               Label("uid", id));
    out->Gauge("tpd_uid_calls_in_flight", "Calls of each local user's sessions awaiting replies",
               u.calls_in_flight, Label("uid", id));
    out->Gauge("tpd_uid_rx_heap_used_bytes",
               "Bytes the daemon placed in each local user's receive heaps, not yet released",
               u.rx_used, Label("uid", id));
    out->Gauge("tpd_uid_rx_heap_bytes", "Size of each local user's receive heaps, together",
               u.rx_bytes, Label("uid", id));
    out->Counter("tpd_uid_calls_total",
                 "Calls each local user's sessions made, ended ones included", u.calls,
                 Label("uid", id));
    out->Counter("tpd_uid_sent_bytes_total",
                 "Payload and tensor bytes of each local user's calls and replies", u.bytes_sent,
                 Label("uid", id));
    out->Counter("tpd_uid_call_errors_total",
                 "Calls of each local user that the daemon answered with an error", u.errors,
                 Label("uid", id));
  }
}

void AddStore(const v1::StatusResponse& status, Families* out) {
  const v1::StoreStats& store = status.store();
  out->Gauge("tpd_store_keys", "Keys in the embedded store", static_cast<double>(store.num_keys()));
  out->Gauge("tpd_store_bytes", "Bytes of keys and values in the embedded store",
             static_cast<double>(store.bytes()));
  out->Gauge("tpd_store_waiters", "Store calls waiting for keys now",
             static_cast<double>(store.waiters()));
  for (const auto& [method, count] :
       std::map<std::string, int64_t>(store.calls().begin(), store.calls().end())) {
    out->Counter("tpd_store_calls_total", "Store calls served, by method",
                 static_cast<double>(count), Label("method", method));
  }
  for (const auto& [code, count] :
       std::map<std::string, int64_t>(store.errors().begin(), store.errors().end())) {
    out->Counter("tpd_store_errors_total", "Store calls that ended in an error, by gRPC code",
                 static_cast<double>(count), Label("code", code));
  }
}

void AddControl(const v1::StatusResponse& status, Families* out) {
  for (const auto& [method, count] : std::map<std::string, int64_t>(status.control_calls().begin(),
                                                                    status.control_calls().end())) {
    out->Counter("tpd_control_calls_total", "tpd.v1.Control calls served, by method",
                 static_cast<double>(count), Label("method", method));
  }
  for (const auto& [code, count] : std::map<std::string, int64_t>(status.control_errors().begin(),
                                                                  status.control_errors().end())) {
    out->Counter("tpd_control_errors_total", "Control calls that ended in an error, by gRPC code",
                 static_cast<double>(count), Label("code", code));
  }
  for (const auto& [code, count] :
       std::map<std::string, int64_t>(status.call_errors().begin(), status.call_errors().end())) {
    out->Counter("tpd_call_errors_total",
                 "Calls of sessions here that the daemon answered with an error, by gRPC code",
                 static_cast<double>(count), Label("code", code));
  }
}

void AddGroups(const v1::StatusResponse& status, Families* out) {
  std::map<std::string, double> phases;
  for (const v1::GroupView& group : status.groups()) phases[group.phase()] += 1;
  for (const auto& [phase, count] : phases) {
    out->Gauge("tpd_groups", "Groups this daemon tracks, by phase", count, Label("phase", phase));
  }
  for (const v1::PeerInfo& peer : status.peers()) {
    out->Gauge("tpd_peer_last_heartbeat_timestamp_seconds",
               "When this daemon last saw each peer node's heartbeat change, Unix time",
               static_cast<double>(peer.last_heartbeat_unix_ms()) / 1e3,
               Label("node", peer.node()));
  }
  for (const v1::RendezvousStoreInfo& store : status.rendezvous_stores()) {
    out->Counter("tpd_rendezvous_failed_beats_total",
                 "Liveness writes and lease renewals the rendezvous store did not answer",
                 static_cast<double>(store.failed_beats()), Label("store", store.name()));
    out->Counter("tpd_rendezvous_leases_lost_total",
                 "etcd leases found expired: this node was gone for a TTL",
                 static_cast<double>(store.leases_lost()), Label("store", store.name()));
    if (store.last_beat_unix_ms() != 0) {
      out->Gauge("tpd_rendezvous_last_beat_timestamp_seconds",
                 "When this node last showed it lives in the store, Unix time",
                 static_cast<double>(store.last_beat_unix_ms()) / 1e3,
                 Label("store", store.name()));
    }
  }
}

void AddAgent(const v1::StatusResponse& status, Families* out) {
  if (!status.has_agent()) return;
  const v1::AgentStatus& agent = status.agent();
  out->Counter("tpd_agent_auth_failures_total",
               "Pipes from other daemons closed because their handshake failed",
               static_cast<double>(agent.auth_failures()));
  out->Gauge("tpd_agent_calls_pending", "Calls to other daemons awaiting their answers",
             static_cast<double>(agent.calls_pending()));
  std::map<std::string, double> pipes;
  for (const v1::AgentPeer& peer : agent.peers()) {
    pipes[peer.pipe_state()] += 1;
    const Labels node = Label("peer", peer.node());
    out->Counter("tpd_agent_peer_calls_sent_total", "Requests sent to each peer daemon",
                 static_cast<double>(peer.calls_sent()), node);
    out->Counter("tpd_agent_peer_calls_received_total", "Requests each peer daemon sent here",
                 static_cast<double>(peer.calls_received()), node);
    out->Gauge("tpd_agent_peer_calls_pending", "Requests to each peer daemon awaiting answers",
               static_cast<double>(peer.calls_pending()), node);
    out->Counter("tpd_agent_peer_sent_bytes_total",
                 "Payload and tensor bytes written to each peer daemon",
                 static_cast<double>(peer.bytes_sent()), node);
    out->Counter("tpd_agent_peer_received_bytes_total",
                 "Payload and tensor bytes read from each peer daemon",
                 static_cast<double>(peer.bytes_received()), node);
    out->Counter("tpd_agent_peer_errors_total", "Failed calls and pipe failures, by peer daemon",
                 static_cast<double>(peer.errors()), node);
    out->Gauge("tpd_agent_peer_inbound_pipes", "Authenticated pipes each peer daemon holds here",
               static_cast<double>(peer.inbound_pipes()), node);
  }
  for (const auto& [state, count] : pipes) {
    out->Gauge("tpd_agent_pipes", "This daemon's pipes to peer daemons, by state", count,
               Label("state", state));
  }
}

void AddGpus(const v1::StatusResponse& status, Families* out) {
  const v1::GpuStatus& gpus = status.gpus();
  out->Gauge("tpd_gpus", "GPUs the NVIDIA driver reports on this node",
             static_cast<double>(gpus.devices_size()));
  for (const v1::CudaCopyCount& route : gpus.copies()) {
    const Labels labels = Label("route", route.route());
    out->Counter("tpd_cuda_copies_total", "Copies of CUDA tensors in calls, by route",
                 static_cast<double>(route.copies()), labels);
    out->Counter("tpd_cuda_copied_bytes_total", "Bytes of CUDA tensors copied in calls, by route",
                 static_cast<double>(route.bytes()), labels);
    out->Counter("tpd_cuda_copy_busy_seconds_total", "Time the copies of each route ran",
                 static_cast<double>(route.busy_us()) / 1e6, labels);
  }
}

// The descriptors come from Status's limits, which counted them for this snapshot already.
void AddProcess(const ProcessSample& p, const v1::NodeLimits& limits, Families* out) {
  out->Counter("process_cpu_seconds_total", "User and system CPU time spent in seconds",
               p.cpu_seconds);
  out->Gauge("process_resident_memory_bytes", "Resident memory size in bytes", p.resident_bytes);
  out->Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes", p.virtual_bytes);
  out->Gauge("process_open_fds", "Number of open file descriptors",
             static_cast<double>(limits.open_files()));
  if (limits.open_file_limit() > 0) {  // 0: unlimited
    out->Gauge("process_max_fds", "Maximum number of open file descriptors",
               static_cast<double>(limits.open_file_limit()));
  }
  out->Gauge("process_threads", "Number of OS threads in the process", p.threads);
  out->Gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds",
             p.start_time_seconds);
}

// Calls `snapshot` at each scrape.
class StatusCollectable final : public prometheus::Collectable {
 public:
  explicit StatusCollectable(std::function<v1::StatusResponse()> snapshot)
      : snapshot_(std::move(snapshot)) {}
  std::vector<MetricFamily> Collect() const override {
    return StatusMetrics(snapshot_(), SampleThisProcess());
  }

 private:
  const std::function<v1::StatusResponse()> snapshot_;
};

}  // namespace

const std::vector<double>& StageBucketBounds() {
  static const std::vector<double>* const bounds = new std::vector<double>{
      1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
      1e-2, 2.5e-2, 5e-2, 0.1,  0.25,   0.5,  1,    2.5,    5,    10,   30,     60};
  return *bounds;
}

std::vector<MetricFamily> StatusMetrics(const v1::StatusResponse& status,
                                        const ProcessSample& process) {
  Families out;
  out.Gauge("tpd_build_info", "The tpd release running, as a label; always 1", 1,
            Label("version", status.version()));
  out.Gauge("tpd_serving", "1 while the daemon admits work, 0 while it drains or stops",
            status.serving_status() == "SERVING" ? 1 : 0);
  out.Gauge("tpd_grpc_calls_in_flight",
            "gRPC calls on the unix socket being served now (store waits included)",
            static_cast<double>(status.calls_in_flight()));
  AddSessions(status, &out);
  AddStageHistograms(status, &out);
  AddControl(status, &out);
  AddStore(status, &out);
  AddGroups(status, &out);
  AddAgent(status, &out);
  AddGpus(status, &out);
  AddProcess(process, status.limits(), &out);
  return out.Take();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen_address, std::function<v1::StatusResponse()> snapshot) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  try {
    // A scraper that stalls mid-request holds one of the two threads for at most 10 s.
    server->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", listen_address, "num_threads", "2", "request_timeout_ms", "10000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("[metrics] listen_address ", listen_address,
                                               ": cannot serve /metrics there: ", e.what()));
  }
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  const std::string host = listen_address.substr(0, listen_address.rfind(':'));
  server->address_ = absl::StrCat(host, ":", ports.empty() ? 0 : ports.front());
  server->collectable_ = std::make_shared<StatusCollectable>(std::move(snapshot));
  server->exposer_->RegisterCollectable(server->collectable_);
  return server;
}

MetricsServer::~MetricsServer() {
  // The HTTP threads stop before the snapshot's sources may go.
  exposer_.reset();
}

}  // namespace tpd
