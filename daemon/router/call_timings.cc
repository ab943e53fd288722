#include "daemon/router/call_timings.h"

#include <chrono>

namespace tpd::router {

const char* StageName(CallStage stage) {
  switch (stage) {
    case CallStage::kLocalDeliver:
      return "local.deliver";
    case CallStage::kLocalCallee:
      return "local.callee";
    case CallStage::kLocalReply:
      return "local.reply";
    case CallStage::kLocalTotal:
      return "local.total";
    case CallStage::kRemoteSend:
      return "remote.send";
    case CallStage::kRemoteWait:
      return "remote.wait";
    case CallStage::kRemotePost:
      return "remote.post";
    case CallStage::kRemoteTotal:
      return "remote.total";
    case CallStage::kInboundDeliver:
      return "inbound.deliver";
    case CallStage::kInboundCallee:
      return "inbound.callee";
    case CallStage::kInboundRespond:
      return "inbound.respond";
    case CallStage::kCount:
      break;
  }
  return "unknown";
}

int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void CallTimings::Record(CallStage stage, int64_t start_ns, int64_t end_ns) {
  stages_[static_cast<size_t>(stage)].Record(end_ns - start_ns);
}

std::vector<CallTimings::Stage> CallTimings::Read() const {
  std::vector<Stage> out;
  for (size_t i = 0; i < stages_.size(); ++i) {
    LatencyHistogram::Snapshot latency = stages_[i].Read();
    if (latency.count != 0) out.push_back({static_cast<CallStage>(i), latency});
  }
  return out;
}

}  // namespace tpd::router
