// Closed-loop throughput of concurrent clients, shared by the store benchmarks (B5): tpd's
// store_bench (Bazel) and tcpstore_bench (c10d's TCPStore, built with torch's headers on the
// GPU machine), so both sides of a ratio are measured the same way. Standard C++ only.
//
// Thread safety: Measure runs `op` on `clients` threads at once; `op(i)` must be safe to call
// concurrently for different i.

#ifndef TPD_BENCH_CLOSED_LOOP_H_
#define TPD_BENCH_CLOSED_LOOP_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

namespace tpd::bench {

struct LoopRow {
  double ops_per_second = 0;
  double p50_us = 0;
  double p99_us = 0;
};

// Runs `op(client_index)` in a closed loop on `clients` threads for a warm-up of 0.3 s and
// then `seconds`; throughput and latency percentiles over the measured window. `op` returns
// false on a failed call (counted, reported on stderr).
inline LoopRow MeasureClosedLoop(int clients, double seconds, const std::function<bool(int)>& op) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now() + std::chrono::milliseconds(50);
  const Clock::time_point measure_from = start + std::chrono::milliseconds(300);
  const Clock::time_point stop = measure_from + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(seconds));
  std::atomic<int> failed{0};
  std::vector<std::vector<double>> latencies(clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      std::this_thread::sleep_until(start);
      while (true) {
        const Clock::time_point t0 = Clock::now();
        if (t0 >= stop) break;
        if (!op(i)) ++failed;
        if (t0 >= measure_from) {
          latencies[i].push_back(
              std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  if (failed > 0) std::fprintf(stderr, "warning: %d calls failed\n", failed.load());
  std::vector<double> all;
  for (auto& per_client : latencies) all.insert(all.end(), per_client.begin(), per_client.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    return all.empty() ? 0.0 : all[static_cast<size_t>(p * (all.size() - 1))];
  };
  return {all.size() / seconds, pct(0.50), pct(0.99)};
}

}  // namespace tpd::bench

#endif  // TPD_BENCH_CLOSED_LOOP_H_
