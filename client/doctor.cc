#include "client/doctor.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tpd {
namespace {

using Level = Finding::Level;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

class Findings {
 public:
  void Add(std::string check, Level level, std::string detail, std::string fix = "") {
    all_.push_back({std::move(check), level, std::move(detail), std::move(fix)});
  }
  std::vector<Finding> Take() { return std::move(all_); }

 private:
  std::vector<Finding> all_;
};

// Whether the agent registered the transport or channel `name` (none without an agent).
bool Registered(const google::protobuf::RepeatedPtrField<v1::AgentBackend>& backends,
                const std::string& name) {
  for (const v1::AgentBackend& backend : backends) {
    if (backend.name() == name) return backend.registered();
  }
  return false;
}

std::string Mib(int64_t bytes) { return absl::StrCat(bytes / kMiB, " MiB"); }

void CheckServing(const v1::StatusResponse& status, Findings* out) {
  if (status.serving_status() == "SERVING") {
    out->Add("serving", Level::kOk, "SERVING");
    return;
  }
  out->Add("serving", Level::kProblem,
           absl::StrCat(status.serving_status(), ": drain ", status.drain().state(),
                        status.drain().requested_by().empty()
                            ? ""
                            : absl::StrCat(" (asked by ", status.drain().requested_by(), ")")),
           "a drained node takes no joins or calls: `systemctl restart tpd` once maintenance is "
           "over");
}

void CheckLimits(const v1::StatusResponse& status, Findings* out) {
  const v1::NodeLimits& limits = status.limits();
  const v1::ConfigSummary& config = status.config();
  if (limits.open_file_limit() > 0 && limits.open_file_limit() < limits.open_files_needed()) {
    out->Add("open files", Level::kProblem,
             absl::StrCat("the daemon may open ", limits.open_file_limit(), " files; ",
                          config.data_max_sessions(),
                          " sessions ([data] max_sessions) and the "
                          "rest may need ",
                          limits.open_files_needed()),
             "raise LimitNOFILE= in a drop-in of the unit (systemctl edit tpd), or lower [data] "
             "max_sessions");
  } else if (limits.open_file_limit() > 0 &&
             limits.open_files() * 5 > limits.open_file_limit() * 4) {
    out->Add("open files", Level::kWarning,
             absl::StrCat(limits.open_files(), " of ", limits.open_file_limit(), " open now"),
             "raise LimitNOFILE= before sessions are refused");
  } else {
    out->Add("open files", Level::kOk,
             absl::StrCat(limits.open_files(), " open, limit ", limits.open_file_limit(),
                          ", the configuration may need ", limits.open_files_needed()));
  }
  const int64_t shm = config.data_max_shared_memory_bytes();
  if (limits.memory_bytes() > 0 && shm > limits.memory_bytes()) {
    out->Add("shared memory", Level::kProblem,
             absl::StrCat("[data] max_shared_memory_bytes ", Mib(shm), " exceeds the machine's ",
                          Mib(limits.memory_bytes())),
             "lower [data] max_shared_memory_bytes (0 derives half of memory)");
  } else if (limits.memory_bytes() > 0 && shm * 4 > limits.memory_bytes() * 3) {
    out->Add("shared memory", Level::kWarning,
             absl::StrCat("sessions may hold ", Mib(shm), " of ", Mib(limits.memory_bytes()),
                          " of memory"),
             "leave memory to the jobs: lower [data] max_shared_memory_bytes");
  } else {
    out->Add("shared memory", Level::kOk,
             absl::StrCat("sessions may hold ", Mib(shm), " of ", Mib(limits.memory_bytes())));
  }
  const bool ibv = Registered(status.agent().transports(), "ibv");
  const int64_t memlock = limits.memlock_limit_bytes();
  const std::string memlock_text = memlock < 0 ? "unlimited" : Mib(memlock);
  if (ibv && memlock >= 0 && memlock < kGiB) {
    out->Add("locked memory", Level::kWarning,
             absl::StrCat("RLIMIT_MEMLOCK ", memlock_text,
                          ", and the ibv transport registers "
                          "(locks) the memory it sends from"),
             "LimitMEMLOCK=infinity in a drop-in of the unit");
  } else {
    out->Add("locked memory", Level::kOk, absl::StrCat("RLIMIT_MEMLOCK ", memlock_text));
  }
  if ((std::strtol(config.socket_mode().c_str(), nullptr, 8) & 07) != 0) {
    out->Add("socket", Level::kWarning,
             absl::StrCat("socket mode ", config.socket_mode(), ": every user may connect"),
             "[daemon] socket_mode \"0660\" and socket_group for the users who run jobs");
  }
}

void CheckAgent(const v1::StatusResponse& status, Findings* out) {
  if (!status.has_agent()) {
    out->Add("agent", Level::kNote, "no peer port: calls stay on this node",
             "[peer] listen_address and token, to join groups across nodes");
    return;
  }
  const v1::AgentStatus& agent = status.agent();
  for (const auto* list : {&agent.transports(), &agent.channels()}) {
    const char* kind = list == &agent.transports() ? "transport" : "channel";
    for (const v1::AgentBackend& backend : *list) {
      out->Add(absl::StrCat(kind, " ", backend.name()),
               backend.registered() ? Level::kOk : Level::kNote,
               absl::StrCat(backend.registered() ? "on" : "off",
                            backend.reason().empty() ? "" : absl::StrCat(": ", backend.reason())));
    }
  }
  const bool cma = Registered(agent.channels(), "cma");
  const v1::NodeLimits& limits = status.limits();
  if (cma && limits.yama_ptrace_scope() >= 1 && !limits.cap_sys_ptrace()) {
    out->Add("cma", Level::kWarning,
             absl::StrCat("Yama ptrace_scope is ", limits.yama_ptrace_scope(),
                          " and the daemon lacks CAP_SYS_PTRACE: the cma channel cannot read "
                          "another daemon's memory, which matters only for two daemons on one "
                          "host"),
             "one daemon per host; or leave cma out of [agent] channels");
  } else if (cma) {
    out->Add("cma", Level::kOk,
             absl::StrCat("Yama ptrace_scope ", limits.yama_ptrace_scope(),
                          limits.cap_sys_ptrace() ? ", CAP_SYS_PTRACE held" : ""));
  }
  if (agent.auth_failures() > 0) {
    out->Add("peer handshakes", Level::kWarning,
             absl::StrCat(agent.auth_failures(),
                          " pipes from other daemons failed their "
                          "handshake"),
             "the daemon's log names each: a wrong [peer] token, or clocks further apart than "
             "[peer] auth_max_skew_ms");
  }
  for (const v1::AgentPeer& peer : agent.peers()) {
    const std::string check = absl::StrCat("peer ", peer.node());
    if (peer.pipe_state() == "failed") {
      out->Add(check, Level::kProblem, absl::StrCat("pipe failed: ", peer.last_error()),
               "check that the peer's daemon runs and its agent's address is reachable from here "
               "([peer] dial_networks, firewalls)");
    } else if (peer.errors() > 0) {
      out->Add(check, Level::kWarning,
               absl::StrCat(peer.errors(), " errors, the last: ", peer.last_error()));
    } else {
      out->Add(check, Level::kOk,
               absl::StrCat(peer.pipe_state(), " over ",
                            peer.transport().empty() ? "-" : peer.transport(), "/",
                            peer.channel().empty() ? "-" : peer.channel(), ", ", peer.calls_sent(),
                            " calls sent, ", peer.calls_received(), " received"));
    }
  }
}

void CheckPeersAndStores(const v1::StatusResponse& status, absl::Time now, Findings* out) {
  const absl::Duration timeout = absl::Milliseconds(status.config().peer_heartbeat_timeout_ms());
  for (const v1::PeerInfo& peer : status.peers()) {
    const absl::Duration age = now - absl::FromUnixMillis(peer.last_heartbeat_unix_ms());
    if (timeout > absl::ZeroDuration() && age > timeout) {
      out->Add(
          absl::StrCat("heartbeat ", peer.node()), Level::kProblem,
          absl::StrCat("last seen ", absl::FormatDuration(absl::Trunc(age, absl::Seconds(1))),
                       " ago ([peer] heartbeat_timeout_ms ", absl::FormatDuration(timeout), ")"),
          "the node is gone or cut off: its members are evicted");
    }
  }
  for (const v1::RendezvousStoreInfo& store : status.rendezvous_stores()) {
    const std::string check = absl::StrCat("rendezvous ", store.name());
    if (store.leases_lost() > 0 || store.failed_beats() > 0) {
      out->Add(
          check, Level::kWarning,
          absl::StrCat(store.failed_beats(), " failed beats, ", store.leases_lost(), " leases lost",
                       store.last_error().empty() ? "" : ", the last error: ", store.last_error()),
          absl::StartsWith(store.name(), "etcd://")
              ? "check the etcd members (etcdctl endpoint health) and this node's network"
              : "check that the store's host answers");
    } else {
      out->Add(check, Level::kOk, absl::StrCat(store.liveness(), ", beating"));
    }
  }
  for (const v1::GroupView& group : status.groups()) {
    if (group.phase() == "BROKEN" || group.phase() == "FAILED") {
      out->Add(absl::StrCat("group ", group.group()), Level::kWarning,
               absl::StrCat(group.phase(), ": ", group.reason()),
               "the job restarts its workers, or the group is released when idle");
    }
  }
}

void CheckProbes(const v1::StatusResponse& status, const v1::ProbePeersResponse& probes,
                 Findings* out) {
  const double max_skew_ms = static_cast<double>(status.config().peer_auth_max_skew_ms());
  for (const v1::PeerProbe& probe : probes.peers()) {
    if (!probe.error().empty()) {
      out->Add(absl::StrCat("ping ", probe.node()), Level::kProblem,
               absl::StrCat("no answer over the agent: ", probe.error()),
               "check that the peer's daemon runs and its agent is reachable from here");
      continue;
    }
    out->Add(absl::StrCat("ping ", probe.node()), Level::kOk,
             absl::StrFormat("round trip %.0f us over the agent", probe.round_trip_us()));
    const double offset = probe.clock_offset_ms();
    const std::string detail =
        absl::StrFormat("its clock is %+.1f ms from this node's (within %.1f ms)", offset,
                        probe.round_trip_us() / 2000);
    const double skew = offset < 0 ? -offset : offset;
    if (max_skew_ms > 0 && skew > max_skew_ms) {
      out->Add(absl::StrCat("clock ", probe.node()), Level::kProblem,
               absl::StrCat(detail, ", past [peer] auth_max_skew_ms ", max_skew_ms,
                            ": the daemons refuse each other's calls"),
               "synchronize the clocks (chrony, systemd-timesyncd)");
    } else if (skew > 1000) {
      out->Add(absl::StrCat("clock ", probe.node()), Level::kWarning, detail,
               "synchronize the clocks (chrony, systemd-timesyncd): logs and heartbeats of the "
               "two nodes disagree");
    } else {
      out->Add(absl::StrCat("clock ", probe.node()), Level::kOk, detail);
    }
  }
}

// What one etcd cluster's members said, gathered member by member (CheckStoreMember), then
// judged as a whole (CheckStoreCluster).
class ClusterTally {
 public:
  ClusterTally(const v1::StoreProbe& store, Findings* out)
      : store_(store), check_(absl::StrCat("etcd ", store.name())), out_(out) {}

  // One member's findings: not asked, silent, alarms, no leader, or its numbers.
  void CheckStoreMember(const v1::StoreMember& member) {
    const std::string who =
        absl::StrCat("member ", member.name().empty() ? member.id() : member.name());
    if (member.endpoint().empty()) {
      out_->Add(check_, Level::kNote,
                absl::StrCat(who, " (", absl::StrJoin(member.client_urls(), ", "),
                             ") is not among the URL's endpoints: not asked, and the store "
                             "cannot fail over to it"),
                "name every member in the etcd:// URL (etcd://a:2379,b:2379,c:2379/prefix)");
      return;
    }
    const std::string at = absl::StrCat(who, " at ", member.endpoint());
    if (!member.unanswered().empty()) {
      silent_.push_back(absl::StrCat(at, " does not answer: ", member.unanswered()));
      return;
    }
    ++answered_;
    if (member.errors_size() > 0) {
      trouble_ = true;
      const std::string raised = absl::StrJoin(member.errors(), "; ");
      out_->Add(check_, Level::kProblem, absl::StrCat(at, " raises: ", raised),
                absl::StrContains(raised, "NOSPACE")
                    ? "its database is full and it refuses writes: etcdctl compact, etcdctl "
                      "defrag, then etcdctl alarm disarm (docs/etcd.md)"
                    : "see etcd's log on that member; etcdctl alarm list");
    }
    if (member.leader_id().empty()) {
      trouble_ = true;
      out_->Add(check_, Level::kProblem,
                absl::StrCat(at,
                             " has no leader: the cluster has lost its majority, or this "
                             "member is cut off from it"),
                "bring members back until a majority runs (etcdctl endpoint status --cluster)");
      return;
    }
    AddOnce(&leaders_, member.leader_id());
    AddOnce(&versions_, member.version());
    out_->Add(check_, Level::kOk,
              absl::StrFormat("%s: etcd %s, leader %s, term %d, db %s, round trip %.1f ms", at,
                              member.version(), NameOf(member.leader_id()), member.raft_term(),
                              Mib(member.db_size_bytes()), member.round_trip_ms()));
  }

  // The cluster's findings: who is silent, listing, leaders, versions, or all well.
  void CheckStoreCluster() {
    for (const std::string& unanswered : store_.unanswered()) {
      silent_.push_back(absl::StrCat("endpoint ", unanswered));
    }
    // While one member answers, the store fails over to it: silence is a warning.
    const Level level = answered_ > 0 ? Level::kWarning : Level::kProblem;
    for (const std::string& detail : silent_) {
      trouble_ = true;
      out_->Add(check_, level, detail,
                answered_ > 0 ? "the store fails over to the others meanwhile; check that member "
                                "(etcdctl endpoint health)"
                              : "no member answers: check the etcd members and this node's "
                                "network to them (etcdctl endpoint health)");
    }
    if (!store_.list_error().empty()) {
      trouble_ = true;
      out_->Add(check_, level,
                absl::StrCat("the members could not be listed: ", store_.list_error()),
                "check the etcd members (etcdctl member list, endpoint health)");
    }
    if (leaders_.size() > 1) {
      trouble_ = true;
      out_->Add(check_, Level::kWarning,
                absl::StrCat("members disagree on the leader (",
                             absl::StrJoin(leaders_, ", ",
                                           [this](std::string* to, const std::string& id) {
                                             to->append(NameOf(id));
                                           }),
                             "): an election is under way, or a member is cut off"),
                "check again in a few seconds; if it lasts, etcdctl endpoint status --cluster");
    }
    if (versions_.size() > 1) {
      out_->Add(check_, Level::kNote,
                absl::StrCat("members run etcd ", absl::StrJoin(versions_, " and "),
                             ": an upgrade under way?"));
    }
    if (!trouble_ && answered_ > 0) {
      out_->Add(check_, Level::kOk,
                absl::StrCat(store_.members_size(), " members, every endpoint answers, leader ",
                             NameOf(leaders_.front())));
    }
  }

 private:
  static void AddOnce(std::vector<std::string>* seen, const std::string& value) {
    if (std::find(seen->begin(), seen->end(), value) == seen->end()) seen->push_back(value);
  }

  // A member's name by its id (the id when it has none, or is not listed).
  std::string NameOf(const std::string& id) const {
    for (const v1::StoreMember& member : store_.members()) {
      if (member.id() == id && !member.name().empty()) return member.name();
    }
    return id;
  }

  const v1::StoreProbe& store_;
  const std::string check_;
  Findings* const out_;
  std::vector<std::string> leaders_;   // the leaders members follow, each once
  std::vector<std::string> versions_;  // their etcd versions, each once
  std::vector<std::string> silent_;    // members and endpoints that did not answer
  int answered_ = 0;
  bool trouble_ = false;
};

// The members of each etcd cluster behind a rendezvous store, as the store's endpoints answer.
void CheckStoreClusters(const v1::ProbeStoresResponse& probes, Findings* out) {
  for (const v1::StoreProbe& store : probes.stores()) {
    ClusterTally tally(store, out);
    for (const v1::StoreMember& member : store.members()) tally.CheckStoreMember(member);
    tally.CheckStoreCluster();
  }
}

void CheckGpus(const v1::StatusResponse& status, Findings* out) {
  const v1::GpuStatus& gpus = status.gpus();
  if (gpus.devices_size() == 0) {
    out->Add("gpus", Level::kNote,
             gpus.unavailable_reason().empty() ? "none" : gpus.unavailable_reason());
    return;
  }
  if (!gpus.copies_unavailable().empty()) {
    out->Add("gpus", Level::kProblem,
             absl::StrCat(gpus.devices_size(),
                          " GPUs, but calls with CUDA tensors cannot be "
                          "served: ",
                          gpus.copies_unavailable()),
             "update the NVIDIA driver");
    return;
  }
  std::vector<std::string> missing;
  for (int i = 0; i < gpus.peer_access_size(); ++i) {
    for (int j = 0; j < gpus.peer_access(i).can_access_size(); ++j) {
      if (i != j && !gpus.peer_access(i).can_access(j)) {
        missing.push_back(absl::StrCat("cuda:", i, "->cuda:", j));
      }
    }
  }
  if (!missing.empty()) {
    out->Add("gpu peer access", Level::kWarning,
             absl::StrCat("no peer access for ", absl::StrJoin(missing, ", "),
                          ": copies between them go through host memory"),
             "check the topology (nvidia-smi topo -m) and that IOMMU/ACS allow P2P");
  }
  out->Add("gpus", Level::kOk,
           absl::StrCat(gpus.devices_size(), " GPUs, driver ", gpus.driver_version() / 1000, ".",
                        gpus.driver_version() % 1000 / 10,
                        missing.empty() ? ", peer access between all" : ""));
}

void CheckMetrics(const v1::StatusResponse& status, Findings* out) {
  const std::string& address = status.metrics_address();
  if (address.empty()) {
    out->Add("metrics", Level::kNote, "off",
             "[metrics] listen_address for Prometheus (docs/operations.md)");
  } else if (absl::StartsWith(address, "127.") || absl::StartsWith(address, "[::1]")) {
    out->Add("metrics", Level::kOk, absl::StrCat("http://", address, "/metrics (loopback)"));
  } else {
    out->Add("metrics", Level::kNote,
             absl::StrCat("http://", address, "/metrics, reachable from the network"),
             "let only the scraper reach the port (host firewall)");
  }
}

}  // namespace

const char* LevelName(Finding::Level level) {
  switch (level) {
    case Level::kOk:
      return "ok";
    case Level::kNote:
      return "note";
    case Level::kWarning:
      return "warning";
    case Level::kProblem:
      return "PROBLEM";
  }
  return "?";
}

std::vector<Finding> Diagnose(const v1::StatusResponse& status, const Probes& probes,
                              absl::Time now) {
  Findings out;
  CheckServing(status, &out);
  CheckLimits(status, &out);
  CheckAgent(status, &out);
  if (probes.peers != nullptr) CheckProbes(status, *probes.peers, &out);
  CheckPeersAndStores(status, now, &out);
  if (probes.stores != nullptr) CheckStoreClusters(*probes.stores, &out);
  CheckGpus(status, &out);
  CheckMetrics(status, &out);
  return out.Take();
}

}  // namespace tpd
