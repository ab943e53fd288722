// Server-streaming with gRPC's callback API, safely fed from other threads.
//
// gRPC allows one write in flight per stream and deletes nothing for us; producers (group
// trackers, shutdown) outlive any single stream. So producers hold a shared StreamSink,
// which queues messages and forwards them to the reactor while it lives; when the stream
// ends the reactor detaches itself from the sink, and later sends are dropped.
//
// Thread safety: StreamSink is thread-safe; the reactor is driven by gRPC.

#ifndef TPD_DAEMON_STREAM_REACTOR_H_
#define TPD_DAEMON_STREAM_REACTOR_H_

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_callback.h"

namespace tpd {

template <typename T>
class StreamReactor;

template <typename T>
class StreamSink {
 public:
  // Queues `message` for the client; dropped when the stream has ended. A client that
  // falls kMaxQueued messages behind is cut off with RESOURCE_EXHAUSTED rather than let the
  // daemon's memory grow (a new watch starts again from a snapshot).
  void Send(T message) {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || closing_) return;
    if (queue_.size() >= kMaxQueued) {
      queue_.clear();
      closing_ = true;
      close_status_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                   "the client fell 1024 messages behind this stream; open it "
                                   "again");
      PumpLocked();
      return;
    }
    queue_.push_back(std::move(message));
    PumpLocked();
  }

  static constexpr size_t kMaxQueued = 1024;

  // Ends the stream with `status` after the queued messages.
  void Close(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || closing_) return;
    closing_ = true;
    close_status_ = std::move(status);
    PumpLocked();
  }

 private:
  friend class StreamReactor<T>;

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (!queue_.empty()) {
      writing_ = true;
      current_ = std::move(queue_.front());
      queue_.pop_front();
      reactor_->StartWrite(&current_);
    } else if (closing_) {
      finished_ = true;
      reactor_->Finish(*close_status_);
    }
  }

  void OnWriteDone(bool ok) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    // A failed write means the client is gone: drop the rest, but still Finish if closing.
    if (!ok) queue_.clear();
    PumpLocked();
  }

  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

  absl::Mutex mu_;
  StreamReactor<T>* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  T current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> close_status_ ABSL_GUARDED_BY(mu_);
};

// Deletes itself when gRPC is done with the stream. `on_cancel` runs when the client goes
// away (or the call is cancelled); `on_done` runs last, after the sink is detached.
template <typename T>
class StreamReactor final : public grpc::ServerWriteReactor<T> {
 public:
  StreamReactor(std::shared_ptr<StreamSink<T>> sink, std::function<void()> on_cancel,
                std::function<void()> on_done)
      : sink_(std::move(sink)), on_cancel_(std::move(on_cancel)), on_done_(std::move(on_done)) {
    absl::MutexLock lock(&sink_->mu_);
    sink_->reactor_ = this;
  }

  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }

  void OnCancel() override {
    if (on_cancel_) on_cancel_();
    sink_->Close(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    sink_->Detach();
    if (on_done_) on_done_();
    delete this;
  }

 private:
  std::shared_ptr<StreamSink<T>> sink_;
  std::function<void()> on_cancel_;
  std::function<void()> on_done_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_STREAM_REACTOR_H_
