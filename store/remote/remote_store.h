// A store served by another tpd daemon, reached over its peer port: the backend behind
// tcp:// and env:// rendezvous, where one daemon hosts the group's store. Every call is
// signed with a per-call MAC keyed by the cluster token (peer_mac.h); the token is never
// sent. Every successful answer must carry the serving daemon's MAC over it, bound to the
// call: one without (a store that is no daemon of this cluster, or an answer changed on the
// way) is UNAUTHENTICATED, and nothing it said is used. With TLS options the channel is
// mutual TLS as well.
//
// Errors come back with the serving daemon's code; messages are prefixed with its address
// ("store at 10.0.0.1:29400: ...") so a failure names the peer. An unreachable daemon is
// UNAVAILABLE.
//
// Thread safety: thread-safe. Waits are asynchronous gRPC calls on a completion queue that
// one thread per RemoteStore drains: no thread per wait. (The callback client API is avoided:
// gRPC 1.51 tears its shared callback queue down racily when channels go away.)

#ifndef TPD_STORE_REMOTE_REMOTE_STORE_H_
#define TPD_STORE_REMOTE_REMOTE_STORE_H_

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "proto/store.grpc.pb.h"
#include "store/peer_mac.h"
#include "store/store.h"

namespace tpd::store {

struct RemoteStoreOptions {
  // Cluster token, the key of every call's MAC (the serving daemon's [peer] token).
  std::string token;
  // Deadline of calls that do not wait for keys.
  absl::Duration call_timeout = absl::Seconds(30);
  // Mutual TLS, as PEM text: the CA that signed the serving daemon's certificate, and this
  // daemon's own certificate chain and key. All empty: plaintext.
  std::string tls_root_certs;
  std::string tls_cert_chain;
  std::string tls_private_key;
  // With TLS: the name the serving daemon's certificate must carry, when it is not the
  // address dialed (the host name a URL named, when the address is its resolved IP).
  std::string tls_server_name;
};

class RemoteStore : public Store {
 public:
  // `address` is the serving daemon's peer port, "host:port" (an IP literal when the caller
  // resolved it first, so DNS cannot move it afterwards); it is also the audience every
  // call's MAC names. Connecting is lazy: the first call reports an unreachable daemon.
  // RESOURCE_EXHAUSTED when its completion thread cannot be started.
  static absl::StatusOr<std::unique_ptr<RemoteStore>> Create(std::string address,
                                                             RemoteStoreOptions options);
  // Cancels pending waits (their callbacks run with CANCELLED) and waits for them to end.
  ~RemoteStore() override;
  RemoteStore(const RemoteStore&) = delete;
  RemoteStore& operator=(const RemoteStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Append(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys(absl::string_view prefix) override;
  // A wait is a call to the serving daemon, answered over the wire: `done` runs on this
  // store's completion thread, never before WaitAsync returns, even when the keys are there.
  // Past the serving daemon's store.max_waiters the refusal is `done`'s RESOURCE_EXHAUSTED,
  // not WaitAsync's result (store.h): only the daemon knows its waiters.
  absl::StatusOr<WaitId> WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                   WaitCallback done) override;
  // Returns at once; the callback follows on the completion thread, with CANCELLED.
  void CancelWait(WaitId id) override;

  // This store as `user`'s calls reach it: each signed naming the user (peer_mac.h), so the
  // serving daemon charges them to that user's share of its store. Cheap (no connection of
  // its own); this store must outlive the view.
  std::unique_ptr<Store> OnBehalfOf(const StoreUser& user) override;

 private:
  RemoteStore(std::string address, RemoteStoreOptions options);
  struct PendingWait;
  class ForUser;
  using OnBehalf = std::optional<StoreUser>;  // nullopt: the daemon's own call

  // The Store methods, for `user`.
  absl::Status SetFor(const OnBehalf& user, absl::string_view key, absl::string_view value);
  absl::Status MultiSetFor(const OnBehalf& user, const std::vector<std::string>& keys,
                           const std::vector<std::string>& values);
  absl::StatusOr<int64_t> AddFor(const OnBehalf& user, absl::string_view key, int64_t delta);
  absl::StatusOr<std::string> CompareSetFor(const OnBehalf& user, absl::string_view key,
                                            absl::string_view expected, absl::string_view desired);
  absl::Status AppendFor(const OnBehalf& user, absl::string_view key, absl::string_view value);
  absl::StatusOr<bool> CheckFor(const OnBehalf& user, const std::vector<std::string>& keys);
  absl::StatusOr<bool> DeleteKeyFor(const OnBehalf& user, absl::string_view key);
  absl::StatusOr<int64_t> NumKeysFor(const OnBehalf& user, absl::string_view prefix);
  absl::StatusOr<WaitId> WaitAsyncFor(const OnBehalf& user, std::vector<std::string> keys,
                                      absl::Time deadline, WaitCallback done);

  // One unary call of `method` (e.g. "Set"), with the call timeout as deadline: signed, and
  // its answer checked (Answer).
  template <typename Request, typename Response>
  absl::Status Unary(const OnBehalf& user, const char* method,
                     grpc::Status (v1::Store::Stub::*invoke)(grpc::ClientContext*, const Request&,
                                                             Response*),
                     const Request& request, Response* response);
  // Adds the call's MAC to `context`; returns it ("" without a token).
  std::string Sign(grpc::ClientContext* context, const OnBehalf& user, const char* method,
                   const google::protobuf::Message& request);
  void DrainCompletions();
  // The call's outcome: FromGrpc of `status`, and for a success, the answer's MAC checked
  // against `call_mac` (UNAUTHENTICATED when missing or wrong).
  absl::Status Answer(const grpc::ClientContext& context, const grpc::Status& status,
                      const std::string& call_mac, const google::protobuf::Message& response) const;
  absl::Status FromGrpc(const grpc::Status& status) const;

  const std::string address_;
  const RemoteStoreOptions options_;
  PeerCallSigner signer_;
  std::unique_ptr<v1::Store::Stub> stub_;
  grpc::CompletionQueue cq_;
  std::thread cq_thread_;  // completes waits

  absl::Mutex mu_;
  absl::flat_hash_map<WaitId, std::shared_ptr<PendingWait>> waits_ ABSL_GUARDED_BY(mu_);
  WaitId next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace tpd::store

#endif  // TPD_STORE_REMOTE_REMOTE_STORE_H_
