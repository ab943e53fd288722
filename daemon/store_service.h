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
// Thread safety: thread-safe; gRPC calls the handlers from its own threads.

#ifndef TPD_DAEMON_STORE_SERVICE_H_
#define TPD_DAEMON_STORE_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "daemon/call_stats.h"
#include "daemon/config.h"
#include "daemon/peer_auth.h"
#include "proto/store.grpc.pb.h"
#include "proto/store_scope.h"
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

 private:
  // The store a call reaches, seen under its request's namespace; `owner` keeps a group's
  // store open while the call uses it.
  struct Scoped {
    std::shared_ptr<store::Store> owner;
    store::PrefixStore view;
  };
  // Finishes a call that does not wait, counting it.
  grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, const char* method,
                                  const absl::Status& status);
  // Parks a waiting call in the store; `on_values` fills the response once keys arrive.
  template <typename OnValues>
  grpc::ServerUnaryReactor* WaitFor(grpc::CallbackServerContext* context, const char* method,
                                    Scoped scope,
                                    const google::protobuf::RepeatedPtrField<std::string>& keys,
                                    int64_t timeout_ms, OnValues on_values);

  // Admits the call (on the peer port, PeerAuth's verdict on its MAC), finds the store it
  // reaches and checks its namespace.
  absl::StatusOr<Scoped> Admit(const grpc::CallbackServerContext& context, const char* method,
                               const google::protobuf::Message& request,
                               const std::string& name_space);
  // The store the call reaches: the root, or the group its metadata names.
  absl::StatusOr<std::shared_ptr<store::Store>> Reached(const grpc::CallbackServerContext& context,
                                                        const char* method,
                                                        const google::protobuf::Message& request);
  // `method` names the request in the message ("SetRequest.namespace").
  absl::Status CheckNamespace(absl::string_view method, absl::string_view name_space) const;
  absl::Status CheckKey(absl::string_view key) const;
  absl::Status CheckKeys(const google::protobuf::RepeatedPtrField<std::string>& keys) const;
  absl::Status CheckValue(absl::string_view key, size_t size) const;
  // The wait's deadline: now + timeout_ms (0 = the default), capped by the call's deadline.
  absl::StatusOr<absl::Time> WaitDeadline(const grpc::CallbackServerContext* context,
                                          int64_t timeout_ms) const;

  store::Store* const root_;
  const StoreConfig limits_;
  CallStats* const stats_;
  PeerAuth* const auth_;
  GroupStores group_stores_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_STORE_SERVICE_H_
