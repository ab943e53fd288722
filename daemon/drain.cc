#include "daemon/drain.h"

#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/logging.h"

namespace tpd {

NodeDrain::NodeDrain(Steps steps) : steps_(std::move(steps)) {}

NodeDrain::~NodeDrain() {
  if (thread_.joinable()) thread_.join();
}

void NodeDrain::Request(std::string requested_by, absl::Duration timeout,
                        std::function<void(const v1::DrainStatus&)> done) {
  v1::DrainStatus over;
  {
    absl::MutexLock lock(&mu_);
    if (!drained_) {
      waiting_.push_back(std::move(done));
      if (!started_) {
        started_ = true;
        requested_by_ = std::move(requested_by);
        started_at_ = absl::Now();
        thread_ = std::thread([this, timeout] { Run(timeout); });
      }
      return;
    }
    over = StatusLocked();
  }
  done(over);
}

v1::DrainStatus NodeDrain::RequestAndWait(std::string requested_by, absl::Duration timeout) {
  absl::Notification over;
  v1::DrainStatus result;
  Request(std::move(requested_by), timeout, [&](const v1::DrainStatus& status) {
    result = status;
    over.Notify();
  });
  over.WaitForNotification();
  return result;
}

void NodeDrain::Run(absl::Duration timeout) {
  std::string requested_by;
  {
    absl::MutexLock lock(&mu_);
    requested_by = requested_by_;
  }
  DaemonLog().info(
      "[drain] asked by {}: refusing new joins and calls; {} for the "
      "calls in flight",
      requested_by, absl::FormatDuration(timeout));
  const size_t cut_off = steps_.finish_calls(absl::Now() + timeout, requested_by);
  if (cut_off > 0) {
    DaemonLog().warn("[drain] {} calls still in flight after {}; they are answered UNAVAILABLE",
                     cut_off, absl::FormatDuration(timeout));
  }
  steps_.leave(requested_by);
  const Progress left = steps_.progress();
  std::vector<std::function<void(const v1::DrainStatus&)>> waiting;
  v1::DrainStatus status;
  {
    absl::MutexLock lock(&mu_);
    drained_ = true;
    drained_at_ = absl::Now();
    calls_cut_off_ = static_cast<int64_t>(cut_off);
    left_ = left;
    waiting = std::move(waiting_);
    status = StatusLocked();
  }
  DaemonLog().info(
      "[drain] drained in {}: {} members of this node still in groups, {} sessions "
      "open",
      absl::FormatDuration(absl::Milliseconds(status.drained_unix_ms() - status.started_unix_ms())),
      left.members, left.sessions_open);
  for (auto& done : waiting) done(status);
}

v1::DrainStatus NodeDrain::Status() {
  v1::DrainStatus status;
  {
    absl::MutexLock lock(&mu_);
    status = StatusLocked();
    if (drained_) return status;
  }
  const Progress now = steps_.progress();
  status.set_calls_in_flight(now.calls_in_flight);
  status.set_members(now.members);
  status.set_sessions_open(now.sessions_open);
  return status;
}

v1::DrainStatus NodeDrain::StatusLocked() {
  v1::DrainStatus status;
  status.set_state(!started_ ? "serving" : drained_ ? "drained" : "draining");
  status.set_requested_by(requested_by_);
  if (started_) status.set_started_unix_ms(absl::ToUnixMillis(started_at_));
  if (drained_) status.set_drained_unix_ms(absl::ToUnixMillis(drained_at_));
  status.set_calls_cut_off(calls_cut_off_);
  if (drained_) {
    status.set_calls_in_flight(left_.calls_in_flight);
    status.set_members(left_.members);
    status.set_sessions_open(left_.sessions_open);
  }
  return status;
}

}  // namespace tpd
