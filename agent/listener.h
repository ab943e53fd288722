// The agent's listening side: TensorPipe's listener on every registered transport, the
// accept_networks filter on its sockets (agent/listen_guard.h), accepted pipes handed on, and
// listening again when TensorPipe's listener fails (which one connection closing before its
// first packet does: docs/security.md, "Agent pipes").
//
// Thread safety: thread-safe. Relisten runs on the agent's timer thread; hooks run with no
// lock of the listener's held.

#ifndef TPD_AGENT_LISTENER_H_
#define TPD_AGENT_LISTENER_H_

#include <tensorpipe/tensorpipe.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/listen_guard.h"
#include "agent/registry.h"
#include "agent/types.h"

namespace tpd::agent {

class Listener {
 public:
  struct Hooks {
    // Each pipe TensorPipe accepted; a TensorPipe thread.
    std::function<void(std::shared_ptr<tensorpipe::Pipe>)> accepted;
    // Asks the owner to call Relisten at `when` (or sooner, if it already would).
    std::function<void(absl::Time when)> relisten_at;
  };

  // Checks listen_address and accept_networks, that the port is free (TensorPipe aborts the
  // process when its bind fails), and notes this process's listening sockets so that Listen
  // can tell ours: call it before anything else of the agent listens (the mpt_uv lanes in
  // Registry::Create). Create's INVALID_ARGUMENT, UNAVAILABLE and FAILED_PRECONDITION.
  static absl::StatusOr<std::unique_ptr<Listener>> Create(const AgentOptions& options);

  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // The host of listen_address, an IP literal.
  const std::string& host() const { return host_; }

  // Listens on every transport `registry` registered with `context` and attaches the filter
  // to our sockets (FAILED_PRECONDITION if it cannot). Once, before Accept.
  absl::Status Listen(std::shared_ptr<tensorpipe::Context> context, const Registry& registry,
                      Hooks hooks);
  // Starts accepting pipes, each handed to hooks.accepted.
  void Accept() ABSL_LOCKS_EXCLUDED(mu_);
  // Listens again on the same URLs once the failed listener's port is free; on the owner's
  // timer thread, when hooks.relisten_at asked.
  void Relisten() ABSL_LOCKS_EXCLUDED(relisten_mu_, mu_);
  // Closes the listener; waits for a Relisten in progress, and none starts afterwards.
  void Close() ABSL_LOCKS_EXCLUDED(relisten_mu_, mu_);

  // What Listen listens on, lowest priority first (Agent::urls()), and joined by commas.
  const std::vector<std::string>& urls() const { return urls_; }
  const std::string& address() const { return address_; }
  // Times TensorPipe's listener failed.
  uint64_t failures() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Listener() = default;

  void AcceptOn(std::shared_ptr<tensorpipe::Listener> listener);
  void OnFailed(const std::string& what) ABSL_LOCKS_EXCLUDED(mu_);
  // Attaches guard_ to every listening socket of ours (host_ and a port in guarded_ports_), at
  // start or after a re-listen. FAILED_PRECONDITION when the uv listener was not among them.
  absl::Status Guard(bool at_start);

  std::string id_;  // the agent's, for logs
  std::string host_;
  std::string port_;
  int family_ = 0;
  // host_'s bytes, as ListeningSocket::address.
  std::array<unsigned char, 16> host_bytes_{};
  std::optional<ListenGuard> guard_;
  // This process's listening sockets (inodes) before the agent made any: the rest of those
  // bound to host_ are the agent's.
  absl::flat_hash_set<uint64_t> sockets_before_;
  // Set by Listen, then const: the ports of our listening sockets (uv, ibv, the mpt_uv lanes),
  // uv's (-1: uv not registered), the URLs, and what the listener needs again on a re-listen.
  absl::flat_hash_set<int> guarded_ports_;
  int uv_port_ = -1;
  std::vector<std::string> urls_;
  std::string address_;
  std::shared_ptr<tensorpipe::Context> context_;
  const Registry* registry_ = nullptr;
  Hooks hooks_;

  // Held across a whole Relisten, so that Close never closes the context under a listen().
  absl::Mutex relisten_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  // Replaced by Relisten until closed.
  std::shared_ptr<tensorpipe::Listener> listener_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // How the failures are logged: the first, then at most one line per 10 s with a count.
  uint64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failures_unlogged_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time failure_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace tpd::agent

#endif  // TPD_AGENT_LISTENER_H_
