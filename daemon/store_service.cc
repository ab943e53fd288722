#include "daemon/store_service.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/grpc_status.h"
#include "daemon/names.h"
#include "store/prefix_store.h"

namespace tpd {
namespace {

using Keys = google::protobuf::RepeatedPtrField<std::string>;
using Values = std::vector<std::string>;

// One waiting call. It finishes exactly once, when the store's callback fires (keys
// arrived, deadline, cancellation, shutdown); the client going away cancels the store wait
// so the waiter is reclaimed at once. Start() and the store callback may run on different
// threads in either order: whichever of them sees the other has happened finishes the call.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  using Fill = absl::AnyInvocable<void(Values)>;

  // `root` (the store the call reaches) stays open until the reactor is done. `sign`, when
  // set, signs the filled answer (the peer port's reply MAC).
  WaitReactor(std::shared_ptr<store::Store> root, CallStats* stats, const char* method, Fill fill,
              absl::AnyInvocable<void()> sign)
      : root_(std::move(root)),
        stats_(stats),
        method_(method),
        fill_(std::move(fill)),
        sign_(std::move(sign)) {}

  // `scoped` is the namespace's view of `root`; it is only used during this call.
  void Start(store::Store* scoped, Values keys, absl::Time deadline) {
    absl::StatusOr<store::WaitId> id =
        scoped->WaitAsync(std::move(keys), deadline,
                          [this](absl::StatusOr<Values> result) { OnWaitDone(std::move(result)); });
    bool finish_now;
    bool cancel_now;
    std::shared_ptr<store::Store> root = root_;
    {
      absl::MutexLock lock(&mu_);
      started_ = true;
      if (id.ok()) {
        id_ = *id;
      } else {
        result_ = id.status();
      }
      finish_now = result_.has_value();
      cancel_now = !finish_now && cancelled_;
    }
    // Past this point `this` may already be deleted unless finish_now: use locals only.
    if (finish_now) {
      Complete();
    } else if (cancel_now) {
      root->CancelWait(*id);
    }
  }

  void OnCancel() override {
    store::WaitId id;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!started_ || result_.has_value()) return;
      id = id_;
    }
    // gRPC runs OnDone only after this reaction returns, so `this` is still alive.
    root_->CancelWait(id);
  }

  void OnDone() override { delete this; }

 private:
  void OnWaitDone(absl::StatusOr<Values> result) {
    bool finish_now;
    {
      absl::MutexLock lock(&mu_);
      result_ = std::move(result);
      finish_now = started_;
    }
    if (finish_now) Complete();
  }

  // Runs once; result_ no longer changes.
  void Complete() {
    absl::Status status = result_->status();
    if (status.ok()) {
      fill_(*std::move(*result_));
      if (sign_) sign_();
    }
    stats_->Record(method_, status);
    Finish(ToGrpcStatus(status));
  }

  const std::shared_ptr<store::Store> root_;
  CallStats* const stats_;
  const char* const method_;
  Fill fill_;
  absl::AnyInvocable<void()> sign_;

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  store::WaitId id_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::StatusOr<Values>> result_;  // written once, under mu_
};

Values ToVector(const Keys& keys) { return Values(keys.begin(), keys.end()); }

std::string Quoted(absl::string_view key) {
  return absl::StrCat("\"", absl::CEscape(key.substr(0, 64)), key.size() > 64 ? "...\"" : "\"");
}

}  // namespace

StoreService::StoreService(store::Store* root, const StoreConfig& limits, CallStats* stats,
                           PeerAuth* peer_auth)
    : root_(root), limits_(limits), stats_(stats), auth_(peer_auth) {}

absl::StatusOr<StoreService::Scoped> StoreService::Admit(const grpc::CallbackServerContext& context,
                                                         const char* method,
                                                         const google::protobuf::Message& request,
                                                         const std::string& name_space) {
  absl::StatusOr<std::shared_ptr<store::Store>> owner = Reached(context, method, request);
  if (!owner.ok()) return owner.status();
  if (absl::Status status = CheckNamespace(method, name_space); !status.ok()) return status;
  store::PrefixStore view(name_space, owner->get());
  return Scoped{*std::move(owner), std::move(view)};
}

absl::StatusOr<std::shared_ptr<store::Store>> StoreService::Root(const std::string* session_id) {
  // The root store is the daemon's and outlives every call: nothing to own.
  if (!charged_root_) {
    return std::shared_ptr<store::Store>(std::shared_ptr<void>(), root_);
  }
  std::optional<int64_t> uid;
  if (session_id != nullptr) {
    absl::StatusOr<int64_t> bound = session_uid_(*session_id);
    if (!bound.ok()) return bound.status();
    uid = *bound;
  }
  absl::MutexLock lock(&roots_mu_);
  std::shared_ptr<store::Store>& root = uid ? uid_roots_[*uid] : sessionless_root_;
  if (root == nullptr) {
    root = uid ? charged_root_({absl::StrCat("uid ", *uid), limits_.max_bytes_per_uid,
                                limits_.max_keys_per_uid, limits_.max_waiters_per_uid, "per_uid"})
               : charged_root_({"callers without a session", limits_.max_bytes_without_session,
                                limits_.max_keys_without_session,
                                limits_.max_waiters_without_session, "without_session"});
  }
  return root;
}

std::shared_ptr<store::Store> StoreService::PeerRoot(const std::optional<store::StoreUser>& user) {
  if (!user.has_value() || !charged_root_) {
    return std::shared_ptr<store::Store>(std::shared_ptr<void>(), root_);
  }
  absl::MutexLock lock(&roots_mu_);
  std::shared_ptr<store::Store>& root = peer_user_roots_[{user->uid, user->node}];
  if (root == nullptr) {
    root = charged_root_({absl::StrCat("uid ", user->uid, " of node ", user->node),
                          limits_.max_bytes_per_uid, limits_.max_keys_per_uid,
                          limits_.max_waiters_per_uid, "per_uid"});
  }
  return root;
}

absl::StatusOr<std::shared_ptr<store::Store>> StoreService::Reached(
    const grpc::CallbackServerContext& context, const char* method,
    const google::protobuf::Message& request) {
  std::optional<store::StoreUser> on_behalf;
  if (auth_ != nullptr) {
    absl::Status admitted =
        auth_->Admit(context, absl::StrCat("/", v1::Store::service_full_name(), "/", method),
                     request, &on_behalf);
    if (!admitted.ok()) return admitted;
  }
  const auto& metadata = context.client_metadata();
  auto group = metadata.find(kStoreGroupMetadata);
  auto session = metadata.find(kStoreSessionMetadata);
  if (group == metadata.end()) {
    if (auth_ != nullptr) return PeerRoot(on_behalf);
    if (session == metadata.end()) return Root(nullptr);
    const std::string id(session->second.data(), session->second.size());
    return Root(&id);
  }
  if (auth_ != nullptr) {
    return absl::InvalidArgumentError(
        "a group's store is served to local clients on the daemon's unix socket, not to peers");
  }
  const std::string name(group->second.data(), group->second.size());
  if (absl::Status valid = ValidateGroupName(absl::StrCat("metadata ", kStoreGroupMetadata), name);
      !valid.ok()) {
    return valid;
  }
  if (session == metadata.end() || session->second.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("a request for group '", name, "''s store must carry its session (metadata ",
                     kStoreSessionMetadata, "): join the group first"));
  }
  if (!group_stores_) {
    return absl::FailedPreconditionError("this daemon serves no group stores");
  }
  return group_stores_(std::string(session->second.data(), session->second.size()), name);
}

grpc::ServerUnaryReactor* StoreService::Reply(grpc::CallbackServerContext* context,
                                              const char* method, const absl::Status& status,
                                              const google::protobuf::Message* response) {
  stats_->Record(method, status);
  if (auth_ != nullptr && status.ok() && response != nullptr) auth_->SignReply(context, *response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

absl::Status StoreService::CheckKey(absl::string_view key) const {
  if (key.empty()) return absl::InvalidArgumentError("key must not be empty");
  if (static_cast<int64_t>(key.size()) > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("key ", Quoted(key), " is ", key.size(),
                                                   " bytes; the limit store.max_key_bytes is ",
                                                   limits_.max_key_bytes));
  }
  return absl::OkStatus();
}

// Before the namespace is copied into any key (PrefixStore): it is bounded and printable.
absl::Status StoreService::CheckNamespace(absl::string_view method,
                                          absl::string_view name_space) const {
  return ValidateNamespace(absl::StrCat(method, "Request.namespace"), name_space,
                           limits_.max_namespace_bytes);
}

absl::Status StoreService::CheckKeys(const Keys& keys) const {
  if (keys.empty()) return absl::InvalidArgumentError("at least one key is required");
  if (keys.size() > limits_.max_keys_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request names ", keys.size(), " keys; the limit store.max_keys_per_request is ",
        limits_.max_keys_per_request));
  }
  for (const std::string& key : keys) {
    if (absl::Status status = CheckKey(key); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status StoreService::CheckValue(absl::string_view key, size_t size) const {
  if (static_cast<int64_t>(size) > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("value for key ", Quoted(key), " is ", size,
                                                     " bytes; the limit store.max_value_bytes is ",
                                                     limits_.max_value_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Time> StoreService::WaitDeadline(const grpc::CallbackServerContext* context,
                                                      int64_t timeout_ms) const {
  if (timeout_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms must be >= 0 (0 uses the daemon's default), got ", timeout_ms));
  }
  const absl::Duration timeout =
      timeout_ms == 0 ? limits_.default_timeout : absl::Milliseconds(timeout_ms);
  absl::Time deadline = absl::Now() + timeout;
  if (context != nullptr && context->deadline() != std::chrono::system_clock::time_point::max()) {
    deadline = std::min(deadline, absl::FromChrono(context->deadline()));
  }
  return deadline;
}

template <typename OnValues>
grpc::ServerUnaryReactor* StoreService::WaitFor(grpc::CallbackServerContext* context,
                                                const char* method, Scoped scope, const Keys& keys,
                                                int64_t timeout_ms,
                                                const google::protobuf::Message* response,
                                                OnValues on_values) {
  if (absl::Status status = CheckKeys(keys); !status.ok()) return Reply(context, method, status);
  absl::StatusOr<absl::Time> deadline = WaitDeadline(context, timeout_ms);
  if (!deadline.ok()) return Reply(context, method, deadline.status());
  absl::AnyInvocable<void()> sign;
  if (auth_ != nullptr) {
    sign = [auth = auth_, context, response] { auth->SignReply(context, *response); };
  }
  auto* reactor = new WaitReactor(std::move(scope.owner), stats_, method, std::move(on_values),
                                  std::move(sign));
  reactor->Start(&scope.view, ToVector(keys), *deadline);
  return reactor;
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* StoreService::Simple(grpc::CallbackServerContext* context,
                                               const char* method, const Request& request,
                                               Response* response, Work<Request, Response> work) {
  absl::StatusOr<Scoped> scope = Admit(*context, method, request, request.namespace_());
  if (!scope.ok()) return Reply(context, method, scope.status());
  return Reply(context, method, (this->*work)(scope->view, request, response), response);
}

// --- What each method does once its store is reached, for both transports ---

absl::Status StoreService::DoSet(store::Store& view, const v1::SetRequest& request,
                                 v1::SetResponse*) const {
  absl::Status status = CheckKey(request.key());
  if (status.ok()) status = CheckValue(request.key(), request.value().size());
  if (status.ok()) status = view.Set(request.key(), request.value());
  return status;
}

absl::Status StoreService::DoAdd(store::Store& view, const v1::AddRequest& request,
                                 v1::AddResponse* response) const {
  if (absl::Status status = CheckKey(request.key()); !status.ok()) return status;
  absl::StatusOr<int64_t> sum = view.Add(request.key(), request.delta());
  if (sum.ok()) response->set_value(*sum);
  return sum.status();
}

absl::Status StoreService::DoCompareSet(store::Store& view, const v1::CompareSetRequest& request,
                                        v1::CompareSetResponse* response) const {
  absl::Status status = CheckKey(request.key());
  if (status.ok()) status = CheckValue(request.key(), request.desired_value().size());
  if (!status.ok()) return status;
  absl::StatusOr<std::string> value =
      view.CompareSet(request.key(), request.expected_value(), request.desired_value());
  if (value.ok()) response->set_value(*std::move(value));
  return value.status();
}

absl::Status StoreService::DoCheck(store::Store& view, const v1::CheckRequest& request,
                                   v1::CheckResponse* response) const {
  if (absl::Status status = CheckKeys(request.keys()); !status.ok()) return status;
  absl::StatusOr<bool> ready = view.Check(ToVector(request.keys()));
  if (ready.ok()) response->set_ready(*ready);
  return ready.status();
}

absl::Status StoreService::DoDeleteKey(store::Store& view, const v1::DeleteKeyRequest& request,
                                       v1::DeleteKeyResponse* response) const {
  if (absl::Status status = CheckKey(request.key()); !status.ok()) return status;
  absl::StatusOr<bool> deleted = view.DeleteKey(request.key());
  if (deleted.ok()) response->set_deleted(*deleted);
  return deleted.status();
}

absl::Status StoreService::DoNumKeys(store::Store& view, const v1::NumKeysRequest& request,
                                     v1::NumKeysResponse* response) const {
  if (static_cast<int64_t>(request.prefix().size()) > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("NumKeysRequest.prefix is ", request.prefix().size(),
                     " bytes; the limit store.max_key_bytes is ", limits_.max_key_bytes));
  }
  absl::StatusOr<int64_t> count = view.NumKeys(request.prefix());
  if (count.ok()) response->set_num_keys(*count);
  return count.status();
}

absl::Status StoreService::DoMultiSet(store::Store& view, const v1::MultiSetRequest& request,
                                      v1::MultiSetResponse*) const {
  absl::Status status = CheckKeys(request.keys());
  if (status.ok() && request.keys_size() != request.values_size()) {
    status = absl::InvalidArgumentError(absl::StrCat("multi_set needs one value per key: got ",
                                                     request.keys_size(), " keys and ",
                                                     request.values_size(), " values"));
  }
  for (int i = 0; status.ok() && i < request.values_size(); ++i) {
    status = CheckValue(request.keys(i), request.values(i).size());
  }
  if (status.ok()) status = view.MultiSet(ToVector(request.keys()), ToVector(request.values()));
  return status;
}

absl::Status StoreService::DoAppend(store::Store& view, const v1::AppendRequest& request,
                                    v1::AppendResponse*) const {
  absl::Status status = CheckKey(request.key());
  if (status.ok()) status = CheckValue(request.key(), request.value().size());
  if (status.ok()) status = view.Append(request.key(), request.value());
  return status;
}

// --- gRPC ---

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* context,
                                            const v1::SetRequest* request,
                                            v1::SetResponse* response) {
  return Simple(context, "Set", *request, response, &StoreService::DoSet);
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* context,
                                            const v1::GetRequest* request,
                                            v1::GetResponse* response) {
  absl::StatusOr<Scoped> scope = Admit(*context, "Get", *request, request->namespace_());
  if (!scope.ok()) return Reply(context, "Get", scope.status());
  Keys keys;
  keys.Add()->assign(request->key());
  return WaitFor(context, "Get", *std::move(scope), keys, request->timeout_ms(), response,
                 [response](Values values) { response->set_value(std::move(values[0])); });
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* context,
                                            const v1::AddRequest* request,
                                            v1::AddResponse* response) {
  return Simple(context, "Add", *request, response, &StoreService::DoAdd);
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* context,
                                                   const v1::CompareSetRequest* request,
                                                   v1::CompareSetResponse* response) {
  return Simple(context, "CompareSet", *request, response, &StoreService::DoCompareSet);
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* context,
                                             const v1::WaitRequest* request,
                                             v1::WaitResponse* response) {
  absl::StatusOr<Scoped> scope = Admit(*context, "Wait", *request, request->namespace_());
  if (!scope.ok()) return Reply(context, "Wait", scope.status());
  return WaitFor(context, "Wait", *std::move(scope), request->keys(), request->timeout_ms(),
                 response, [](Values) {});
}

grpc::ServerUnaryReactor* StoreService::Check(grpc::CallbackServerContext* context,
                                              const v1::CheckRequest* request,
                                              v1::CheckResponse* response) {
  return Simple(context, "Check", *request, response, &StoreService::DoCheck);
}

grpc::ServerUnaryReactor* StoreService::DeleteKey(grpc::CallbackServerContext* context,
                                                  const v1::DeleteKeyRequest* request,
                                                  v1::DeleteKeyResponse* response) {
  return Simple(context, "DeleteKey", *request, response, &StoreService::DoDeleteKey);
}

grpc::ServerUnaryReactor* StoreService::NumKeys(grpc::CallbackServerContext* context,
                                                const v1::NumKeysRequest* request,
                                                v1::NumKeysResponse* response) {
  return Simple(context, "NumKeys", *request, response, &StoreService::DoNumKeys);
}

grpc::ServerUnaryReactor* StoreService::MultiGet(grpc::CallbackServerContext* context,
                                                 const v1::MultiGetRequest* request,
                                                 v1::MultiGetResponse* response) {
  absl::StatusOr<Scoped> scope = Admit(*context, "MultiGet", *request, request->namespace_());
  if (!scope.ok()) return Reply(context, "MultiGet", scope.status());
  return WaitFor(context, "MultiGet", *std::move(scope), request->keys(), request->timeout_ms(),
                 response, [response](Values values) {
                   for (std::string& value : values) response->add_values(std::move(value));
                 });
}

grpc::ServerUnaryReactor* StoreService::MultiSet(grpc::CallbackServerContext* context,
                                                 const v1::MultiSetRequest* request,
                                                 v1::MultiSetResponse* response) {
  return Simple(context, "MultiSet", *request, response, &StoreService::DoMultiSet);
}

grpc::ServerUnaryReactor* StoreService::Append(grpc::CallbackServerContext* context,
                                               const v1::AppendRequest* request,
                                               v1::AppendResponse* response) {
  return Simple(context, "Append", *request, response, &StoreService::DoAppend);
}

// --- Shared memory (ServeLocal) ---

template <typename Request, typename Response>
void StoreService::LocalCall(const char* method, const std::string& bytes,
                             const std::shared_ptr<store::Store>& owner, LocalDone& done,
                             Work<Request, Response> work) {
  Request request;
  Response response;
  absl::Status status = Parse(method, bytes, &request);
  if (status.ok()) status = CheckNamespace(method, request.namespace_());
  if (status.ok()) {
    store::PrefixStore view(request.namespace_(), owner.get());
    status = (this->*work)(view, request, &response);
  }
  stats_->Record(method, status);
  done(status, status.ok() ? response.SerializeAsString() : std::string());
}

template <typename Request, typename Response, typename KeysOf, typename Fill>
void StoreService::LocalWait(const char* method, const std::string& bytes,
                             std::shared_ptr<store::Store> owner, LocalDone done, KeysOf keys_of,
                             Fill fill) {
  Request request;
  absl::Status status = Parse(method, bytes, &request);
  if (status.ok()) status = CheckNamespace(method, request.namespace_());
  Keys keys;
  if (status.ok()) {
    keys = keys_of(request);
    status = CheckKeys(keys);
  }
  absl::StatusOr<absl::Time> deadline =
      status.ok() ? WaitDeadline(nullptr, request.timeout_ms()) : status;
  if (!deadline.ok()) {
    stats_->Record(method, deadline.status());
    done(deadline.status(), std::string());
    return;
  }
  store::PrefixStore view(request.namespace_(), owner.get());
  // The callback may run before WaitAsync returns (keys already there) or on the store's
  // thread later; it keeps the store open and answers once.
  auto answer = std::make_shared<LocalDone>(std::move(done));
  absl::StatusOr<store::WaitId> waiting = view.WaitAsync(
      ToVector(keys), *deadline,
      [this, owner, answer, method, fill](absl::StatusOr<Values> values) {
        Response response;
        if (values.ok()) fill(*std::move(values), &response);
        stats_->Record(method, values.status());
        (*answer)(values.status(), values.ok() ? response.SerializeAsString() : std::string());
      });
  if (!waiting.ok()) {
    stats_->Record(method, waiting.status());
    (*answer)(waiting.status(), std::string());
  }
}

template <typename Request>
absl::Status StoreService::Parse(const char* method, const std::string& bytes, Request* request) {
  if (request->ParseFromString(bytes)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "a ", method, "Request over shared memory that does not parse (", bytes.size(), " bytes)"));
}

absl::StatusOr<std::shared_ptr<store::Store>> StoreService::LocalStore(
    const std::string& session_id, const std::string& group) {
  if (group.empty()) return Root(&session_id);
  if (absl::Status valid = ValidateGroupName("the store call's group", group); !valid.ok()) {
    return valid;
  }
  if (!group_stores_) return absl::FailedPreconditionError("this daemon serves no group stores");
  return group_stores_(session_id, group);
}

void StoreService::ServeLocal(const std::string& session_id, const std::string& group,
                              const std::string& method, const std::string& request,
                              LocalDone done) {
  absl::StatusOr<std::shared_ptr<store::Store>> owner = LocalStore(session_id, group);
  if (!owner.ok()) {
    done(owner.status(), std::string());
    return;
  }
  // Each method as over gRPC (the Do* functions), with the request and response as bytes.
  if (method == "Set") {
    LocalCall("Set", request, *owner, done, &StoreService::DoSet);
  } else if (method == "Add") {
    LocalCall("Add", request, *owner, done, &StoreService::DoAdd);
  } else if (method == "CompareSet") {
    LocalCall("CompareSet", request, *owner, done, &StoreService::DoCompareSet);
  } else if (method == "Check") {
    LocalCall("Check", request, *owner, done, &StoreService::DoCheck);
  } else if (method == "DeleteKey") {
    LocalCall("DeleteKey", request, *owner, done, &StoreService::DoDeleteKey);
  } else if (method == "NumKeys") {
    LocalCall("NumKeys", request, *owner, done, &StoreService::DoNumKeys);
  } else if (method == "MultiSet") {
    LocalCall("MultiSet", request, *owner, done, &StoreService::DoMultiSet);
  } else if (method == "Append") {
    LocalCall("Append", request, *owner, done, &StoreService::DoAppend);
  } else if (method == "Get") {
    LocalWait<v1::GetRequest, v1::GetResponse>(
        "Get", request, *std::move(owner), std::move(done),
        [](const v1::GetRequest& r) {
          Keys keys;
          keys.Add()->assign(r.key());
          return keys;
        },
        [](Values values, v1::GetResponse* out) { out->set_value(std::move(values[0])); });
  } else if (method == "Wait") {
    LocalWait<v1::WaitRequest, v1::WaitResponse>(
        "Wait", request, *std::move(owner), std::move(done),
        [](const v1::WaitRequest& r) { return r.keys(); }, [](Values, v1::WaitResponse*) {});
  } else if (method == "MultiGet") {
    LocalWait<v1::MultiGetRequest, v1::MultiGetResponse>(
        "MultiGet", request, *std::move(owner), std::move(done),
        [](const v1::MultiGetRequest& r) { return r.keys(); },
        [](Values values, v1::MultiGetResponse* out) {
          for (std::string& value : values) out->add_values(std::move(value));
        });
  } else {
    done(absl::UnimplementedError(
             absl::StrCat("the store has no method '", absl::CEscape(method), "'")),
         std::string());
  }
}

}  // namespace tpd
