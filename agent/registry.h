// Which TensorPipe transports and channels this build and this node can use, with PyTorch's
// priorities (seed 001: tensorpipe_agent.h), narrowed to the lists a group negotiated.
//
// TensorPipe picks, per pipe, the highest-priority transport both ends registered whose domains
// match (shm only on one host), after bootstrapping on the lowest-priority one (uv, which works
// everywhere), and per device pair the highest-priority channel both ends registered that can
// connect them (cma only between processes of one host and user, xth only inside one process).
//
//   transports   shm 200   ibv 100   uv 0
//   channels     xth 1300  cma 1200  mpt_uv 1100  basic 1000
//                cuda_xth 400  cuda_ipc 300  cuda_gdr 200  cuda_basic 0   (not in this build)
//
// xth is tpd's addition (PyTorch registers no CPU xth): a memcpy between two agents of one
// process, which daemons never are. It is registered only when the channel list names it:
// when a pipe fails mid-transfer, TensorPipe's xth hands the sender's buffer back while the
// receiving thread may still be copying from it (a use after free; seen under ThreadSanitizer),
// a risk worth nothing to a daemon. Groups never list it.
// Every name is probed when the registry is created: a context TensorPipe calls not viable
// (no InfiniBand device, ptrace forbidding cma, no shared memory) is not registered, and
// Describe() says so, as it says which names a group's lists left out.
//
// Lifetime: the registry creates the TensorPipe transport and channel contexts; RegisterWith()
// hands those it chose to a tensorpipe::Context, which closes them when it closes. Contexts
// found not viable are closed at once (some own a thread even then); chosen ones never handed
// over are closed by the registry's destructor.
//
// Thread safety: const methods are thread-safe; RegisterWith() is called once, before the
// context is used.

#ifndef TPD_AGENT_REGISTRY_H_
#define TPD_AGENT_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tensorpipe {
class Context;
namespace transport {
class Context;
}  // namespace transport
namespace channel {
class Context;
}  // namespace channel
}  // namespace tensorpipe

namespace tpd::agent {

// PyTorch's priorities: higher wins the TensorPipe handshake.
inline constexpr int64_t kShmTransportPriority = 200;
inline constexpr int64_t kIbvTransportPriority = 100;
inline constexpr int64_t kUvTransportPriority = 0;
inline constexpr int64_t kXthChannelPriority = 1300;  // tpd's; in-process only
inline constexpr int64_t kCmaChannelPriority = 1200;
inline constexpr int64_t kMultiplexedUvChannelPriority = 1100;
inline constexpr int64_t kBasicChannelPriority = 1000;
inline constexpr int64_t kCudaXthChannelPriority = 400;
inline constexpr int64_t kCudaIpcChannelPriority = 300;
inline constexpr int64_t kCudaGdrChannelPriority = 200;
inline constexpr int64_t kCudaBasicChannelPriority = 0;

struct RegistryOptions {
  // The names allowed (a group's negotiated `transports` and `channels`); empty allows every
  // name this build knows but xth (see above). An unknown name is INVALID_ARGUMENT, as in
  // PyTorch.
  std::vector<std::string> transports;
  std::vector<std::string> channels;
  // The host the uv-based listeners bind: uv itself, ibv, and mpt_uv's lanes.
  std::string host = "127.0.0.1";
  // mpt_uv's lanes: each is a uv context (one thread) and a listener of its own. PyTorch uses
  // 16; fewer suit small machines. 1..64.
  int mpt_lanes = 4;
  // The cluster token. Set (the agent always sets it), "uv" and mpt_uv's lanes run on tpd's
  // authenticating TCP transport (agent/auth_tcp.h) instead of TensorPipe's uv, which is
  // then told each connection refused (`on_refused`). Empty: TensorPipe's own uv.
  std::string token;
  std::function<void(const std::string& why)> on_refused;
  // How long a connection may take to prove the token before it is closed.
  absl::Duration handshake_timeout = absl::Seconds(10);
};

// One name this build knows, and what became of it on this node.
struct Candidate {
  std::string name;
  int64_t priority = 0;
  // Handed to TensorPipe (allowed, built and viable).
  bool registered = false;
  // Registered: a note ("bootstraps every pipe", "4 lanes") or empty. Otherwise why not.
  std::string reason;
};

class Registry {
 public:
  // Probes every allowed name on this node. FAILED_PRECONDITION when no transport or no CPU
  // channel is left (the message says why each was not); INVALID_ARGUMENT for unknown names
  // or a bad lane count.
  static absl::StatusOr<std::unique_ptr<Registry>> Create(const RegistryOptions& options);

  // Every name this build knows, highest priority first, for validation and documentation.
  static const std::vector<Candidate>& KnownTransports();
  static const std::vector<Candidate>& KnownChannels();

  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  ~Registry();

  // Registers the chosen transports and channels with `context`. REQUIRES: called once.
  void RegisterWith(tensorpipe::Context& context);

  // Every known name with its outcome, highest priority first.
  const std::vector<Candidate>& transports() const { return transports_; }
  const std::vector<Candidate>& channels() const { return channels_; }

  // The registered transports, lowest priority first: the order to try URLs when dialing
  // (TensorPipe bootstraps on the most widely usable one and moves up from there).
  std::vector<std::string> BootstrapOrder() const;

  // The URL to listen on for each registered transport, given the listening port for uv
  // ("0" picks one): uv://host:port, shm://<unique name>, ibv://host.
  std::map<std::string, std::string> ListenUrls(const std::string& port) const;

  // What this node offers, for the peer to predict TensorPipe's choice (PipeHello):
  // transport -> domain descriptor; channel -> its CPU device's descriptor.
  std::map<std::string, std::string> TransportDomains() const;
  std::map<std::string, std::string> ChannelCpuDescriptors() const;

  // What TensorPipe picks between this node and a peer that offers `remote` (its
  // TransportDomains() / ChannelCpuDescriptors()), by TensorPipe's own rule; empty if nothing
  // fits. Both ends compute the same answer (the rule is symmetric and the priorities equal).
  std::string PickTransport(const std::map<std::string, std::string>& remote) const;
  std::string PickChannel(const std::map<std::string, std::string>& remote) const;

  // Several lines: every known transport and channel, its priority, and whether it was
  // registered or why not; for Admin.Status and the log at start.
  std::string Describe() const;

 private:
  explicit Registry(const RegistryOptions& options);
  // A context of the TCP transport the options call for: tpd's authenticating one with a
  // token, TensorPipe's uv without.
  std::shared_ptr<tensorpipe::transport::Context> Tcp() const;
  // Creates the transport or channel of `candidate` if the options allow it, and registers it
  // when viable; else candidate.reason says why not.
  void ProbeTransport(Candidate& candidate);
  void ProbeChannel(Candidate& candidate);
  // mpt_uv over options_.mpt_lanes uv lanes listening on options_.host; null when a lane
  // cannot start.
  std::shared_ptr<tensorpipe::channel::Context> MultiplexedUv() const;

  const RegistryOptions options_;
  std::vector<Candidate> transports_;
  std::vector<Candidate> channels_;
  // The probed contexts of registered names, keyed by name.
  std::map<std::string, std::shared_ptr<tensorpipe::transport::Context>> transport_contexts_;
  std::map<std::string, std::shared_ptr<tensorpipe::channel::Context>> channel_contexts_;
  bool handed_over_ = false;
  std::string shm_name_;
};

}  // namespace tpd::agent

#endif  // TPD_AGENT_REGISTRY_H_
