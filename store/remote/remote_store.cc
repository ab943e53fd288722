#include "store/remote/remote_store.h"

#include <cstdint>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/hmac.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace tpd::store {

// The gRPC call state of one wait; shared by the call's completion callback and CancelWait.
struct RemoteStore::PendingWait {
  WaitId id = 0;
  grpc::ClientContext context;
  v1::MultiGetRequest request;
  v1::MultiGetResponse response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::MultiGetResponse>> call;
  std::string call_mac;
  WaitCallback done;
};

RemoteStore::RemoteStore(std::string address, RemoteStoreOptions options)
    : address_(std::move(address)),
      options_(std::move(options)),
      signer_(options_.token, address_) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options_.tls_root_certs.empty()) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = options_.tls_root_certs;
    tls.pem_cert_chain = options_.tls_cert_chain;
    tls.pem_private_key = options_.tls_private_key;
    credentials = grpc::SslCredentials(tls);
    if (!options_.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options_.tls_server_name);
    }
  }
  stub_ = v1::Store::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("dns:///", address_), credentials, args));
}

absl::StatusOr<std::unique_ptr<RemoteStore>> RemoteStore::Create(std::string address,
                                                                 RemoteStoreOptions options) {
  std::unique_ptr<RemoteStore> store(new RemoteStore(std::move(address), std::move(options)));
  // Past a pids limit the start throws: the join that needed this store fails, the daemon
  // keeps serving.
  try {
    store->cq_thread_ = std::thread([raw = store.get()] { raw->DrainCompletions(); });
  } catch (const std::system_error& error) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot start a thread for the store at ",
                                                     store->address_, ": ", error.what()));
  }
  return store;
}

void RemoteStore::DrainCompletions() {
  void* tag;
  bool ok;
  while (cq_.Next(&tag, &ok)) {
    std::shared_ptr<PendingWait> wait;
    {
      absl::MutexLock lock(&mu_);
      auto it = waits_.find(reinterpret_cast<uintptr_t>(tag));
      wait = std::move(it->second);
      waits_.erase(it);
    }
    absl::Status result = Answer(wait->context, wait->status, wait->call_mac, wait->response);
    if (result.ok()) {
      wait->done(
          std::vector<std::string>(wait->response.values().begin(), wait->response.values().end()));
    } else {
      wait->done(result);
    }
  }
}

RemoteStore::~RemoteStore() {
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, wait] : waits_) wait->context.TryCancel();
  }
  // Every call started has one completion still to come; the queue drains them, then ends.
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](absl::flat_hash_map<WaitId, std::shared_ptr<PendingWait>>* waits) {
          return waits->empty();
        },
        &waits_));
  }
  cq_.Shutdown();
  cq_thread_.join();
}

std::string RemoteStore::Sign(grpc::ClientContext* context, const OnBehalf& user,
                              const char* method, const google::protobuf::Message& request) {
  if (options_.token.empty()) return "";
  SignedCall call = signer_.SignCall(absl::StrCat("/", v1::Store::service_full_name(), "/", method),
                                     request, user);
  context->AddMetadata(kPeerAuthHeader, call.header);
  return std::move(call.mac);
}

template <typename Request, typename Response>
absl::Status RemoteStore::Unary(const OnBehalf& user, const char* method,
                                grpc::Status (v1::Store::Stub::*invoke)(grpc::ClientContext*,
                                                                        const Request&, Response*),
                                const Request& request, Response* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  const std::string call_mac = Sign(&context, user, method, request);
  const grpc::Status status = (stub_.get()->*invoke)(&context, request, response);
  return Answer(context, status, call_mac, *response);
}

absl::Status RemoteStore::Answer(const grpc::ClientContext& context, const grpc::Status& status,
                                 const std::string& call_mac,
                                 const google::protobuf::Message& response) const {
  if (!status.ok() || options_.token.empty()) return FromGrpc(status);
  const auto& trailers = context.GetServerTrailingMetadata();
  auto header = trailers.find(kPeerReplyHeader);
  absl::StatusOr<std::string> mac =
      header == trailers.end()
          ? absl::NotFoundError(absl::StrCat("no ", kPeerReplyHeader, " trailer"))
          : ParsePeerReplyHeader(absl::string_view(header->second.data(), header->second.size()));
  if (mac.ok() && ConstantTimeEquals(*mac, ComputeReplyMac(options_.token, call_mac, response))) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(absl::StrCat(
      "store at ", address_, " did not prove the cluster token in its answer (",
      mac.ok() ? "bad MAC" : mac.status().message(),
      "): it is no tpd daemon of this cluster, or the answer was changed on the way; nothing "
      "it said is used"));
}

absl::Status RemoteStore::FromGrpc(const grpc::Status& status) const {
  if (status.ok()) return absl::OkStatus();
  absl::Status converted(static_cast<absl::StatusCode>(status.error_code()),
                         absl::StrCat("store at ", address_, ": ", status.error_message()));
  switch (status.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
      return converted;  // the answer may have been lost after the write was applied
    case grpc::StatusCode::UNAVAILABLE:
      // Applied only if it was sent: a connection that never came up sent nothing.
      for (absl::string_view sign :
           {"failed to connect", "Connection refused", "connections to all backends failing"}) {
        if (absl::StrContains(status.error_message(), sign)) return store::NotApplied(converted);
      }
      return converted;
    default:
      return store::NotApplied(converted);  // the store refused it
  }
}

absl::Status RemoteStore::SetFor(const OnBehalf& user, absl::string_view key,
                                 absl::string_view value) {
  v1::SetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::SetResponse response;
  return Unary(user, "Set", &v1::Store::Stub::Set, request, &response);
}

absl::Status RemoteStore::MultiSetFor(const OnBehalf& user, const std::vector<std::string>& keys,
                                      const std::vector<std::string>& values) {
  v1::MultiSetRequest request;
  request.mutable_keys()->Add(keys.begin(), keys.end());
  request.mutable_values()->Add(values.begin(), values.end());
  v1::MultiSetResponse response;
  return Unary(user, "MultiSet", &v1::Store::Stub::MultiSet, request, &response);
}

absl::StatusOr<int64_t> RemoteStore::AddFor(const OnBehalf& user, absl::string_view key,
                                            int64_t delta) {
  v1::AddRequest request;
  request.set_key(std::string(key));
  request.set_delta(delta);
  v1::AddResponse response;
  absl::Status status = Unary(user, "Add", &v1::Store::Stub::Add, request, &response);
  if (!status.ok()) return status;
  return response.value();
}

absl::StatusOr<std::string> RemoteStore::CompareSetFor(const OnBehalf& user, absl::string_view key,
                                                       absl::string_view expected,
                                                       absl::string_view desired) {
  v1::CompareSetRequest request;
  request.set_key(std::string(key));
  request.set_expected_value(std::string(expected));
  request.set_desired_value(std::string(desired));
  v1::CompareSetResponse response;
  absl::Status status = Unary(user, "CompareSet", &v1::Store::Stub::CompareSet, request, &response);
  if (!status.ok()) return status;
  return std::move(*response.mutable_value());
}

absl::Status RemoteStore::AppendFor(const OnBehalf& user, absl::string_view key,
                                    absl::string_view value) {
  v1::AppendRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::AppendResponse response;
  return Unary(user, "Append", &v1::Store::Stub::Append, request, &response);
}

absl::StatusOr<bool> RemoteStore::CheckFor(const OnBehalf& user,
                                           const std::vector<std::string>& keys) {
  v1::CheckRequest request;
  request.mutable_keys()->Add(keys.begin(), keys.end());
  v1::CheckResponse response;
  absl::Status status = Unary(user, "Check", &v1::Store::Stub::Check, request, &response);
  if (!status.ok()) return status;
  return response.ready();
}

absl::StatusOr<bool> RemoteStore::DeleteKeyFor(const OnBehalf& user, absl::string_view key) {
  v1::DeleteKeyRequest request;
  request.set_key(std::string(key));
  v1::DeleteKeyResponse response;
  absl::Status status = Unary(user, "DeleteKey", &v1::Store::Stub::DeleteKey, request, &response);
  if (!status.ok()) return status;
  return response.deleted();
}

absl::StatusOr<int64_t> RemoteStore::NumKeysFor(const OnBehalf& user, absl::string_view prefix) {
  // The root namespace with the prefix as asked. (Mapping a "<ns>/" prefix onto the
  // namespace alone counted "a/..." for "a" and every key for "/".)
  v1::NumKeysRequest request;
  request.set_prefix(std::string(prefix));
  v1::NumKeysResponse response;
  absl::Status status = Unary(user, "NumKeys", &v1::Store::Stub::NumKeys, request, &response);
  if (!status.ok()) return status;
  return response.num_keys();
}

absl::StatusOr<WaitId> RemoteStore::WaitAsyncFor(const OnBehalf& user,
                                                 std::vector<std::string> keys, absl::Time deadline,
                                                 WaitCallback done) {
  auto wait = std::make_shared<PendingWait>();
  wait->request.mutable_keys()->Add(keys.begin(), keys.end());
  // The serving daemon ends the wait with DEADLINE_EXCEEDED naming the keys; the RPC
  // deadline, a little later, only covers a daemon that stopped answering.
  const int64_t timeout_ms =
      std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now()));
  wait->request.set_timeout_ms(deadline == absl::InfiniteFuture() ? 0 : timeout_ms);
  if (deadline != absl::InfiniteFuture()) {
    wait->context.set_deadline(absl::ToChronoTime(deadline + absl::Seconds(2)));
  }
  wait->call_mac = Sign(&wait->context, user, "MultiGet", wait->request);
  wait->done = std::move(done);
  WaitId id;
  {
    absl::MutexLock lock(&mu_);
    id = next_id_++;
    wait->id = id;
    waits_.emplace(id, wait);
  }
  // The wait id is the completion tag; the map keeps the call state alive until it completes.
  wait->call = stub_->PrepareAsyncMultiGet(&wait->context, wait->request, &cq_);
  wait->call->StartCall();
  wait->call->Finish(&wait->response, &wait->status, reinterpret_cast<void*>(id));
  return id;
}

// The calls of one local user: the same connection, each call signed naming the user.
class RemoteStore::ForUser final : public Store {
 public:
  ForUser(RemoteStore* store, StoreUser user) : store_(store), user_(std::move(user)) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return store_->SetFor(user_, key, value);
  }
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) override {
    return store_->MultiSetFor(user_, keys, values);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    return store_->AddFor(user_, key, delta);
  }
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override {
    return store_->CompareSetFor(user_, key, expected, desired);
  }
  absl::Status Append(absl::string_view key, absl::string_view value) override {
    return store_->AppendFor(user_, key, value);
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    return store_->CheckFor(user_, keys);
  }
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override {
    return store_->DeleteKeyFor(user_, key);
  }
  absl::StatusOr<int64_t> NumKeys(absl::string_view prefix) override {
    return store_->NumKeysFor(user_, prefix);
  }
  absl::StatusOr<WaitId> WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                   WaitCallback done) override {
    return store_->WaitAsyncFor(user_, std::move(keys), deadline, std::move(done));
  }
  void CancelWait(WaitId id) override { store_->CancelWait(id); }

 private:
  RemoteStore* const store_;
  const OnBehalf user_;
};

std::unique_ptr<Store> RemoteStore::OnBehalfOf(const StoreUser& user) {
  return std::make_unique<ForUser>(this, user);
}

absl::Status RemoteStore::Set(absl::string_view key, absl::string_view value) {
  return SetFor(std::nullopt, key, value);
}

absl::Status RemoteStore::MultiSet(const std::vector<std::string>& keys,
                                   const std::vector<std::string>& values) {
  return MultiSetFor(std::nullopt, keys, values);
}

absl::StatusOr<int64_t> RemoteStore::Add(absl::string_view key, int64_t delta) {
  return AddFor(std::nullopt, key, delta);
}

absl::StatusOr<std::string> RemoteStore::CompareSet(absl::string_view key,
                                                    absl::string_view expected,
                                                    absl::string_view desired) {
  return CompareSetFor(std::nullopt, key, expected, desired);
}

absl::Status RemoteStore::Append(absl::string_view key, absl::string_view value) {
  return AppendFor(std::nullopt, key, value);
}

absl::StatusOr<bool> RemoteStore::Check(const std::vector<std::string>& keys) {
  return CheckFor(std::nullopt, keys);
}

absl::StatusOr<bool> RemoteStore::DeleteKey(absl::string_view key) {
  return DeleteKeyFor(std::nullopt, key);
}

absl::StatusOr<int64_t> RemoteStore::NumKeys(absl::string_view prefix) {
  return NumKeysFor(std::nullopt, prefix);
}

absl::StatusOr<WaitId> RemoteStore::WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                              WaitCallback done) {
  return WaitAsyncFor(std::nullopt, std::move(keys), deadline, std::move(done));
}

void RemoteStore::CancelWait(WaitId id) {
  absl::MutexLock lock(&mu_);
  auto it = waits_.find(id);
  if (it != waits_.end()) it->second->context.TryCancel();
}

}  // namespace tpd::store
