// Calls between two sessions of this daemon through their shared memory (docs/data_plane.md,
// "Calls on one node"): each attached session's submission ring is consumed here, calls are
// routed to the session holding the target worker, replies back to the caller, matched by id.
//
// Every descriptor is copied out of the ring and validated (ValidateDescriptor,
// ReadTensorTable, ParseMessage) before use. A bad call is answered INVALID_ARGUMENT; a
// descriptor with no call id to answer, or a broken ring, ends the session (`end_session`).
// Payload and tensors are copied once, from the sender's tx heap into the receiver's rx heap
// (allocated with the daemon's allocator of that heap), and the tx block is released.
//
// Thread safety: thread-safe. One thread per attached session ("tpd-session", at most
// data.max_sessions) reads its submission ring with bounded waits; one timer thread
// ("tpd-call-timer") answers calls past their deadline. A session's completion ring and rx
// heap allocator are guarded by that session's mutex; no two session mutexes are held at once.

#ifndef TPD_DAEMON_CALL_ROUTER_H_
#define TPD_DAEMON_CALL_ROUTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/shm/descriptor.h"
#include "proto/shm/heap.h"
#include "proto/shm/ring.h"
#include "proto/shm/segment.h"

namespace tpd {

struct CallRouterOptions {
  // The session holding worker `worker` of `group` on this daemon, if any.
  std::function<std::optional<std::string>(const std::string& group, const std::string& worker)>
      lookup;
  // Ends a session whose ring is broken or that sent a descriptor with nothing to answer.
  std::function<void(const std::string& session_id, const std::string& why)> end_session;
};

class CallRouter {
 public:
  explicit CallRouter(CallRouterOptions options);
  ~CallRouter();

  // `segment` stays mapped until Detach(session_id) returns.
  void Attach(const std::string& session_id, shm::Segment* segment);
  // Stops the session's thread; calls it was serving are answered UNAVAILABLE.
  void Detach(const std::string& session_id);
  void Shutdown();

 private:
  struct Session {
    std::string id;
    shm::Segment* segment = nullptr;
    std::unique_ptr<shm::RingConsumer> submissions;  // its thread only
    absl::Mutex mu;
    std::unique_ptr<shm::RingProducer> completions ABSL_GUARDED_BY(mu);
    std::unique_ptr<shm::HeapAllocator> rx ABSL_GUARDED_BY(mu);
    bool broken ABSL_GUARDED_BY(mu) = false;
    std::atomic<bool> stop{false};
    std::thread thread;
  };
  struct Pending {
    std::string caller;
    uint64_t caller_call_id = 0;
    std::string callee;
    std::string worker;
    std::string method;
    absl::Time deadline = absl::InfiniteFuture();
  };

  void Serve(std::shared_ptr<Session> session);
  void Handle(const std::shared_ptr<Session>& session, const shm::Descriptor& d);
  void HandleCall(const std::shared_ptr<Session>& session, const shm::Descriptor& d);
  void HandleReply(const std::shared_ptr<Session>& session, const shm::Descriptor& d);
  std::shared_ptr<Session> Find(const std::string& id);
  // Copies the message of `d` (from `from`'s tx heap) into `to`'s rx heap and posts it with
  // `op`, `call_id`, `flags`, `deadline`. The error is what the caller should be told.
  absl::Status Deliver(const Session& from, const shm::Descriptor& d, const std::string& prefix0,
                       const std::string& prefix1, const std::string& prefix2,
                       const std::string& prefix3, uint32_t code,
                       uint64_t body_offset, uint64_t body_length,
                       const std::vector<shm::TensorEntry>& tensors, Session& to, shm::Op op,
                       uint64_t call_id, uint16_t flags, int64_t deadline_ns);
  // Posts an error reply to `to` for its call `call_id`.
  void Fail(const std::shared_ptr<Session>& to, uint64_t call_id, const absl::Status& status);
  // Posts `d` on `to`'s completion ring (waits up to a second for space).
  absl::Status Post(Session& to, const shm::Descriptor& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(to.mu);
  void Release(const std::shared_ptr<Session>& to, uint64_t tx_offset);
  void TimerLoop();

  const CallRouterOptions options_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);  // by routed call id
  std::set<std::pair<absl::Time, uint64_t>> deadlines_ ABSL_GUARDED_BY(mu_);
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar timer_cv_;
  std::thread timer_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_CALL_ROUTER_H_
