// Admission of calls on the peer port. Every call carries a per-call MAC keyed by the
// cluster token (store/peer_mac.h); the token itself never travels. Local (unix
// socket) calls are admitted by file permission instead and never reach this.
//
// A call is admitted when, in this order: it carries the MAC header ("no MAC" otherwise),
// the MAC over method, audience, timestamp, sender, sequence and the request's digest
// matches ("bad MAC"), the timestamp is within max_skew of this daemon's clock ("stale
// timestamp"), the audience's port is this daemon's peer port ("wrong audience": a call
// signed for another daemon), and its (sender, sequence) was not accepted before ("replay",
// see ReplayGuard). Otherwise UNAUTHENTICATED naming which.
//
// Rejections are logged at most once per caller host per log_interval; the next line says
// how many were suppressed meanwhile.
//
// Thread safety: thread-safe.

#ifndef TPD_DAEMON_PEER_AUTH_H_
#define TPD_DAEMON_PEER_AUTH_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/log_limiter.h"
#include "daemon/replay_guard.h"
#include "google/protobuf/message.h"
#include "grpcpp/server_context.h"
#include "store/store.h"

namespace tpd {

struct PeerAuthOptions {
  // The cluster token, the MAC key. Must not be empty.
  std::string token;
  // This daemon's peer port, when known at construction (else set_port() once bound).
  int port = 0;
  // Largest difference between a call's timestamp and this daemon's clock.
  absl::Duration max_skew = absl::Seconds(30);
  // Senders whose replay windows are kept (ReplayGuard).
  size_t max_senders = 4096;
  // At most one log line per caller host per this long.
  absl::Duration log_interval = absl::Seconds(10);
  // Hosts whose log limit is tracked; past it the table starts over.
  size_t max_log_hosts = 1024;
};

class PeerAuth {
 public:
  // `start` is this daemon's start: calls of unknown senders stamped before it are refused.
  explicit PeerAuth(PeerAuthOptions options, absl::Time start = absl::Now());

  // The peer port actually bound ("host:0" in the config picks one at start).
  void set_port(int port) { port_.store(port); }

  // Admits the call `method` ("/tpd.v1.Store/Set") with `request`, reading the MAC from the
  // call's metadata; logs a refusal (rate-limited) with the caller's address. An admitted
  // call made on behalf of a user of the calling node names that user in `*on_behalf` (when
  // not null; nullopt for the calling daemon's own call).
  absl::Status Admit(const grpc::CallbackServerContext& context, absl::string_view method,
                     const google::protobuf::Message& request,
                     std::optional<store::StoreUser>* on_behalf = nullptr);

  // Signs the successful answer `response` to an admitted call (store/peer_mac.h):
  // adds the reply MAC, bound to the call's own MAC, to the call's trailing metadata.
  void SignReply(grpc::CallbackServerContext* context, const google::protobuf::Message& response);

  // The decision itself: `header` is the MAC header's value, nullopt when absent. Does not log.
  absl::Status Check(std::optional<absl::string_view> header, absl::string_view method,
                     const google::protobuf::Message& request, absl::Time now,
                     std::optional<store::StoreUser>* on_behalf = nullptr);

 private:
  // Logs `status` for `peer` unless a line for its host was logged within log_interval.
  void LogRejection(const std::string& peer, const absl::Status& status, absl::Time now);

  const PeerAuthOptions options_;
  std::atomic<int> port_;
  ReplayGuard replays_;

  LogLimiter log_;  // one line per caller host per log_interval
};

}  // namespace tpd

#endif  // TPD_DAEMON_PEER_AUTH_H_
