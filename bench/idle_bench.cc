// Idle cost: CPU used by a daemon and its clients when nothing is called (issue 7's target:
// 64 idle clients ≈ 0% CPU). An in-process daemon, then 64 clients that attach to shared
// memory, join a group and register a handler, then sit idle. CPU is read per thread from
// /proc/self/task, grouped by thread name, over --seconds, first with no client (the
// baseline: gRPC's and the daemon's own threads), then with the 64.
//
//   bazel run -c opt //bench:idle_bench -- --clients=64 --seconds=10

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/daemon.h"

ABSL_FLAG(int, clients, 64, "idle clients");
ABSL_FLAG(int, seconds, 10, "seconds measured in each phase");

namespace {

// CPU seconds used so far per thread name ("tpd-session", "tpd-calls", "grpc_global_tim"...).
std::map<std::string, double> CpuByThreadName() {
  std::map<std::string, double> out;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return out;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream stat(absl::StrCat("/proc/self/task/", entry->d_name, "/stat"));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t open = text.find('(');
    const size_t close = text.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    const std::string name = text.substr(open + 1, close - open - 1);
    std::istringstream rest(text.substr(close + 2));
    std::string field;
    std::vector<std::string> fields;
    while (rest >> field) fields.push_back(field);
    if (fields.size() < 13) continue;
    // After the name: state(0) ... utime(11) stime(12), in clock ticks.
    out[name] += (std::stod(fields[11]) + std::stod(fields[12])) / tick;
  }
  closedir(dir);
  return out;
}

// Percent of one core used per thread name over `seconds`, and in total.
void Measure(const char* phase, int seconds) {
  const std::map<std::string, double> before = CpuByThreadName();
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Seconds(seconds));
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  const std::map<std::string, double> after = CpuByThreadName();
  double total = 0;
  std::printf("%s: CPU over %.1f s, %% of one core\n", phase, wall);
  for (const auto& [name, cpu] : after) {
    auto it = before.find(name);
    const double used = cpu - (it == before.end() ? 0 : it->second);
    total += used;
    if (used > 0) std::printf("  %-18s %6.2f%%\n", name.c_str(), 100 * used / wall);
  }
  std::printf("  %-18s %6.2f%%\n", "total", 100 * total / wall);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  char dir_template[] = "/tmp/tpd-idle-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  tpd::Config config;
  config.socket_path = absl::StrCat(dir, "/tpd.sock");
  config.log_level = "warn";
  config.peer.listen_address = "127.0.0.1:0";
  config.peer.token = "bench";
  config.peer.node_name = "idle-bench";
  config.group.cuda_device_count = 0;
  config.data.arena_bytes = 1 << 20;
  // All clients are this process's (one uid): past the default per-uid cap (32) the rest
  // would be refused.
  config.data.max_sessions_per_uid =
      std::max<int64_t>(config.data.max_sessions_per_uid, absl::GetFlag(FLAGS_clients));
  absl::StatusOr<std::unique_ptr<tpd::Daemon>> daemon = tpd::Daemon::Start(config);
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s\n", daemon.status().ToString().c_str());
    return 1;
  }
  absl::SleepFor(absl::Seconds(1));
  Measure("baseline (daemon, no client)", absl::GetFlag(FLAGS_seconds));

  std::vector<std::unique_ptr<tpd::Client>> clients;
  const std::string init_method = absl::StrCat("tcp://", (*daemon)->peer_address());
  for (int i = 0; i < absl::GetFlag(FLAGS_clients); ++i) {
    absl::StatusOr<std::unique_ptr<tpd::Client>> client = tpd::Client::Connect(config.socket_path);
    if (!client.ok()) {
      std::fprintf(stderr, "client %d: %s\n", i, client.status().ToString().c_str());
      return 1;
    }
    tpd::JoinOptions join;
    join.group = "idle";
    join.name = absl::StrCat("w", i);
    join.init_method = init_method;
    absl::Status status = (*client)->Join(join).status();
    if (status.ok()) {
      status = (*client)->Handle(
          "noop", [](const tpd::Message& m) -> absl::StatusOr<tpd::Message> { return m; });
    }
    if (!status.ok()) {
      std::fprintf(stderr, "client %d: %s\n", i, status.ToString().c_str());
      return 1;
    }
    clients.push_back(*std::move(client));
  }
  absl::SleepFor(absl::Seconds(2));  // joins settle, adaptive spins wind down
  Measure(absl::StrCat(clients.size(), " idle clients attached").c_str(),
          absl::GetFlag(FLAGS_seconds));
  clients.clear();
  (*daemon)->Shutdown();
  return 0;
}
