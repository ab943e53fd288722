// Runs the groups of one rendezvous store on one thread. A group's work (recording this
// daemon's joins and leaves, following versions, heartbeat and deadline checks) is a series
// of steps, each of which may call the store; the groups of one store share its speed anyway,
// so they share a thread, and a daemon following a thousand groups in one store runs one
// thread for them, not a thousand. A slow store only slows its own groups.
//
// Thread safety: thread-safe. Steps run on the worker's thread, one at a time; Wake may be
// called from any thread, also with the waking task's own lock held (the worker never calls a
// task while holding its own lock).

#ifndef TPD_DAEMON_GROUP_GROUP_WORKER_H_
#define TPD_DAEMON_GROUP_GROUP_WORKER_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/group/clock.h"

namespace tpd::group {

// Something the worker runs: Step() does what is due and returns when it is next due
// (absl::InfinitePast() or any past time: at once; absl::InfiniteFuture(): when woken).
class WorkerTask {
 public:
  virtual ~WorkerTask() = default;
  virtual absl::Time Step() = 0;
};

class GroupWorker {
 public:
  // `name` names the thread's store in logs. Due times are on `clock` (which must outlive
  // the worker). RESOURCE_EXHAUSTED when no thread can start.
  static absl::StatusOr<std::unique_ptr<GroupWorker>> Start(std::string name,
                                                            Clock* clock = Clock::Real());
  // Stops the thread. REQUIRES: every task was removed.
  ~GroupWorker();

  // Runs `task` from now on, first at once. It must stay alive until Remove returns.
  void Add(WorkerTask* task);
  // After this returns, `task` is not running and never runs again. Must not be called from
  // a step (it would wait for itself).
  void Remove(WorkerTask* task);
  // Runs `task` as soon as the worker is free. A no-op for a task not added (or removed).
  void Wake(WorkerTask* task);

 private:
  GroupWorker(std::string name, Clock* clock) : name_(std::move(name)), clock_(clock) {}
  void Loop();

  const std::string name_;
  Clock* const clock_;
  absl::Mutex mu_;
  // Each task's next due time.
  std::map<WorkerTask*, absl::Time> due_ ABSL_GUARDED_BY(mu_);
  WorkerTask* running_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tpd::group

#endif  // TPD_DAEMON_GROUP_GROUP_WORKER_H_
