// One client session attached to shared memory, as the router holds it: its segment, its
// rings and rx heap allocator, and what waits for room on its completion ring. Post is the one
// way anything reaches its completion ring; no thread ever waits there for the client.
//
// What cannot go at once joins the session's queue, in order, and goes as the client makes
// room (its own thread flushes the queue): answers and releases up to limits.max_unposted
// (one more breaks the session: its client stopped reading), calls up to
// limits.max_waiting_calls (one more is RESOURCE_EXHAUSTED for its caller, and the session
// lives on).
//
// Thread safety: `mu` guards the completion ring producer, the rx heap allocator and the
// queue; no two sessions' `mu` are ever held together.

#ifndef TPD_DAEMON_ROUTER_SESSION_H_
#define TPD_DAEMON_ROUTER_SESSION_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cuda_copies.h"
#include "proto/shm/descriptor.h"
#include "proto/shm/heap.h"
#include "proto/shm/ring.h"
#include "proto/shm/segment.h"

namespace tpd::router {

struct SessionLimits {
  // Answers and releases that may wait for room on the completion ring.
  size_t max_unposted = 8192;
  // Calls that may wait for room on it.
  size_t max_waiting_calls = 1024;
};

struct Session {
  std::string id;
  std::string handle;  // what logs and errors show (SessionHandle(id))
  SessionLimits limits;
  // OK when its user could open the GPUs itself; else why the daemon opens no CUDA memory
  // it names (daemon/gpu_access.h).
  absl::Status cuda_allowed;
  std::shared_ptr<shm::Segment> segment;
  std::unique_ptr<shm::RingConsumer> submissions;  // its thread only
  std::atomic<int64_t> calls_in_flight{0};
  std::atomic<uint64_t> rx_used_seen{0};  // rx heap bytes in use when Stats last looked
  absl::Mutex mu;
  std::unique_ptr<shm::RingProducer> completions ABSL_GUARDED_BY(mu);
  std::unique_ptr<shm::HeapAllocator> rx ABSL_GUARDED_BY(mu);
  bool broken ABSL_GUARDED_BY(mu) = false;
  // Why its completion ring cannot be written (the client broke it); its thread ends it.
  std::string ring_error ABSL_GUARDED_BY(mu);
  // Answers, releases and calls waiting for room on its completion ring, oldest first;
  // `waiting_calls` of them are calls.
  std::deque<shm::Descriptor> unposted ABSL_GUARDED_BY(mu);
  size_t waiting_calls ABSL_GUARDED_BY(mu) = 0;
  std::atomic<int64_t> unposted_count{0};  // unposted.size(), for Stats and Serve
  std::atomic<bool> stop{false};
  std::thread thread;
  // Its receive pools and the CUDA memory it exported (null without CUDA); shared with the
  // copies in flight from or into it.
  std::shared_ptr<SessionMemory> cuda;

  // Posts `d` now, or queues it (see above): OK when it went or waits. UNAVAILABLE once the
  // session is broken or ended.
  absl::Status Post(const shm::Descriptor& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Posts what waits, in order, while the ring has room.
  void FlushUnposted() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // UNAVAILABLE naming the session and why it ended.
  absl::Status EndedError() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

 private:
  // One push on the ring: false when it is full; a broken ring breaks the session. A reply
  // counts its call down.
  absl::StatusOr<bool> Push(const shm::Descriptor& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

}  // namespace tpd::router

#endif  // TPD_DAEMON_ROUTER_SESSION_H_
