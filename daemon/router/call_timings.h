// Where a call's time goes inside this daemon, as latency histograms by stage (Admin.Status
// `call_latency`, `tpctl status`). Each stage runs between two of the points the router sees a
// call pass: read off a session's submission ring, posted to a session's completion ring, given
// to the agent, and the agent's announcement of a message from another node. What lies
// between posting to a client and reading its answer is the client's own time (its reader
// thread, its handler, its submission), measured from outside.
//
// Thread safety: thread-safe, lock-free (LatencyHistogram).

#ifndef TPD_DAEMON_ROUTER_CALL_TIMINGS_H_
#define TPD_DAEMON_ROUTER_CALL_TIMINGS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/latency_histogram.h"

namespace tpd::router {

enum class CallStage : size_t {
  // A call between two sessions of this daemon.
  kLocalDeliver,  // the call read off the caller's ring → posted to the callee
  kLocalCallee,   // posted to the callee → its reply read off the callee's ring
  kLocalReply,    // the reply read → posted to the caller
  kLocalTotal,    // the call read → its reply posted to the caller
  // A call of a session here to a worker on another node.
  kRemoteSend,   // the call read off the caller's ring → given to the agent
  kRemoteWait,   // given to the agent → the reply received (the pipe and the other daemon)
  kRemotePost,   // the reply received → posted to the caller
  kRemoteTotal,  // the call read → its reply posted to the caller
  // A request from another node to a session here.
  kInboundDeliver,  // received → posted to the callee
  kInboundCallee,   // posted → the callee's reply read off its ring
  kInboundRespond,  // the reply read → given to the agent
  kCount,
};

// The stage's name in Admin.Status: "local.deliver", "remote.wait", ...
const char* StageName(CallStage stage);

// Nanoseconds of the monotonic clock, the one every stage is measured with.
int64_t MonotonicNanos();

class CallTimings {
 public:
  struct Stage {
    CallStage stage;
    LatencyHistogram::Snapshot latency;
  };

  // Counts one pass through `stage` from `start_ns` to `end_ns` (MonotonicNanos).
  void Record(CallStage stage, int64_t start_ns, int64_t end_ns);
  // Every stage that some call passed through, in enum order.
  std::vector<Stage> Read() const;

 private:
  std::array<LatencyHistogram, static_cast<size_t>(CallStage::kCount)> stages_;
};

}  // namespace tpd::router

#endif  // TPD_DAEMON_ROUTER_CALL_TIMINGS_H_
