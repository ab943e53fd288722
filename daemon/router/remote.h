// The router's side of calls that cross to other nodes: messages read in place for the agent to
// send (one path for requests and responses, Ship), messages from the agent placed straight
// into a session's rx heap (PlaceIncoming, RxBlock), and the local calls waiting on another
// node (RemoteCalls).
//
// Thread safety: RemoteCalls is thread-safe; the rest are functions and blocks shared with the
// agent, each owned by whoever holds its last reference.

#ifndef TPD_DAEMON_ROUTER_REMOTE_H_
#define TPD_DAEMON_ROUTER_REMOTE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "agent/agent.h"
#include "daemon/router/cuda_staging.h"
#include "daemon/router/session.h"
#include "daemon/router/submitted.h"
#include "proto/shm/message.h"

namespace tpd::router {

// A message for another node: tx block `tx_offset` of `session`, read as `submitted`, its
// tensors bound for `places` (empty: host memory) on the other side.
struct Shipment {
  std::shared_ptr<Session> session;
  uint64_t tx_offset = 0;
  const Submitted& submitted;
  const std::vector<Place>& places;
};

// Points `message` at the shipment's bytes (TensorPipe reads host bytes in place; CUDA tensors
// are staged) and calls `send` with it once it can go, or `failed` with why it cannot. The tx
// block goes back to the client once the agent is done with the message.
void Ship(const CudaStaging& staging, const Shipment& what, agent::Message message,
          std::function<void(agent::Message)> send, std::function<void(absl::Status)> failed);

// Where an incoming message's bytes were placed: a block of a session's rx heap, freed unless
// it was posted, and the staging of its tensors bound for the session's devices. Shared with the
// agent as the message's keepalive.
struct RxBlock {
  ~RxBlock();
  // Where the message lies, for its descriptor.
  shm::MessageBlock Placed() const {
    return {offset, plan.payload, plan.table, static_cast<uint32_t>(tensors.size())};
  }
  // Copies its staged tensors into the session's pools, then runs `then` (at once without any).
  static void Land(const std::shared_ptr<const RxBlock>& self,
                   std::function<void(absl::Status)> then);
  // Posts `d` (this block) to its session; once posted the block is the client's.
  absl::Status Post(const shm::Descriptor& d) const;

  std::shared_ptr<Session> session;
  uint64_t offset = 0;
  shm::BlockPlan plan;
  std::vector<shm::TensorEntry> tensors;  // offsets filled in, once validated
  std::unique_ptr<StagedIn> staged;       // null when every tensor lands in host memory
  mutable std::atomic<bool> posted{false};
};

// A message from another node, as the agent announces it before reading its bytes.
struct Arrival {
  const v1::AgentMessage& header;
  uint32_t code = 0;  // a reply's status code; 0 for a call or a reply that is not an error
  shm::MessageNames names;
  size_t payload_size = 0;
  absl::Span<const size_t> tensor_sizes;
};

// Places `arrival` in `to`: a block of its rx heap for the names, body and host tensors, and
// staging and pool blocks for tensors bound for its devices (its RxBlock is the destination's
// keepalive). INVALID_ARGUMENT for counts or names past the limits, the wire's errors for a bad
// tensor descriptor.
absl::StatusOr<agent::Destination> PlaceIncoming(const CudaStaging& staging,
                                                 const std::shared_ptr<Session>& to,
                                                 const Arrival& arrival);

// A call of a local session to a worker on another node, until it is answered.
struct Outgoing {
  std::string node;
  std::string worker;
  std::string method;
};

// The calls of local sessions waiting on other nodes, by (session id, its call id). Whoever
// takes a call out answers it: a reply, a cancel, a failed send, the node being lost.
class RemoteCalls {
 public:
  using Key = std::pair<std::string, uint64_t>;

  void Add(const Key& key, Outgoing call) ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<Outgoing> Take(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Every call to `node`, taken out.
  std::vector<std::pair<Key, Outgoing>> TakeNode(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets the calls of a session that ended (their replies have nowhere to go).
  void DropSession(const std::string& session_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no call is left or `deadline`; returns how many are left.
  size_t AwaitNone(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::map<Key, Outgoing> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpd::router

#endif  // TPD_DAEMON_ROUTER_REMOTE_H_
