// The agent behind agent/agent.h: the TensorPipe context, the listener (agent/listener.h), the
// pipes (agent/pipe.h), every call from Send until its `done` ran, and the timer thread that
// fails late calls, closes late handshakes and stalled chunks, and listens again.
//
// Thread safety: thread-safe, as Agent; PipeOwner::mu_ guards the tables below (see
// docs/threading.md, "The agent").

#ifndef TPD_AGENT_AGENT_IMPL_H_
#define TPD_AGENT_AGENT_IMPL_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/listener.h"
#include "agent/pipe.h"
#include "agent/registry.h"
#include "agent/types.h"
#include "base/deadline_queue.h"
#include "base/log_limiter.h"

namespace tpd::agent {

class AgentImpl final : public PipeOwner {
 public:
  // Agent::Create and the methods of Agent, which forward here.
  static absl::StatusOr<std::unique_ptr<AgentImpl>> Create(const AgentOptions& options);
  ~AgentImpl();

  void SetHandler(Handler handler) ABSL_LOCKS_EXCLUDED(mu_);
  void Send(const PeerId& peer, Message msg, absl::Time deadline, Callback done,
            Allocator reply_allocator) ABSL_LOCKS_EXCLUDED(mu_);
  void Respond(const ReplyTo& to, Message response, SentCallback sent) ABSL_LOCKS_EXCLUDED(mu_);
  void FailPeer(const PeerId& peer, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  AgentStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& address() const { return listener_->address(); }
  const std::vector<std::string>& urls() const { return listener_->urls(); }
  const std::string& id() const { return config_.options.id; }
  const Registry& registry() const { return *registry_; }

  // PipeOwner.
  uint64_t NextId() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_id_++; }
  bool closing() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_; }
  std::shared_ptr<const Handler> handler() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return handler_;
  }
  PeerCounters& Counters(const std::string& node) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return counters_[node];
  }
  void CountAuthFailure() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++auth_failures_; }
  // Wakes the timer only if it sleeps past this deadline: most calls' deadlines come after
  // the one it waits for, and a wake-up per call costs a context switch per call.
  void AddDeadline(uint64_t id, absl::Time deadline) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveDeadline(uint64_t id) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    deadlines_.Remove(id);
  }
  void AddChunkTimer(uint64_t timer_id, std::weak_ptr<Pipe> pipe, uint64_t call_id,
                     absl::Time deadline) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveChunkTimer(uint64_t timer_id) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<Allocator> ReplyAllocator(uint64_t call_id, const Pipe& pipe) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(const Pipe& pipe, const PeerId& peer, const std::vector<uint64_t>& pending,
              const absl::Status& status, std::vector<std::function<void()>>* run) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogAuthFailure(const std::string& claimed, const std::string& why) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void CompleteCall(uint64_t call_id, absl::StatusOr<Message> outcome) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Respond(const ReplyTo& to, Message response) override ABSL_LOCKS_EXCLUDED(mu_) {
    Respond(to, std::move(response), nullptr);
  }
  void WriteCall(const std::shared_ptr<Pipe>& pipe, uint64_t call_id) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Whether a call's request is still read by TensorPipe (its buffers are not free while
  // kWriting).
  enum class CallWrite { kNotStarted, kWriting, kWritten };
  // One call from Send until its `done` is taken.
  struct Call {
    uint64_t id = 0;
    PeerId peer;
    std::string method;
    absl::Time start;
    absl::Time deadline = absl::InfiniteFuture();
    Message msg;
    uint64_t bytes = 0;
    Callback done;
    Allocator reply_allocator;
    std::shared_ptr<Pipe> pipe;
    CallWrite write = CallWrite::kNotStarted;
    std::optional<absl::StatusOr<Message>> outcome;
  };
  // One message to write on a pipe, and its chunks; its bytes count toward `node` once written.
  struct Outgoing {
    tensorpipe::Message message;
    std::optional<std::string> reply_node;  // a response's; nullopt for a request
    uint64_t call_id = 0;
    std::shared_ptr<const void> keepalive;
    std::string node;
    uint64_t bytes = 0;
    size_t chunk_count = 0;
    Message chunked;  // a message with chunks: its header, tensors and when_chunk_ready
  };
  // What one pass of the timer found due, handled after mu_.
  struct Due {
    std::vector<std::function<void()>> run;
    std::vector<std::pair<std::shared_ptr<Pipe>, absl::Status>> late_handshakes;
    std::vector<std::pair<std::shared_ptr<Pipe>, std::string>> stalled;
  };
  // Connections the transport refused before TensorPipe saw them (agent/auth_tcp.h): counted
  // in AgentStats::auth_failures, logged at most once per 10 s. Shared with the transport's
  // thread, which reports them.
  struct TransportRefusals {
    void Refused(const std::string& why);
    std::string id;
    std::atomic<int64_t> count{0};
    LogLimiter log{absl::Seconds(10)};
  };

  AgentImpl(const AgentOptions& options, std::unique_ptr<Registry> registry,
            std::unique_ptr<Listener> listener);

  absl::Status Start();
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void TakeDue(uint64_t id, absl::Time now, Due& due) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireCall(Call& call, Due& due) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RelistenAt(absl::Time when) ABSL_LOCKS_EXCLUDED(mu_);
  void OnAccepted(std::shared_ptr<tensorpipe::Pipe> accepted) ABSL_LOCKS_EXCLUDED(mu_);
  // Registers a new pipe to `peer` (no TensorPipe call: that is Connect's, outside mu_);
  // null with *error set when the peer's address does not fit this agent.
  std::shared_ptr<Pipe> NewOutbound(const PeerId& peer, absl::Status* error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `out` on `pipe`; `then` runs once with the outcome of its writes.
  void Write(const std::shared_ptr<Pipe>& pipe, Outgoing out,
             absl::AnyInvocable<void(absl::Status)> then) ABSL_LOCKS_EXCLUDED(mu_);
  void OnCallWritten(uint64_t call_id, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives `call` its outcome: the pipe stops waiting for its reply and its deadline goes.
  // REQUIRES: it has none yet.
  void Settle(Call& call, absl::StatusOr<Message> outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Collects the done callback of `call` if it may run now.
  void TakeDoneIfFinished(Call& call, std::vector<std::function<void()>>* run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountCallError(const PeerId& peer, absl::string_view error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<Registry> registry_;
  const std::unique_ptr<Listener> listener_;
  // The options, the registry and this agent's hello, for every pipe; self.urls set by Start.
  PipeConfig config_;
  std::shared_ptr<tensorpipe::Context> context_;

  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // Replaced whole by SetHandler; a message in flight keeps the one it started with.
  std::shared_ptr<const Handler> handler_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Our pipe to each peer (the newest; failed ones are removed).
  absl::flat_hash_map<PeerId, std::shared_ptr<Pipe>> outbound_ ABSL_GUARDED_BY(mu_);
  // Every live pipe by serial, both directions (handshaking ones included).
  absl::flat_hash_map<uint64_t, std::shared_ptr<Pipe>> pipes_ ABSL_GUARDED_BY(mu_);
  // Calls from Send until `done` is taken.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  // Deadlines of calls, handshakes and chunk timeouts (ids share one counter, next_id_).
  DeadlineQueue deadlines_ ABSL_GUARDED_BY(mu_);
  // Chunk timeouts: the pipe and the call id of the message waiting for chunks.
  absl::flat_hash_map<uint64_t, std::pair<std::weak_ptr<Pipe>, uint64_t>> chunk_timers_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, PeerCounters> counters_ ABSL_GUARDED_BY(mu_);
  uint64_t auth_failures_ ABSL_GUARDED_BY(mu_) = 0;
  bool timer_stop_ ABSL_GUARDED_BY(mu_) = false;
  // Wakes the timer thread: a deadline earlier than the one it sleeps until, or stop.
  absl::CondVar timer_cv_;
  // What the timer thread sleeps until; InfinitePast() while it is awake.
  absl::Time timer_wake_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // When the timer thread should listen again (InfiniteFuture(): no need).
  absl::Time relisten_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();

  // Rate limit of handshake-failure lines, per claimed peer.
  LogLimiter auth_log_{absl::Seconds(10), 1024};
  std::shared_ptr<TransportRefusals> transport_refusals_;

  std::thread timer_;
};

}  // namespace tpd::agent

#endif  // TPD_AGENT_AGENT_IMPL_H_
