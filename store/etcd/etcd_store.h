// The etcd backend: a Store with c10d semantics over etcd's v3 gRPC API (KV and Watch), its
// keys under one prefix, so the state of a job outlives any one tpd daemon. docs/etcd.md has
// the key layout and which etcd operation each Store call uses.
//
// Every call has a deadline (options.call_timeout) and fails over across the endpoints: one
// that does not connect within options.connect_timeout, or answers UNAVAILABLE before
// applying anything, is skipped for the next; when none answers, the call is UNAVAILABLE
// naming each endpoint tried and why. Add and Append are read-modify-write transactions that
// compare the key's mod revision and retry when another writer came first; an UNAVAILABLE
// that may have come after etcd applied one of them is returned, never retried (a retry
// could add twice), and says the outcome is unknown.
//
// Waits cost no thread and never poll: a wait reads its keys once (one transaction, at one
// revision), and each missing key is followed by a Watch from the next revision on, shared
// by every wait on that key, over one watch stream per store. The stream moves to the next
// endpoint when its endpoint goes away and resumes every key's watch from the last revision
// it saw, so no write is missed; a watch whose revision was compacted rereads its key. A
// write made through this store also completes its own waits before it returns (their
// callbacks have run, on this thread or on the watch thread), so this store's waits complete
// as promptly as a MemoryStore's.
//
// The cluster (store::Cluster) is etcd's too: its members (Cluster.MemberList, with failover)
// and each endpoint's own view (Maintenance.Status, every endpoint at once).
//
// Leases (store::Leases) are etcd's: granted, bound to keys, renewed (one LeaseKeepAlive
// stream per renewal) and revoked through the same failover, deadlines and token as KV calls.
//
// With credentials (EtcdCredentials), every channel is TLS and/or every call and the watch
// stream carry an auth token, renewed when etcd answers that it is stale; neither the
// password nor the token is ever logged.
//
// Thread safety: thread-safe. One mutex guards the waits and the watched keys' states;
// callbacks run after it is released. A timer thread ends waits at their deadlines and a
// watch thread reads (and reopens) the watch stream; both are owned by the store.

#ifndef TPD_STORE_ETCD_ETCD_STORE_H_
#define TPD_STORE_ETCD_ETCD_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "store/store.h"
#include "store/waiter_table.h"

namespace tpd::store {

// Who tpd is to etcd, from the daemon's [etcd] config table (store/etcd/etcd_credentials.h
// reads its files), never from an etcd:// URL. Empty: plain gRPC and no user, for an etcd
// reached over a trusted network with authentication off.
struct EtcdCredentials {
  // etcd user and password (both or neither): the store calls Auth.Authenticate for a token
  // and sends it as the "token" metadata of every KV and Watch call, authenticating again
  // when etcd answers that the token is invalid or older than the last auth change. Neither
  // the password nor the token is ever logged or put in a message.
  std::string user;
  std::string password;
  // TLS to every endpoint (PEM text, not paths), on when root_certs or cert_chain is set:
  // the CA that signed the members' certificates (empty: gRPC's default roots), and a client
  // certificate with its key (both or neither) for members run with --client-cert-auth.
  std::string root_certs;
  std::string cert_chain;
  std::string private_key;

  bool tls() const { return !root_certs.empty() || !cert_chain.empty() || !private_key.empty(); }
  bool empty() const { return user.empty() && password.empty() && !tls(); }
};

struct EtcdStoreOptions {
  // The bound on each Store call, all endpoints and retries included; past it the call is
  // DEADLINE_EXCEEDED (or UNAVAILABLE when no endpoint answered). Waits have their own
  // deadlines; this bounds only the read that starts them.
  absl::Duration call_timeout = absl::Seconds(10);
  // How long a call waits for one endpoint's connection before trying the next.
  absl::Duration connect_timeout = absl::Seconds(2);
  // Most waits pending at once (store.max_waiters); past it WaitAsync answers
  // RESOURCE_EXHAUSTED.
  int64_t max_waiters = 100000;
  // How often Add, Append and CompareSet retry after another writer changed the key between
  // their read and their transaction; then ABORTED naming the key.
  int max_conflict_retries = 1000;
  // See EtcdCredentials.
  EtcdCredentials credentials;
  // The host each endpoint was named by (an etcd:// URL's, before it was resolved), in
  // endpoint order: with TLS, each member's certificate must name it. Empty, or an entry
  // empty or equal to the address's host: the certificate must name the address itself.
  std::vector<std::string> endpoint_hosts;
};

struct EtcdStoreStats {
  int64_t waiters = 0;
  int64_t watched_keys = 0;  // keys followed by a Watch for pending waits
  int64_t watch_streams_opened = 0;
  int64_t watch_events = 0;  // events received on watch streams
  int64_t compactions_seen = 0;
};

class EtcdStore : public Store, public Leases, public Cluster {
 public:
  // A store over the etcd cluster at `endpoints` ("ip:port" or "[ip6]:port", as dialed; the
  // caller has resolved and checked them) keeping its keys under `prefix` + "/" (prefix
  // non-empty, no trailing '/', e.g. "/tpd"). Connects lazily: an etcd that is down makes
  // the first call UNAVAILABLE, not Create. INVALID_ARGUMENT for no endpoints, a bad prefix,
  // a user without a password (or the reverse), a certificate without its key (or the
  // reverse), or endpoint_hosts of another length than endpoints.
  static absl::StatusOr<std::unique_ptr<EtcdStore>> Create(std::vector<std::string> endpoints,
                                                           std::string prefix,
                                                           EtcdStoreOptions options = {});

  // Ends pending waits with UNAVAILABLE, closes the watch stream and joins the threads.
  ~EtcdStore() override;

  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

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
  absl::StatusOr<WaitId> WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                   WaitCallback done) override;
  void CancelWait(WaitId id) override;
  Leases* leases() override { return this; }
  Cluster* cluster() override { return this; }

  // Leases (etcd's Lease service; a lease lives on the cluster, so it survives a failover).
  absl::StatusOr<Grant> GrantLease(absl::Duration ttl) override;
  absl::Status SetLeased(absl::string_view key, absl::string_view value, int64_t id) override;
  absl::Status KeepLeaseAlive(int64_t id) override;
  absl::Status RevokeLease(int64_t id) override;

  // Cluster. Strings the members send (names, URLs, errors) are cut and escaped (Echo); at
  // most kMaxProbedMembers members are listed.
  Health ProbeMembers(absl::Time deadline) override;
  static constexpr size_t kMaxProbedMembers = 64;

  EtcdStoreStats Stats();

  // "etcd://a:2379,b:2379/prefix": how messages and logs name this store.
  const std::string& name() const { return name_; }

 private:
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Cluster::Stub> cluster;
    std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
  };

  // The auth token calls carry: `token` ("" without a user, or where etcd has authentication
  // off) as of `generation`, which counts the authentications.
  struct Token {
    std::string token;
    int64_t generation = 0;
  };

  // What this store knows of a key some pending wait needs: its value (absent: not set) as
  // of `revision`, followed by the Watch `watch_id` on the current stream.
  struct KeyState {
    std::optional<std::string> value;
    int64_t revision = 0;
    int64_t watch_id = 0;
    int64_t refs = 0;  // pending waits that name the key (each once)
  };

  // Whether an UNAVAILABLE call may have been applied: calls that may not be repeated
  // (Add, Append) fail over only when they surely were not.
  enum class Retry { kIdempotent, kOnlyIfNotSent };

  using Completion = WaiterTable::Completion;
  using EtcdCall = absl::FunctionRef<grpc::Status(Endpoint&, grpc::ClientContext&)>;

  EtcdStore(std::vector<std::string> endpoints, std::string prefix, EtcdStoreOptions options);

  // Runs `call` on the endpoint last seen working, then on the others in turn, under one
  // deadline. `what` names the operation and key for messages ("set of key \"k\"").
  absl::Status CallEtcd(absl::string_view what, Retry retry, EtcdCall call);

  // The token to send to `endpoint`, authenticating (at it, by `deadline`) when there is none
  // yet or the current one is no newer than `stale` (the generation a call saw refused).
  // UNAUTHENTICATED for a wrong user or password, naming the endpoint and the user.
  absl::StatusOr<Token> GetToken(Endpoint& endpoint, absl::Time deadline, int64_t stale = -1)
      ABSL_LOCKS_EXCLUDED(auth_mu_, token_mu_);
  // The endpoint one of a member's `client_urls` names ("http://10.0.0.1:2379" names
  // 10.0.0.1:2379, and a URL with the host an endpoint was named by names it too); "" when
  // none does.
  std::string EndpointNamedBy(const std::vector<std::string>& client_urls) const;
  // The token calls carry now, without authenticating ("" when there is none yet).
  std::string CurrentToken() ABSL_LOCKS_EXCLUDED(token_mu_);
  // Adds the token and etcd's "require leader" metadata to a call's context.
  static void Decorate(grpc::ClientContext& context, const Token& token);

  // The key etcd holds for `key`: prefix_ + "/" + key.
  std::string EtcdKey(absl::string_view key) const;

  // The read-modify-write loop of Add, Append and CompareSet: reads `key`, asks `decide` for
  // the new value (nullopt: write nothing), writes it if the key's mod revision is unchanged,
  // else retries with the value the failed transaction read. Returns the value `decide` saw.
  struct Update {
    std::optional<std::string> before;
    bool wrote = false;
  };
  using Decide = absl::FunctionRef<absl::StatusOr<std::optional<std::string>>(
      const std::optional<std::string>& current)>;
  absl::StatusOr<Update> ReadModifyWrite(absl::string_view op, absl::string_view key,
                                         Decide decide);

  // Values of `keys` at one revision (nullopt: missing); the revision in `*revision`.
  absl::StatusOr<std::vector<std::optional<std::string>>> ReadAtOneRevision(
      const std::vector<std::string>& keys, int64_t* revision);

  // A write through this store: what it wrote (nullopt: deleted) at `revision`, so its own
  // waits complete before the call returns.
  void NoteWrite(const std::string& key, std::optional<std::string> value, int64_t revision);
  // Applies a value of `key` known as of `revision` if newer than what is known; completes
  // the waits it completes. REQUIRES: mu_.
  void ApplyLocked(const std::string& key, std::optional<std::string> value, int64_t revision,
                   std::vector<Completion>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs completions the watch thread collected (counted in watch_completions_running_).
  void RunWatchCompletions(std::vector<Completion> completions) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops one wait's reference on each of `keys` (unique), cancelling watches nobody needs.
  void ReleaseKeys(const std::vector<std::string>& keys);
  // The WaiterTable lookup over key_states_ (see MemoryStore::LookupHeld).
  const std::string* LookupHeld(const std::string& key);
  // Queues a Watch for `key` from `start_revision` on the current stream. REQUIRES: mu_.
  void QueueWatchLocked(const std::string& key, KeyState& state, int64_t start_revision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes queued watch requests to the stream, in order.
  void FlushWatchRequests() ABSL_LOCKS_EXCLUDED(write_mu_, mu_);
  void FlushWatchRequestsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  void TimerLoop();
  void WatchLoop();
  // Handles one response of the watch stream; false when the stream must be reopened with a
  // fresh token (etcd cancelled a watch for want of permission, which an expired token also
  // causes).
  bool OnWatchResponse(const etcdserverpb::WatchResponse& response);
  // Rereads `key` after its watch was cancelled (compaction) and watches it again.
  void RewatchAfterCancel(const std::string& key, int64_t watch_id);

  const std::string prefix_;  // with its trailing '/'
  const std::string name_;
  const EtcdStoreOptions options_;
  std::vector<Endpoint> endpoints_;
  // The endpoint that answered last; calls start there.
  std::atomic<size_t> preferred_endpoint_{0};
  // When a call last found no member reachable (Unix ns; 0: never).
  std::atomic<int64_t> unreachable_since_{0};

  // Held while authenticating, so that concurrent calls refused for one stale token
  // authenticate once. Order: auth_mu_ before token_mu_; neither with mu_ or write_mu_.
  absl::Mutex auth_mu_;
  absl::Mutex token_mu_;
  Token token_ ABSL_GUARDED_BY(token_mu_);
  // Whether the store has authenticated at all (and so whether etcd's "authentication is not
  // enabled" was already logged).
  bool auth_disabled_logged_ ABSL_GUARDED_BY(auth_mu_) = false;

  // Order: write_mu_ before mu_.
  absl::Mutex write_mu_;
  // The watch stream, written here under write_mu_ and read by the watch thread alone.
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>* watch_stream_
      ABSL_GUARDED_BY(write_mu_) = nullptr;

  absl::Mutex mu_;
  WaiterTable waiters_ ABSL_GUARDED_BY(mu_);
  // Waits started again under a new id (a confirmation read found a key missing), by the id
  // their callers hold, for CancelWait; an entry stays until it is cancelled (restarts are
  // rare: they need events of two watches to arrive out of revision order).
  absl::flat_hash_map<WaitId, WaitId> restarted_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, KeyState> key_states_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, std::string> watch_keys_ ABSL_GUARDED_BY(mu_);  // id -> key
  int64_t next_watch_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Watch requests not yet written, in order; FlushWatchRequests writes them.
  std::deque<etcdserverpb::WatchRequest> watch_requests_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar timer_cv_;
  absl::CondVar watch_cv_;  // signalled when keys need watching or the store stops
  // Batches of completions the watch thread collected and has not finished running; a write
  // through this store waits for them (NoteWrite), so that the waits it completes have run
  // their callbacks when it returns even where the watch event came first.
  int64_t watch_completions_running_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar watch_completions_done_;
  EtcdStoreStats stats_ ABSL_GUARDED_BY(mu_);

  std::thread timer_;
  std::thread watcher_;
};

}  // namespace tpd::store

#endif  // TPD_STORE_ETCD_ETCD_STORE_H_
