// tpd.v1.Store: the c10d store over gRPC, for local clients on the unix socket.
//
// Waiting calls (Get, Wait, MultiGet) hold no server thread while they wait: each is a
// reactor parked in the store until its keys arrive, its deadline passes, or the client
// cancels. Every request is checked against the configured limits before it touches the
// store; a rejected request answers INVALID_ARGUMENT or RESOURCE_EXHAUSTED naming the limit.
//
// A request carrying the metadata `tpd-group` (and `tpd-session`, the caller's session id:
// proto/store_scope.h)
// reaches that group's store instead: its rendezvous store (tcp://, file:// or etcd://), under
// keys of its own ("tpd/group/<group>/store/..."), shared by its members on every node. Only
// a session holding a member of the group may use it (docs/security.md, "A group's store"),
// and only on the unix socket.
//
// Local clients attached to shared memory send the same requests through their session's
// rings instead (ServeLocal, called by the call router: docs/data_plane.md, "The store over
// shared memory"); each method does the same work either way (the Do* functions).
//
// Thread safety: thread-safe; gRPC calls the handlers from its own threads.

#ifndef TPD_DAEMON_STORE_SERVICE_H_
#define TPD_DAEMON_STORE_SERVICE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "daemon/call_stats.h"
#include "daemon/config.h"
#include "daemon/peer_auth.h"
#include "proto/store.grpc.pb.h"
#include "proto/store_scope.h"
#include "store/memory/memory_store.h"
#include "store/prefix_store.h"
#include "store/store.h"

namespace tpd {

class StoreService final : public v1::Store::CallbackService {
 public:
  // The store of `group` for `session_id`, or why that session may not use it. The returned
  // pointer keeps the store open while a call uses it.
  using GroupStores = std::function<absl::StatusOr<std::shared_ptr<store::Store>>(
      const std::string& session_id, const std::string& group)>;

  // `root` and `stats` must outlive the service. Namespaces are PrefixStores over `root`.
  // With `peer_auth` (the peer-port instance) every call must pass it; it must outlive the
  // service.
  StoreService(store::Store* root, const StoreConfig& limits, CallStats* stats,
               PeerAuth* peer_auth = nullptr);
  // How requests naming a group find its store; set once, before the service serves (without
  // it they are FAILED_PRECONDITION).
  void set_group_stores(GroupStores group_stores) { group_stores_ = std::move(group_stores); }

  // The daemon's store as the writer of `share` reaches it (MemoryStore::ChargedTo under the
  // client view), and the uid a session is bound to.
  using ChargedRoot = std::function<std::shared_ptr<store::Store>(store::StoreShare share)>;
  using SessionUid = std::function<absl::StatusOr<int64_t>(const std::string& session_id)>;
  // Charges the daemon's store to its writers (docs/security.md, "Per-user bounds"): a call of
  // a session (over shared memory, or over gRPC with the metadata `tpd-session`) to its uid's
  // share, any other to the share of callers without a session. On the peer port (no
  // `session_uid` needed), a call a peer makes on behalf of one of its node's users to that
  // user's share, "uid U of node N"; the peer daemons' own calls reach `root` as it is. Set
  // once, before the service serves; without it every call reaches `root` as it is.
  void set_charging(ChargedRoot charged_root, SessionUid session_uid = nullptr) {
    charged_root_ = std::move(charged_root);
    session_uid_ = std::move(session_uid);
  }

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context, const v1::SetRequest* request,
                                v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context, const v1::GetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context, const v1::AddRequest* request,
                                v1::AddResponse* response) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* context,
                                       const v1::CompareSetRequest* request,
                                       v1::CompareSetResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::WaitRequest* request,
                                 v1::WaitResponse* response) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const v1::CheckRequest* request,
                                  v1::CheckResponse* response) override;
  grpc::ServerUnaryReactor* DeleteKey(grpc::CallbackServerContext* context,
                                      const v1::DeleteKeyRequest* request,
                                      v1::DeleteKeyResponse* response) override;
  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* context,
                                    const v1::NumKeysRequest* request,
                                    v1::NumKeysResponse* response) override;
  grpc::ServerUnaryReactor* MultiGet(grpc::CallbackServerContext* context,
                                     const v1::MultiGetRequest* request,
                                     v1::MultiGetResponse* response) override;
  grpc::ServerUnaryReactor* MultiSet(grpc::CallbackServerContext* context,
                                     const v1::MultiSetRequest* request,
                                     v1::MultiSetResponse* response) override;
  grpc::ServerUnaryReactor* Append(grpc::CallbackServerContext* context,
                                   const v1::AppendRequest* request,
                                   v1::AppendResponse* response) override;

  // The answer to a call over shared memory: its status and, when OK, the serialized response.
  using LocalDone = absl::AnyInvocable<void(absl::Status, std::string)>;
  // A Store call of session `session_id` that came through its rings: `method` ("Set", "Get",
  // ...), the serialized request, and `group` ("" for the daemon's store, else that group's,
  // which the session must hold a member of). `done` runs once: at once, or when a waiting
  // call's keys arrive or its deadline passes (on the store's thread). UNIMPLEMENTED for a
  // method the Store service does not have; INVALID_ARGUMENT for a request that does not
  // parse; else what the gRPC method answers.
  void ServeLocal(const std::string& session_id, const std::string& group,
                  const std::string& method, const std::string& request, LocalDone done);

 private:
  // The store a call reaches, seen under its request's namespace; `owner` keeps a group's
  // store open while the call uses it.
  struct Scoped {
    std::shared_ptr<store::Store> owner;
    store::PrefixStore view;
  };
  // Finishes a call that does not wait, counting it; on the peer port a successful answer
  // (`response`) is signed.
  grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, const char* method,
                                  const absl::Status& status,
                                  const google::protobuf::Message* response = nullptr);
  // Parks a waiting call in the store; `on_values` fills `response` once keys arrive.
  template <typename OnValues>
  grpc::ServerUnaryReactor* WaitFor(grpc::CallbackServerContext* context, const char* method,
                                    Scoped scope,
                                    const google::protobuf::RepeatedPtrField<std::string>& keys,
                                    int64_t timeout_ms, const google::protobuf::Message* response,
                                    OnValues on_values);

  // Admits the call (on the peer port, PeerAuth's verdict on its MAC), finds the store it
  // reaches and checks its namespace.
  absl::StatusOr<Scoped> Admit(const grpc::CallbackServerContext& context, const char* method,
                               const google::protobuf::Message& request,
                               const std::string& name_space);
  // The daemon's store as this caller reaches it: charged to the uid of `session_id`, or to
  // callers without a session when it is null (the root as it is without set_charging).
  absl::StatusOr<std::shared_ptr<store::Store>> Root(const std::string* session_id);
  // The daemon's store as a peer's call reaches it: charged to `user` when the call was made
  // on its behalf (with set_charging), else the root as it is.
  std::shared_ptr<store::Store> PeerRoot(const std::optional<store::StoreUser>& user);
  // The store the call reaches: the root, or the group its metadata names.
  absl::StatusOr<std::shared_ptr<store::Store>> Reached(const grpc::CallbackServerContext& context,
                                                        const char* method,
                                                        const google::protobuf::Message& request);
  // `method` names the request in the message ("SetRequest.namespace").
  absl::Status CheckNamespace(absl::string_view method, absl::string_view name_space) const;
  absl::Status CheckKey(absl::string_view key) const;
  absl::Status CheckKeys(const google::protobuf::RepeatedPtrField<std::string>& keys) const;
  absl::Status CheckValue(absl::string_view key, size_t size) const;
  // What a method that does not wait does once its store is reached (one of the Do*).
  template <typename Request, typename Response>
  using Work = absl::Status (StoreService::*)(store::Store& view, const Request& request,
                                              Response* response) const;
  // Admit, then `work` and Reply: a method that does not wait.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* Simple(grpc::CallbackServerContext* context, const char* method,
                                   const Request& request, Response* response,
                                   Work<Request, Response> work);
  // What each method that does not wait does to the store it reached, for either transport.
  absl::Status DoSet(store::Store& view, const v1::SetRequest& request, v1::SetResponse*) const;
  absl::Status DoAdd(store::Store& view, const v1::AddRequest& request,
                     v1::AddResponse* response) const;
  absl::Status DoCompareSet(store::Store& view, const v1::CompareSetRequest& request,
                            v1::CompareSetResponse* response) const;
  absl::Status DoCheck(store::Store& view, const v1::CheckRequest& request,
                       v1::CheckResponse* response) const;
  absl::Status DoDeleteKey(store::Store& view, const v1::DeleteKeyRequest& request,
                           v1::DeleteKeyResponse* response) const;
  absl::Status DoNumKeys(store::Store& view, const v1::NumKeysRequest& request,
                         v1::NumKeysResponse* response) const;
  absl::Status DoMultiSet(store::Store& view, const v1::MultiSetRequest& request,
                          v1::MultiSetResponse*) const;
  absl::Status DoAppend(store::Store& view, const v1::AppendRequest& request,
                        v1::AppendResponse*) const;
  // ServeLocal's parts: the store a session's call reaches; a request parsed; a method that
  // does not wait; one that waits for `keys_of(request)` and fills its response from the
  // values.
  absl::StatusOr<std::shared_ptr<store::Store>> LocalStore(const std::string& session_id,
                                                           const std::string& group);
  template <typename Request>
  static absl::Status Parse(const char* method, const std::string& bytes, Request* request);
  template <typename Request, typename Response>
  void LocalCall(const char* method, const std::string& bytes,
                 const std::shared_ptr<store::Store>& owner, LocalDone& done,
                 Work<Request, Response> work);
  template <typename Request, typename Response, typename KeysOf, typename Fill>
  void LocalWait(const char* method, const std::string& bytes, std::shared_ptr<store::Store> owner,
                 LocalDone done, KeysOf keys_of, Fill fill);
  // The wait's deadline: now + timeout_ms (0 = the default), capped by the gRPC call's
  // deadline (`context` null: a call through the rings, which has none).
  absl::StatusOr<absl::Time> WaitDeadline(const grpc::CallbackServerContext* context,
                                          int64_t timeout_ms) const;

  store::Store* const root_;
  const StoreConfig limits_;
  CallStats* const stats_;
  PeerAuth* const auth_;
  GroupStores group_stores_;
  ChargedRoot charged_root_;
  SessionUid session_uid_;
  absl::Mutex roots_mu_;
  // One charged view per uid that called (a few dozen bytes each), and one for callers
  // without a session.
  absl::flat_hash_map<int64_t, std::shared_ptr<store::Store>> uid_roots_ ABSL_GUARDED_BY(roots_mu_);
  std::shared_ptr<store::Store> sessionless_root_ ABSL_GUARDED_BY(roots_mu_);
  // On the peer port: one per user of another node that called (token holders only name
  // them).
  absl::flat_hash_map<std::pair<int64_t, std::string>, std::shared_ptr<store::Store>>
      peer_user_roots_ ABSL_GUARDED_BY(roots_mu_);
};

}  // namespace tpd

#endif  // TPD_DAEMON_STORE_SERVICE_H_
