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
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/calls.h"
#include "proto/admin.grpc.pb.h"
#include "proto/control.grpc.pb.h"
#include "proto/shm/segment.h"
#include "proto/store.grpc.pb.h"

namespace tpd {

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
  absl::Duration timeout = absl::ZeroDuration();  // 0: the daemon's default
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
  // Deadline of calls that do not wait for keys.
  absl::Duration call_timeout = absl::Seconds(30);
  // Store namespace of every store call (the daemon keeps namespaces apart).
  std::string name_space;
};

class Client {
 public:
  // Connects to the daemon on `socket_path` ("" = DefaultClientSocketPath()). UNAVAILABLE,
  // naming the socket, when no daemon answers within options.connect_timeout;
  // PERMISSION_DENIED, naming the socket and its owner, when the socket belongs to neither
  // root nor this user (CheckSocketOwner in client/socket_path.h).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket_path = "",
                                                         ClientOptions options = {});

  const std::string& socket_path() const { return socket_path_; }

  // Store calls. `timeout` of a waiting call: absl::ZeroDuration() = the daemon's default.
  absl::Status Set(absl::string_view key, absl::string_view value);
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired);
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys);
  absl::StatusOr<bool> DeleteKey(absl::string_view key);
  absl::StatusOr<int64_t> NumKeys();
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout = absl::ZeroDuration());
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values);
  absl::Status Append(absl::string_view key, absl::string_view value);

  // Groups. The first Join opens this client's session with the daemon, a stream that stays
  // open while the Client lives: when the process exits, its members leave at once.
  absl::StatusOr<v1::JoinResponse> Join(const JoinOptions& options);
  absl::Status Leave(absl::string_view group, absl::string_view name);
  absl::Status Barrier(absl::string_view group, absl::string_view name,
                       absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<v1::GroupView> GetGroup(absl::string_view group,
                                         absl::string_view init_method = "");
  absl::StatusOr<std::vector<v1::GroupView>> ListGroups();
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
  // one node"). Both attach to shared memory first (AttachSharedMemory). Handle registers
  // `handler` for `method` (replacing an earlier one); handlers run on a pool of two threads
  // of this client, never on the thread that reads the ring. Call blocks until the reply, or
  // the daemon's DEADLINE_EXCEEDED naming worker, method and deadline after `timeout`
  // (zero: options.call_timeout); NOT_FOUND names a worker with no member on this daemon
  // (calls to other daemons are not available in this build); UNAVAILABLE names a worker
  // whose session ended during the call; FAILED_PRECONDITION when this client has not joined
  // `group` (it calls as the worker it joined as last; handlers see it in Message::caller); a
  // handler's error arrives with its code, marked "remote: worker ... method ...". CallAsync
  // returns a future of the same. Payload and tensors are copied into and out of the
  // shared heaps (this first version copies; the user's data is never referenced).
  absl::Status Handle(const std::string& method, Handler handler);
  // Call without blocking; the future holds what Call would return.
  std::future<absl::StatusOr<Message>> CallAsync(const std::string& group,
                                                 const std::string& worker,
                                                 const std::string& method,
                                                 const std::string& payload,
                                                 const std::vector<Tensor>& tensors = {},
                                                 absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<Message> Call(const std::string& group, const std::string& worker,
                               const std::string& method, const std::string& payload,
                               const std::vector<Tensor>& tensors = {},
                               absl::Duration timeout = absl::ZeroDuration());

  // Admin.Status of the daemon.
  absl::StatusOr<v1::StatusResponse> Status();
  // grpc.health.v1 check of the whole daemon: true when SERVING.
  absl::StatusOr<bool> Serving();

  ~Client();

 private:
  Client(std::string socket_path, ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  // A context with the call deadline, or, for a call waiting `timeout`, one a little past
  // it so the daemon's own DEADLINE_EXCEEDED (which names the keys) arrives first.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration wait = absl::ZeroDuration(),
                                               bool waits = false) const;

  // The worker this client calls as in `group` (its latest Join there), or FAILED_PRECONDITION.
  absl::StatusOr<std::string> CallerIn(const std::string& group);
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
  std::thread session_reader_;  // drains the session stream until it ends

  absl::Mutex data_mu_;  // taken before session_mu_, never after
  std::string attached_session_ ABSL_GUARDED_BY(data_mu_);
  int data_fd_ ABSL_GUARDED_BY(data_mu_) = -1;
  std::shared_ptr<const shm::Segment> segment_ ABSL_GUARDED_BY(data_mu_);
  // Started by the first Handle or Call, on the segment attached then.
  std::shared_ptr<CallEngine> calls_ ABSL_GUARDED_BY(data_mu_);
  std::shared_ptr<const shm::Segment> calls_segment_ ABSL_GUARDED_BY(data_mu_);
  std::map<std::string, Handler> handlers_ ABSL_GUARDED_BY(data_mu_);
  absl::Mutex joined_mu_;
  std::map<std::string, std::string> joined_ ABSL_GUARDED_BY(joined_mu_);  // group -> worker
};

}  // namespace tpd

#endif  // TPD_CLIENT_CLIENT_H_
