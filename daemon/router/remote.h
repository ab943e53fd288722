// The router's side of calls that cross to other nodes (Remote): a local session's call to a
// worker elsewhere and the reply it gets, a request from another daemon admitted by this
// daemon's own view of the group and its callee's response. Below it: messages read in place
// for the agent to send (one path for requests and responses, Ship), messages from the agent
// placed straight into a session's rx heap (PlaceIncoming, RxBlock), and the local calls
// waiting on another node (RemoteCalls).
//
// Thread safety: Remote and RemoteCalls are thread-safe; Remote's methods run on session
// threads and the agent's callbacks on TensorPipe's threads, and it holds no lock while calling
// the agent or the router. Blocks are shared with the agent, each owned by whoever holds its
// last reference.

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
#include "daemon/router/call_timings.h"
#include "daemon/router/cuda_staging.h"
#include "daemon/router/options.h"
#include "daemon/router/pending_calls.h"
#include "daemon/router/session.h"
#include "daemon/router/submitted.h"
#include "shm/message.h"

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
  size_t size() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::map<Key, Outgoing> calls_ ABSL_GUARDED_BY(mu_);
};

// What Remote needs of the router that owns it.
struct RouterHooks {
  // The attached session `id`, or null.
  std::function<std::shared_ptr<Session>(const std::string& id)> find;
  // Answers a local session's call with an error.
  std::function<void(const std::shared_ptr<Session>& to, uint64_t call_id,
                     const absl::Status& status)>
      fail;
  // OK while the router takes new calls; the error to refuse them with once it drains.
  std::function<absl::Status()> admit;
  // Where a message's tensors land by the group's device maps (reply: the reverse map).
  std::function<absl::StatusOr<std::vector<Place>>(const MapUse& use, bool reply,
                                                   const std::vector<shm::TensorEntry>& tensors)>
      place;
};

class Remote {
 public:
  // `options` (agent non-null), `staging`, `pending` and `timings` outlive this.
  Remote(const CallRouterOptions& options, const CudaStaging& staging, PendingCalls& pending,
         CallTimings& timings, RouterHooks hooks)
      : options_(options),
        staging_(staging),
        pending_(pending),
        timings_(timings),
        hooks_(std::move(hooks)) {}

  // A call of `session` (descriptor `d`, read as `call`) to `member` on another node: sent on
  // the agent's pipe to it; the reply, or the error, answers the call. `read_ns`: when `d`
  // was read off the session's ring (MonotonicNanos), as for each of these.
  void Call(const std::shared_ptr<Session>& session, const shm::Descriptor& d,
            const Submitted& call, const std::vector<Place>& places, const v1::Member& member,
            int64_t read_ns);
  // A local callee's reply (`d`) to `pending`, a request from another daemon.
  void Respond(const std::shared_ptr<Session>& session, const shm::Descriptor& d,
               const PendingCall& pending, int64_t read_ns);
  // Answers a request from another daemon with an error.
  void RespondError(const agent::ReplyTo& to, const absl::Status& status);
  // The agent's handler for requests from other daemons.
  agent::Handler Handler();
  // The calls of local sessions waiting on other nodes.
  RemoteCalls& calls() { return calls_; }

 private:
  // The header of a request from worker names[3] to worker names[1] of group names[0].
  v1::AgentMessage RequestHeader(const shm::MessageNames& names);
  // Answers call `call_id` of `caller` with `status` unless something answered it already.
  void FailCall(const std::shared_ptr<Session>& caller, uint64_t call_id,
                const absl::Status& status);
  // `read_ns`: when the call was read off the caller's ring; `received_ns`: when its reply came.
  void OnReply(const std::shared_ptr<Session>& caller, uint64_t call_id,
               absl::StatusOr<agent::Message> reply, int64_t read_ns, int64_t received_ns);
  absl::StatusOr<agent::Destination> PlaceRequest(const v1::AgentMessage& header,
                                                  size_t payload_size,
                                                  absl::Span<const size_t> sizes);
  // `received_ns`: when the agent delivered it (MonotonicNanos), as below.
  void OnRequest(agent::InboundRequest request, int64_t received_ns);
  // OK when this daemon's own view of the request's group has its calling worker on `node`
  // in the incarnation the sender named; else PERMISSION_DENIED saying what it knows. The
  // number of the version it looked at goes to `*version_read` (when not null).
  absl::Status CheckCaller(const v1::AgentMessage& header, const std::string& node,
                           int64_t* version_read);
  // A request once its caller was checked (`admitted`): delivered to its callee, or answered
  // with the refusal.
  void ServeRequest(agent::InboundRequest request, const absl::Status& admitted,
                    int64_t received_ns);

  const CallRouterOptions& options_;
  const CudaStaging& staging_;
  PendingCalls& pending_;
  CallTimings& timings_;
  const RouterHooks hooks_;
  RemoteCalls calls_;
};

}  // namespace tpd::router

#endif  // TPD_DAEMON_ROUTER_REMOTE_H_
