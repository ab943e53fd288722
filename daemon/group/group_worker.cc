#include "daemon/group/group_worker.h"

#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tpd::group {

absl::StatusOr<std::unique_ptr<GroupWorker>> GroupWorker::Start(std::string name, Clock* clock) {
  std::unique_ptr<GroupWorker> worker(new GroupWorker(std::move(name), clock));
  try {
    worker->thread_ = std::thread([raw = worker.get()] { raw->Loop(); });
  } catch (const std::system_error& error) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot start a worker for the groups of ",
                                                     worker->name_, ": ", error.what()));
  }
  return worker;
}

GroupWorker::~GroupWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void GroupWorker::Add(WorkerTask* task) {
  absl::MutexLock lock(&mu_);
  due_[task] = absl::InfinitePast();
}

void GroupWorker::Remove(WorkerTask* task) {
  absl::MutexLock lock(&mu_);
  due_.erase(task);
  auto idle = [this, task]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ != task; };
  mu_.Await(absl::Condition(&idle));
}

void GroupWorker::Wake(WorkerTask* task) {
  absl::MutexLock lock(&mu_);
  auto it = due_.find(task);
  if (it != due_.end()) it->second = absl::InfinitePast();
}

void GroupWorker::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    // The earliest due task; ties in map order, which is fair enough for a handful of groups
    // that are all due at once (each step is short and returns its next time).
    WorkerTask* next = nullptr;
    absl::Time when = absl::InfiniteFuture();
    for (const auto& [task, due] : due_) {
      if (due < when) {
        when = due;
        next = task;
      }
    }
    if (stop_) return;
    const absl::Time now = clock_->Now();
    if (next == nullptr || when > now) {
      // Sleep until it is due, or until Add/Wake/stop changes the picture.
      auto changed = [this, next, when]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stop_) return true;
        for (const auto& [task, due] : due_) {
          if (due < when || (task == next && due != when)) return true;
        }
        return next != nullptr && due_.count(next) == 0;
      };
      // The wait is real time; a clock moved by hand (tests) wakes tasks with Wake.
      mu_.AwaitWithTimeout(absl::Condition(&changed), when - now);
      continue;
    }
    running_ = next;
    due_[next] = absl::InfiniteFuture();  // a Wake during the step makes it due again
    mu_.Unlock();
    const absl::Time again = next->Step();
    mu_.Lock();
    running_ = nullptr;
    auto it = due_.find(next);
    if (it != due_.end()) it->second = std::min(it->second, again);
  }
}

}  // namespace tpd::group
