// tpctl: the operator's command line for a tpd daemon.
//
//   tpctl status | health
//   tpctl store set KEY VALUE | get KEY | add KEY DELTA | wait KEY... | check KEY...
//               | delete KEY | keys
//   tpctl status --by_uid
//   tpctl group list | show GROUP | watch GROUP | usage | join GROUP NAME [--hold]
//   tpctl drain [--timeout_ms N] [--exit]      (on the operator socket)
//   tpctl doctor                               (exit 1 on a problem)
//   tpctl top [--interval_ms N] [--frames N]
//
// Output is for people by default and JSON with --json. Exit status: 0 on success, 1 when
// the daemon answered an error (printed as "tpctl: CODE: message"), 2 on a usage error.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/doctor.h"
#include "client/socket_path.h"
#include "client/top.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/admin.grpc.pb.h"

ABSL_FLAG(std::string, socket, "", "daemon socket; default $TPD_SOCKET, then /run/tpd/tpd.sock");
ABSL_FLAG(bool, json, false, "print JSON instead of text");
ABSL_FLAG(int64_t, timeout_ms, 0, "wait timeout of get/wait; 0 = the daemon's default");
ABSL_FLAG(std::string, ns, "", "store namespace of store commands");
ABSL_FLAG(std::string, init_method, "", "group commands: tcp://host:port, env://, file:///path");
ABSL_FLAG(int64_t, rank, -1, "group join: rank (-1: assigned, dynamic groups)");
ABSL_FLAG(int64_t, world_size, -1, "group join: world size (-1: dynamic group)");
ABSL_FLAG(std::string, device_maps, "",
          "group join: WORKER:LOCAL=REMOTE,...;WORKER2:... e.g. 'w1:cuda:0=cuda:1'");
ABSL_FLAG(std::string, devices, "", "group join: comma-separated devices, e.g. cuda:0,cuda:1");
ABSL_FLAG(std::string, transports, "", "group join: comma-separated transports, by priority");
ABSL_FLAG(std::string, channels, "", "group join: comma-separated channels, by priority");
ABSL_FLAG(bool, exit, false, "drain: the daemon exits once drained");
ABSL_FLAG(int64_t, interval_ms, 2000, "top: time between frames");
ABSL_FLAG(int64_t, frames, 0, "top: stop after this many frames; 0: until interrupted");
ABSL_FLAG(bool, by_uid, false,
          "status: per local user, what it holds and sent against the limits that apply to it");
ABSL_FLAG(std::string, operator_socket, "",
          "drain: the daemon's operator socket; default: the socket's path + \".operator\"");
ABSL_FLAG(bool, hold, false,
          "group join: stay in the group until stdin closes or SIGTERM/SIGINT, then leave");

namespace {

constexpr char kUsage[] = R"(tpctl: talk to a tpd daemon.

  tpctl status                   daemon identity, config and statistics (--by_uid: per user)
  tpctl health                   SERVING or NOT_SERVING (exit 1 unless SERVING)
  tpctl store set KEY VALUE      set a key
  tpctl store get KEY            print a key's value, waiting up to --timeout_ms
  tpctl store add KEY DELTA      add to an integer key, print the sum
  tpctl store wait KEY...        wait until every key is set
  tpctl store check KEY...       print whether every key is set
  tpctl store delete KEY         delete a key
  tpctl store keys               print the number of keys

  tpctl group list               groups this daemon tracks
  tpctl group show GROUP         members, phase, negotiated options (--init_method if untracked)
  tpctl group watch GROUP        print every membership version as it happens
  tpctl group usage              calls, bytes and errors by group, members here
  tpctl group join GROUP NAME    join (--init_method, --rank, --world_size, --device_maps,
                                 --devices, --transports, --channels, --timeout_ms, --hold)

  tpctl drain                    take the node out of service: refuse new joins and calls,
                                 finish those in flight (--timeout_ms, default the daemon's
                                 shutdown grace), members leave their groups; --exit: then
                                 stop the daemon. Needs the operator socket (root, the
                                 daemon's user, [daemon] operator_group)

  tpctl top                      a live view: calls/s and p50/p99 per stage, bytes/s per peer,
                                 sessions, memory and calls/s per user (--interval_ms, --frames)
  tpctl doctor                   what stands in the way on this node, each finding with what
                                 to do (exit 1 on a problem)

Flags: --socket PATH, --json, --timeout_ms N, --ns NAMESPACE, --operator_socket PATH)";

int Usage(const std::string& problem) {
  std::cerr << "tpctl: " << problem << "\n\n" << kUsage << "\n";
  return 2;
}

int Error(const absl::Status& status) {
  std::cerr << "tpctl: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return 1;
}

// A JSON string literal.
std::string Json(absl::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

void Print(const std::string& text, const std::string& json) {
  std::cout << (absl::GetFlag(FLAGS_json) ? json : text) << "\n";
}

// One line per transport or channel: "    transport uv      0  registered (bootstraps ...)".
void PrintBackends(const char* kind,
                   const google::protobuf::RepeatedPtrField<tpd::v1::AgentBackend>& backends) {
  for (const tpd::v1::AgentBackend& backend : backends) {
    std::cout << "    " << kind << " "
              << absl::StrFormat("%-10s %5d  ", backend.name(), backend.priority())
              << (backend.registered() ? "registered" : "not registered");
    if (!backend.reason().empty()) {
      std::cout << (backend.registered() ? " (" : ": ") << backend.reason()
                << (backend.registered() ? ")" : "");
    }
    std::cout << "\n";
  }
}

// One line per stage: where calls' time went inside the daemon.
void PrintLatencies(const google::protobuf::RepeatedPtrField<tpd::v1::CallLatency>& stages) {
  if (stages.empty()) return;
  std::cout << "  call latency (us, since start):\n"
            << absl::StrFormat("    %-16s %10s %9s %9s %9s %9s %9s\n", "stage", "calls", "mean",
                               "p50", "p90", "p99", "max");
  for (const tpd::v1::CallLatency& stage : stages) {
    std::cout << absl::StrFormat("    %-16s %10d %9.1f %9.1f %9.1f %9.1f %9.1f\n", stage.stage(),
                                 stage.count(), stage.mean_us(), stage.p50_us(), stage.p90_us(),
                                 stage.p99_us(), stage.max_us());
  }
}

void PrintDrain(const tpd::v1::DrainStatus& drain) {
  if (drain.state().empty() || drain.state() == "serving") return;
  std::cout << "  drain:   " << drain.state() << " (asked by " << drain.requested_by() << ")";
  if (drain.state() == "drained") {
    std::cout << " in " << (drain.drained_unix_ms() - drain.started_unix_ms()) << " ms";
  }
  std::cout << "; " << drain.calls_in_flight() << " calls in flight, " << drain.members()
            << " members of this node in groups, " << drain.sessions_open() << " sessions open";
  if (drain.calls_cut_off() > 0) {
    std::cout << "; " << drain.calls_cut_off() << " calls cut off at the timeout";
  }
  std::cout << "\n";
}

void PrintCallErrors(const tpd::v1::StatusResponse& status) {
  if (status.call_errors().empty()) return;
  std::vector<std::string> errors;
  for (const auto& [code, count] :
       std::map<std::string, int64_t>(status.call_errors().begin(), status.call_errors().end())) {
    errors.push_back(absl::StrCat(code, "=", count));
  }
  std::cout << "  call errors answered by the daemon: " << absl::StrJoin(errors, " ") << "\n";
}

// The data plane: the agent, its registry, then one line per peer node (a second line with
// its last error, if any).
void PrintAgent(const tpd::v1::AgentStatus& agent) {
  std::cout << "  agent:   " << agent.id() << " at " << agent.address() << "; "
            << agent.peers_size() << " peers, " << agent.calls_pending() << " calls pending, "
            << agent.auth_failures() << " auth failures\n";
  PrintBackends("transport", agent.transports());
  PrintBackends("channel  ", agent.channels());
  for (const tpd::v1::AgentPeer& peer : agent.peers()) {
    std::cout << "    peer " << peer.node() << ": pipe " << peer.pipe_state() << ", "
              << peer.inbound_pipes() << " inbound; "
              << (peer.transport().empty() ? "-" : peer.transport()) << "/"
              << (peer.channel().empty() ? "-" : peer.channel()) << "; calls sent "
              << peer.calls_sent() << " received " << peer.calls_received() << " pending "
              << peer.calls_pending() << "; bytes sent " << peer.bytes_sent() << " received "
              << peer.bytes_received() << "; errors " << peer.errors() << "\n";
    if (peer.peer_transports_size() > 0 || peer.peer_channels_size() > 0) {
      std::cout << "      it offers transports " << absl::StrJoin(peer.peer_transports(), ", ")
                << "; channels " << absl::StrJoin(peer.peer_channels(), ", ") << "\n";
    }
    if (!peer.last_error().empty()) {
      std::cout << "      last error: " << peer.last_error() << "\n";
    }
  }
}

// The node's GPUs: a summary line, then one line per GPU with the devices it can access as
// peers; or "no GPUs: <reason>".
void PrintGpus(const tpd::v1::GpuStatus& gpus, int64_t group_device_count) {
  const std::string told = group_device_count == gpus.devices_size()
                               ? ""
                               : absl::StrCat(" (groups are told ", group_device_count,
                                              " CUDA devices: [group] cuda_device_count)");
  if (gpus.devices_size() == 0) {
    std::string why = gpus.unavailable_reason();
    if (why.empty()) {
      why = gpus.driver_loaded() ? "the NVIDIA driver reports no devices" : "not reported";
    }
    std::cout << "  gpus:    no GPUs: " << why << told << "\n";
    return;
  }
  const int64_t version = gpus.driver_version();
  std::cout << "  gpus:    " << gpus.devices_size() << " (NVIDIA driver for CUDA " << version / 1000
            << "." << (version % 1000) / 10 << ")" << told << "\n";
  for (const tpd::v1::GpuDevice& gpu : gpus.devices()) {
    std::vector<std::string> peers;
    if (gpu.index() >= 0 && gpu.index() < gpus.peer_access_size()) {
      const auto& row = gpus.peer_access(static_cast<int>(gpu.index())).can_access();
      for (int j = 0; j < row.size(); ++j) {
        if (j != gpu.index() && row[j]) peers.push_back(absl::StrCat("cuda:", j));
      }
    }
    std::cout << "    cuda:" << gpu.index() << " " << gpu.name() << ", "
              << gpu.total_memory_bytes() / (1024 * 1024) << " MiB, compute "
              << gpu.compute_capability_major() << "." << gpu.compute_capability_minor() << ", PCI "
              << gpu.pci_bus_id() << ", " << gpu.uuid()
              << "; peer access: " << (peers.empty() ? "none" : absl::StrJoin(peers, ", ")) << "\n";
  }
  if (!gpus.copies_unavailable().empty()) {
    std::cout << "    calls with CUDA tensors: unavailable: " << gpus.copies_unavailable() << "\n";
  }
  for (const tpd::v1::CudaCopyCount& route : gpus.copies()) {
    std::cout << "    copied " << route.route() << ": " << route.copies() << " copies, "
              << route.bytes() << " B";
    if (route.busy_us() > 0) {
      std::cout << " in " << route.busy_us() << " us ("
                << static_cast<double>(route.bytes()) / static_cast<double>(route.busy_us()) / 1e3
                << " GB/s)";
    }
    std::cout << "\n";
  }
}

// The daemon, its store and its groups' control calls.
void PrintSummary(const tpd::v1::StatusResponse& status) {
  const tpd::v1::StoreStats& store = status.store();
  std::cout << "tpd " << status.version() << " (pid " << status.pid() << ") "
            << status.serving_status() << "\n"
            << "  socket:  " << status.socket_path() << " (mode " << status.config().socket_mode()
            << ")\n"
            << "  uptime:  " << static_cast<int64_t>(status.uptime_seconds()) << "s"
            << "\n"
            << "  config:  "
            << (status.config().config_path().empty() ? "(defaults)"
                                                      : status.config().config_path())
            << ", log level " << status.config().log_level() << "\n"
            << "  metrics: "
            << (status.metrics_address().empty()
                    ? "off ([metrics] listen_address)"
                    : absl::StrCat("http://", status.metrics_address(), "/metrics"))
            << "\n"
            << "  operator socket: " << status.operator_socket() << "\n"
            << "  store:   " << store.num_keys() << " keys, " << store.bytes() << " bytes, "
            << store.waiters() << " waiting calls\n";
  for (const tpd::v1::StoreWriter& writer : store.writers()) {
    std::cout << "           " << writer.writer() << ": " << writer.keys() << " keys, "
              << writer.bytes() << " bytes, " << writer.waiters() << " waiting\n";
  }
  if (!store.calls().empty()) {
    std::vector<std::string> calls;
    for (const auto& [method, count] :
         std::map<std::string, int64_t>(store.calls().begin(), store.calls().end())) {
      calls.push_back(absl::StrCat(method, "=", count));
    }
    std::cout << "  calls:   " << absl::StrJoin(calls, " ") << "\n";
  }
  if (!store.errors().empty()) {
    std::vector<std::string> errors;
    for (const auto& [code, count] :
         std::map<std::string, int64_t>(store.errors().begin(), store.errors().end())) {
      errors.push_back(absl::StrCat(code, "=", count));
    }
    std::cout << "  errors:  " << absl::StrJoin(errors, " ") << "\n";
  }
  if (!status.control_calls().empty()) {
    std::vector<std::string> calls;
    for (const auto& [method, count] : std::map<std::string, int64_t>(
             status.control_calls().begin(), status.control_calls().end())) {
      calls.push_back(absl::StrCat(method, "=", count));
    }
    std::cout << "  groups:  " << status.groups_size() << " tracked; calls "
              << absl::StrJoin(calls, " ") << "\n";
  }
}

// The rendezvous stores the daemon's groups beat in.
void PrintRendezvousStores(const tpd::v1::StatusResponse& status) {
  const absl::Time now = absl::Now();
  for (const tpd::v1::RendezvousStoreInfo& store : status.rendezvous_stores()) {
    std::cout << "    store " << store.name() << ": liveness by " << store.liveness();
    if (store.liveness() == "lease" && store.lease_id().empty()) {
      std::cout << " (none held)";
    } else if (store.liveness() == "lease") {
      std::cout << " " << store.lease_id() << " TTL "
                << absl::FormatDuration(absl::Milliseconds(store.lease_ttl_ms()));
    }
    std::cout << ", last "
              << (store.last_beat_unix_ms() == 0
                      ? std::string("never")
                      : absl::StrCat(absl::FormatDuration(absl::Trunc(
                                         now - absl::FromUnixMillis(store.last_beat_unix_ms()),
                                         absl::Milliseconds(1))),
                                     " ago"));
    if (store.failed_beats() > 0) {
      std::cout << "; " << store.failed_beats() << " failed, last: " << store.last_error();
    }
    if (store.leases_lost() > 0) std::cout << "; " << store.leases_lost() << " leases lost";
    std::cout << "\n";
  }
}

// One session attached to the data plane.
void PrintSession(const tpd::v1::AttachedSession& session, const tpd::v1::ConfigSummary& config) {
  std::cout << "    session " << session.handle() << ": pid " << session.pid() << " uid "
            << session.uid() << " gid " << session.gid() << ": arena " << session.arena_bytes()
            << " B x 2, segment " << session.segment_bytes() << " B; " << session.calls_in_flight()
            << " calls in flight, rx heap " << session.rx_heap_used() << "/"
            << session.rx_heap_bytes() << " B used, " << session.reader_wakeups()
            << " wake-ups of its reader, " << session.daemon_sleeps()
            << " sleeps of its daemon thread";
  if (session.unposted_completions() > 0) {
    std::cout << ", " << session.unposted_completions() << " completions waiting for room";
  }
  if (session.bytes_shared() > 0) {
    std::cout << ", " << session.bytes_shared() << " B of tensors received uncopied";
  }
  std::cout << "\n";
  if (session.cuda_pools_size() > 0 || session.cuda_open_allocations() > 0) {
    std::vector<std::string> pools;
    for (const tpd::v1::CudaPoolStatus& pool : session.cuda_pools()) {
      pools.push_back(absl::StrCat(pool.device(), " ", pool.used(), "/", pool.bytes(), " B"));
    }
    std::cout << "      cuda: pools " << (pools.empty() ? "none" : absl::StrJoin(pools, ", "))
              << "; " << session.cuda_open_allocations() << " IPC mappings open in the "
              << "daemon\n";
  }
}

// The data plane: its socket, sessions and their use by uid.
void PrintDataPlane(const tpd::v1::StatusResponse& status) {
  if (status.data_socket().empty()) return;
  std::cout << "  data:    " << status.data_socket() << ", " << status.attached_session_count()
            << " sessions attached (max " << status.config().data_max_sessions() << ", "
            << status.config().data_sessions_kept_free() << " kept for other users, "
            << (status.config().data_max_shared_memory_bytes() >> 20) << " MiB of segments), "
            << status.open_session_count() << " sessions open (max "
            << status.config().data_max_open_sessions() << ")"
            << (status.config().data_share_memory()
                    ? "; large tensors shared between sessions of one uid and gid\n"
                    : "; every tensor copied (share_memory off)\n");
  for (const tpd::v1::UidUse& use : status.uid_use()) {
    std::cout << "    uid " << use.uid() << ": " << use.attached_sessions()
              << " sessions attached (max " << status.config().data_max_sessions_per_uid() << "), "
              << use.segment_bytes() << " B of segments, " << use.pending_connections()
              << " connections not attached yet\n";
  }
  for (const tpd::v1::AttachedSession& session : status.attached_sessions()) {
    PrintSession(session, status.config());
  }
}

// `message` as JSON with every field, zeros included (status and drain: a script reads them).
std::string FullJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

// "12 MiB" / "3 KiB" / "17 B".
std::string Bytes(uint64_t bytes) {
  if (bytes >= (uint64_t{10} << 30)) return absl::StrCat(bytes >> 30, " GiB");
  if (bytes >= (uint64_t{10} << 20)) return absl::StrCat(bytes >> 20, " MiB");
  if (bytes >= (uint64_t{10} << 10)) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

// "used/limit (P%)", the share of a limit in use.
std::string OfLimit(int64_t used, int64_t limit, bool bytes = false) {
  const std::string text =
      bytes ? absl::StrCat(Bytes(used), "/", Bytes(limit)) : absl::StrCat(used, "/", limit);
  if (limit <= 0) return text;
  return absl::StrCat(text, " (", used * 100 / limit, "%)");
}

// tpctl status --by_uid: each local user's sessions, memory, calls and store share against
// the limits that apply to it.
void PrintByUid(const tpd::v1::StatusResponse& status) {
  const tpd::v1::ConfigSummary& config = status.config();
  std::map<std::string, const tpd::v1::StoreWriter*> writers;
  for (const tpd::v1::StoreWriter& writer : status.store().writers()) {
    writers[writer.writer()] = &writer;
  }
  std::cout << "per local user (limits: " << config.data_max_sessions_per_uid()
            << " sessions, store " << Bytes(config.store_max_bytes_per_uid()) << " in "
            << config.store_max_keys_per_uid() << " keys with "
            << config.store_max_waiters_per_uid() << " waits, " << config.group_max_groups_per_uid()
            << " groups each):\n";
  for (const tpd::v1::UidUse& use : status.uid_use()) {
    std::cout << "  uid " << use.uid() << ": sessions "
              << OfLimit(use.attached_sessions(), config.data_max_sessions_per_uid())
              << ", shared memory "
              << OfLimit(use.segment_bytes(), config.data_max_shared_memory_bytes(), true) << ", "
              << use.calls_in_flight() << " calls in flight; since start " << use.calls()
              << " calls, " << Bytes(use.bytes_sent()) << " sent, " << use.call_errors()
              << " errors\n";
    auto writer = writers.find(absl::StrCat("uid ", use.uid()));
    if (writer != writers.end()) {
      std::cout << "    store: keys "
                << OfLimit(writer->second->keys(), config.store_max_keys_per_uid()) << ", bytes "
                << OfLimit(writer->second->bytes(), config.store_max_bytes_per_uid(), true)
                << ", waits "
                << OfLimit(writer->second->waiters(), config.store_max_waiters_per_uid()) << "\n";
    }
  }
}

int RunStatus(tpd::Client& client) {
  absl::StatusOr<tpd::v1::StatusResponse> status = client.Status();
  if (!status.ok()) return Error(status.status());
  if (absl::GetFlag(FLAGS_by_uid) && !absl::GetFlag(FLAGS_json)) {
    PrintByUid(*status);
    return 0;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << FullJson(*status);
    return 0;
  }
  PrintSummary(*status);
  PrintRendezvousStores(*status);
  PrintDataPlane(*status);
  PrintLatencies(status->call_latency());
  PrintCallErrors(*status);
  PrintDrain(status->drain());
  if (status->has_agent()) PrintAgent(status->agent());
  PrintGpus(status->gpus(), status->node().device_count());
  return 0;
}

int RunHealth(tpd::Client& client) {
  absl::StatusOr<bool> serving = client.Serving();
  if (!serving.ok()) return Error(serving.status());
  const char* word = *serving ? "SERVING" : "NOT_SERVING";
  Print(word, absl::StrCat("{\"status\": ", Json(word), "}"));
  return *serving ? 0 : 1;
}

int RunStore(tpd::Client& client, const std::vector<std::string>& args) {
  if (args.empty()) return Usage("store needs a command");
  const std::string& command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  const absl::Duration timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  auto want = [&](size_t n) { return rest.size() == n; };

  if (command == "set") {
    if (!want(2)) return Usage("usage: tpctl store set KEY VALUE");
    if (absl::Status s = client.Store().Set(rest[0], rest[1]); !s.ok()) return Error(s);
    Print("OK", "{\"ok\": true}");
  } else if (command == "get") {
    if (!want(1)) return Usage("usage: tpctl store get KEY");
    absl::StatusOr<std::string> value = client.Store().Get(rest[0], timeout);
    if (!value.ok()) return Error(value.status());
    Print(*value, absl::StrCat("{\"key\": ", Json(rest[0]), ", \"value\": ", Json(*value), "}"));
  } else if (command == "add") {
    int64_t delta = 0;
    if (!want(2) || !absl::SimpleAtoi(rest[1], &delta)) {
      return Usage("usage: tpctl store add KEY DELTA (DELTA an integer)");
    }
    absl::StatusOr<int64_t> sum = client.Store().Add(rest[0], delta);
    if (!sum.ok()) return Error(sum.status());
    Print(absl::StrCat(*sum),
          absl::StrCat("{\"key\": ", Json(rest[0]), ", \"value\": ", *sum, "}"));
  } else if (command == "wait") {
    if (rest.empty()) return Usage("usage: tpctl store wait KEY...");
    if (absl::Status s = client.Store().Wait(rest, timeout); !s.ok()) return Error(s);
    Print("OK", "{\"ok\": true}");
  } else if (command == "check") {
    if (rest.empty()) return Usage("usage: tpctl store check KEY...");
    absl::StatusOr<bool> ready = client.Store().Check(rest);
    if (!ready.ok()) return Error(ready.status());
    Print(*ready ? "true" : "false", absl::StrCat("{\"ready\": ", *ready ? "true" : "false", "}"));
  } else if (command == "delete") {
    if (!want(1)) return Usage("usage: tpctl store delete KEY");
    absl::StatusOr<bool> deleted = client.Store().DeleteKey(rest[0]);
    if (!deleted.ok()) return Error(deleted.status());
    Print(*deleted ? "deleted" : "absent",
          absl::StrCat("{\"deleted\": ", *deleted ? "true" : "false", "}"));
  } else if (command == "keys") {
    if (!want(0)) return Usage("usage: tpctl store keys");
    absl::StatusOr<int64_t> count = client.Store().NumKeys();
    if (!count.ok()) return Error(count.status());
    Print(absl::StrCat(*count), absl::StrCat("{\"num_keys\": ", *count, "}"));
  } else {
    return Usage(absl::StrCat("unknown store command \"", command, "\""));
  }
  return 0;
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

std::string MapsText(const google::protobuf::Map<std::string, tpd::v1::DeviceMap>& maps) {
  std::map<std::string, std::map<std::string, std::string>> sorted;
  for (const auto& [to, map] : maps) sorted[to].insert(map.devices().begin(), map.devices().end());
  std::vector<std::string> parts;
  for (const auto& [to, map] : sorted) {
    std::vector<std::string> pairs;
    for (const auto& [from, onto] : map) pairs.push_back(absl::StrCat(from, ": ", onto));
    parts.push_back(absl::StrCat(to, ": {", absl::StrJoin(pairs, ", "), "}"));
  }
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

void PrintGroup(const tpd::v1::GroupView& view) {
  std::cout << "group " << view.group() << " @ " << view.store() << "  version " << view.version()
            << "  " << view.phase();
  if (view.is_static()) std::cout << "  world_size " << view.world_size();
  std::cout << "\n";
  if (!view.reason().empty()) std::cout << "  reason: " << view.reason() << "\n";
  for (const tpd::v1::Member& member : view.members()) {
    std::cout << "  rank " << member.rank() << "  " << member.name() << "  node " << member.node()
              << "  incarnation " << absl::StrCat(absl::Hex(member.incarnation())) << "  since "
              << absl::FormatTime("%Y-%m-%dT%H:%M:%S", absl::FromUnixMillis(member.since_unix_ms()),
                                  absl::UTCTimeZone())
              << "\n";
  }
  for (const tpd::v1::NegotiatedMember& member : view.negotiated()) {
    std::cout << "  " << member.name() << ": devices [" << absl::StrJoin(member.devices(), ", ")
              << "] device_maps " << MapsText(member.device_maps()) << " reverse "
              << MapsText(member.reverse_device_maps()) << "\n";
  }
  if (!view.transports().empty()) {
    std::cout << "  transports [" << absl::StrJoin(view.transports(), ", ") << "] channels ["
              << absl::StrJoin(view.channels(), ", ") << "] threads " << view.num_worker_threads()
              << " rpc_timeout " << view.rpc_timeout_ms() << "ms\n";
  }
}

// Parses --device_maps "w1:cuda:0=cuda:1,cuda:1=cuda:0;w2:0=1". The same pair given twice is
// one pair (as torch's set_device_map takes it); a device mapped toward one worker to two
// different devices is refused, naming both, rather than keeping the last silently.
absl::Status ParseDeviceMaps(const std::string& text, tpd::v1::BackendOptions* options) {
  for (absl::string_view worker : absl::StrSplit(text, ';', absl::SkipEmpty())) {
    const size_t colon = worker.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", worker, "\" names no worker: expected WORKER:LOCAL=REMOTE,..."));
    }
    const std::string to(worker.substr(0, colon));
    tpd::v1::DeviceMap& map = (*options->mutable_device_maps())[to];
    for (absl::string_view pair :
         absl::StrSplit(worker.substr(colon + 1), ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
      if (kv.second.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("\"", pair, "\" toward ", to, ": expected LOCAL=REMOTE"));
      }
      auto [it, inserted] = map.mutable_devices()->insert({kv.first, kv.second});
      if (!inserted && it->second != kv.second) {
        return absl::InvalidArgumentError(absl::StrCat("device ", kv.first,
                                                       " is mapped twice toward ", to, " (to ",
                                                       it->second, " and to ", kv.second, ")"));
      }
    }
  }
  return absl::OkStatus();
}

int GroupList(tpd::Client& client) {
  absl::StatusOr<std::vector<tpd::v1::GroupView>> groups = client.ListGroups();
  if (!groups.ok()) return Error(groups.status());
  if (absl::GetFlag(FLAGS_json)) {
    tpd::v1::ListGroupsResponse response;
    response.mutable_groups()->Add(groups->begin(), groups->end());
    std::cout << ToJson(response);
    return 0;
  }
  for (const tpd::v1::GroupView& view : *groups) {
    std::cout << view.group() << "  " << view.phase() << "  version " << view.version() << "  "
              << view.members_size() << " members  " << view.store() << "\n";
  }
  return 0;
}

int GroupShow(tpd::Client& client, const std::string& group) {
  absl::StatusOr<tpd::v1::GroupView> view =
      client.GetGroup(group, absl::GetFlag(FLAGS_init_method));
  if (!view.ok()) return Error(view.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(*view);
  } else {
    PrintGroup(*view);
  }
  return 0;
}

int GroupWatch(tpd::Client& client, const std::string& group) {
  std::unique_ptr<tpd::GroupWatch> watch = client.Watch(group, absl::GetFlag(FLAGS_init_method));
  tpd::v1::GroupEvent event;
  while (watch->Next(&event)) {
    if (absl::GetFlag(FLAGS_json)) {
      std::string line;
      (void)google::protobuf::util::MessageToJsonString(event, &line);
      std::cout << line << std::endl;
    } else {
      std::cout << "version " << event.group().version() << " " << event.kind() << " "
                << event.group().phase() << " members " << event.group().members_size()
                << (event.detail().empty() ? "" : ": ") << event.detail() << std::endl;
    }
  }
  absl::Status status = watch->Finish();
  return status.ok() ? 0 : Error(status);
}

// `group join`'s options from the flags: INVALID_ARGUMENT for a bad --device_maps.
absl::StatusOr<tpd::JoinOptions> JoinOptionsFromFlags(const std::string& group,
                                                      const std::string& name) {
  tpd::JoinOptions options;
  options.group = group;
  options.name = name;
  options.init_method = absl::GetFlag(FLAGS_init_method);
  if (absl::GetFlag(FLAGS_rank) >= 0) options.rank = absl::GetFlag(FLAGS_rank);
  if (absl::GetFlag(FLAGS_world_size) >= 0) options.world_size = absl::GetFlag(FLAGS_world_size);
  options.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  if (absl::Status maps = ParseDeviceMaps(absl::GetFlag(FLAGS_device_maps), &options.options);
      !maps.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--device_maps: ", maps.message()));
  }
  for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_devices), ',', absl::SkipEmpty())) {
    options.options.add_devices(std::string(d));
  }
  for (absl::string_view t :
       absl::StrSplit(absl::GetFlag(FLAGS_transports), ',', absl::SkipEmpty())) {
    options.options.add_transports(std::string(t));
  }
  for (absl::string_view c :
       absl::StrSplit(absl::GetFlag(FLAGS_channels), ',', absl::SkipEmpty())) {
    options.options.add_channels(std::string(c));
  }
  return options;
}

// Stays a member until SIGTERM, SIGINT or the end of stdin; then leaves explicitly.
int HoldMembership(tpd::Client& client, const tpd::JoinOptions& options) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::thread stdin_closed([] {
    char buf[256];
    while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
    }
    kill(getpid(), SIGTERM);
  });
  stdin_closed.detach();
  int signal = 0;
  sigwait(&stop, &signal);
  absl::Status left = client.Leave(options.group, options.name);
  return left.ok() ? 0 : Error(left);
}

int GroupJoin(tpd::Client& client, const std::string& group, const std::string& name) {
  absl::StatusOr<tpd::JoinOptions> options = JoinOptionsFromFlags(group, name);
  if (!options.ok()) return Usage(std::string(options.status().message()));
  absl::StatusOr<tpd::v1::JoinResponse> joined = client.Join(*options);
  if (!joined.ok()) return Error(joined.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(*joined) << std::flush;
  } else {
    std::cout << "joined " << options->group << " as " << options->name << " rank "
              << joined->rank() << "\n";
    PrintGroup(joined->group());
    const tpd::v1::NegotiatedMember& own = joined->negotiated();
    std::cout << "  negotiated for " << own.name() << ": devices ["
              << absl::StrJoin(own.devices(), ", ") << "] device_maps "
              << MapsText(own.device_maps()) << " reverse " << MapsText(own.reverse_device_maps())
              << "\n";
    std::cout << std::flush;
  }
  return absl::GetFlag(FLAGS_hold) ? HoldMembership(client, *options) : 0;
}

// tpctl group usage: calls through this daemon by group, busiest first.
int GroupUsage(tpd::Client& client) {
  absl::StatusOr<tpd::v1::StatusResponse> status = client.Status();
  if (!status.ok()) return Error(status.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::vector<std::string> items;
    for (const tpd::v1::GroupUsage& group : status->group_usage()) {
      std::string json;
      (void)google::protobuf::util::MessageToJsonString(group, &json);
      items.push_back(json);
    }
    std::cout << "[" << absl::StrJoin(items, ",\n ") << "]\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-32s %-9s %7s %10s %10s %7s\n", "group", "phase", "members",
                               "calls", "sent", "errors");
  for (const tpd::v1::GroupUsage& group : status->group_usage()) {
    std::cout << absl::StrFormat("%-32s %-9s %7d %10d %10s %7d\n", group.group(),
                                 group.phase().empty() ? "-" : group.phase(), group.members_here(),
                                 group.calls(), Bytes(group.bytes_sent()), group.call_errors());
  }
  return 0;
}

int RunGroup(tpd::Client& client, const std::vector<std::string>& args) {
  if (args.empty()) return Usage("group needs a command");
  const std::string& command = args[0];
  if (command == "list") return GroupList(client);
  if (command == "usage")
    return args.size() == 1 ? GroupUsage(client) : Usage("usage takes no arguments");
  if (command == "show") {
    if (args.size() != 2) return Usage("usage: tpctl group show GROUP [--init_method URL]");
    return GroupShow(client, args[1]);
  }
  if (command == "watch") {
    if (args.size() != 2) return Usage("usage: tpctl group watch GROUP [--init_method URL]");
    return GroupWatch(client, args[1]);
  }
  if (command == "join") {
    if (args.size() != 3) return Usage("usage: tpctl group join GROUP NAME --init_method URL");
    return GroupJoin(client, args[1], args[2]);
  }
  return Usage(absl::StrCat("unknown group command \"", command, "\""));
}
}  // namespace

// tpctl top: a frame per interval, the screen cleared before each when stdout is a terminal.
int RunTop(tpd::Client& client) {
  const absl::Duration interval =
      absl::Milliseconds(std::max<int64_t>(100, absl::GetFlag(FLAGS_interval_ms)));
  const int64_t frames = absl::GetFlag(FLAGS_frames);
  const bool terminal = isatty(STDOUT_FILENO) != 0;
  std::optional<tpd::v1::StatusResponse> before;
  absl::Time before_at;
  for (int64_t frame = 0; frames == 0 || frame < frames; ++frame) {
    if (frame > 0) absl::SleepFor(interval);
    absl::StatusOr<tpd::v1::StatusResponse> now = client.Status();
    if (!now.ok()) return Error(now.status());
    const absl::Time at = absl::Now();
    if (terminal) std::cout << "\033[H\033[2J";
    std::cout << tpd::RenderTop(before ? &*before : nullptr, *now, at - before_at);
    if (!terminal) std::cout << "\n";
    std::cout.flush();
    before = *std::move(now);
    before_at = at;
  }
  return 0;
}

// tpctl doctor: the findings, one line each (with the fix on the next), or JSON.
int RunDoctor(tpd::Client& client) {
  absl::StatusOr<tpd::v1::StatusResponse> status = client.Status();
  if (!status.ok()) return Error(status.status());
  // Round trips and clocks of the peers, pinged by the daemon over its agent.
  const absl::StatusOr<tpd::v1::ProbePeersResponse> peers = client.ProbePeers();
  // The members of the etcd clusters behind its rendezvous stores, asked by the daemon.
  const absl::StatusOr<tpd::v1::ProbeStoresResponse> stores = client.ProbeStores();
  tpd::Probes probes;
  if (peers.ok()) probes.peers = &*peers;
  if (stores.ok()) probes.stores = &*stores;
  const std::vector<tpd::Finding> findings = tpd::Diagnose(*status, probes, absl::Now());
  int problems = 0;
  int warnings = 0;
  for (const tpd::Finding& finding : findings) {
    problems += finding.level == tpd::Finding::Level::kProblem;
    warnings += finding.level == tpd::Finding::Level::kWarning;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::vector<std::string> items;
    for (const tpd::Finding& finding : findings) {
      items.push_back(absl::StrCat(
          "{\"check\": ", Json(finding.check), ", \"level\": ", Json(tpd::LevelName(finding.level)),
          ", \"detail\": ", Json(finding.detail), ", \"fix\": ", Json(finding.fix), "}"));
    }
    std::cout << "{\"node\": " << Json(status->node().name()) << ", \"problems\": " << problems
              << ", \"warnings\": " << warnings << ", \"findings\": [\n  "
              << absl::StrJoin(items, ",\n  ") << "\n]}\n";
  } else {
    std::cout << "tpd " << status->version() << " on node " << status->node().name() << " ("
              << status->socket_path() << ")\n";
    for (const tpd::Finding& finding : findings) {
      std::cout << absl::StrFormat("  %-8s %-22s %s\n", tpd::LevelName(finding.level),
                                   finding.check, finding.detail);
      if (!finding.fix.empty() && finding.level != tpd::Finding::Level::kOk) {
        std::cout << absl::StrFormat("  %-8s %-22s fix: %s\n", "", "", finding.fix);
      }
    }
    std::cout << problems << " problems, " << warnings << " warnings\n";
  }
  return problems > 0 ? 1 : 0;
}

// tpctl drain: Admin.Drain on the operator socket, waiting for the end.
int RunDrain(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("drain takes no arguments");
  std::string socket = absl::GetFlag(FLAGS_operator_socket);
  if (socket.empty()) {
    const std::string main_socket = absl::GetFlag(FLAGS_socket);
    socket = absl::StrCat(main_socket.empty() ? tpd::DefaultClientSocketPath() : main_socket,
                          ".operator");
  }
  if (access(socket.c_str(), F_OK) != 0) {
    return Error(
        absl::NotFoundError(absl::StrCat("no operator socket at ", socket,
                                         " (is tpd running there? --operator_socket names "
                                         "another; [daemon] operator_socket sets the daemon's)")));
  }
  if (access(socket.c_str(), R_OK | W_OK) != 0) {
    return Error(absl::PermissionDeniedError(absl::StrCat(
        "this user may not open the operator socket ", socket,
        ": draining a node is for root, the daemon's user and [daemon] operator_group")));
  }
  tpd::v1::DrainRequest request;
  request.set_timeout_ms(absl::GetFlag(FLAGS_timeout_ms));
  request.set_exit(absl::GetFlag(FLAGS_exit));
  std::unique_ptr<tpd::v1::Admin::Stub> admin = tpd::v1::Admin::NewStub(
      grpc::CreateChannel(absl::StrCat("unix:", socket), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  // The daemon bounds the drain by the timeout (at most an hour); leaving its members and
  // ending its sessions come on top.
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(2));
  tpd::v1::DrainResponse response;
  const grpc::Status status = admin->Drain(&context, request, &response);
  if (!status.ok()) {
    return Error(
        absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message()));
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << FullJson(response.drain());
    return 0;
  }
  PrintDrain(response.drain());
  if (request.exit()) std::cout << "  the daemon is stopping\n";
  return 0;
}

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  if (args.empty()) return Usage("missing command");
  const std::string& command = args[0];
  if (command != "status" && command != "health" && command != "store" && command != "group" &&
      command != "drain" && command != "doctor" && command != "top") {
    return Usage(absl::StrCat("unknown command \"", command, "\""));
  }
  // A drain opens no session on the node it takes out of service.
  if (command == "drain") return RunDrain(args);

  tpd::ClientOptions options;
  options.name_space = absl::GetFlag(FLAGS_ns);
  absl::StatusOr<std::unique_ptr<tpd::Client>> client =
      tpd::Client::Connect(absl::GetFlag(FLAGS_socket), options);
  if (!client.ok()) return Error(client.status());

  if (command == "status")
    return args.size() == 1 ? RunStatus(**client) : Usage("status takes no arguments");
  if (command == "doctor")
    return args.size() == 1 ? RunDoctor(**client) : Usage("doctor takes no arguments");
  if (command == "top")
    return args.size() == 1 ? RunTop(**client) : Usage("top takes no arguments");
  if (command == "health")
    return args.size() == 1 ? RunHealth(**client) : Usage("health takes no arguments");
  if (command == "group") return RunGroup(**client, {args.begin() + 1, args.end()});
  return RunStore(**client, {args.begin() + 1, args.end()});
}
