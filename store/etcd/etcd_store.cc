#include "store/etcd/etcd_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/check.h"
#include "base/summarize.h"
#include "spdlog/spdlog.h"

namespace tpd::store {
namespace {

using etcdserverpb::Compare;
using etcdserverpb::DeleteRangeRequest;
using etcdserverpb::DeleteRangeResponse;
using etcdserverpb::PutRequest;
using etcdserverpb::PutResponse;
using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;
using etcdserverpb::TxnRequest;
using etcdserverpb::TxnResponse;
using etcdserverpb::WatchRequest;
using etcdserverpb::WatchResponse;

// etcd refuses a transaction of more operations than its --max-txn-ops (128 by default);
// reads of more keys go in several transactions pinned to the first one's revision.
constexpr size_t kMaxTxnOps = 128;
// Pause between rounds over every endpoint while the watch stream finds none.
constexpr absl::Duration kWatchRetryPause = absl::Milliseconds(200);

std::shared_ptr<spdlog::logger> Log() {
  std::shared_ptr<spdlog::logger> log = spdlog::get("store");
  return log != nullptr ? log : spdlog::default_logger();
}

std::string KeyName(absl::string_view key) { return absl::StrCat("\"", Echo(key), "\""); }

// The end of the range of every key that starts with `prefix` (etcd's clientv3.GetPrefixRangeEnd).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    unsigned char last = static_cast<unsigned char>(prefix.back());
    if (last < 0xff) {
      prefix.back() = static_cast<char>(last + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// Whether an UNAVAILABLE surely came before etcd applied anything: the connection failed, or
// the member refused for want of a leader (it proposes nothing then).
bool GrpcSurelyNotApplied(const grpc::Status& status) {
  const std::string& message = status.error_message();
  for (absl::string_view sign :
       {"etcdserver: no leader", "etcdserver: not capable", "failed to connect",
        "Connection refused", "connections to all backends failing", "Socket closed"}) {
    if (absl::StrContains(message, sign)) return true;
  }
  return false;
}

// etcd's answers that a token is no longer good, on which clientv3 authenticates again: an
// expired or unknown token, and one issued before the last change of users, roles or
// permissions (checked when a write is applied, which then changes nothing). Either way the
// call was not applied, so it is retried with a fresh token, even an Add.
bool IsStaleToken(const grpc::Status& status) {
  const std::string& message = status.error_message();
  return absl::StrContains(message, "etcdserver: invalid auth token") ||
         absl::StrContains(message, "etcdserver: revision of auth store is old");
}

// How often one call authenticates again after its token was refused as stale.
constexpr int kMaxReauthentications = 2;

// etcd's answer to a call without a token where authentication is on.
bool IsUserEmpty(const grpc::Status& status) {
  return absl::StrContains(status.error_message(), "etcdserver: user name is empty");
}

// Whether etcd cancelled a watch for want of authority: a stale or missing token, or a user
// without read permission on the key.
bool IsAuthCancel(const std::string& reason) {
  for (absl::string_view sign :
       {"etcdserver: invalid auth token", "etcdserver: revision of auth store is old",
        "etcdserver: user name is empty", "etcdserver: permission denied"}) {
    if (absl::StrContains(reason, sign)) return true;
  }
  return false;
}

// How long to pause before reopening a watch stream whose watches etcd refused even with a
// fresh token (the user lost its permission): waits then end at their deadlines.
constexpr absl::Duration kWatchDeniedPause = absl::Seconds(1);

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what,
                      absl::string_view address) {
  std::string hint;
  if (absl::StrContains(status.error_message(), "too many operations in txn request")) {
    hint = absl::StrCat("; etcd takes at most --max-txn-ops (", kMaxTxnOps,
                        " by default) operations in one transaction");
  }
  if (IsUserEmpty(status)) {
    // INVALID_ARGUMENT from etcd, but nothing is wrong with the call: it lacks a user.
    return absl::UnauthenticatedError(absl::StrCat(
        "etcd ", what, " at ", address, ": ", Echo(status.error_message()),
        ": etcd has authentication on and this store has no user; set the daemon's [etcd] "
        "user and password_file"));
  }
  if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    hint = "; the etcd user's roles must grant readwrite on the store's key prefix";
  }
  if (absl::StrContains(status.error_message(), "request is too large") ||
      (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
       absl::StrContains(status.error_message(), "larger than max"))) {
    // etcd answers INVALID_ARGUMENT, but nothing is wrong with the request but its size.
    return absl::ResourceExhaustedError(
        absl::StrCat("etcd ", what, " at ", address, ": ", Echo(status.error_message()),
                     "; etcd takes requests up to its --max-request-bytes (1.5 MiB by default)"));
  }
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat("etcd ", what, " at ", address, ": ", Echo(status.error_message()), hint));
}

// Whether `channel` is connected, or connects, before `deadline`. A connection attempt that
// fails ends the wait at once: an endpoint that refuses is skipped without waiting out
// connect_timeout. A channel already failing (gRPC retries it in the background, backing off
// up to a second) is skipped at once unless `wait_if_failing`: other endpoints go first, and
// only when none of them answers does a call wait for a failing one's next attempt.
bool Connect(grpc::Channel& channel, absl::Time deadline, bool wait_if_failing) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  bool attempted = false;
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_SHUTDOWN) return false;
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && (attempted || !wait_if_failing)) return false;
    if (state == GRPC_CHANNEL_CONNECTING) attempted = true;
    if (!channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) return false;
    state = channel.GetState(/*try_to_connect=*/true);
  }
  return true;
}

const std::string* Present(const std::optional<std::string>& value) {
  return value.has_value() ? &*value : nullptr;
}

}  // namespace

void EtcdStore::Decorate(grpc::ClientContext& context, const Token& token) {
  // Asks the member to refuse the call, UNAVAILABLE "etcdserver: no leader", while it has no
  // leader (etcd's clientv3.WithRequireLeader), instead of holding it until the deadline: a
  // member cut off from its majority then sends calls on to the next endpoint at once, and
  // ends a watch stream, which resumes on a member that has one.
  context.AddMetadata("hasleader", "true");
  if (!token.token.empty()) context.AddMetadata("token", token.token);
}

absl::StatusOr<std::unique_ptr<EtcdStore>> EtcdStore::Create(std::vector<std::string> endpoints,
                                                             std::string prefix,
                                                             EtcdStoreOptions options) {
  if (endpoints.empty()) {
    return absl::InvalidArgumentError("an etcd store needs at least one endpoint (host:port)");
  }
  if (prefix.empty() || absl::EndsWith(prefix, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd key prefix ", KeyName(prefix), " must be non-empty and not end in '/'"));
  }
  const EtcdCredentials& credentials = options.credentials;
  if (credentials.user.empty() != credentials.password.empty()) {
    return absl::InvalidArgumentError(
        credentials.user.empty() ? "an etcd password needs its user: set [etcd] user"
                                 : absl::StrCat("etcd user \"", Echo(credentials.user),
                                                "\" needs a password: set [etcd] password_file"));
  }
  if (credentials.cert_chain.empty() != credentials.private_key.empty()) {
    return absl::InvalidArgumentError(
        "an etcd client certificate needs its private key, and a key its certificate: set "
        "[etcd] cert_file and key_file together");
  }
  if (!options.endpoint_hosts.empty() && options.endpoint_hosts.size() != endpoints.size()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd endpoint_hosts names ",
                                                   options.endpoint_hosts.size(), " hosts for ",
                                                   endpoints.size(), " endpoints"));
  }
  std::unique_ptr<EtcdStore> store(
      new EtcdStore(std::move(endpoints), std::move(prefix), std::move(options)));
  // Past a pids limit a start throws: the join that needed this store fails, the daemon keeps
  // serving (the destructor stops whichever thread did start).
  try {
    store->timer_ = std::thread([raw = store.get()] { raw->TimerLoop(); });
    store->watcher_ = std::thread([raw = store.get()] { raw->WatchLoop(); });
  } catch (const std::system_error& error) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot start the threads of the store at ",
                                                     store->name_, ": ", error.what()));
  }
  return store;
}

EtcdStore::EtcdStore(std::vector<std::string> endpoints, std::string prefix,
                     EtcdStoreOptions options)
    : prefix_(absl::StrCat(prefix, "/")),
      name_(absl::StrCat("etcd://", absl::StrJoin(endpoints, ","), prefix)),
      options_(std::move(options)),
      waiters_(options_.max_waiters) {
  grpc::ChannelArguments args;
  // Reconnect soon after a member comes back: gRPC's default backoff grows to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: it is also the bound on one connection attempt,
  // and etcd's handshake can take longer than a short one on a busy machine.)
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Notice a member that vanished without closing the watch stream. etcd's
  // --grpc-keepalive-min-time is 5 s; pinging faster gets the connection closed.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetMaxReceiveMessageSize(256 << 20);
  const EtcdCredentials& credentials = options_.credentials;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials =
      grpc::InsecureChannelCredentials();
  if (credentials.tls()) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = credentials.root_certs;
    tls.pem_cert_chain = credentials.cert_chain;
    tls.pem_private_key = credentials.private_key;
    channel_credentials = grpc::SslCredentials(tls);
  }
  for (size_t i = 0; i < endpoints.size(); ++i) {
    std::string& address = endpoints[i];
    Endpoint endpoint;
    grpc::ChannelArguments endpoint_args = args;
    if (credentials.tls() && i < options_.endpoint_hosts.size()) {
      // The store dials the resolved address; the member's certificate names the host the
      // URL gave (a DNS name, usually).
      const std::string& host = options_.endpoint_hosts[i];
      const size_t colon = address.rfind(':');
      std::string address_host = address.substr(0, colon);
      if (absl::StartsWith(address_host, "[")) {
        address_host = address_host.substr(1, address_host.size() - 2);
      }
      if (!host.empty() && host != address_host) {
        endpoint_args.SetSslTargetNameOverride(host);
      }
    }
    endpoint.channel = grpc::CreateCustomChannel(address, channel_credentials, endpoint_args);
    endpoint.kv = etcdserverpb::KV::NewStub(endpoint.channel);
    endpoint.watch = etcdserverpb::Watch::NewStub(endpoint.channel);
    endpoint.auth = etcdserverpb::Auth::NewStub(endpoint.channel);
    endpoint.lease = etcdserverpb::Lease::NewStub(endpoint.channel);
    endpoint.cluster = etcdserverpb::Cluster::NewStub(endpoint.channel);
    endpoint.maintenance = etcdserverpb::Maintenance::NewStub(endpoint.channel);
    endpoint.address = std::move(address);
    endpoints_.push_back(std::move(endpoint));
  }
}

EtcdStore::~EtcdStore() {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    waiters_.EndAll(absl::UnavailableError(absl::StrCat("store ", name_, " is shutting down")),
                    &completions);
    timer_cv_.Signal();
    watch_cv_.SignalAll();
  }
  WaiterTable::Run(std::move(completions));
  {
    absl::MutexLock lock(&write_mu_);
    if (watch_context_ != nullptr) watch_context_->TryCancel();
  }
  timer_.join();
  watcher_.join();
}

std::string EtcdStore::EtcdKey(absl::string_view key) const { return absl::StrCat(prefix_, key); }

std::string EtcdStore::CurrentToken() {
  absl::MutexLock lock(&token_mu_);
  return token_.token;
}

absl::StatusOr<EtcdStore::Token> EtcdStore::GetToken(Endpoint& endpoint, absl::Time deadline,
                                                     int64_t stale) {
  const std::string& user = options_.credentials.user;
  if (user.empty()) return Token();  // no lock on the path of every call without a user
  const auto current = [&]() -> std::optional<Token> {
    absl::MutexLock lock(&token_mu_);
    if (token_.generation > 0 && token_.generation > stale) return token_;
    return std::nullopt;
  };
  if (std::optional<Token> token = current()) return *token;
  absl::MutexLock auth_lock(&auth_mu_);
  // Another call may have authenticated while this one waited.
  if (std::optional<Token> token = current()) return *token;
  etcdserverpb::AuthenticateRequest request;
  request.set_name(user);
  request.set_password(options_.credentials.password);
  etcdserverpb::AuthenticateResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  const grpc::Status status = endpoint.auth->Authenticate(&context, request, &response);
  std::string token;
  if (status.ok()) {
    token = response.token();
  } else if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
             absl::StrContains(status.error_message(), "authentication is not enabled")) {
    // As clientv3 does: go on without a token.
    if (!auth_disabled_logged_) {
      auth_disabled_logged_ = true;
      Log()->warn(
          "[store {}] etcd at {} has authentication off; calls go without a token "
          "(user \"{}\" is not checked)",
          name_, endpoint.address, Echo(user));
    }
  } else if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
             status.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
             status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    // Wrong user or password: the same at every member, so no failover. The message names
    // the user and the endpoint, never the password.
    return absl::UnauthenticatedError(absl::StrCat(
        "etcd authentication of user \"", Echo(user), "\" at ", endpoint.address, " failed: ",
        Echo(status.error_message()), "; check the daemon's [etcd] user and password_file"));
  } else {
    // UNAVAILABLE, DEADLINE_EXCEEDED, ...: the caller treats it as the endpoint's failure.
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("authenticating: ", Echo(status.error_message())));
  }
  absl::MutexLock lock(&token_mu_);
  token_.token = std::move(token);
  ++token_.generation;
  Log()->debug("[store {}] authenticated as etcd user \"{}\" at {}", name_, Echo(user),
               endpoint.address);
  return token_;
}

absl::Status EtcdStore::CallEtcd(absl::string_view what, Retry retry, EtcdCall call) {
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  const size_t count = endpoints_.size();
  const size_t first = preferred_endpoint_.load();
  // Why each endpoint did not answer, by endpoint; "" = not tried (yet).
  std::vector<std::string> why(count);
  const auto tried = [&] {
    std::vector<std::string> listed;
    for (size_t i = 0; i < count; ++i) {
      if (!why[i].empty()) listed.push_back(absl::StrCat(endpoints_[i].address, " (", why[i], ")"));
    }
    return absl::StrJoin(listed, ", ");
  };
  // First the endpoints that are connected or may connect; then, if none was reachable,
  // those whose connection was failing, waiting for their next attempt. When a reachable
  // member refused (no leader: the cluster lost its majority), waiting on dead members
  // would only delay the answer by connect_timeout each, so the call fails at once.
  std::vector<size_t> failing;
  bool reached = false;
  // An endpoint may have applied the call before its answer was lost (a repeatable call is
  // repeated elsewhere then): the call's failure must not be marked NotApplied.
  bool maybe_applied = false;
  bool waited_for_failing = false;
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<size_t> order;
    if (pass == 0) {
      for (size_t i = 0; i < count; ++i) order.push_back((first + i) % count);
    } else {
      order = failing;
    }
    // The failing endpoints share one connect_timeout: a failing channel reports no new
    // state until it connects, so each would otherwise be waited for in full, in turn.
    const absl::Time failing_by = std::min(deadline, absl::Now() + options_.connect_timeout);
    waited_for_failing |= pass == 1;
    for (size_t index : order) {
      Endpoint& endpoint = endpoints_[index];
      const absl::Time now = absl::Now();
      if (now >= deadline) break;
      const absl::Time connect_by =
          pass == 0 ? std::min(deadline, now + options_.connect_timeout) : failing_by;
      if (!Connect(*endpoint.channel, connect_by, /*wait_if_failing=*/pass == 1)) {
        if (pass == 0) failing.push_back(index);
        why[index] = absl::StrCat("not connected: ",
                                  absl::Now() >= connect_by ? "timed out" : "connection failed");
        continue;
      }
      absl::StatusOr<Token> token = GetToken(endpoint, deadline);
      grpc::Status status;
      for (int reauthentications = 0;; ++reauthentications) {
        if (!token.ok()) break;
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(deadline));
        Decorate(context, *token);
        status = call(endpoint, context);
        if (!IsStaleToken(status) || reauthentications == kMaxReauthentications) break;
        Log()->debug("[store {}] {} at {}: the auth token is stale ({}); authenticating again",
                     name_, std::string(what), endpoint.address, Echo(status.error_message()));
        token = GetToken(endpoint, deadline, token->generation);
      }
      if (!token.ok()) {
        if (token.status().code() == absl::StatusCode::kUnauthenticated) {
          return NotApplied(absl::UnauthenticatedError(
              absl::StrCat("etcd ", what, ": ", token.status().message())));
        }
        why[index] = std::string(token.status().message());
        continue;
      }
      if (status.ok()) {
        preferred_endpoint_.store(index);
        return absl::OkStatus();
      }
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        if (retry == Retry::kIdempotent || GrpcSurelyNotApplied(status)) {
          why[index] = Echo(status.error_message());
          // An answer of etcd's own ("etcdserver: no leader"), not a broken connection.
          reached |= absl::StartsWith(status.error_message(), "etcdserver:");
          maybe_applied |= !GrpcSurelyNotApplied(status);
          continue;
        }
        return absl::UnavailableError(absl::StrCat(
            "etcd ", what, " at ", endpoint.address, ": ", Echo(status.error_message()),
            "; the request was sent, so whether etcd applied it is unknown and it is not "
            "retried on another endpoint"));
      }
      if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        why[index] = "no answer";
        return absl::DeadlineExceededError(
            absl::StrCat("etcd ", what, " on ", name_, ": no answer within the store call timeout ",
                         absl::FormatDuration(options_.call_timeout), "; tried ", tried()));
      }
      // etcd refused it: nothing was applied.
      return NotApplied(FromGrpc(status, what, endpoint.address));
    }
    if (failing.empty() || reached) break;
    // A call that just waited for the failing members in vain: the next ones fail at once,
    // for connect_timeout, instead of each waiting again.
    if (absl::Now() - absl::FromUnixNanos(unreachable_since_.load()) < options_.connect_timeout) {
      break;
    }
  }
  // Only a call that waited marks the outage: calls that skipped the wait must not extend it,
  // or no call would wait again while the members come back.
  if (waited_for_failing) unreachable_since_.store(absl::ToUnixNanos(absl::Now()));
  const std::string listed = tried();
  if (listed.empty()) {
    return absl::DeadlineExceededError(absl::StrCat("etcd ", what, " on ", name_,
                                                    ": no answer within the store call timeout ",
                                                    absl::FormatDuration(options_.call_timeout)));
  }
  absl::Status unavailable = absl::UnavailableError(absl::StrCat(
      "etcd ", what, " failed: no endpoint of ", name_, " answered; tried ", listed,
      options_.credentials.tls()
          ? " (over TLS, a connection also fails when a member's certificate is not signed "
            "by [etcd] ca_file or does not name the endpoint, or when the member requires a "
            "client certificate that [etcd] cert_file does not give or its CA does not trust)"
          : ""));
  return maybe_applied ? unavailable : NotApplied(std::move(unavailable));
}

absl::StatusOr<std::vector<std::optional<std::string>>> EtcdStore::ReadAtOneRevision(
    const std::vector<std::string>& keys, int64_t* revision) {
  std::vector<std::optional<std::string>> values;
  values.reserve(keys.size());
  *revision = 0;
  for (size_t begin = 0; begin < keys.size(); begin += kMaxTxnOps) {
    const size_t end = std::min(keys.size(), begin + kMaxTxnOps);
    TxnRequest request;
    for (size_t i = begin; i < end; ++i) {
      RangeRequest* range = request.add_success()->mutable_request_range();
      range->set_key(EtcdKey(keys[i]));
      if (*revision != 0) range->set_revision(*revision);
    }
    TxnResponse response;
    absl::Status status = CallEtcd(
        absl::StrCat("read of ", keys.size() == 1 ? "key " : "keys ", JoinEchoed(keys, ", ")),
        Retry::kIdempotent, [&](Endpoint& endpoint, grpc::ClientContext& context) {
          return endpoint.kv->Txn(&context, request, &response);
        });
    if (!status.ok()) return status;
    if (*revision == 0) *revision = response.header().revision();
    TPD_DCHECK(response.responses_size() == static_cast<int>(end - begin));
    for (const etcdserverpb::ResponseOp& op : response.responses()) {
      const RangeResponse& range = op.response_range();
      values.push_back(range.kvs_size() > 0 ? std::optional<std::string>(range.kvs(0).value())
                                            : std::nullopt);
    }
  }
  return values;
}

absl::Status EtcdStore::Set(absl::string_view key, absl::string_view value) {
  PutRequest request;
  request.set_key(EtcdKey(key));
  request.set_value(std::string(value));
  PutResponse response;
  absl::Status status = CallEtcd(absl::StrCat("set of key ", KeyName(key)), Retry::kIdempotent,
                                 [&](Endpoint& endpoint, grpc::ClientContext& context) {
                                   return endpoint.kv->Put(&context, request, &response);
                                 });
  if (!status.ok()) return status;
  NoteWrite(std::string(key), std::string(value), response.header().revision());
  return absl::OkStatus();
}

absl::Status EtcdStore::MultiSet(const std::vector<std::string>& keys,
                                 const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("multi_set needs one value per key: got %d keys and %d values", keys.size(),
                        values.size()));
  }
  if (keys.empty()) return absl::OkStatus();
  TxnRequest request;
  for (size_t i = 0; i < keys.size(); ++i) {
    PutRequest* put = request.add_success()->mutable_request_put();
    put->set_key(EtcdKey(keys[i]));
    put->set_value(values[i]);
  }
  TxnResponse response;
  absl::Status status =
      CallEtcd(absl::StrCat("multi_set of keys ", JoinEchoed(keys, ", ")), Retry::kIdempotent,
               [&](Endpoint& endpoint, grpc::ClientContext& context) {
                 return endpoint.kv->Txn(&context, request, &response);
               });
  if (!status.ok()) return status;
  for (size_t i = 0; i < keys.size(); ++i) {
    NoteWrite(keys[i], values[i], response.header().revision());
  }
  return absl::OkStatus();
}

absl::StatusOr<EtcdStore::Update> EtcdStore::ReadModifyWrite(absl::string_view op,
                                                             absl::string_view key, Decide decide) {
  const std::string etcd_key = EtcdKey(key);
  const std::string what = absl::StrCat(op, " of key ", KeyName(key));
  RangeRequest read;
  read.set_key(etcd_key);
  RangeResponse range;
  absl::Status status =
      CallEtcd(what, Retry::kIdempotent, [&](Endpoint& endpoint, grpc::ClientContext& context) {
        return endpoint.kv->Range(&context, read, &range);
      });
  if (!status.ok()) return NotApplied(status);  // a read: nothing was written
  for (int attempt = 0; attempt <= options_.max_conflict_retries; ++attempt) {
    Update update;
    int64_t mod_revision = 0;  // etcd compares a missing key's mod revision as 0
    if (range.kvs_size() > 0) {
      update.before = range.kvs(0).value();
      mod_revision = range.kvs(0).mod_revision();
    }
    absl::StatusOr<std::optional<std::string>> next = decide(update.before);
    if (!next.ok()) return NotApplied(next.status());
    if (!next->has_value()) return update;

    TxnRequest txn;
    Compare* compare = txn.add_compare();
    compare->set_key(etcd_key);
    compare->set_target(Compare::MOD);
    compare->set_result(Compare::EQUAL);
    compare->set_mod_revision(mod_revision);
    PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(etcd_key);
    put->set_value(**next);
    txn.add_failure()->mutable_request_range()->set_key(etcd_key);
    TxnResponse response;
    status = CallEtcd(what, Retry::kOnlyIfNotSent,
                      [&](Endpoint& endpoint, grpc::ClientContext& context) {
                        return endpoint.kv->Txn(&context, txn, &response);
                      });
    if (!status.ok()) return status;
    if (response.succeeded()) {
      NoteWrite(std::string(key), **std::move(next), response.header().revision());
      update.wrote = true;
      return update;
    }
    // Another writer came between the read and the transaction: retry on what it left.
    range = response.responses(0).response_range();
  }
  return NotApplied(absl::AbortedError(absl::StrCat(
      "etcd ", what, ": another writer changed the key ", options_.max_conflict_retries + 1,
      " times in a row between read and write; retry later")));
}

absl::StatusOr<int64_t> EtcdStore::Add(absl::string_view key, int64_t delta) {
  int64_t sum = 0;
  absl::StatusOr<Update> update = ReadModifyWrite(
      "add", key,
      [&](const std::optional<std::string>& current) -> absl::StatusOr<std::optional<std::string>> {
        int64_t value = 0;
        if (current.has_value() && !absl::SimpleAtoi(*current, &value)) {
          return absl::FailedPreconditionError(
              absl::StrCat("add: key ", KeyName(key), " holds a value that is not an integer: \"",
                           absl::CEscape(current->substr(0, 64)), "\""));
        }
        if (__builtin_add_overflow(value, delta, &sum)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "add: key ", KeyName(key), " would overflow int64 (", value, " + ", delta, ")"));
        }
        return absl::StrCat(sum);
      });
  if (!update.ok()) return update.status();
  return sum;
}

absl::StatusOr<std::string> EtcdStore::CompareSet(absl::string_view key, absl::string_view expected,
                                                  absl::string_view desired) {
  absl::StatusOr<Update> update = ReadModifyWrite(
      "compare_set", key,
      [&](const std::optional<std::string>& current) -> absl::StatusOr<std::optional<std::string>> {
        const bool matches = current.has_value() ? *current == expected : expected.empty();
        if (!matches) return std::nullopt;
        return std::string(desired);
      });
  if (!update.ok()) return update.status();
  if (update->wrote) return std::string(desired);
  return update->before.has_value() ? *update->before : std::string(expected);
}

absl::Status EtcdStore::Append(absl::string_view key, absl::string_view value) {
  return ReadModifyWrite("append", key,
                         [&](const std::optional<std::string>& current)
                             -> absl::StatusOr<std::optional<std::string>> {
                           return absl::StrCat(current.value_or(""), value);
                         })
      .status();
}

absl::StatusOr<bool> EtcdStore::Check(const std::vector<std::string>& keys) {
  int64_t revision = 0;
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      ReadAtOneRevision(keys, &revision);
  if (!values.ok()) return values.status();
  return std::all_of(values->begin(), values->end(),
                     [](const std::optional<std::string>& v) { return v.has_value(); });
}

absl::StatusOr<bool> EtcdStore::DeleteKey(absl::string_view key) {
  DeleteRangeRequest request;
  request.set_key(EtcdKey(key));
  DeleteRangeResponse response;
  absl::Status status = CallEtcd(absl::StrCat("delete of key ", KeyName(key)), Retry::kIdempotent,
                                 [&](Endpoint& endpoint, grpc::ClientContext& context) {
                                   return endpoint.kv->DeleteRange(&context, request, &response);
                                 });
  if (!status.ok()) return status;
  if (response.deleted() == 0) return false;
  NoteWrite(std::string(key), std::nullopt, response.header().revision());
  return true;
}

absl::StatusOr<int64_t> EtcdStore::NumKeys(absl::string_view prefix) {
  RangeRequest request;
  request.set_key(EtcdKey(prefix));
  request.set_range_end(PrefixEnd(EtcdKey(prefix)));
  request.set_count_only(true);
  RangeResponse response;
  absl::Status status =
      CallEtcd(absl::StrCat("num_keys under ", KeyName(prefix)), Retry::kIdempotent,
               [&](Endpoint& endpoint, grpc::ClientContext& context) {
                 return endpoint.kv->Range(&context, request, &response);
               });
  if (!status.ok()) return status;
  return response.count();
}

absl::StatusOr<Leases::Grant> EtcdStore::GrantLease(absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse response;
  // Repeated on another endpoint even if the first may have granted: a lease nobody renews
  // expires by itself, with no key bound to it.
  absl::Status status =
      CallEtcd(absl::StrCat("grant of a ", request.ttl(), " s lease"), Retry::kIdempotent,
               [&](Endpoint& endpoint, grpc::ClientContext& context) {
                 return endpoint.lease->LeaseGrant(&context, request, &response);
               });
  if (!status.ok()) return status;
  if (!response.error().empty() || response.id() == 0 || response.ttl() <= 0) {
    return absl::UnavailableError(absl::StrCat("etcd grant of a ", request.ttl(), " s lease on ",
                                               name_, " failed: ", Echo(response.error())));
  }
  return Grant{response.id(), absl::Seconds(response.ttl())};
}

absl::Status EtcdStore::SetLeased(absl::string_view key, absl::string_view value, int64_t id) {
  PutRequest request;
  request.set_key(EtcdKey(key));
  request.set_value(std::string(value));
  request.set_lease(id);
  PutResponse response;
  absl::Status status =
      CallEtcd(absl::StrFormat("set of key %s bound to lease %016x", KeyName(key), id),
               Retry::kIdempotent, [&](Endpoint& endpoint, grpc::ClientContext& context) {
                 return endpoint.kv->Put(&context, request, &response);
               });
  if (!status.ok()) return status;
  NoteWrite(std::string(key), std::string(value), response.header().revision());
  return absl::OkStatus();
}

absl::Status EtcdStore::KeepLeaseAlive(int64_t id) {
  const std::string what = absl::StrFormat("keepalive of lease %016x", id);
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(id);
  etcdserverpb::LeaseKeepAliveResponse response;
  bool answered = false;
  // One renewal per stream (etcd's stream ends when the client closes its side): renewals
  // come once per heartbeat interval, and a short stream fails over like any other call.
  absl::Status status =
      CallEtcd(what, Retry::kIdempotent, [&](Endpoint& endpoint, grpc::ClientContext& context) {
        answered = false;  // this attempt's answer only (the call may be repeated)
        response.Clear();
        std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                                                 etcdserverpb::LeaseKeepAliveResponse>>
            stream = endpoint.lease->LeaseKeepAlive(&context);
        if (stream->Write(request) && stream->Read(&response)) {
          answered = true;
          stream->WritesDone();
        }
        return stream->Finish();
      });
  if (!status.ok()) return status;
  if (!answered) {
    return absl::UnavailableError(
        absl::StrCat("etcd ", what, " on ", name_, ": the stream closed without an answer"));
  }
  // etcd answers an expired (or unknown) lease with a TTL of 0 or less, not an error.
  if (response.ttl() <= 0) {
    return absl::NotFoundError(
        absl::StrCat("etcd ", what, " on ", name_, ": the lease has expired"));
  }
  return absl::OkStatus();
}

absl::Status EtcdStore::RevokeLease(int64_t id) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(id);
  etcdserverpb::LeaseRevokeResponse response;
  absl::Status status = CallEtcd(absl::StrFormat("revoke of lease %016x", id), Retry::kIdempotent,
                                 [&](Endpoint& endpoint, grpc::ClientContext& context) {
                                   return endpoint.lease->LeaseRevoke(&context, request, &response);
                                 });
  if (absl::IsNotFound(status)) return absl::OkStatus();
  return status;
}

absl::StatusOr<WaitId> EtcdStore::WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                            WaitCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      return absl::UnavailableError(absl::StrCat("store ", name_, " is shutting down"));
    }
  }
  std::vector<std::string> unique = keys;
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  int64_t revision = 0;
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      ReadAtOneRevision(unique, &revision);
  if (!values.ok()) return values.status();
  const bool all_present =
      std::all_of(values->begin(), values->end(),
                  [](const std::optional<std::string>& v) { return v.has_value(); });

  std::vector<Completion> completions;
  absl::StatusOr<WaitId> id;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      return absl::UnavailableError(absl::StrCat("store ", name_, " is shutting down"));
    }
    if (all_present) {
      // Ends at once, from what was read: no watch needed.
      id = waiters_.Add(
          std::move(keys), deadline, std::move(done),
          [&](const std::string& key) {
            const size_t i = std::lower_bound(unique.begin(), unique.end(), key) - unique.begin();
            return Present((*values)[i]);
          },
          &completions);
    } else {
      for (size_t i = 0; i < unique.size(); ++i) {
        auto [it, inserted] = key_states_.try_emplace(unique[i]);
        KeyState& state = it->second;
        if (inserted) {
          state.value = (*values)[i];
          state.revision = revision;
          QueueWatchLocked(unique[i], state, revision + 1);
        } else {
          ApplyLocked(unique[i], (*values)[i], revision, &completions);
        }
        ++state.refs;
      }
      // The wait holds its keys' watches until it ends, however it ends. Each key has its
      // own watch, and etcd does not order events across watches: a wait for a and b may see
      // b's put before a's delete that came first. So a wait the watches complete for several
      // keys is confirmed by one read at a single revision; a key missing there starts the
      // wait again.
      auto self = std::make_shared<WaitId>(0);  // this wait's id, once Add gave it
      id = waiters_.Add(
          keys, deadline,
          [this, unique, keys, deadline, self,
           done = std::move(done)](absl::StatusOr<std::vector<std::string>> result) mutable {
            if (result.ok() && unique.size() > 1) {
              int64_t at = 0;
              absl::StatusOr<std::vector<std::optional<std::string>>> read =
                  ReadAtOneRevision(unique, &at);
              if (!read.ok()) {
                result = read.status();
              } else if (std::all_of(
                             read->begin(), read->end(),
                             [](const std::optional<std::string>& v) { return v.has_value(); })) {
                for (size_t k = 0; k < keys.size(); ++k) {
                  const size_t i =
                      std::lower_bound(unique.begin(), unique.end(), keys[k]) - unique.begin();
                  (*result)[k] = *(*read)[i];
                }
              } else {
                // WaitAsync calls its callback only when it started the wait.
                auto callback = std::make_shared<WaitCallback>(std::move(done));
                absl::StatusOr<WaitId> again = WaitAsync(
                    keys, deadline, [callback](absl::StatusOr<std::vector<std::string>> r) {
                      (*callback)(std::move(r));
                    });
                ReleaseKeys(unique);
                if (!again.ok()) {
                  (*callback)(again.status());
                  return;
                }
                // CancelWait with the id its caller holds reaches the wait's new self.
                absl::MutexLock lock(&mu_);
                restarted_[*self] = *again;
                return;
              }
            }
            ReleaseKeys(unique);
            done(std::move(result));
          },
          [this](const std::string& key) { return LookupHeld(key); }, &completions);
      if (id.ok()) *self = *id;
      if (id.ok() && waiters_.Contains(*id) && waiters_.NextDeadline() == deadline) {
        timer_cv_.Signal();
      }
      watch_cv_.SignalAll();
    }
  }
  if (!id.ok() && !all_present) ReleaseKeys(unique);  // refused: the callback never runs
  FlushWatchRequests();
  WaiterTable::Run(std::move(completions));
  return id;
}

void EtcdStore::CancelWait(WaitId id) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = restarted_.find(id); it != restarted_.end(); it = restarted_.find(id)) {
      id = it->second;
      restarted_.erase(it);
    }
    waiters_.Cancel(id, &completions);
  }
  WaiterTable::Run(std::move(completions));
}

std::string EtcdStore::EndpointNamedBy(const std::vector<std::string>& client_urls) const {
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const std::string& address = endpoints_[i].address;
    const std::string port = address.substr(address.rfind(':'));
    std::string named_host;  // the endpoint as the URL named it, before it was resolved
    if (i < options_.endpoint_hosts.size() && !options_.endpoint_hosts[i].empty()) {
      named_host = absl::StrCat(options_.endpoint_hosts[i], port);
    }
    for (absl::string_view url : client_urls) {
      if (!absl::ConsumePrefix(&url, "http://")) absl::ConsumePrefix(&url, "https://");
      absl::ConsumeSuffix(&url, "/");
      if (url == address || (!named_host.empty() && url == named_host)) return address;
    }
  }
  return "";
}

Cluster::Health EtcdStore::ProbeMembers(absl::Time deadline) {
  Health health;
  etcdserverpb::MemberListResponse list;
  const absl::Status listed = CallEtcd(
      "member list", Retry::kIdempotent, [&](Endpoint& endpoint, grpc::ClientContext& context) {
        return endpoint.cluster->MemberList(&context, etcdserverpb::MemberListRequest(), &list);
      });
  if (listed.ok()) {
    for (const etcdserverpb::Member& from : list.members()) {
      if (health.members.size() == kMaxProbedMembers) break;
      Member& member = health.members.emplace_back();
      member.id = from.id();
      member.name = Echo(from.name());
      for (const std::string& url : from.clienturls()) {
        if (member.client_urls.size() == kMaxListedItems) break;
        member.client_urls.push_back(Echo(url));
      }
      member.learner = from.islearner();
      member.endpoint = EndpointNamedBy({from.clienturls().begin(), from.clienturls().end()});
    }
  } else {
    health.list_error = listed.ToString();
  }

  // Every endpoint at once: a member that is down costs the probe one failed connection, not
  // a timeout each in turn. No "hasleader" (Decorate): a member without a leader must answer,
  // saying so. The token is the one calls carry (listing authenticated, where it could).
  struct Asked {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientAsyncResponseReader<etcdserverpb::StatusResponse>> call;
    etcdserverpb::StatusResponse response;
    grpc::Status status;
    absl::Time sent;
    absl::Duration round_trip;
  };
  const std::string token = CurrentToken();
  grpc::CompletionQueue queue;
  std::vector<Asked> asked(endpoints_.size());
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    Asked& one = asked[i];
    one.context.set_deadline(absl::ToChronoTime(deadline));
    if (!token.empty()) one.context.AddMetadata("token", token);
    one.sent = absl::Now();
    one.call =
        endpoints_[i].maintenance->AsyncStatus(&one.context, etcdserverpb::StatusRequest(), &queue);
    one.call->Finish(&one.response, &one.status, reinterpret_cast<void*>(i));
  }
  // Each call ends by its deadline, so every tag comes back.
  void* tag;
  bool ok;
  for (size_t left = asked.size(); left > 0; --left) {
    if (!queue.Next(&tag, &ok)) break;
    Asked& one = asked[reinterpret_cast<uintptr_t>(tag)];
    one.round_trip = absl::Now() - one.sent;
  }
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }

  for (size_t i = 0; i < asked.size(); ++i) {
    const Asked& one = asked[i];
    const std::string& address = endpoints_[i].address;
    if (!one.status.ok()) {
      const std::string why = Echo(one.status.error_message());
      auto member = std::find_if(health.members.begin(), health.members.end(),
                                 [&address](const Member& m) { return m.endpoint == address; });
      if (member != health.members.end()) {
        member->unanswered = why;
      } else {
        health.unanswered.push_back(absl::StrCat(address, ": ", why));
      }
      continue;
    }
    const uint64_t id = one.response.header().member_id();
    auto member = std::find_if(health.members.begin(), health.members.end(),
                               [id](const Member& m) { return m.id == id; });
    if (member == health.members.end()) {
      // Not listed (listing failed, or the member joined since): known by its answer alone.
      if (health.members.size() == kMaxProbedMembers) continue;
      member = health.members.insert(health.members.end(), Member());
      member->id = id;
    }
    member->endpoint = address;
    member->version = Echo(one.response.version());
    member->db_size_bytes = one.response.dbsize();
    member->leader = one.response.leader();
    member->raft_term = one.response.raftterm();
    member->raft_index = one.response.raftindex();
    member->learner = member->learner || one.response.islearner();
    for (const std::string& error : one.response.errors()) {
      if (member->errors.size() == kMaxListedItems) break;
      member->errors.push_back(Echo(error));
    }
    member->round_trip = one.round_trip;
  }
  return health;
}

EtcdStoreStats EtcdStore::Stats() {
  absl::MutexLock lock(&mu_);
  EtcdStoreStats stats = stats_;
  stats.waiters = waiters_.size();
  stats.watched_keys = static_cast<int64_t>(key_states_.size());
  return stats;
}

void EtcdStore::NoteWrite(const std::string& key, std::optional<std::string> value,
                          int64_t revision) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    ApplyLocked(key, std::move(value), revision, &completions);
  }
  WaiterTable::Run(std::move(completions));
  // The watch thread may have seen this very write first and ended the waits it completes;
  // their callbacks must have run before the write returns, as they would have here.
  if (std::this_thread::get_id() == watcher_.get_id()) return;  // a callback's own write
  absl::MutexLock lock(&mu_);
  while (watch_completions_running_ > 0) watch_completions_done_.Wait(&mu_);
}

void EtcdStore::RunWatchCompletions(std::vector<Completion> completions) {
  if (completions.empty()) return;
  WaiterTable::Run(std::move(completions));
  absl::MutexLock lock(&mu_);
  if (--watch_completions_running_ == 0) watch_completions_done_.SignalAll();
}

void EtcdStore::ApplyLocked(const std::string& key, std::optional<std::string> value,
                            int64_t revision, std::vector<Completion>* out) {
  auto it = key_states_.find(key);
  if (it == key_states_.end() || revision <= it->second.revision) return;
  it->second.value = std::move(value);
  it->second.revision = revision;
  if (it->second.value.has_value()) {
    waiters_.OnKeySet(
        key, [this](const std::string& k) { return LookupHeld(k); }, out);
  }
}

void EtcdStore::ReleaseKeys(const std::vector<std::string>& keys) {
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& key : keys) {
      auto it = key_states_.find(key);
      if (it == key_states_.end()) continue;
      if (--it->second.refs > 0) continue;
      if (watch_keys_.erase(it->second.watch_id) > 0) {
        WatchRequest request;
        request.mutable_cancel_request()->set_watch_id(it->second.watch_id);
        watch_requests_.push_back(std::move(request));
      }
      key_states_.erase(it);
    }
  }
  FlushWatchRequests();
}

const std::string* EtcdStore::LookupHeld(const std::string& key) {
  mu_.AssertHeld();
  auto it = key_states_.find(key);
  return it == key_states_.end() ? nullptr : Present(it->second.value);
}

void EtcdStore::QueueWatchLocked(const std::string& key, KeyState& state, int64_t start_revision) {
  // A fresh id per watch, so a late answer for an old watch of the key is recognised and
  // dropped.
  state.watch_id = next_watch_id_++;
  watch_keys_[state.watch_id] = key;
  WatchRequest request;
  etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
  create->set_key(EtcdKey(key));
  create->set_start_revision(start_revision);
  create->set_watch_id(state.watch_id);
  watch_requests_.push_back(std::move(request));
}

void EtcdStore::FlushWatchRequests() {
  // Never waits for another writer: whoever holds write_mu_ writes what is queued, and checks
  // again after letting go, so nothing queued meanwhile is stranded. The watch thread runs
  // wait callbacks, which flush; blocking it behind a Write that waits for etcd to read
  // could stall the stream both ways.
  for (;;) {
    if (!write_mu_.TryLock()) return;
    FlushWatchRequestsLocked();
    write_mu_.Unlock();
    absl::MutexLock lock(&mu_);
    if (watch_requests_.empty()) return;
  }
}

void EtcdStore::FlushWatchRequestsLocked() {
  for (;;) {
    WatchRequest request;
    {
      absl::MutexLock lock(&mu_);
      if (watch_requests_.empty()) return;
      request = std::move(watch_requests_.front());
      watch_requests_.pop_front();
    }
    // With no stream, or a broken one, the request is dropped: the watch thread recreates
    // every key's watch on the next stream.
    if (watch_stream_ != nullptr) watch_stream_->Write(request);
  }
}

void EtcdStore::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time next = waiters_.NextDeadline();
    if (absl::Now() < next) {
      timer_cv_.WaitWithDeadline(&mu_, next);
      continue;
    }
    std::vector<Completion> completions;
    waiters_.ExpireUntil(
        absl::Now(), [this](const std::string& key) { return LookupHeld(key); }, &completions);
    mu_.Unlock();
    WaiterTable::Run(std::move(completions));
    mu_.Lock();
  }
}

void EtcdStore::WatchLoop() {
  size_t index = preferred_endpoint_.load();
  size_t failures_in_a_row = 0;
  bool outage_logged = false;
  // After a round in which no endpoint answered, wait for failing members' next attempts.
  bool wait_if_failing = false;
  // The token generation etcd refused a watch with (-1: none), and how many streams in a row
  // ended so.
  int64_t stale_token = -1;
  int denials_in_a_row = 0;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && key_states_.empty()) watch_cv_.Wait(&mu_);
      if (stopping_) return;
      if (failures_in_a_row >= endpoints_.size()) {
        // Every endpoint failed: pause before the next round (the destructor wakes it).
        watch_cv_.WaitWithTimeout(&mu_, kWatchRetryPause);
        if (stopping_) return;
        failures_in_a_row = 0;
        wait_if_failing = true;
      }
    }
    Endpoint& endpoint = endpoints_[index % endpoints_.size()];
    if (!Connect(*endpoint.channel, absl::Now() + options_.connect_timeout, wait_if_failing)) {
      ++index;
      ++failures_in_a_row;
      continue;
    }
    // etcd checks a watch's permission (with the stream's token) when the watch is created;
    // an expired token makes it cancel the watch, and the stream reopens with a fresh one.
    absl::StatusOr<Token> token =
        GetToken(endpoint, absl::Now() + options_.connect_timeout, stale_token);
    if (!token.ok()) {
      if (!outage_logged) {
        outage_logged = true;
        Log()->warn("[store {}] watch stream at {}: {}", name_, endpoint.address,
                    std::string(token.status().message()));
      }
      ++index;
      ++failures_in_a_row;
      continue;
    }
    grpc::ClientContext context;
    Decorate(context, *token);
    std::unique_ptr<grpc::ClientReaderWriter<WatchRequest, WatchResponse>> stream =
        endpoint.watch->Watch(&context);
    int64_t keys = 0;
    {
      absl::MutexLock write_lock(&write_mu_);
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) {
          context.TryCancel();
          stream->Finish().IgnoreError();
          return;
        }
        // Every key resumes from the revision after the last one seen, so nothing written
        // while the previous stream was down is missed.
        watch_requests_.clear();
        watch_keys_.clear();
        for (auto& [key, state] : key_states_) QueueWatchLocked(key, state, state.revision + 1);
        keys = static_cast<int64_t>(key_states_.size());
        ++stats_.watch_streams_opened;
      }
      watch_context_ = &context;
      watch_stream_ = stream.get();
      FlushWatchRequestsLocked();
    }
    Log()->debug("[store {}] watch stream open at {} for {} keys", name_, endpoint.address, keys);
    WatchResponse response;
    bool answered = false;
    bool denied = false;
    while (stream->Read(&response)) {
      answered = true;
      if (!OnWatchResponse(response)) {
        denied = true;
        context.TryCancel();
        break;
      }
    }
    if (answered) {
      failures_in_a_row = 0;
      outage_logged = false;
      wait_if_failing = false;
    }
    {
      absl::MutexLock write_lock(&write_mu_);
      watch_context_ = nullptr;
      watch_stream_ = nullptr;
    }
    const grpc::Status status = stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (denied) {
      // Reopen at the same endpoint with a fresh token. Refused again with the fresh one: the
      // user lacks the permission; pause, so that a revoked role costs an authentication a
      // second, not a loop (waits end at their deadlines).
      stale_token = token->generation;
      if (++denials_in_a_row > 1) {
        if (denials_in_a_row == 2) {
          Log()->warn(
              "[store {}] etcd at {} refuses to watch the store's keys even with a "
              "fresh token (permission denied): the etcd user's roles must grant "
              "readwrite on the key prefix; retrying every {}",
              name_, endpoint.address, absl::FormatDuration(kWatchDeniedPause));
        }
        absl::MutexLock lock(&mu_);
        watch_cv_.WaitWithTimeout(&mu_, kWatchDeniedPause);
      }
      continue;
    }
    denials_in_a_row = 0;
    // Once per outage, not once per endpoint and round while no member has a leader.
    if (!outage_logged) {
      outage_logged = true;
      Log()->warn("[store {}] watch stream at {} ended ({}: {}); resuming on the next endpoint",
                  name_, endpoint.address, static_cast<int>(status.error_code()),
                  Echo(status.error_message()));
    }
    ++index;
    ++failures_in_a_row;
  }
}

bool EtcdStore::OnWatchResponse(const WatchResponse& response) {
  if (response.canceled() && IsAuthCancel(response.cancel_reason())) {
    // etcd checks a watch's permission with the stream's token when the watch is created,
    // and refuses it with watch id -1 (not the id asked for), so which key is not known.
    // The next stream, opened with a fresh token, watches every key again from the revision
    // after the last seen.
    Log()->debug(
        "[store {}] etcd refused a watch ({}); reopening the watch stream with a "
        "fresh token",
        name_, Echo(response.cancel_reason()));
    return false;
  }
  std::vector<Completion> completions;
  std::optional<std::string> rewatch;
  {
    absl::MutexLock lock(&mu_);
    auto it = watch_keys_.find(response.watch_id());
    if (it == watch_keys_.end()) return true;  // a cancelled or superseded watch
    const std::string key = it->second;
    if (response.canceled() || response.compact_revision() != 0) {
      if (response.compact_revision() != 0) ++stats_.compactions_seen;
      watch_keys_.erase(it);
      rewatch = key;
      Log()->warn(
          "[store {}] watch of key {} cancelled by etcd (compact revision {}, reason \"{}\"); "
          "rereading the key's current value",
          name_, KeyName(key), response.compact_revision(), Echo(response.cancel_reason()));
    } else {
      for (const mvccpb::Event& event : response.events()) {
        ++stats_.watch_events;
        std::optional<std::string> value;
        if (event.type() == mvccpb::Event::PUT) value = event.kv().value();
        ApplyLocked(key, std::move(value), event.kv().mod_revision(), &completions);
      }
    }
    if (!completions.empty()) ++watch_completions_running_;
  }
  RunWatchCompletions(std::move(completions));
  if (rewatch.has_value()) RewatchAfterCancel(*rewatch, response.watch_id());
  return true;
}

void EtcdStore::RewatchAfterCancel(const std::string& key, int64_t watch_id) {
  for (;;) {
    int64_t revision = 0;
    absl::StatusOr<std::vector<std::optional<std::string>>> values =
        ReadAtOneRevision({key}, &revision);
    std::vector<Completion> completions;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      auto it = key_states_.find(key);
      // Gone (no wait needs it) or already watched again on a new stream.
      if (it == key_states_.end() || it->second.watch_id != watch_id) return;
      if (values.ok()) {
        ApplyLocked(key, (*values)[0], revision, &completions);
        QueueWatchLocked(key, it->second, std::max(revision, it->second.revision) + 1);
        if (!completions.empty()) ++watch_completions_running_;
      }
    }
    if (values.ok()) {
      FlushWatchRequests();
      RunWatchCompletions(std::move(completions));
      return;
    }
    Log()->warn("[store {}] rereading key {} after its watch was cancelled: {}", name_,
                KeyName(key), values.status().ToString());
    absl::MutexLock lock(&mu_);
    watch_cv_.WaitWithTimeout(&mu_, kWatchRetryPause);
  }
}

}  // namespace tpd::store
