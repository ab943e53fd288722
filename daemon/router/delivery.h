// Delivery of a message from one local session to another: the one way a call or a reply
// reaches a session on this node. The body and host tensors are copied from the sender's tx heap
// into one block of the receiver's rx heap, except host tensors of kShareMinBytes or more
// between sessions that share memory (the same uid and gid, Session::Introduce): those stay
// where they are, the receiver's entry points into the sender's tx heap, and the sender's tx
// block is lent to the receiver's rx block until its client releases it; tensors bound for a CUDA
// device (by the sender's device map) are copied into the receiver's receive pools, and CUDA
// tensors bound for host memory into the block, on CudaCopies. A message with no CUDA tensor and no
// map (the host case) issues no copies and is posted before Deliver returns. A call whose copies
// all land in receive pools is posted as soon as they are issued, with a CopySignal its client
// waits on (shm/copy_signal.h); other messages with copies are posted once they completed.
//
// Thread safety: thread-safe; Deliver locks only the receiving session, through its methods.

#ifndef TPD_DAEMON_ROUTER_DELIVERY_H_
#define TPD_DAEMON_ROUTER_DELIVERY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "daemon/router/cuda_copies.h"
#include "daemon/router/session.h"
#include "daemon/router/submitted.h"
#include "shm/descriptor.h"
#include "shm/message.h"

namespace tpd::router {

// A message to post into a session: its descriptor's fields and names, and where its body and
// tensors lie in the sender's segment.
struct Letter {
  shm::Op op = shm::Op::kCall;
  uint64_t call_id = 0;  // the id the receiver answers (a call) or waits on (a reply)
  uint16_t flags = 0;
  int64_t deadline_ns = 0;
  uint32_t code = 0;
  shm::MessageNames names;
  uint64_t tx_block = 0;  // the sender's block holding the message: Deliver gives it back
  uint64_t body_offset = 0;
  uint64_t body_length = 0;
  std::vector<shm::TensorEntry> tensors;
  std::vector<Place> places;  // empty: every tensor is in host memory and stays there
};

// Host tensors this large or larger are shared rather than copied between sessions that may
// share memory: below it a copy costs less than holding the sender's block for as long as the
// receiver holds the message.
inline constexpr uint64_t kShareMinBytes = 64 << 10;

class Delivery {
 public:
  // `cuda`: null without a usable driver, `no_cuda` then says why.
  Delivery(CudaCopies* cuda, std::string no_cuda) : cuda_(cuda), no_cuda_(std::move(no_cuda)) {}

  // Copies `letter` from `from`'s tx heap into `to` (or lends it its tensors) and posts it;
  // `after` gets the outcome once it is posted and copied, or failed (inline in the host case;
  // else on the thread CudaCopies::Run names), never under a session's lock: it may answer the
  // caller, who may be `to`. The error is what the caller should be told; nothing is left
  // allocated in `to` after one, except by a call posted before its copies failed: its client
  // releases those blocks. `letter.tx_block` goes back to `from` before `after` runs, unless
  // lent to `to`.
  void Deliver(const std::shared_ptr<Session>& from, const std::shared_ptr<Session>& to,
               const Letter& letter, std::function<void(absl::Status)> after);

 private:
  struct Placement;

  // Whether the message is posted as soon as its copies are issued, with a CopySignal
  // (shm/copy_signal.h) its client waits on, rather than once they completed.
  static bool PostsBeforeCopies(const Placement& p);
  // Which host tensors `to` reads in `from`'s segment instead of a copy (none unless they may
  // share memory and `to`'s client was sent that segment).
  void Share(const std::shared_ptr<Session>& from, const std::shared_ptr<Session>& to,
             Placement* p);
  // Where each tensor is read from: its host bytes, or the CUDA allocation it names opened.
  absl::Status ResolveSources(Session& from, Placement* p);
  // Under `to`'s lock: writes the message (read from the sender's segment, `p->in`) into `to`'s
  // rx block at `out` (`block`), taking pool blocks and collecting the copies to run; on an
  // error frees the pool blocks it took.
  absl::Status Fill(Session& to, uint64_t block, uint8_t* out, Placement* p);
  absl::Status FillTensor(Session& to, size_t i, uint64_t block, uint8_t* out, Placement* p);
  // Posts the filled block, or frees it and its pool blocks if it cannot be posted.
  absl::Status Post(Session& to, const shm::Descriptor& posted,
                    const std::vector<std::pair<int, uint64_t>>& pool_blocks);
  void FreePools(Session& to, const std::vector<std::pair<int, uint64_t>>& pool_blocks);

  CudaCopies* const cuda_;
  const std::string no_cuda_;
};

}  // namespace tpd::router

#endif  // TPD_DAEMON_ROUTER_DELIVERY_H_
