// Taking a node out of service, once (docs/operations.md "Drain"): Admin.Drain (`tpctl
// drain`) and SIGTERM both come here, so a drain asked for twice, or a SIGTERM during one,
// waits for the same drain instead of starting another. The steps are the daemon's
// (daemon.cc); this class runs them on a thread of its own, answers everyone waiting, and
// says how far it got.
//
// Thread safety: thread-safe. The steps run on the drain's thread, one after the other.

#ifndef TPD_DAEMON_DRAIN_H_
#define TPD_DAEMON_DRAIN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/admin.pb.h"

namespace tpd {

class NodeDrain {
 public:
  struct Progress {
    int64_t calls_in_flight = 0;
    int64_t members = 0;  // of this node, in groups
    int64_t sessions_open = 0;
  };
  struct Steps {
    // Stops admitting joins and calls (their errors name the drain, or the stop when
    // `requested_by` is "SIGTERM"), then waits for the calls in flight until `deadline`;
    // returns how many were still in flight.
    std::function<size_t(absl::Time deadline, const std::string& requested_by)> finish_calls;
    // The node's members leave their groups (peers see them LEFT) and the sessions' streams
    // end.
    std::function<void(const std::string& requested_by)> leave;
    // What is left now.
    std::function<Progress()> progress;
  };

  explicit NodeDrain(Steps steps);
  // Waits for a drain under way.
  ~NodeDrain();

  // Starts the drain unless one has started (`requested_by` names who asked: "Admin.Drain",
  // "SIGTERM"; `timeout` bounds the calls in flight) and calls `done` once it is over: on
  // the drain's thread, or at once when it is over already.
  void Request(std::string requested_by, absl::Duration timeout,
               std::function<void(const v1::DrainStatus&)> done);
  // The same, waiting for the end here.
  v1::DrainStatus RequestAndWait(std::string requested_by, absl::Duration timeout);

  // Where it stands, for Admin.Status.
  v1::DrainStatus Status();

 private:
  void Run(absl::Duration timeout);
  v1::DrainStatus StatusLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Steps steps_;
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool drained_ ABSL_GUARDED_BY(mu_) = false;
  std::string requested_by_ ABSL_GUARDED_BY(mu_);
  absl::Time started_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time drained_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t calls_cut_off_ ABSL_GUARDED_BY(mu_) = 0;
  Progress left_ ABSL_GUARDED_BY(mu_);  // once drained
  std::vector<std::function<void(const v1::DrainStatus&)>> waiting_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // started once, under mu_; joined by the destructor
};

}  // namespace tpd

#endif  // TPD_DAEMON_DRAIN_H_
