// Store throughput over the unix socket, next to a raw gRPC unary round trip (the daemon's
// own grpc.health.v1 Check) measured in the same run, from 1, 8 and 64 concurrent clients.
//
//   bazel run -c opt //bench:store_bench -- [--seconds=2]
//
// Every client is its own process-like actor: its own channel (own connection) and thread,
// calling in a closed loop. Rows print ops/s, p50/p99 latency and the ratio of store ops/s
// to the baseline's ops/s at the same concurrency (1.00 = as fast as an empty gRPC call).

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"

ABSL_FLAG(double, seconds, 2.0, "measured seconds per row (after a 0.3 s warm-up)");

namespace {

struct Row {
  double ops_per_second;
  double p50_us;
  double p99_us;
};

// Runs `op(client_index)` in a closed loop on `clients` threads; returns throughput and
// latency percentiles over the measured window.
Row Measure(int clients, const std::function<bool(int)>& op) {
  const absl::Duration warmup = absl::Milliseconds(300);
  const absl::Duration window = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::atomic<bool> failed{false};
  std::vector<std::vector<double>> latencies(clients);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now() + absl::Milliseconds(50);
  const absl::Time measure_from = start + warmup;
  const absl::Time stop = measure_from + window;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      absl::SleepFor(start - absl::Now());
      while (true) {
        const absl::Time t0 = absl::Now();
        if (t0 >= stop) break;
        if (!op(i)) failed = true;
        if (t0 >= measure_from)
          latencies[i].push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  if (failed) std::fprintf(stderr, "warning: some calls failed\n");
  std::vector<double> all;
  for (auto& per_client : latencies) all.insert(all.end(), per_client.begin(), per_client.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    return all.empty() ? 0.0 : all[static_cast<size_t>(p * (all.size() - 1))];
  };
  return {all.size() / absl::ToDoubleSeconds(window), pct(0.50), pct(0.99)};
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  char dir_pattern[] = "/tmp/tpd-bench-XXXXXX";
  tpd::Config config;
  config.socket_path = absl::StrCat(mkdtemp(dir_pattern), "/tpd.sock");
  absl::StatusOr<std::unique_ptr<tpd::Daemon>> daemon = tpd::Daemon::Start(config);
  if (!daemon.ok()) {
    std::fprintf(stderr, "cannot start daemon: %s\n", daemon.status().ToString().c_str());
    return 1;
  }

  std::printf("%-8s %7s %12s %9s %9s %8s\n", "op", "clients", "ops/s", "p50_us", "p99_us",
              "vs_grpc");
  for (int clients : {1, 8, 64}) {
    std::vector<std::unique_ptr<tpd::Client>> store_clients;
    std::vector<std::unique_ptr<grpc::health::v1::Health::Stub>> health;
    for (int i = 0; i < clients; ++i) {
      store_clients.push_back(*tpd::Client::Connect(config.socket_path));
      grpc::ChannelArguments args;
      args.SetInt("grpc.use_local_subchannel_pool", 1);  // a connection of its own
      health.push_back(grpc::health::v1::Health::NewStub(grpc::CreateCustomChannel(
          absl::StrCat("unix:", config.socket_path), grpc::InsecureChannelCredentials(), args)));
    }
    const Row baseline = Measure(clients, [&](int i) {
      grpc::ClientContext context;
      grpc::health::v1::HealthCheckResponse response;
      return health[i]->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok();
    });
    auto print = [&](const char* op, const Row& row) {
      std::printf("%-8s %7d %12.0f %9.1f %9.1f %8.2f\n", op, clients, row.ops_per_second,
                  row.p50_us, row.p99_us, row.ops_per_second / baseline.ops_per_second);
    };
    print("grpc", baseline);
    print("set", Measure(clients, [&](int i) {
            return store_clients[i]->Set(absl::StrCat("key", i), "value-of-16-byte").ok();
          }));
    print("get", Measure(clients, [&](int i) {
            return store_clients[i]->Get(absl::StrCat("key", i)).ok();
          }));
    print("add", Measure(clients, [&](int i) { return store_clients[i]->Add("counter", 1).ok(); }));
  }
  (*daemon)->Shutdown();
  return 0;
}
