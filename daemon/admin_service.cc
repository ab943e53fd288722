#include "daemon/admin_service.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/str_format.h"
#include "daemon/process_stats.h"
#include "daemon/router/session_handle.h"
#include "daemon/session_limits.h"
#include "daemon/version.h"

namespace tpd {
namespace {

void FillBackends(const std::vector<agent::Candidate>& candidates,
                  google::protobuf::RepeatedPtrField<v1::AgentBackend>* out) {
  for (const agent::Candidate& candidate : candidates) {
    v1::AgentBackend* backend = out->Add();
    backend->set_name(candidate.name);
    backend->set_priority(candidate.priority);
    backend->set_registered(candidate.registered);
    backend->set_reason(candidate.reason);
  }
}

void FillAgent(const agent::Agent& agent, v1::AgentStatus* out) {
  agent::AgentStats stats = agent.Stats();
  out->set_id(std::move(stats.id));
  out->set_address(std::move(stats.address));
  out->set_auth_failures(stats.auth_failures);
  out->set_calls_pending(stats.calls_pending);
  for (agent::PeerStats& peer : stats.peers) {
    v1::AgentPeer* p = out->add_peers();
    p->set_node(std::move(peer.node));
    p->set_address(std::move(peer.address));
    p->set_pipe_state(agent::PipeStateName(peer.state));
    p->set_inbound_pipes(peer.inbound_pipes);
    p->set_transport(std::move(peer.transport));
    p->set_channel(std::move(peer.channel));
    for (std::string& name : peer.peer_transports) p->add_peer_transports(std::move(name));
    for (std::string& name : peer.peer_channels) p->add_peer_channels(std::move(name));
    p->set_calls_sent(peer.calls_sent);
    p->set_calls_received(peer.calls_received);
    p->set_calls_pending(peer.calls_pending);
    p->set_bytes_sent(peer.bytes_sent);
    p->set_bytes_received(peer.bytes_received);
    p->set_errors(peer.errors);
    p->set_last_error(std::move(peer.last_error));
  }
  // The registry is immutable once the agent exists: no lock.
  FillBackends(agent.registry().transports(), out->mutable_transports());
  FillBackends(agent.registry().channels(), out->mutable_channels());
}

void FillGpus(const cuda::GpuDiscovery& gpus, v1::GpuStatus* out) {
  out->set_driver_loaded(gpus.driver_loaded);
  out->set_driver_version(gpus.driver_version);
  out->set_unavailable_reason(gpus.unavailable_reason);
  for (const cuda::Gpu& gpu : gpus.gpus) {
    v1::GpuDevice* device = out->add_devices();
    device->set_index(gpu.index);
    device->set_name(gpu.name);
    device->set_total_memory_bytes(gpu.total_memory_bytes);
    device->set_compute_capability_major(gpu.compute_capability_major);
    device->set_compute_capability_minor(gpu.compute_capability_minor);
    device->set_pci_bus_id(gpu.pci_bus_id);
    device->set_uuid(gpu.uuid);
  }
  for (const std::vector<bool>& row : gpus.can_access_peer) {
    v1::GpuPeerAccess* peers = out->add_peer_access();
    for (bool can : row) peers->add_can_access(can);
  }
}

double Micros(double ns) { return ns / 1000.0; }

// Calls by group, busiest first, with the group's members here and its phase.
void FillGroupUsage(const std::map<std::string, router::Usage>& by_group,
                    const std::vector<v1::GroupView>& groups, const std::string& node,
                    v1::StatusResponse* response) {
  std::map<std::string, const v1::GroupView*> tracked;
  for (const v1::GroupView& group : groups) tracked[group.group()] = &group;
  std::vector<v1::GroupUsage> usage;
  for (const auto& [name, sent] : by_group) {
    v1::GroupUsage& out = usage.emplace_back();
    out.set_group(name);
    out.set_calls(sent.calls);
    out.set_bytes_sent(sent.bytes);
    out.set_call_errors(sent.errors);
    if (auto it = tracked.find(name); it != tracked.end()) {
      out.set_phase(it->second->phase());
      for (const v1::Member& member : it->second->members()) {
        if (member.node() == node) out.set_members_here(out.members_here() + 1);
      }
    }
  }
  std::stable_sort(usage.begin(), usage.end(),
                   [](const auto& a, const auto& b) { return a.calls() > b.calls(); });
  for (v1::GroupUsage& group : usage) *response->add_group_usage() = std::move(group);
}

void FillLatencies(const std::vector<router::CallTimings::Stage>& stages,
                   v1::StatusResponse* response) {
  for (const router::CallTimings::Stage& stage : stages) {
    const LatencyHistogram::Snapshot& h = stage.latency;
    v1::CallLatency* out = response->add_call_latency();
    out->set_stage(router::StageName(stage.stage));
    out->set_count(h.count);
    out->set_mean_us(Micros(h.MeanNs()));
    out->set_p50_us(Micros(h.Percentile(0.5)));
    out->set_p90_us(Micros(h.Percentile(0.9)));
    out->set_p99_us(Micros(h.Percentile(0.99)));
    out->set_max_us(Micros(h.max_ns));
    for (const auto& [le_ns, count] : h.NonEmpty()) {
      v1::LatencyBucket* bucket = out->add_buckets();
      bucket->set_le_us(Micros(le_ns));
      bucket->set_count(count);
    }
  }
}

}  // namespace

AdminService::AdminService(const Config* config, std::string socket_path, absl::Time start_time,
                           const std::atomic<bool>* serving, store::MemoryStore* store,
                           const CallStats* store_calls, const CallStats* control_calls,
                           const InFlightCalls* in_flight, std::string peer_address,
                           group::GroupManager* groups)
    : config_(config),
      socket_path_(std::move(socket_path)),
      start_time_(start_time),
      serving_(serving),
      store_(store),
      store_calls_(store_calls),
      control_calls_(control_calls),
      in_flight_(in_flight),
      peer_address_(std::move(peer_address)),
      groups_(groups),
      peer_probe_([this](std::function<void(v1::ProbePeersResponse)> finish) {
        PingPeers(std::move(finish));
      }),
      store_probe_([this](std::function<void(v1::ProbeStoresResponse)> finish) {
        AskStoreClusters(std::move(finish));
      }) {}

grpc::ServerUnaryReactor* AdminService::Status(grpc::CallbackServerContext* context,
                                               const v1::StatusRequest*,
                                               v1::StatusResponse* response) {
  Fill(response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::Drain(grpc::CallbackServerContext* context,
                                              const v1::DrainRequest*, v1::DrainResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status(
      grpc::StatusCode::PERMISSION_DENIED,
      absl::StrFormat("Admin.Drain is served only on the operator socket %s (mode %04o%s): "
                      "connect there as root or the daemon's user%s (tpctl drain does)",
                      operator_socket_, operator_socket_mode_,
                      operator_group_.empty() ? "" : absl::StrCat(", group ", operator_group_),
                      operator_group_.empty() ? "" : ", or as a member of that group")));
  return reactor;
}

void AdminService::Probe(std::function<void(const v1::ProbePeersResponse&)> done) {
  peer_probe_.Ask(std::move(done));
}

void AdminService::PingPeers(std::function<void(v1::ProbePeersResponse)> finish) {
  std::vector<agent::PeerId> peers;
  if (agent_ != nullptr) {
    for (const agent::PeerStats& peer : agent_->Stats().peers) {
      if (!peer.node.empty()) peers.push_back(agent::PeerId{peer.node, peer.address});
    }
  }
  // Answers gather here; the last ping to end finishes.
  struct Round {
    absl::Mutex mu;
    v1::ProbePeersResponse answer ABSL_GUARDED_BY(mu);
    size_t left ABSL_GUARDED_BY(mu) = 0;
    std::function<void(v1::ProbePeersResponse)> finish;
  };
  auto round = std::make_shared<Round>();
  round->finish = std::move(finish);
  auto done = [round] {
    v1::ProbePeersResponse answer;
    {
      absl::MutexLock lock(&round->mu);
      answer = round->answer;
    }
    answer.set_probed_unix_ms(absl::ToUnixMillis(absl::Now()));
    round->finish(std::move(answer));
  };
  if (peers.empty()) {
    done();
    return;
  }
  {
    absl::MutexLock lock(&round->mu);
    round->left = peers.size();
  }
  for (const agent::PeerId& peer : peers) {
    agent_->Ping(peer, absl::Now() + absl::Seconds(2),
                 [round, done, node = peer.node](absl::StatusOr<agent::PingResult> result) {
                   bool last;
                   {
                     absl::MutexLock lock(&round->mu);
                     v1::PeerProbe* probe = round->answer.add_peers();
                     probe->set_node(node);
                     if (result.ok()) {
                       probe->set_round_trip_us(absl::ToDoubleMicroseconds(result->round_trip));
                       probe->set_clock_offset_ms(absl::ToDoubleMilliseconds(result->clock_offset));
                     } else {
                       probe->set_error(result.status().ToString());
                     }
                     last = --round->left == 0;
                   }
                   if (last) done();
                 });
  }
}

grpc::ServerUnaryReactor* AdminService::ProbePeers(grpc::CallbackServerContext* context,
                                                   const v1::ProbePeersRequest*,
                                                   v1::ProbePeersResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Probe([reactor, response](const v1::ProbePeersResponse& answer) {
    *response = answer;
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

AdminService::~AdminService() {
  std::thread last;
  {
    absl::MutexLock lock(&store_prober_mu_);
    last = std::move(store_prober_);
  }
  if (last.joinable()) last.join();
}

void AdminService::ProbeStoreClusters(std::function<void(const v1::ProbeStoresResponse&)> done) {
  store_probe_.Ask(std::move(done));
}

void AdminService::AskStoreClusters(std::function<void(v1::ProbeStoresResponse)> finish) {
  std::thread finished;
  {
    absl::MutexLock lock(&store_prober_mu_);
    finished = std::move(store_prober_);
    store_prober_ = std::thread([this, finish = std::move(finish)] { finish(StoreClusters()); });
  }
  // The last probe's thread has answered its callers (or is about to): it ends at once.
  if (finished.joinable()) finished.join();
}

v1::ProbeStoresResponse AdminService::StoreClusters() {
  v1::ProbeStoresResponse answer;
  for (const auto& [name, health] : groups_->ProbeStoreClusters(absl::Now() + absl::Seconds(2))) {
    v1::StoreProbe* store = answer.add_stores();
    store->set_name(name);
    store->set_list_error(health.list_error);
    for (const store::Cluster::Member& member : health.members) {
      v1::StoreMember* out = store->add_members();
      out->set_id(absl::StrFormat("%x", member.id));
      out->set_name(member.name);
      for (const std::string& url : member.client_urls) out->add_client_urls(url);
      out->set_learner(member.learner);
      out->set_endpoint(member.endpoint);
      out->set_unanswered(member.unanswered);
      if (member.endpoint.empty() || !member.unanswered.empty()) continue;
      out->set_version(member.version);
      out->set_db_size_bytes(member.db_size_bytes);
      if (member.leader != 0) out->set_leader_id(absl::StrFormat("%x", member.leader));
      out->set_raft_term(member.raft_term);
      out->set_raft_index(member.raft_index);
      for (const std::string& error : member.errors) out->add_errors(error);
      out->set_round_trip_ms(absl::ToDoubleMilliseconds(member.round_trip));
    }
    for (const std::string& unanswered : health.unanswered) store->add_unanswered(unanswered);
  }
  answer.set_probed_unix_ms(absl::ToUnixMillis(absl::Now()));
  return answer;
}

grpc::ServerUnaryReactor* AdminService::ProbeStores(grpc::CallbackServerContext* context,
                                                    const v1::ProbeStoresRequest*,
                                                    v1::ProbeStoresResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ProbeStoreClusters([reactor, response](const v1::ProbeStoresResponse& answer) {
    *response = answer;
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

void AdminService::Fill(v1::StatusResponse* response) const {
  response->set_version(kVersion);
  response->set_pid(getpid());
  response->set_start_time_unix_ms(absl::ToUnixMillis(start_time_));
  response->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - start_time_));
  response->set_socket_path(socket_path_);
  response->set_serving_status(serving_->load() ? "SERVING" : "NOT_SERVING");
  response->set_calls_in_flight(in_flight_->count());
  response->set_peer_address(peer_address_);
  response->set_open_session_count(groups_->SessionCount());
  if (data_socket_ != nullptr) {
    response->set_data_socket(data_socket_->path());
    std::vector<DataSocket::SessionInfo> sessions = data_socket_->Sessions();
    std::sort(sessions.begin(), sessions.end(),
              [](const auto& a, const auto& b) { return a.attached_at < b.attached_at; });
    response->set_attached_session_count(static_cast<int64_t>(sessions.size()));
    std::map<int64_t, v1::UidUse> uids;
    for (const auto& [uid, use] : data_socket_->UsePerUid()) {
      v1::UidUse& out = uids[uid];
      out.set_attached_sessions(use.sessions);
      out.set_segment_bytes(use.segment_bytes);
      out.set_pending_connections(use.pending);
    }
    if (calls_ != nullptr) {
      CallRouter::UsageTotals usage = calls_->Usage();
      for (const auto& [uid, sent] : usage.by_uid) {
        v1::UidUse& out = uids[uid];
        out.set_calls(sent.calls);
        out.set_bytes_sent(sent.bytes);
        out.set_call_errors(sent.errors);
      }
      FillGroupUsage(usage.by_group, groups_->ListGroups(), groups_->node().name, response);
    }
    // Joined by session id here only: the id never leaves the daemon.
    std::map<std::string, SessionCallStats> calls;
    if (calls_ != nullptr) {
      for (SessionCallStats& stats : calls_->Stats()) {
        std::string id = stats.session_id;
        calls.emplace(std::move(id), std::move(stats));
      }
    }
    for (const DataSocket::SessionInfo& info : sessions) {
      v1::AttachedSession* session = response->add_attached_sessions();
      session->set_pid(info.pid);
      session->set_uid(info.uid);
      session->set_gid(info.gid);
      session->set_arena_bytes(static_cast<uint64_t>(config_->data.arena_bytes));
      session->set_segment_bytes(info.segment_bytes);
      session->set_attached_unix_ms(absl::ToUnixMillis(info.attached_at));
      session->set_handle(SessionHandle(info.session_id));
      // A session attached a moment ago may not have reached the router yet: zeros then.
      if (auto it = calls.find(info.session_id); it != calls.end()) {
        session->set_calls_in_flight(it->second.calls_in_flight);
        session->set_unposted_completions(it->second.unposted);
        session->set_rx_heap_bytes(it->second.rx_heap_bytes);
        session->set_rx_heap_used(it->second.rx_heap_used);
        session->set_reader_wakeups(it->second.reader_wakeups);
        session->set_daemon_sleeps(it->second.daemon_sleeps);
        session->set_bytes_shared(it->second.bytes_shared);
        const SessionCudaStats& cuda = it->second.cuda;
        session->set_cuda_open_allocations(cuda.open_allocations);
        for (const SessionCudaStats::Pool& pool : cuda.pools) {
          v1::CudaPoolStatus* out = session->add_cuda_pools();
          out->set_device(absl::StrCat("cuda:", pool.device));
          out->set_bytes(pool.bytes);
          out->set_used(pool.used);
        }
        v1::UidUse& use = uids[info.uid];
        use.set_calls_in_flight(use.calls_in_flight() + it->second.calls_in_flight);
      }
    }
    for (auto& [uid, use] : uids) {
      use.set_uid(uid);
      *response->add_uid_use() = std::move(use);
    }
  }
  if (calls_ != nullptr) {
    FillLatencies(calls_->Latencies(), response);
    for (const auto& [code, count] : calls_->CallErrors()) {
      (*response->mutable_call_errors())[code] = static_cast<int64_t>(count);
    }
  }
  response->set_metrics_address(metrics_address_);
  if (drain_ != nullptr) *response->mutable_drain() = drain_->Status();
  response->set_operator_socket(operator_socket_);
  v1::NodeLimits* limits = response->mutable_limits();
  const MachineFacts machine = ReadMachineFacts();
  limits->set_open_file_limit(machine.open_files);
  limits->set_open_files_needed(config_->data.max_sessions * kFilesPerSession + kFilesKept);
  limits->set_open_files(CountOpenFiles());
  limits->set_memory_bytes(machine.memory_bytes);
  limits->set_memlock_limit_bytes(MemlockLimit());
  const PtraceFacts ptrace = ReadPtraceFacts();
  limits->set_yama_ptrace_scope(ptrace.yama_scope);
  limits->set_cap_sys_ptrace(ptrace.cap_sys_ptrace);
  if (agent_ != nullptr) FillAgent(*agent_, response->mutable_agent());
  if (gpus_ != nullptr) FillGpus(*gpus_, response->mutable_gpus());
  if (cuda_ != nullptr) {
    for (const auto& [route, counts] : cuda_->Stats().routes) {
      v1::CudaCopyCount* out = response->mutable_gpus()->add_copies();
      out->set_route(route);
      out->set_copies(counts.copies);
      out->set_bytes(counts.bytes);
      out->set_busy_us(counts.busy_us);
    }
  }
  response->mutable_gpus()->set_copies_unavailable(cuda_unavailable_);
  v1::NodeInfo* node = response->mutable_node();
  node->set_name(groups_->node().name);
  node->set_incarnation(groups_->node().incarnation.load());
  node->set_device_count(groups_->node().device_count);
  for (v1::GroupView& view : groups_->ListGroups()) *response->add_groups() = std::move(view);
  for (const auto& [name, seen] : groups_->PeerHeartbeats()) {
    v1::PeerInfo* peer = response->add_peers();
    peer->set_node(name);
    peer->set_last_heartbeat_unix_ms(absl::ToUnixMillis(seen));
  }
  for (const auto& [name, liveness] : groups_->RendezvousStores()) {
    v1::RendezvousStoreInfo* store = response->add_rendezvous_stores();
    store->set_name(name);
    store->set_liveness(liveness.leased ? "lease" : "heartbeat");
    if (liveness.lease != 0) store->set_lease_id(absl::StrFormat("%016x", liveness.lease));
    store->set_lease_ttl_ms(absl::ToInt64Milliseconds(liveness.lease_ttl));
    if (liveness.last_beat != absl::InfinitePast()) {
      store->set_last_beat_unix_ms(absl::ToUnixMillis(liveness.last_beat));
    }
    store->set_failed_beats(liveness.failed_beats);
    store->set_last_error(liveness.last_error);
    store->set_leases_lost(liveness.leases_lost);
  }

  v1::ConfigSummary* config = response->mutable_config();
  config->set_config_path(config_->config_path);
  config->set_socket_mode(absl::StrFormat("%04o", config_->socket_mode));
  config->set_log_level(config_->log_level);
  config->set_store_default_timeout_ms(absl::ToInt64Milliseconds(config_->store.default_timeout));
  config->set_store_max_key_bytes(config_->store.max_key_bytes);
  config->set_store_max_value_bytes(config_->store.max_value_bytes);
  config->set_store_max_keys_per_request(config_->store.max_keys_per_request);
  config->set_store_max_waiters(config_->store.max_waiters);
  config->set_shutdown_grace_ms(absl::ToInt64Milliseconds(config_->shutdown_grace));
  config->set_data_arena_bytes(config_->data.arena_bytes);
  config->set_data_max_sessions(config_->data.max_sessions);
  config->set_data_max_sessions_per_uid(config_->data.max_sessions_per_uid);
  config->set_data_max_open_sessions(config_->data.max_open_sessions);
  config->set_data_share_memory(config_->data.share_memory);
  config->set_data_max_shared_memory_bytes(config_->data.max_shared_memory_bytes);
  config->set_data_sessions_kept_free(config_->data.sessions_kept_free);
  config->set_peer_heartbeat_timeout_ms(absl::ToInt64Milliseconds(config_->peer.heartbeat_timeout));
  config->set_store_max_bytes_per_uid(config_->store.max_bytes_per_uid);
  config->set_store_max_keys_per_uid(config_->store.max_keys_per_uid);
  config->set_store_max_waiters_per_uid(config_->store.max_waiters_per_uid);
  config->set_group_max_groups_per_uid(config_->group.max_groups_per_uid);
  config->set_peer_auth_max_skew_ms(absl::ToInt64Milliseconds(config_->peer.auth_max_skew));

  const store::MemoryStoreStats stats = store_->Stats();
  v1::StoreStats* store = response->mutable_store();
  store->set_num_keys(stats.num_keys);
  store->set_bytes(stats.bytes);
  store->set_waiters(stats.waiters);
  for (const store::StoreWriterUse& use : stats.writers) {
    v1::StoreWriter* writer = store->add_writers();
    writer->set_writer(use.writer);
    writer->set_keys(use.keys);
    writer->set_bytes(use.bytes);
    writer->set_waiters(use.waiters);
  }
  for (const auto& [method, count] : store_calls_->Calls())
    (*store->mutable_calls())[method] = count;
  for (const auto& [code, count] : store_calls_->Errors()) (*store->mutable_errors())[code] = count;
  for (const auto& [method, count] : control_calls_->Calls()) {
    (*response->mutable_control_calls())[method] = count;
  }
  for (const auto& [code, count] : control_calls_->Errors()) {
    (*response->mutable_control_errors())[code] = count;
  }
}

}  // namespace tpd
