#include "agent/registry.h"

#include <tensorpipe/tensorpipe.h>
#include <tensorpipe/transport/listener.h>
#include <unistd.h>

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/auth_tcp.h"
#include "base/check.h"

namespace tpd::agent {
namespace {

constexpr char kNotBuiltCuda[] =
    "not in this build: Debian's TensorPipe has no CUDA channels (CUDA tensors take the "
    "agent's own path)";

std::string JoinNames(const std::vector<std::string>& names) {
  return absl::StrCat("[", absl::StrJoin(names, ", "), "]");
}

bool Allowed(const std::vector<std::string>& allowed, const std::string& name) {
  return allowed.empty() || std::find(allowed.begin(), allowed.end(), name) != allowed.end();
}

absl::Status CheckKnown(const std::vector<std::string>& names, const std::vector<Candidate>& known,
                        absl::string_view kind) {
  for (const std::string& name : names) {
    const bool found =
        std::any_of(known.begin(), known.end(), [&](const Candidate& c) { return c.name == name; });
    if (!found) {
      std::vector<std::string> known_names;
      for (const Candidate& c : known) known_names.push_back(c.name);
      return absl::InvalidArgumentError(
          absl::StrCat("Unknown ", kind, ": \"", name, "\" (known: ", JoinNames(known_names), ")"));
    }
  }
  return absl::OkStatus();
}

void CloseAndJoin(const std::shared_ptr<tensorpipe::transport::Context>& context) {
  context->close();
  context->join();
}

void CloseAndJoin(const std::shared_ptr<tensorpipe::channel::Context>& context) {
  context->close();
  context->join();
}

}  // namespace

const std::vector<Candidate>& Registry::KnownTransports() {
  static const auto* known = new std::vector<Candidate>{
      {"shm", kShmTransportPriority, false, ""},
      {"ibv", kIbvTransportPriority, false, ""},
      {"uv", kUvTransportPriority, false, ""},
  };
  return *known;
}

const std::vector<Candidate>& Registry::KnownChannels() {
  static const auto* known = new std::vector<Candidate>{
      {"xth", kXthChannelPriority, false, ""},
      {"cma", kCmaChannelPriority, false, ""},
      {"mpt_uv", kMultiplexedUvChannelPriority, false, ""},
      {"basic", kBasicChannelPriority, false, ""},
      {"cuda_xth", kCudaXthChannelPriority, false, ""},
      {"cuda_ipc", kCudaIpcChannelPriority, false, ""},
      {"cuda_gdr", kCudaGdrChannelPriority, false, ""},
      {"cuda_basic", kCudaBasicChannelPriority, false, ""},
  };
  return *known;
}

Registry::Registry(const RegistryOptions& options) : options_(options) {}

std::shared_ptr<tensorpipe::transport::Context> Registry::Tcp() const {
  if (options_.token.empty()) return tensorpipe::transport::uv::create();
  AuthTcpOptions tcp;
  tcp.token = options_.token;
  tcp.on_refused = options_.on_refused;
  tcp.handshake_timeout = options_.handshake_timeout;
  return CreateAuthTcp(std::move(tcp));
}

absl::StatusOr<std::unique_ptr<Registry>> Registry::Create(const RegistryOptions& options) {
  if (absl::Status s = CheckKnown(options.transports, KnownTransports(), "transport"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckKnown(options.channels, KnownChannels(), "channel"); !s.ok()) {
    return s;
  }
  if (options.mpt_lanes < 1 || options.mpt_lanes > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("mpt_uv lanes must be 1..64, got ", options.mpt_lanes));
  }
  std::unique_ptr<Registry> registry(new Registry(options));
  absl::BitGen gen;
  registry->shm_name_ = absl::StrCat("tpd-agent-", getpid(), "-",
                                     absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16));

  for (Candidate candidate : KnownTransports()) {
    registry->ProbeTransport(candidate);
    registry->transports_.push_back(std::move(candidate));
  }
  for (Candidate candidate : KnownChannels()) {
    registry->ProbeChannel(candidate);
    registry->channels_.push_back(std::move(candidate));
  }
  if (registry->transport_contexts_.empty() || registry->channel_contexts_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable TensorPipe ",
                     registry->transport_contexts_.empty() ? "transport" : "CPU channel",
                     " on this node:\n", registry->Describe()));
  }
  return registry;
}

void Registry::ProbeTransport(Candidate& candidate) {
  if (!Allowed(options_.transports, candidate.name)) {
    candidate.reason =
        absl::StrCat("not in the allowed transports ", JoinNames(options_.transports));
    return;
  }
  std::shared_ptr<tensorpipe::transport::Context> context;
  std::string not_viable;
  if (candidate.name == "uv") {
    context = Tcp();
    not_viable = "not viable on this node (libuv could not start)";
  } else if (candidate.name == "shm") {
    context = tensorpipe::transport::shm::create();
    not_viable = "not viable on this node (needs Linux shared memory and abstract unix sockets)";
  } else if (candidate.name == "ibv") {
    context = tensorpipe::transport::ibv::create();
    not_viable = "not viable on this node (no usable InfiniBand device or libibverbs)";
  }
  TPD_DCHECK(context != nullptr);
  if (!context->isViable()) {
    candidate.reason = std::move(not_viable);
    CloseAndJoin(context);  // a context that is not viable may still own a thread
    return;
  }
  candidate.registered = true;
  if (candidate.name == "uv") {
    candidate.reason = options_.token.empty()
                           ? "bootstraps every pipe"
                           : "bootstraps every pipe; authenticated TCP (tpd's transport)";
  }
  if (candidate.name == "shm") candidate.reason = "between agents on one host";
  transport_contexts_.emplace(candidate.name, std::move(context));
}

void Registry::ProbeChannel(Candidate& candidate) {
  if (candidate.name.rfind("cuda_", 0) == 0) {
    candidate.reason = kNotBuiltCuda;
    return;
  }
  if (candidate.name == "xth" && options_.channels.empty()) {
    candidate.reason =
        "registered only when named: inside one process only, and unsafe "
        "when a pipe fails mid-transfer";
    return;
  }
  if (!Allowed(options_.channels, candidate.name)) {
    candidate.reason = absl::StrCat("not in the allowed channels ", JoinNames(options_.channels));
    return;
  }
  std::shared_ptr<tensorpipe::channel::Context> context;
  std::string not_viable = "not viable on this node";
  std::string note;
  if (candidate.name == "basic") {
    context = tensorpipe::channel::basic::create();
    note = "over the pipe's transport";
  } else if (candidate.name == "cma") {
    context = tensorpipe::channel::cma::create();
    not_viable = "not viable on this node (process_vm_readv not permitted: ptrace restrictions)";
    note = "between processes of one host and user";
  } else if (candidate.name == "xth") {
    context = tensorpipe::channel::xth::create();
    note = "inside one process only";
  } else if (candidate.name == "mpt_uv") {
    context = MultiplexedUv();
    note = absl::StrCat(options_.mpt_lanes, " lanes on ", options_.host);
    if (context == nullptr) not_viable = "not viable on this node (its uv lanes could not start)";
  }
  if (context != nullptr && context->isViable()) {
    candidate.registered = true;
    candidate.reason = std::move(note);
    channel_contexts_.emplace(candidate.name, std::move(context));
  } else {
    candidate.reason = std::move(not_viable);
    if (context != nullptr) CloseAndJoin(context);
  }
}

std::shared_ptr<tensorpipe::channel::Context> Registry::MultiplexedUv() const {
  std::vector<std::shared_ptr<tensorpipe::transport::Context>> lanes;
  std::vector<std::shared_ptr<tensorpipe::transport::Listener>> listeners;
  for (int i = 0; i < options_.mpt_lanes; ++i) {
    lanes.push_back(Tcp());
    if (!lanes.back()->isViable()) {
      for (auto& listener : listeners) listener->close();
      for (auto& lane : lanes) CloseAndJoin(lane);
      return nullptr;
    }
    listeners.push_back(lanes.back()->listen(options_.host));
  }
  return tensorpipe::channel::mpt::create(std::move(lanes), std::move(listeners));
}

Registry::~Registry() {
  if (!handed_over_) {
    for (auto& [name, context] : transport_contexts_) CloseAndJoin(context);
    for (auto& [name, context] : channel_contexts_) CloseAndJoin(context);
  }
}

void Registry::RegisterWith(tensorpipe::Context& context) {
  TPD_DCHECK(!handed_over_);
  handed_over_ = true;
  for (const Candidate& candidate : transports_) {
    if (!candidate.registered) continue;
    context.registerTransport(candidate.priority, candidate.name,
                              transport_contexts_.at(candidate.name));
  }
  for (const Candidate& candidate : channels_) {
    if (!candidate.registered) continue;
    context.registerChannel(candidate.priority, candidate.name,
                            channel_contexts_.at(candidate.name));
  }
}

std::vector<std::string> Registry::BootstrapOrder() const {
  std::vector<std::string> order;
  for (auto it = transports_.rbegin(); it != transports_.rend(); ++it) {
    if (it->registered) order.push_back(it->name);
  }
  return order;
}

std::map<std::string, std::string> Registry::ListenUrls(const std::string& port) const {
  std::map<std::string, std::string> urls;
  const bool v6 = options_.host.find(':') != std::string::npos;
  const std::string host = v6 ? absl::StrCat("[", options_.host, "]") : options_.host;
  for (const auto& [name, context] : transport_contexts_) {
    if (name == "uv") urls[name] = absl::StrCat("uv://", host, ":", port);
    if (name == "shm") urls[name] = absl::StrCat("shm://", shm_name_);
    if (name == "ibv") urls[name] = absl::StrCat("ibv://", options_.host);
  }
  return urls;
}

std::map<std::string, std::string> Registry::TransportDomains() const {
  std::map<std::string, std::string> domains;
  for (const auto& [name, context] : transport_contexts_) {
    domains[name] = context->domainDescriptor();
  }
  return domains;
}

std::map<std::string, std::string> Registry::ChannelCpuDescriptors() const {
  std::map<std::string, std::string> descriptors;
  const tensorpipe::Device cpu{tensorpipe::kCpuDeviceType, 0};
  for (const auto& [name, context] : channel_contexts_) {
    const auto& devices = context->deviceDescriptors();
    if (auto it = devices.find(cpu); it != devices.end()) descriptors[name] = it->second;
  }
  return descriptors;
}

std::string Registry::PickTransport(const std::map<std::string, std::string>& remote) const {
  for (const Candidate& candidate : transports_) {
    if (!candidate.registered) continue;
    auto it = remote.find(candidate.name);
    if (it == remote.end()) continue;
    if (transport_contexts_.at(candidate.name)->canCommunicateWithRemote(it->second)) {
      return candidate.name;
    }
  }
  return "";
}

std::string Registry::PickChannel(const std::map<std::string, std::string>& remote) const {
  const std::map<std::string, std::string> local = ChannelCpuDescriptors();
  for (const Candidate& candidate : channels_) {
    if (!candidate.registered) continue;
    auto remote_it = remote.find(candidate.name);
    auto local_it = local.find(candidate.name);
    if (remote_it == remote.end() || local_it == local.end()) continue;
    if (channel_contexts_.at(candidate.name)
            ->canCommunicateWithRemote(local_it->second, remote_it->second)) {
      return candidate.name;
    }
  }
  return "";
}

std::string Registry::Describe() const {
  std::string out = "transports (highest priority first):";
  auto append = [&out](const Candidate& c) {
    absl::StrAppend(&out, "\n  ", c.name, " (", c.priority,
                    "): ", c.registered ? "registered" : "not registered",
                    c.reason.empty() ? "" : ", ", c.reason);
  };
  for (const Candidate& c : transports_) append(c);
  absl::StrAppend(&out, "\nchannels (highest priority first):");
  for (const Candidate& c : channels_) append(c);
  return out;
}

}  // namespace tpd::agent
