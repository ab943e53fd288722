// Calls between workers, from the sessions' shared memory (docs/data_plane.md): each attached
// session's submission ring is consumed here and each call goes where its target worker is.
//
//   Target on this daemon   one copy, from the caller's tx heap into the callee's rx heap.
//   Target on another node  no copy here: the agent's pipe to that node reads the payload and
//                           tensors in place in the caller's tx heap (the block is released
//                           when TensorPipe is done with it), and the reply is received
//                           straight into the caller's rx heap. A request from another node
//                           is received straight into the callee's rx heap, and the callee's
//                           reply written to the pipe from its tx heap.
//
// Replies are matched to calls by id, exactly once: the reply, the deadline (one timer
// thread), a cancel, the callee's session ending, or the callee's node being lost
// (FailNode), whichever comes first, answers the caller; anything later is dropped. An answer
// is never lost on the way: one that finds its caller's completion ring full waits, in order
// with the session's releases and calls, until the client makes room, and one that finds its rx
// heap full goes as an error reply without a message (the client reads RESOURCE_EXHAUSTED). A
// session whose client leaves more than `max_unposted` answers and releases unread is ended;
// a call finding `max_waiting_calls` already waiting for room is refused RESOURCE_EXHAUSTED.
//
// Sessions are named by their handle (daemon/router/session_handle.h) in every log line and error:
// their ids are credentials.
//
// Every descriptor is copied out of the ring and validated (ValidateDescriptor,
// ReadTensorTable, ParseMessage) before use, and everything a peer daemon sends is validated
// (tensor_wire.h). A bad call is answered INVALID_ARGUMENT; a descriptor with no call id to
// answer, or a broken ring, ends the session (`end_session`).
//
// Thread safety: thread-safe. One thread per attached session ("tpd-session", at most
// data.max_sessions) reads its submission ring with bounded waits; one timer thread
// ("tpd-call-timer") answers calls past their deadline; the agent's callbacks run on
// TensorPipe's threads. No thread waits for ring space: what finds a completion ring full
// waits in the session's queue, which its own thread flushes. A session's completion ring and rx
// heap
// allocator are guarded by that session's mutex; no two session mutexes are held at once, and
// no router lock is held while calling into the agent.

#ifndef TPD_DAEMON_ROUTER_CALL_ROUTER_H_
#define TPD_DAEMON_ROUTER_CALL_ROUTER_H_

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "base/log_limiter.h"
#include "daemon/router/call_timings.h"
#include "daemon/router/cuda_copies.h"
#include "daemon/router/cuda_staging.h"
#include "daemon/router/delivery.h"
#include "daemon/router/options.h"
#include "daemon/router/pending_calls.h"
#include "daemon/router/remote.h"
#include "daemon/router/session.h"
#include "daemon/router/submitted.h"
#include "proto/control.pb.h"
#include "shm/descriptor.h"
#include "shm/heap.h"
#include "shm/message.h"
#include "shm/ring.h"
#include "shm/segment.h"

namespace tpd {

// What Admin.Status shows per session.
struct SessionCallStats {
  std::string session_id;
  int64_t unposted = 0;         // answers, releases and calls waiting for room on its
                                // completion ring
  int64_t calls_in_flight = 0;  // its calls awaiting replies
  uint64_t rx_heap_bytes = 0;
  uint64_t rx_heap_used = 0;    // the daemon's blocks in its rx heap not yet released (may
                                // lag while the session's lock is held)
  SessionCudaStats cuda;        // its receive pools and the IPC mappings the daemon holds
  uint64_t reader_wakeups = 0;  // posts that woke its client's reader
  uint64_t daemon_sleeps = 0;   // its thread slept waiting for submissions
  uint64_t bytes_shared = 0;    // host tensor bytes it received in other sessions' memory
};

class CallRouter {
 public:
  explicit CallRouter(CallRouterOptions options);
  ~CallRouter();

  // The router keeps `segment` mapped while anything (TensorPipe included) still uses it.
  // `uid` and `gid` are the user the session's data connection came from: CUDA tensors and
  // receive pools it names are refused unless that user could open the GPUs itself
  // (daemon/router/gpu_access.h), and only sessions of one uid and gid share memory. With
  // share_memory, the router keeps a dup of `connection` (the data connection) for peer
  // notices, and a read-only fd of the segment (so `segment` must still have its fd).
  // RESOURCE_EXHAUSTED when the session's thread cannot be started (the daemon keeps serving).
  absl::Status Attach(const std::string& session_id, uid_t uid, gid_t gid, int connection,
                      std::shared_ptr<shm::Segment> segment);
  // Stops the session's thread; calls it was serving are answered UNAVAILABLE.
  void Detach(const std::string& session_id);
  // The agent's handler for requests from other daemons. Install after construction.
  agent::Handler AgentHandler();
  // Answers every call waiting on a worker of `node` UNAVAILABLE with `why` (the heartbeat
  // lost that node), and fails the agent's calls to it.
  void FailNode(const std::string& node, const std::string& why);
  std::vector<SessionCallStats> Stats();
  // What sessions sent since the daemon started, ended sessions included: by uid, and by
  // group (the calls' groups; past kMaxGroupsKept groups of ended sessions, the oldest fold
  // into "(other groups)").
  struct UsageTotals {
    std::map<int64_t, router::Usage> by_uid;
    std::map<std::string, router::Usage> by_group;
  };
  UsageTotals Usage();
  static constexpr size_t kMaxGroupsKept = 4096;
  // Where calls' time went inside this daemon, by stage, since it started.
  std::vector<router::CallTimings::Stage> Latencies() const { return timings_.Read(); }
  // Calls of this node's sessions that the daemon answered with an error (no such worker,
  // deadline, a peer lost, a bad descriptor, ...), by code name ("DEADLINE_EXCEEDED"), since
  // start; codes never seen are left out. A handler's own exception is a reply, not counted.
  std::map<std::string, uint64_t> CallErrors() const;
  // Graceful stop (FAULTS D3) or a drain: from now on new calls, local or from other
  // daemons, are refused UNAVAILABLE naming this node and `why` ("is stopping", "is
  // draining (tpctl drain)"); waits until the calls already in flight through this daemon
  // are answered, or `deadline`. Returns how many are left. The first reason stays.
  size_t Drain(absl::Time deadline, std::string why = "is stopping");
  // Calls through this daemon awaiting their replies now, local and to other daemons.
  size_t CallsInFlight();
  // Stops every thread and answers what is pending; the agent must stop calling in first.
  void Shutdown();

 private:
  using Session = router::Session;
  using Pending = router::PendingCall;

  void Serve(std::shared_ptr<Session> session);
  // `read_ns`: when `d` was read off the session's ring (router::MonotonicNanos).
  void Handle(const std::shared_ptr<Session>& session, const shm::Descriptor& d, int64_t read_ns);
  void HandleCall(const std::shared_ptr<Session>& session, const shm::Descriptor& d,
                  int64_t read_ns);
  void HandleReply(const std::shared_ptr<Session>& session, const shm::Descriptor& d,
                   int64_t read_ns);
  void HandleCancel(const std::shared_ptr<Session>& session, const shm::Descriptor& d);
  // A Store call through the rings (Op::kStore), answered by options_.store.
  void HandleStore(const std::shared_ptr<Session>& session, const shm::Descriptor& d);
  // A client's release of a block of its rx heap or of a receive pool.
  void HandleRelease(const std::shared_ptr<Session>& session, const shm::Descriptor& d);
  // A receive pool lent by the client (kDevicePool), answered by a reply.
  void HandleDevicePool(const std::shared_ptr<Session>& session, const shm::Descriptor& d);
  // Where the tensors of a message of worker `from` to worker `to` of `group` land, by from's
  // device map toward `to` (its reverse map for a reply). Empty when all stay in host memory.
  absl::StatusOr<std::vector<router::Place>> PlaceTensors(
      const router::MapUse& use, bool reply, const std::vector<shm::TensorEntry>& tensors);
  std::shared_ptr<Session> Find(const std::string& id);
  // Posts an error reply to `to` for its call `call_id`.
  void Fail(const std::shared_ptr<Session>& to, uint64_t call_id, const absl::Status& status);
  // Logs a warning about what `session`'s client did, at most once per 10 s per session.
  void Warn(const Session& session, absl::string_view what, const absl::Status& status);
  // Logs why and ends the session (its members leave, its stream closes).
  void EndSession(const Session& session, const std::string& why);
  // Answers `p` (its caller, local or remote) with `status`.
  void AnswerPending(const Pending& p, const absl::Status& status);
  // `p` passed its deadline with no reply (the timer thread).
  void OnDeadline(const Pending& p);
  // UNAVAILABLE: this daemon is draining.
  absl::Status StoppingError() ABSL_LOCKS_EXCLUDED(mu_);
  // Folds what a detaching session sent into retired_.
  void Retire(const std::shared_ptr<router::Session>& session) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status StoppingErrorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool draining();

  const CallRouterOptions options_;
  LogLimiter warnings_{absl::Seconds(10)};
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  router::CallTimings timings_;
  // What detached sessions sent (Usage); by_group bounded by kMaxGroupsKept. Sessions between
  // leaving sessions_ and being folded in (their thread is stopping) are in detaching_.
  UsageTotals retired_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::shared_ptr<router::Session>> detaching_ ABSL_GUARDED_BY(mu_);
  // By absl::StatusCode (0..16): lock-free, so counting costs a failing call one atomic add.
  std::array<std::atomic<uint64_t>, 17> call_errors_{};
  router::Delivery delivery_;
  router::CudaStaging staging_;
  // Calls delivered to local sessions, until answered; its deadlines are served by timer_.
  router::PendingCalls pending_;
  // Calls to and from other nodes.
  router::Remote remote_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Empty until Drain: then why new calls are refused ("is stopping", "is draining ...").
  std::string draining_why_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> last_peer_id_{0};  // Session::peer_id
  // Session threads spinning through a call of their client, or a handler of it (Serve), at
  // most max_call_spinners_ at once: each holds a core while it spins.
  std::atomic<int> call_spinners_{0};
  const int max_call_spinners_;
  std::thread timer_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_ROUTER_CALL_ROUTER_H_
