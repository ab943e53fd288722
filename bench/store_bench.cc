// B5: store throughput from 1, 8 and 64 concurrent clients, over gRPC on the unix socket and
// through shared memory (the session's rings: clients attached to it), beside a raw gRPC
// unary round trip (the daemon's own grpc.health.v1 Check) measured in the same run. Its
// baseline, c10d's TCPStore, is bench/tcpstore_bench.cc (built with torch's headers on the GPU
// machine), measured the same way (bench/closed_loop.h) in the same call.
//
//   bazel run -c opt //bench:store_bench -- [--seconds=2]
//
// Every client is its own process-like actor: its own channel (own connection), its own
// session for the shared-memory rows, and its own thread, calling in a closed loop. Ops: set,
// get, add, wait (on a key that exists). Rows print ops/s, p50/p99 latency and the ratio of
// ops/s to the gRPC baseline's at the same concurrency (1.00 = as fast as an empty gRPC call).

#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/closed_loop.h"
#include "bench/health_check.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/daemon.h"

ABSL_FLAG(double, seconds, 2.0, "measured seconds per row (after a 0.3 s warm-up)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  char dir_pattern[] = "/tmp/tpd-bench-XXXXXX";
  tpd::Config config;
  config.socket_path = absl::StrCat(mkdtemp(dir_pattern), "/tpd.sock");
  // 64 attached clients of this one user, each with small heaps: store calls are small.
  config.data.max_sessions_per_uid = 128;
  config.data.arena_bytes = 1 << 20;
  absl::StatusOr<std::unique_ptr<tpd::Daemon>> daemon = tpd::Daemon::Start(config);
  if (!daemon.ok()) {
    std::fprintf(stderr, "cannot start daemon: %s\n", daemon.status().ToString().c_str());
    return 1;
  }

  std::printf("%-8s %7s %12s %9s %9s %8s\n", "op", "clients", "ops/s", "p50_us", "p99_us",
              "vs_grpc");
  const double seconds = absl::GetFlag(FLAGS_seconds);
  for (int clients : {1, 8, 64}) {
    std::vector<std::unique_ptr<tpd::Client>> grpc_clients;
    std::vector<std::unique_ptr<tpd::Client>> shm_clients;
    std::vector<std::unique_ptr<grpc::health::v1::Health::Stub>> health;
    for (int i = 0; i < clients; ++i) {
      grpc_clients.push_back(*tpd::Client::Connect(config.socket_path));
      shm_clients.push_back(*tpd::Client::Connect(config.socket_path));
      if (!shm_clients.back()->AttachSharedMemory().ok()) {
        std::fprintf(stderr, "cannot attach client %d\n", i);
        return 1;
      }
      health.push_back(tpd::bench::OwnHealthStub(config.socket_path));
    }
    const tpd::bench::LoopRow baseline = tpd::bench::MeasureClosedLoop(
        clients, seconds, [&](int i) { return tpd::bench::CheckHealth(*health[i]); });
    auto print = [&](const std::string& op, const tpd::bench::LoopRow& row) {
      std::printf("%-8s %7d %12.0f %9.1f %9.1f %8.2f\n", op.c_str(), clients, row.ops_per_second,
                  row.p50_us, row.p99_us, row.ops_per_second / baseline.ops_per_second);
      std::fflush(stdout);
    };
    print("grpc", baseline);
    for (const auto& [suffix, users] :
         {std::pair<const char*, std::vector<std::unique_ptr<tpd::Client>>*>{"", &grpc_clients},
          {"_shm", &shm_clients}}) {
      std::vector<std::unique_ptr<tpd::Client>>& c = *users;
      const std::string tag = suffix;
      print("set" + tag, tpd::bench::MeasureClosedLoop(clients, seconds, [&](int i) {
              return c[i]->Store().Set(absl::StrCat("key", i), "value-of-16-byte").ok();
            }));
      print("get" + tag, tpd::bench::MeasureClosedLoop(clients, seconds, [&](int i) {
              return c[i]->Store().Get(absl::StrCat("key", i)).ok();
            }));
      print("add" + tag, tpd::bench::MeasureClosedLoop(clients, seconds, [&](int i) {
              return c[i]->Store().Add("counter", 1).ok();
            }));
      print("wait" + tag, tpd::bench::MeasureClosedLoop(clients, seconds, [&](int i) {
              return c[i]->Store().Wait({absl::StrCat("key", i)}).ok();
            }));
    }
  }
  (*daemon)->Shutdown();
  return 0;
}
