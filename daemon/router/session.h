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
// Sessions of one uid and gid share memory instead of copying host tensors (Delivery): the
// receiver's client maps the sender's segment read-only (shm/peer_notice.h), and the
// sender's tx block is lent to the receiver's rx block that points into it, going back to the
// sender when the receiver's client releases that block (or its session ends).
//
// Thread safety: `mu` guards the completion ring producer, the rx heap allocator, the queue
// and what is lent and told; no two sessions' `mu` are ever held together. The router takes `mu`
// only through the methods below that say they lock (session.cc is the one file that locks a
// session).

#ifndef TPD_DAEMON_ROUTER_SESSION_H_
#define TPD_DAEMON_ROUTER_SESSION_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/router/cuda_copies.h"
#include "shm/descriptor.h"
#include "shm/heap.h"
#include "shm/ring.h"
#include "shm/segment.h"

namespace tpd::router {

struct SessionLimits {
  // Answers and releases that may wait for room on the completion ring.
  size_t max_unposted = 8192;
  // Calls that may wait for room on it.
  size_t max_waiting_calls = 1024;
};

// What sessions sent through the router (Admin.Status per uid and per group).
struct Usage {
  uint64_t calls = 0;   // calls made (refused ones included)
  uint64_t bytes = 0;   // payload and tensor bytes of those calls (and, per uid, of replies)
  uint64_t errors = 0;  // calls the daemon answered with an error

  Usage& operator+=(const Usage& other) {
    calls += other.calls;
    bytes += other.bytes;
    errors += other.errors;
    return *this;
  }
};

struct Session {
  // A block the daemon placed for its client, as its release names it: (0, rx heap offset)
  // or (1 + d, offset in its receive pool on cuda:d).
  using BlockRef = std::pair<uint32_t, uint64_t>;

  // A tx block of another session that a message in this one's rx heap points into.
  struct Lent {
    std::shared_ptr<Session> from;
    uint64_t tx_block = 0;
  };

  // A session over `segment`: its rings and rx heap where the segment's layout puts them, its
  // thread waiting for submissions with `spin`. No thread runs yet.
  static std::shared_ptr<Session> Open(std::string id, std::string handle, SessionLimits limits,
                                       std::shared_ptr<shm::Segment> segment,
                                       const shm::SpinOptions& spin);

  ~Session();

  std::string id;
  std::string handle;  // what logs and errors show (SessionHandle(id))
  SessionLimits limits;
  // Its client's user (SO_PEERCRED of its data connection at attach).
  uid_t uid = 0;
  gid_t gid = 0;
  // What peer notices and completions call its segment by (TensorEntry::device_handle); not
  // 0, unique while the daemon runs.
  uint64_t peer_id = 0;
  // Owned, -1 when the daemon shares no memory for it ([data] share_memory): a read-only fd
  // of its memfd, for the clients it lends tx blocks to, and its data connection (a dup),
  // where notices of peers go to its client. Set before it is served, never changed after.
  int share_fd = -1;
  int notice_fd = -1;
  // OK when its user could open the GPUs itself; else why the daemon opens no CUDA memory
  // it names (daemon/router/gpu_access.h).
  absl::Status cuda_allowed;
  std::shared_ptr<shm::Segment> segment;
  std::unique_ptr<shm::RingConsumer> submissions;  // its thread only (Nudge: any thread)
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
  // Tx blocks lent to it, by the rx block that points into them.
  absl::flat_hash_map<uint64_t, Lent> lent ABSL_GUARDED_BY(mu);
  // Blocks of calls posted while their copies still write them (HoldWhileCopying), and
  // whether its client released each meanwhile.
  absl::flat_hash_map<BlockRef, bool> copying ABSL_GUARDED_BY(mu);
  // Peers whose notice went to its client, and the sessions told of it (for their kPeerGone).
  absl::flat_hash_set<uint64_t> peers_told ABSL_GUARDED_BY(mu);
  // Its client closed the reading side of its data connection (a notice failed with EPIPE):
  // it takes no tensors in other sessions' memory, and gets copies.
  bool refuses_notices ABSL_GUARDED_BY(mu) = false;
  std::vector<std::weak_ptr<Session>> told ABSL_GUARDED_BY(mu);
  std::atomic<bool> ended{false};         // End began; read without `mu` by Introduce
  std::atomic<uint64_t> bytes_shared{0};  // host tensor bytes delivered to it uncopied
  // What it sent since it attached (Usage): its thread counts calls and bytes, errors come
  // from any thread that answers it. Folded into the router's totals when it detaches.
  std::atomic<uint64_t> calls_made{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> call_errors{0};
  // Its calls by group, in the groups it held the caller in (it joined each: a name a
  // client makes up is never a key).
  absl::Mutex usage_mu;
  absl::flat_hash_map<std::string, Usage> usage_by_group ABSL_GUARDED_BY(usage_mu);
  // Calls posted to its client (CallPosted): its thread, nudged, then waits for the reply with
  // the window for waits that follow a call (CallRouter::Serve).
  std::atomic<uint64_t> calls_received{0};
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

  // Each of these locks `mu`.
  //
  // Post, under the lock.
  absl::Status PostLocking(const shm::Descriptor& d) ABSL_LOCKS_EXCLUDED(mu);
  // Returns tx block `tx_offset` to the client (a kRelease, queued like any answer). Nothing is
  // owed to a session that ended.
  void Release(uint64_t tx_offset) ABSL_LOCKS_EXCLUDED(mu);
  // A call was posted to its client, whose reply is to come: wakes its thread if it sleeps, to
  // wait for that reply spinning (CallRouter::Serve). Any thread.
  void CallPosted() {
    calls_received.fetch_add(1, std::memory_order_relaxed);
    submissions->Nudge();
  }
  // Answers the client's call `call_id` with `status` (an error reply with its message; an
  // OK status is a reply whose body is `body`). When the rx heap has no room for the message
  // the reply goes without it, which the client reads as RESOURCE_EXHAUSTED, and the heap's
  // error is returned for the router to log. A session that ended is owed nothing.
  absl::Status Answer(uint64_t call_id, const absl::Status& status, absl::string_view body = {})
      ABSL_LOCKS_EXCLUDED(mu);
  // Allocates `bytes` of the rx heap and runs `fill(block, at)` on them under the lock (`at`:
  // where the block is mapped); the block is freed again when `fill` fails. UNAVAILABLE once
  // the session ended; the heap's error when it is full.
  absl::StatusOr<uint64_t> WriteRx(
      uint64_t bytes, absl::FunctionRef<absl::Status(uint64_t block, uint8_t* at)> fill)
      ABSL_LOCKS_EXCLUDED(mu);
  // WriteRx, then posts `describe(block)` under the same lock: a message with nothing left to
  // copy goes in one critical section. The block is freed again if it cannot be posted; the
  // error is WriteRx's or Post's. With `lend`, the posted block holds that tx block until it
  // is freed (not when it was not posted: the caller still owns it then).
  absl::Status WriteRxAndPost(uint64_t bytes,
                              absl::FunctionRef<absl::Status(uint64_t block, uint8_t* at)> fill,
                              absl::FunctionRef<shm::Descriptor(uint64_t block)> describe,
                              const Lent* lend = nullptr) ABSL_LOCKS_EXCLUDED(mu);
  // Frees rx block `offset`: one the client released, or one the router filled and never
  // posted; a tx block lent to it goes back to its sender. OK for a session that ended (its
  // heap is gone with it).
  absl::Status FreeRx(uint64_t offset) ABSL_LOCKS_EXCLUDED(mu);
  // Blocks of a call posted before its copies completed (router::Delivery): their client's
  // releases wait (DeferRelease) until EndCopying, so nothing is placed there again while a
  // copy still writes it, whatever the client does.
  void HoldWhileCopying(absl::Span<const BlockRef> blocks) ABSL_LOCKS_EXCLUDED(mu);
  // True when `block` is held: its release then happens at EndCopying.
  bool DeferRelease(const BlockRef& block) ABSL_LOCKS_EXCLUDED(mu);
  // The copies into `blocks` completed: returns those the client released meanwhile, for the
  // caller to free now.
  std::vector<BlockRef> EndCopying(absl::Span<const BlockRef> blocks) ABSL_LOCKS_EXCLUDED(mu);
  // Makes sure `to`'s client has been sent `from`'s segment (a peer notice, once per pair), so
  // that messages to it may point into `from`'s tx heap. False when they may not: either
  // shares no memory, one of them ended, or the notice could not be sent (then the message is
  // copied as any other). Locks `to`, and `from` the first time.
  static bool Introduce(const std::shared_ptr<Session>& from, const std::shared_ptr<Session>& to)
      ABSL_LOCKS_EXCLUDED(from->mu, to->mu);
  // Posts what waits; returns why its ring is broken ("" while it is not): its thread then ends
  // the session.
  std::string Flush() ABSL_LOCKS_EXCLUDED(mu);
  // Nothing is written into its segment once this returns. What was lent to it goes back, and
  // the sessions told of it get a kPeerGone.
  void End() ABSL_LOCKS_EXCLUDED(mu);
  // Bytes its client has not released of its rx heap. Never waits for the lock: while another
  // thread holds it, the value read last time.
  uint64_t RxUsed() ABSL_LOCKS_EXCLUDED(mu);
  // Times a post found its client's reader asleep and woke it, and times its thread slept
  // waiting for submissions: hops that cost a wake-up. Never waits for the lock.
  uint64_t ReaderWakeups() const;
  uint64_t DaemonSleeps() const { return submissions->sleeps(); }

 private:
  absl::StatusOr<uint64_t> WriteRxLocked(
      uint64_t bytes, absl::FunctionRef<absl::Status(uint64_t block, uint8_t* at)> fill)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // One push on the ring: false when it is full; a broken ring breaks the session. A reply
  // counts its call down.
  absl::StatusOr<bool> Push(const shm::Descriptor& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

// A block of a session's tx heap that TensorPipe reads in place: back to the client (Release)
// when the last holder lets go.
class TxBlock {
 public:
  TxBlock(std::shared_ptr<Session> session, uint64_t offset)
      : session_(std::move(session)), offset_(offset) {}
  TxBlock(const TxBlock&) = delete;
  TxBlock& operator=(const TxBlock&) = delete;
  ~TxBlock() { session_->Release(offset_); }

 private:
  const std::shared_ptr<Session> session_;
  const uint64_t offset_;
};

}  // namespace tpd::router

#endif  // TPD_DAEMON_ROUTER_SESSION_H_
