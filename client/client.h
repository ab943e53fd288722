// The tpd client library: a local process's handle on its node's daemon.
//
//   absl::StatusOr<std::unique_ptr<tpd::Client>> client = tpd::Client::Connect();
//   if (!client.ok()) return client.status();
//   (*client)->Set("ready", "1");
//   absl::StatusOr<std::string> v = (*client)->Get("peer", absl::Seconds(10));
//
// Store calls have c10d semantics (see proto/store.proto). Errors are absl::Status values
// carrying the daemon's gRPC code and message unchanged, e.g. DEADLINE_EXCEEDED naming the
// keys a Get waited for.
//
// Thread safety: a Client is thread-safe; share one per process.

#ifndef TPD_CLIENT_CLIENT_H_
#define TPD_CLIENT_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/calls.h"
#include "proto/admin.grpc.pb.h"
#include "proto/control.grpc.pb.h"
#include "proto/store.grpc.pb.h"
#include "shm/segment.h"

namespace tpd {

// A call's timeout that means "no deadline" (PyTorch's timeout 0).
inline constexpr absl::Duration kNoTimeout = absl::ZeroDuration();

// What a process brings to Join (torch.distributed.rpc's init_rpc arguments).
struct JoinOptions {
  std::string group = "default";
  std::string name;                   // worker name, unique in the group
  std::optional<int64_t> rank;        // absent: assigned (dynamic groups)
  std::optional<int64_t> world_size;  // absent: dynamic group
  std::string init_method;            // tcp://host:port, env://, file:///path
  // For env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE. Empty: taken from this process's
  // environment.
  std::map<std::string, std::string> env;
  v1::BackendOptions options;
  // The group's secret (docs/security.md, "Who may join a group"): the member that starts the
  // group sets it, every later one must bring it. Empty: none.
  std::string secret;
  absl::Duration timeout = absl::ZeroDuration();  // 0: the daemon's default
  // The answer's group with its member list (JoinRequest.include_members). Without (the
  // default), a group of N ranks does not cost N answers of N members; GetGroup has the list.
  bool include_members = false;
  // Static groups: not a join, this rank cannot take part, and why (JoinRequest.abandon). The
  // group fails at once naming the rank, so the other ranks stop waiting; Join returns ABORTED.
  std::string abandon;
};

// A WatchGroup stream: every version of a group, in order.
class GroupWatch {
 public:
  virtual ~GroupWatch() = default;
  // Blocks for the next event; false when the stream ended (Finish() tells why).
  virtual bool Next(v1::GroupEvent* event) = 0;
  // Ends the stream; a Next blocked on another thread returns false. Thread-safe.
  virtual void Cancel() = 0;
  // The stream's final status. Call once, after Next returned false, from the thread that
  // called Next (gRPC forbids Finish while a Read is in progress).
  virtual absl::Status Finish() = 0;
};

struct ClientOptions {
  // How long Connect waits for the daemon to accept the connection.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Deadline of gRPC calls to the daemon that do not wait for keys (not of calls between
  // workers: those default to their group's rpc_timeout).
  absl::Duration call_timeout = absl::Seconds(30);
  // Store namespace of every store call (the daemon keeps namespaces apart).
  std::string name_space;
  // The receive pool this client lends the daemon on each CUDA device a Join's negotiation
  // gives its worker (JoinResponse.negotiated.devices): CUDA tensors sent to its workers land
  // there, and stay while the received Tensors live. 0: none (CUDA tensors sent to it fail).
  uint64_t cuda_pool_bytes = uint64_t{256} << 20;
  // Whether this client takes host tensors that stay in their sender's memory: from a process
  // of the same uid and gid, the daemon copies no tensor of 64 KiB or more, and the received
  // Tensor views the sender's memory, mapped read-only here (docs/data_plane.md, "Tensors shared
  // between sessions"). false: every received tensor is copied by the daemon into this
  // client's receive heap (the C ABI sets it: DLPack consumers such as torch write into what
  // they receive, and a copy out of read-only memory into fresh pages costs more than the
  // daemon's copy into pages the heap reuses).
  bool tensors_in_sender_memory = true;
};

class Client;

// A store as one client reaches it (Client::Store, Client::GroupStore: the client's one way
// to a store): the daemon's store under a namespace, or a group's store (shared by the group's
// members on every node; the client must hold a member of the group, PERMISSION_DENIED
// otherwise). A small value; it must not outlive its Client. Calls have c10d's semantics (the
// file comment); `timeout` of a waiting call: absl::ZeroDuration() = the daemon's default.
class StoreView {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) const;
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout = absl::ZeroDuration()) const;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) const;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) const;
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout = absl::ZeroDuration()) const;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) const;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) const;
  absl::StatusOr<int64_t> NumKeys() const;
  absl::StatusOr<std::vector<std::string>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout = absl::ZeroDuration()) const;
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) const;
  absl::Status Append(absl::string_view key, absl::string_view value) const;

 private:
  friend class Client;
  StoreView(Client* client, std::string name_space, std::string group)
      : client_(client), name_space_(std::move(name_space)), group_(std::move(group)) {}
  // The client's context for a store call, naming the group and this client's session when
  // the view is a group's.
  absl::StatusOr<std::unique_ptr<grpc::ClientContext>> Context(absl::Duration wait,
                                                               bool waits) const;
  // One store call in that context (`wait`, `waits`: as Client::Context).
  // Through the session's rings when the client is attached to shared memory (Client::
  // AttachSharedMemory, or a call or handler made it), else over gRPC.
  template <typename Request, typename Response>
  absl::Status Unary(grpc::Status (v1::Store::Stub::*method)(grpc::ClientContext*, const Request&,
                                                             Response*),
                     const Request& request, Response* response,
                     absl::Duration wait = absl::ZeroDuration(), bool waits = false) const;

  Client* client_;
  std::string name_space_;
  std::string group_;
};

class Client {
 public:
  // Connects to the daemon on `socket_path` ("" = DefaultClientSocketPath()). UNAVAILABLE,
  // naming the socket, when no daemon answers within options.connect_timeout;
  // PERMISSION_DENIED, naming the socket and its owner, when the socket belongs to neither
  // root nor this user (CheckSocketOwner in client/socket_path.h).
  //
  // Turns off Abseil's Mutex deadlock detection for the whole process, as the daemon does:
  // Debian builds Abseil without NDEBUG, so otherwise every Mutex acquisition of every thread
  // (the library's on each call, and the program's own) goes through one process-wide spin
  // lock to check lock order. Lock order is checked by the thread-safety annotations and the
  // sanitizer builds instead.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket_path = "",
                                                         ClientOptions options = {});

  const std::string& socket_path() const { return socket_path_; }

  // The daemon's store under options.name_space, or under `name_space`.
  StoreView Store() { return Store(options_.name_space); }
  StoreView Store(absl::string_view name_space) {
    return StoreView(this, std::string(name_space), "");
  }
  // The store of `group` (its rendezvous store: tcp://, file:// or etcd://), which its members
  // share on every node, under `name_space`. This client must hold a member of `group`.
  StoreView GroupStore(absl::string_view group, absl::string_view name_space = "") {
    return StoreView(this, std::string(name_space), std::string(group));
  }

  // Groups. The first Join opens this client's session with the daemon, a stream that stays
  // open while the Client lives: when the process exits, its members leave at once.
  //
  // Join records the group's negotiated num_worker_threads (handler pool) and rpc_timeout
  // (default call timeout) from its response, and lends the daemon a receive pool
  // (ClientOptions::cuda_pool_bytes) on each CUDA device negotiation gave the worker, when
  // this process has a usable NVIDIA driver. An error lending one is returned (the worker has
  // joined all the same: CUDA tensors sent to it on that device then fail, naming the missing
  // pool).
  absl::StatusOr<v1::JoinResponse> Join(const JoinOptions& options);
  // Graceful: when this client's call engine runs, Leave first refuses new calls to the
  // worker (UNAVAILABLE "worker 'w' is leaving group 'g'") and from it (FAILED_PRECONDITION),
  // and waits for its calls in flight in both directions (calls it made, handlers running
  // or queued for calls to it). The wait is bounded by the calls' own deadlines: at most
  // until the latest of them (plus 2 s for a call it made, the daemon's answer); a call
  // without a deadline counts as the group's rpc_timeout from now, or 60 s when the group
  // has none. Then it sends Leave; calls still running past the bound finish normally.
  // Afterwards this client no longer calls into `group` (FAILED_PRECONDITION until it joins
  // again); a failed Leave lifts the refusals.
  absl::Status Leave(absl::string_view group, absl::string_view name);
  // Waits until every member of `group` entered the barrier. In a static group, members gone
  // since it formed count as arrived; their names go to `*gone` when it is not null.
  absl::Status Barrier(absl::string_view group, absl::string_view name,
                       absl::Duration timeout = absl::ZeroDuration(),
                       std::vector<std::string>* gone = nullptr);
  absl::StatusOr<v1::GroupView> GetGroup(absl::string_view group,
                                         absl::string_view init_method = "");
  absl::StatusOr<std::vector<v1::GroupView>> ListGroups();
  // A secret of this process's user for `purpose` (Control.UserSecret): 32 bytes, the same
  // for this uid on every daemon of the cluster, given to no other uid. Opens the session.
  absl::StatusOr<std::string> UserSecret(absl::string_view purpose);
  // The stream lives until Finish or destruction; no call deadline.
  std::unique_ptr<GroupWatch> Watch(absl::string_view group, absl::string_view init_method = "");

  // Shared memory with the daemon (docs/data_plane.md, "Attaching a session"). Opens the
  // session if needed, connects to the daemon's data socket (its owner checked as Connect
  // checks the gRPC socket's), sends the session id and maps the sealed segment the daemon
  // answers with. Once attached, returns the same segment until the session ends (then
  // the next call attaches the new session). The daemon's refusals arrive with its code and
  // message: RESOURCE_EXHAUSTED naming data.max_sessions, ALREADY_EXISTS, NOT_FOUND.
  absl::StatusOr<std::shared_ptr<const shm::Segment>> AttachSharedMemory();
  // Closes the data connection, which ends the session on the daemon's side (its members
  // leave, as when the process exits). The segment stays mapped while someone holds it.
  void DetachSharedMemory();

  // Calls between workers of this daemon through shared memory (docs/data_plane.md, "Calls on
  // one node"). Each attaches to shared memory first (AttachSharedMemory) and starts the
  // call engine (client/calls.h).
  //
  // Handle registers `handler` for `method` (replacing an earlier one). Handlers run on a
  // pool of this client's threads ("tpd-calls"), never while their thread reads the ring;
  // the pool has as many threads as the largest num_worker_threads (GroupView, negotiated)
  // of the groups this client joined, and grows when it joins a group with more; it never
  // shrinks. An engine started before any Join has no handler thread until the first Join
  // (no call can reach a client that holds no member).
  absl::Status Handle(const std::string& method, Handler handler);
  // As Handle, for a handler that answers through its Responder, possibly after it returned
  // (calls.h, Responder).
  absl::Status HandleDeferred(const std::string& method, DeferredHandler handler);

  // Calls `method` of `worker` in `group` as the worker this client joined `group` as
  // (latest Join; handlers see it in Message::caller). `timeout`: absent, the group's
  // negotiated rpc_timeout (GroupView::rpc_timeout_ms of this client's Join; 0 there: none);
  // kNoTimeout (zero) or absl::InfiniteDuration(): no deadline, as PyTorch's timeout 0;
  // negative: INVALID_ARGUMENT.
  //
  // Copies: the payload, and each tensor not allocated by AllocateTensor, are copied once
  // into the shared arena before CallAsync returns (a borrowed tensor's memory may be reused
  // then); arena tensors are sent where they lie. A reply's tensors are views into the rx
  // heap (TensorStorage::kReceived), read in place; the block goes back to the daemon when
  // the last copy of them goes.
  //
  // Errors, each naming the worker: FAILED_PRECONDITION when this client has not joined
  // `group` or its worker there is leaving; PERMISSION_DENIED from the daemon when the
  // session does not hold the caller; NOT_FOUND for a worker with no member on this daemon;
  // UNAVAILABLE for a worker whose session ended during the call, or that is leaving;
  // DEADLINE_EXCEEDED naming worker, method, the deadline and the timeout;
  // RESOURCE_EXHAUSTED when the arena (naming its size and the request) or the callee's rx
  // heap is full; UNIMPLEMENTED for a method the callee does not handle; a handler's error
  // with its own code, its message prefixed "remote handler of worker 'w' method 'm'
  // failed: "; CANCELLED when this client detaches during the call.
  //
  // `by_reverse_map`: CUDA tensors go by the reverse of `worker`'s device map toward this
  // worker (the map its replies take) instead of this worker's map toward it, as PyTorch's
  // distributed autograd sends gradients back by the map their forward pass took.
  CallFuture CallAsync(const std::string& group, const std::string& worker,
                       const std::string& method, std::string_view payload,
                       const std::vector<Tensor>& tensors = {},
                       std::optional<absl::Duration> timeout = std::nullopt,
                       bool by_reverse_map = false);
  // CallAsync and Wait.
  absl::StatusOr<Message> Call(const std::string& group, const std::string& worker,
                               const std::string& method, std::string_view payload,
                               const std::vector<Tensor>& tensors = {},
                               std::optional<absl::Duration> timeout = std::nullopt);

  // A tensor in the shared arena (the tx heap), to fill through mutable_data() and pass to
  // Call/CallAsync or return from a handler with no copy. The block stays allocated while
  // the Tensor (or a copy) lives and while a message sent with it is not yet released by
  // the daemon. RESOURCE_EXHAUSTED naming the arena's size and the request when it does not
  // fit (the arena is [data] arena_bytes of the daemon, 64 MiB by default).
  absl::StatusOr<Tensor> AllocateTensor(shm::DType dtype, std::vector<int64_t> shape);

  // The call engine's counters; FAILED_PRECONDITION before the first Handle, Call or
  // AllocateTensor started it.
  absl::StatusOr<CallEngineStats> GetCallStats();
  // The call engine when this client is attached to shared memory (started if need be); null
  // when it is not attached. For a thread that lends itself to it (CallEngine::ReadAsLent).
  std::shared_ptr<CallEngine> AttachedEngine();

  // Admin.Status of the daemon.
  absl::StatusOr<v1::StatusResponse> Status();
  // Admin.ProbePeers: the daemon pings the peer daemons its agent knows (`tpctl doctor`).
  absl::StatusOr<v1::ProbePeersResponse> ProbePeers();
  // Admin.ProbeStores: the members of the etcd clusters behind the node's rendezvous stores,
  // as the stores' endpoints answer (`tpctl doctor`).
  absl::StatusOr<v1::ProbeStoresResponse> ProbeStores();
  // grpc.health.v1 check of the whole daemon: true when SERVING.
  absl::StatusOr<bool> Serving();

  ~Client();

 private:
  friend class StoreView;
  Client(std::string socket_path, ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  // A context with the call deadline, or, for a call waiting `timeout`, one a little past
  // it so the daemon's own DEADLINE_EXCEEDED (which names the keys) arrives first.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration wait = absl::ZeroDuration(),
                                               bool waits = false) const;

  // What this client's latest Join of a group gave it.
  struct Joined {
    std::string name;            // the worker it calls as
    absl::Duration rpc_timeout;  // the group's negotiated one; zero: none
  };
  // The worker this client calls as in `group`, or FAILED_PRECONDITION.
  absl::StatusOr<Joined> CallerIn(const std::string& group);
  // The call engine of the attached segment, attaching and starting it when needed.
  absl::StatusOr<std::shared_ptr<CallEngine>> Engine();

  // The session id, opening the session stream on first use.
  absl::StatusOr<std::string> Session();

  const std::string socket_path_;
  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Store::Stub> store_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  std::unique_ptr<v1::Control::Stub> control_;

  absl::Mutex session_mu_;
  std::string session_id_ ABSL_GUARDED_BY(session_mu_);
  std::unique_ptr<grpc::ClientContext> session_context_ ABSL_GUARDED_BY(session_mu_);
  std::string data_socket_ ABSL_GUARDED_BY(session_mu_);  // from the session's first event
  std::thread session_reader_;                            // drains the session stream until it ends

  absl::Mutex data_mu_;  // taken before session_mu_, never after
  std::string attached_session_ ABSL_GUARDED_BY(data_mu_);
  int data_fd_ ABSL_GUARDED_BY(data_mu_) = -1;
  std::shared_ptr<const shm::Segment> segment_ ABSL_GUARDED_BY(data_mu_);
  // Started by the first Handle or Call, on the segment attached then.
  std::shared_ptr<CallEngine> calls_ ABSL_GUARDED_BY(data_mu_);
  std::shared_ptr<const shm::Segment> calls_segment_ ABSL_GUARDED_BY(data_mu_);
  std::map<std::string, DeferredHandler> handlers_ ABSL_GUARDED_BY(data_mu_);
  // The largest num_worker_threads of the groups joined: the handler pool's size.
  int handler_threads_ ABSL_GUARDED_BY(data_mu_) = 0;
  // CUDA devices the joins gave this client's workers: each engine lends a pool on each.
  std::set<int> cuda_devices_ ABSL_GUARDED_BY(data_mu_);
  absl::Mutex joined_mu_;                                             // never held with data_mu_
  std::map<std::string, Joined> joined_ ABSL_GUARDED_BY(joined_mu_);  // by group
};

}  // namespace tpd

#endif  // TPD_CLIENT_CLIENT_H_
