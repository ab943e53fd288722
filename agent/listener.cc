#include "agent/listener.h"

#include <arpa/inet.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/address.h"
#include "agent/log.h"
#include "base/check.h"

namespace tpd::agent {

namespace {

constexpr absl::Duration kFailureLogInterval = absl::Seconds(10);
// How soon after a listener failure the agent tries to listen again, and how often while the
// old listener's port is not free yet.
constexpr absl::Duration kRelistenDelay = absl::Milliseconds(20);

absl::Status CannotGuard(absl::string_view why) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot guard the agent's ports with accept_networks: ", why));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> Listener::Create(const AgentOptions& options) {
  std::unique_ptr<Listener> listener(new Listener());
  listener->id_ = options.id;
  if (absl::Status s = SplitHostPort(options.listen_address, &listener->host_, &listener->port_,
                                     &listener->family_);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("agent listen_address: ", s.message()));
  }
  absl::StatusOr<ListenGuard> guard = ListenGuard::Create(options.accept_networks);
  if (!guard.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("agent ", guard.status().message()));
  }
  listener->guard_ = *std::move(guard);
  const std::string option_text = absl::StrCat(options.listen_address, " (agent listen_address)");
  const std::string& host = listener->host_;
  if (absl::Status s = CheckBindable(host, listener->port_, listener->family_, option_text);
      !s.ok()) {
    return s;
  }
  if (listener->port_ != "0") {
    // The mpt_uv lanes bind the same host on free ports.
    if (absl::Status s = CheckBindable(host, "0", listener->family_, option_text); !s.ok()) {
      return s;
    }
  }
  // The listening sockets this process has now: those bound to the host that appear from
  // here on are ours (the mpt_uv lanes listen inside Registry::Create, on ports TensorPipe
  // keeps to itself). A listener another thread opens on the host meanwhile would be guarded
  // too.
  if (absl::Status s = ForEachListeningTcpSocket(
          [&](const ListeningSocket& socket) { listener->sockets_before_.insert(socket.inode); });
      !s.ok()) {
    return CannotGuard(s.message());
  }
  const int parsed = inet_pton(listener->family_, host.c_str(), listener->host_bytes_.data());
  TPD_DCHECK(parsed == 1);  // SplitHostPort took it
  return listener;
}

absl::Status Listener::Listen(std::shared_ptr<tensorpipe::Context> context,
                              const Registry& registry, Hooks hooks) {
  context_ = std::move(context);
  registry_ = &registry;
  hooks_ = std::move(hooks);
  const std::map<std::string, std::string> listen_urls = registry.ListenUrls(port_);
  std::vector<std::string> to_listen;
  const std::vector<std::string> order = registry.BootstrapOrder();
  for (const std::string& transport : order) to_listen.push_back(listen_urls.at(transport));
  std::shared_ptr<tensorpipe::Listener> listener = context_->listen(to_listen);
  // url() waits for TensorPipe's loop, so every transport listens by the time it returns.
  for (const std::string& transport : order) urls_.push_back(listener->url(transport));
  address_ = absl::StrJoin(urls_, ",");
  {
    absl::MutexLock lock(&mu_);
    listener_ = listener;  // Close closes it if the guard below fails
  }
  for (const std::string& url : urls_) {
    if (absl::StartsWith(url, "uv://")) {
      const bool parsed = absl::SimpleAtoi(url.substr(url.rfind(':') + 1), &uv_port_);
      TPD_DCHECK(parsed);
    }
  }
  // Ours: the listening sockets on host_ that Create and listen() made.
  absl::Status listed = ForEachListeningTcpSocket([&](const ListeningSocket& socket) {
    if (!sockets_before_.contains(socket.inode) && socket.family == family_ &&
        socket.address == host_bytes_) {
      guarded_ports_.insert(socket.port);
    }
  });
  if (!listed.ok()) return CannotGuard(listed.message());
  return Guard(/*at_start=*/true);
}

absl::Status Listener::Guard(bool at_start) {
  const char* when = at_start ? "at start" : "after listening again";
  absl::StatusOr<std::vector<int>> guarded =
      GuardListeningSockets(*guard_, family_, host_bytes_, guarded_ports_);
  if (!guarded.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot guard the agent's ports with accept_networks ", when, ": ",
                     guarded.status().message()));
  }
  if (uv_port_ >= 0 && std::find(guarded->begin(), guarded->end(), uv_port_) == guarded->end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot guard the agent's ports with accept_networks ", when,
                     ": no listening socket of this process on the uv port ", uv_port_));
  }
  std::sort(guarded->begin(), guarded->end());
  // Once at info; re-listens (which anyone inside accept_networks can cause) at debug.
  AgentLog().log(at_start ? spdlog::level::info : spdlog::level::debug,
                 "[agent {}] only hosts in accept_networks ({}) may connect to ports {} ({})", id_,
                 guard_->ToString(), absl::StrJoin(*guarded, ", "), when);
  return absl::OkStatus();
}

void Listener::Accept() {
  std::shared_ptr<tensorpipe::Listener> listener;
  {
    absl::MutexLock lock(&mu_);
    listener = listener_;
  }
  AcceptOn(std::move(listener));
}

void Listener::AcceptOn(std::shared_ptr<tensorpipe::Listener> listener) {
  std::weak_ptr<tensorpipe::Listener> weak = listener;
  listener->accept(
      [this, weak](const tensorpipe::Error& error, std::shared_ptr<tensorpipe::Pipe> pipe) {
        if (error) {
          OnFailed(error.what());
          return;
        }
        if (std::shared_ptr<tensorpipe::Listener> still = weak.lock()) AcceptOn(std::move(still));
        hooks_.accepted(std::move(pipe));
      });
}

void Listener::OnFailed(const std::string& what) {
  uint64_t unlogged = 0;
  bool log = false;
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    ++failures_;
    if (now - failure_logged_ >= kFailureLogInterval) {
      log = true;
      unlogged = failures_unlogged_;
      failures_unlogged_ = 0;
      failure_logged_ = now;
    } else {
      ++failures_unlogged_;
    }
  }
  hooks_.relisten_at(now + kRelistenDelay);
  if (log) {
    AgentLog().warn(
        "[agent {}] TensorPipe's listener failed: {}{}; listening again on {} (a "
        "connection that closes before its first packet does this: a port scan, "
        "a peer gone mid-connect)",
        id_, what,
        unlogged > 0 ? absl::StrCat(" (and ", unlogged, " more times in the last ",
                                    absl::FormatDuration(kFailureLogInterval), ")")
                     : std::string(),
        address_);
  }
}

void Listener::Relisten() {
  absl::MutexLock relisten(&relisten_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
  }
  // TensorPipe aborts the process when the uv listener's bind fails, and the failed listener
  // closes its socket on TensorPipe's loop, some time after it reported the failure: listen
  // only once the port is free (the shm listener's name is no risk: its bind failing is an
  // error, which brings us back here).
  for (const std::string& url : urls_) {
    if (!absl::StartsWith(url, "uv://")) continue;
    const std::string port = url.substr(url.rfind(':') + 1);
    if (!CheckBindable(host_, port, family_, url).ok()) {
      hooks_.relisten_at(absl::Now() + kRelistenDelay);
      return;
    }
  }
  std::shared_ptr<tensorpipe::Listener> listener = context_->listen(urls_);
  const std::vector<std::string> order = registry_->BootstrapOrder();
  for (size_t i = 0; i < order.size() && i < urls_.size(); ++i) {
    if (listener->url(order[i]) != urls_[i]) {
      AgentLog().error(
          "[agent {}] listening again on {} gave {}; peers that have the old URL "
          "cannot reach this agent",
          id_, urls_[i], listener->url(order[i]));
    }
  }
  if (absl::Status s = Guard(/*at_start=*/false); !s.ok()) {
    // Fail closed: an unguarded listener never accepts. Closing it fails no pipe (accepted
    // pipes do not depend on it); the next attempt comes in a second.
    AgentLog().error("[agent {}] {}; not accepting pipes until it can, retrying in 1s", id_,
                     std::string(s.message()));
    listener->close();
    hooks_.relisten_at(absl::Now() + absl::Seconds(1));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    listener_ = listener;  // not closed_: Close waits for relisten_mu_ before it sets it
  }
  AcceptOn(std::move(listener));
}

void Listener::Close() {
  std::shared_ptr<tensorpipe::Listener> listener;
  {
    absl::MutexLock relisten(&relisten_mu_);
    absl::MutexLock lock(&mu_);
    closed_ = true;
    listener = listener_;
  }
  if (listener != nullptr) listener->close();
}

uint64_t Listener::failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

}  // namespace tpd::agent
