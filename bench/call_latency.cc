#include "bench/call_latency.h"

#include <cstdio>

#include "absl/strings/match.h"

namespace tpd::bench {

void PrintCallLatency(const std::string& title, const v1::StatusResponse& status,
                      const std::string& prefix) {
  std::printf("%s: the daemon's call_latency stages (us)\n", title.c_str());
  std::printf("  %-16s %9s %8s %8s %8s %8s\n", "stage", "calls", "mean", "p50", "p99", "max");
  for (const v1::CallLatency& stage : status.call_latency()) {
    if (!absl::StartsWith(stage.stage(), prefix)) continue;
    std::printf("  %-16s %9llu %8.1f %8.1f %8.1f %8.1f\n", stage.stage().c_str(),
                static_cast<unsigned long long>(stage.count()), stage.mean_us(), stage.p50_us(),
                stage.p99_us(), stage.max_us());
  }
}

}  // namespace tpd::bench
