// The state behind a CallFuture (one call's result) and a Responder (one incoming call not
// yet answered), shared by the engine and the handles users hold; and the spin rule of the
// client's waits.
//
// Internal to the client library.
//
// Thread safety: thread-safe (each struct says what guards what).

#ifndef TPD_CLIENT_CALL_STATE_H_
#define TPD_CLIENT_CALL_STATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/calls.h"
#include "client/segment/link.h"
#include "shm/doorbell.h"

namespace tpd::calls_internal {

class Engine;  // the engine a pending reply answers through (client/engine.h)

// How long the client's threads spin before they sleep: the reader on the completion ring,
// an idle engine thread waiting for work, a caller waiting for its result. The doorbell's
// adaptive rule (pause 1 µs, then yield; a window of four times the typical wait; 2 µs once
// waits keep running longer than max_spin, so an idle client sleeps at once), with a max_spin
// of 100 µs rather than the doorbell's 50: where every hop of a call sleeps, a round trip on a
// 16-core VM takes 35-40 µs, and a 50 µs cap sat so close to that that tails kept collapsing
// the window, so the hops never spun and the round trip stayed there (docs/BENCHMARKS.md, B2).
inline constexpr shm::SpinOptions kClientSpin{absl::Microseconds(2), absl::Microseconds(100),
                                              absl::Microseconds(1)};

// Spins on done() for `window_ns` from `start_ns` (GetCurrentTimeNanos), pausing for the
// first `pause_ns`: shm::SpinUntil's rule. Returns done() at the last look.
bool Spin(absl::FunctionRef<bool()> done, int64_t start_ns, int64_t window_ns, int64_t pause_ns);

struct CallState {
  absl::Mutex mu;
  absl::CondVar cv;
  bool done ABSL_GUARDED_BY(mu) = false;
  // `done`, readable without the lock: a waiting caller spins on it before it sleeps on cv.
  std::atomic<bool> ready{false};
  // For Cancel: the engine's half of the segment (gone with the engine) and the call's id on
  // this client's ring; 0 for a future that was never sent.
  std::weak_ptr<Link> link;
  uint64_t call_id = 0;
  // It sends CUDA bytes the daemon copies between devices: its wait is learnt apart, since it
  // runs as long as the copy.
  bool copies = false;
  bool cancel_sent ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<Message> result ABSL_GUARDED_BY(mu) = absl::UnknownError("no result yet");
  std::vector<CallCallback> callbacks ABSL_GUARDED_BY(mu);

  // REQUIRES: done (the result never changes after that).
  const absl::StatusOr<Message>& Result() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return result; }
};

struct PendingReply {
  PendingReply(std::weak_ptr<Engine> engine, uint64_t call_id, std::string worker,
               std::string method)
      : engine(std::move(engine)),
        call_id(call_id),
        worker(std::move(worker)),
        method(std::move(method)) {}
  // The last Responder went without an answer: the caller hears so now, not at its deadline.
  ~PendingReply();

  const std::weak_ptr<Engine> engine;
  const uint64_t call_id;
  const std::string worker;
  const std::string method;
  std::atomic<bool> answered{false};
};

}  // namespace tpd::calls_internal

#endif  // TPD_CLIENT_CALL_STATE_H_
