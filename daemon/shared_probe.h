// An answer that takes round trips to find (the peers pinged, the etcd members asked) and that
// any user of the socket may ask for: one probe runs at a time, at most one a second, and every
// asker meanwhile gets the answer of the probe running or, within a second of the last, that
// one's. So no local user can make the daemon flood its peers or its etcd cluster.
//
// Thread safety: thread-safe. `done` callbacks run on the thread that finished the probe (or on
// the asker's, for a cached answer), with no lock held.

#ifndef TPD_DAEMON_SHARED_PROBE_H_
#define TPD_DAEMON_SHARED_PROBE_H_

#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tpd {

template <typename Answer>
class SharedProbe {
 public:
  using Done = std::function<void(const Answer&)>;
  // Begins one probe; it calls `finish` once with the answer, from any thread.
  using Start = std::function<void(std::function<void(Answer)> finish)>;

  explicit SharedProbe(Start start) : start_(std::move(start)) {}

  void Ask(Done done) {
    std::optional<Answer> cached;
    {
      absl::MutexLock lock(&mu_);
      if (!running_ && absl::Now() - last_ < absl::Seconds(1)) {
        cached = last_answer_;
      } else {
        waiting_.push_back(std::move(done));
        if (running_) return;
        running_ = true;
      }
    }
    if (cached.has_value()) {
      done(*cached);
      return;
    }
    start_([this](Answer answer) { Finish(std::move(answer)); });
  }

 private:
  void Finish(Answer answer) {
    std::vector<Done> waiting;
    {
      absl::MutexLock lock(&mu_);
      last_ = absl::Now();
      last_answer_ = answer;
      running_ = false;
      waiting.swap(waiting_);
    }
    for (const Done& done : waiting) done(answer);
  }

  const Start start_;
  absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Answer last_answer_ ABSL_GUARDED_BY(mu_);
  std::vector<Done> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpd

#endif  // TPD_DAEMON_SHARED_PROBE_H_
