#include "python/tpd/csrc/agent.h"

#include <ATen/dlpack.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/rpc/request_callback_impl.h>
#include <torch/csrc/distributed/rpc/utils.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#ifdef TPD_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cstring>
#include <exception>
#include <stdexcept>

namespace tpd::torch_agent {
namespace {

constexpr char kMethod[] = "torch.rpc";

// A torch message on tpd, as torch's TensorPipe agent splits it: the call's payload is a
// header, the message's payload and the pickled metadata of its tensors (torch's jit pickle,
// as rpc::wireSerialize writes it); each of the call's tensors is the bytes of one storage the
// metadata names ("0", "1", ...). The library copies a CPU storage once into the shared
// arena, and the receiver's tensors are views of its receive heap: no copy into or out of a
// byte string on either side. A CUDA storage goes by pointer; the daemon copies it to the
// device the group's device maps name (the payload is no tensor: maps move CPU tensors too).
struct Header {
  uint32_t magic;
  int32_t type;  // rpc::MessageType
  int64_t id;
  uint64_t payload_size;  // the message's payload; the metadata takes the rest
};
constexpr uint32_t kMagic = 0x33445054;  // "TPD3"

// The CUDA stream (cudaStream_t) current on `device`: the daemon copies a CUDA tensor after
// the work queued there before the call, as torch's agent sends on the caller's streams.
void* CurrentStream(c10::DeviceIndex device) {
#ifdef TPD_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(device).stream();
#else
  throw std::runtime_error("a CUDA tensor on device " + std::to_string(device) +
                           ", but tpd._C was built for a torch without CUDA: rebuild it");
#endif
}

struct Wire {
  std::string payload;  // header, the message's payload, the metadata
  // Tensors whose storages the call carries. A CUDA storage is read by the daemon after the
  // call or reply went: kept until the call completes or the reply is released.
  std::vector<at::Tensor> storages;

  // The call's tensors: each storage's bytes (CUDA ones by pointer, after the current
  // stream's work). They point into the storages: valid while this Wire lives.
  std::vector<tpd_tensor> Tensors() const {
    std::vector<tpd_tensor> tensors;
    tensors.reserve(storages.size());
    for (const at::Tensor& tensor : storages) {
      const c10::Storage& storage = tensor.storage();
      tpd_tensor bytes{};
      bytes.dtype = TPD_UINT8;
      bytes.ndim = 1;
      bytes.shape[0] = static_cast<int64_t>(storage.nbytes());
      bytes.data = storage.data();
      bytes.nbytes = storage.nbytes();
      bytes.device_type = TPD_CPU;
      if (tensor.is_cuda()) {
        bytes.device_type = TPD_CUDA;
        bytes.device_index = tensor.device().index();
        bytes.stream = CurrentStream(tensor.device().index());
      }
      tensors.push_back(bytes);
    }
    return tensors;
  }

  bool HasCuda() const {
    return std::any_of(storages.begin(), storages.end(),
                       [](const at::Tensor& tensor) { return tensor.is_cuda(); });
  }
};

Wire Encode(const rpc::Message& message) {
  Wire wire;
  const std::vector<char>& payload = message.payload();
  const Header header{kMagic, static_cast<int32_t>(message.type()), message.id(), payload.size()};
  wire.payload.append(reinterpret_cast<const char*>(&header), sizeof(header));
  wire.payload.append(payload.data(), payload.size());
  if (!message.tensors().empty()) {
    // The tensors' metadata, their storages apart (views of a much larger storage cloned
    // first, as torch does, so a slice does not send its whole base).
    ::torch::jit::Pickler pickler(
        [&](const char* data, size_t size) { wire.payload.append(data, size); });
    pickler.protocol();
    pickler.pushIValue(rpc::cloneSparseTensors(message.tensors()));
    pickler.stop();
    wire.storages = pickler.tensorData();
  }
  return wire;
}

// A received storage's bytes, viewed where they lie in the receive heap (or copied out by the
// library when its views already hold half of it), or in the CUDA receive pool of the device
// the device maps chose (the daemon's copy has completed): the DataPtr keeps them until the
// last tensor using them goes.
at::DataPtr Received(const ClientApi& api, const tpd_event* event, int i) {
  void* handle = nullptr;
  if (api.event_tensor_dlpack(event, i, /*copy=*/-1, &handle) != TPD_OK) {
    throw std::runtime_error("tensor " + std::to_string(i) + " of a TPD message: " +
                             (api.last_error() != nullptr ? api.last_error() : "unreadable"));
  }
  auto* managed = static_cast<DLManagedTensor*>(handle);
  void* data = static_cast<char*>(managed->dl_tensor.data) + managed->dl_tensor.byte_offset;
  const at::Device device = managed->dl_tensor.device.device_type == kDLCUDA
                                ? at::Device(at::kCUDA, managed->dl_tensor.device.device_id)
                                : at::Device(at::kCPU);
  return at::DataPtr(
      data, managed,
      [](void* context) {
        auto* held = static_cast<DLManagedTensor*>(context);
        if (held->deleter != nullptr) held->deleter(held);
      },
      device);
}

// The message a peer sent (`info` read from `event`); throws std::runtime_error for an event
// that carries none.
c10::intrusive_ptr<rpc::Message> Decode(const ClientApi& api, const tpd_event* event,
                                        const tpd_event_info& info) {
  Header header;
  if (info.payload_size < sizeof(header)) {
    throw std::runtime_error("not a TPD message: a " + std::to_string(info.payload_size) +
                             "-byte payload, shorter than its header");
  }
  std::memcpy(&header, info.payload, sizeof(header));
  if (header.magic != kMagic) {
    throw std::runtime_error(
        "not a TPD message of this release (bad magic): run one tpd "
        "Python package on every worker");
  }
  const char* const bytes = info.payload + sizeof(header);
  const uint64_t size = info.payload_size - sizeof(header);
  if (header.payload_size > size) {
    throw std::runtime_error("a TPD message's payload runs past its end");
  }
  std::vector<char> payload(bytes, bytes + header.payload_size);
  std::vector<at::Tensor> tensors;
  const char* const meta = bytes + header.payload_size;
  const size_t meta_size = size - header.payload_size;
  if (meta_size > 0) {
    size_t read = 0;
    auto reader = [&](char* out, size_t n) {
      n = std::min(n, meta_size - read);
      std::memcpy(out, meta + read, n);
      read += n;
      return n;
    };
    auto storage = [&](const std::string& name) -> at::DataPtr {
      // Storage "k" is tensor k of the call.
      size_t used = 0;
      int k = -1;
      try {
        k = std::stoi(name, &used);
      } catch (const std::exception&) {
      }
      if (used != name.size() || k < 0 || k >= static_cast<int>(info.num_tensors)) {
        throw std::runtime_error("a TPD message's metadata names storage '" + name +
                                 "', which it does not carry");
      }
      return Received(api, event, k);
    };
    // Tensors made on their storage's device (where the maps put them), not the sender's.
    ::torch::jit::Unpickler unpickler(reader, nullptr, nullptr, storage, {},
                                      /*use_storage_device=*/true);
    for (const at::Tensor& tensor : unpickler.parse_ivalue().toTensorList()) {
      tensors.push_back(tensor);
    }
  }
  return c10::make_intrusive<rpc::Message>(std::move(payload), std::move(tensors),
                                           static_cast<rpc::MessageType>(header.type), header.id);
}

// Throws torch's error (its TensorPipe agent's, in send) for a CUDA tensor of `message` that
// `map`, the map toward `to`, does not place. The daemon checks too; this makes the refusal
// synchronous, as torch's is (rpc.remote raises rather than its RRef failing later).
void CheckMapped(const rpc::Message& message, const rpc::DeviceMap& map, const std::string& to) {
  for (const at::Tensor& tensor : message.tensors()) {
    if (!tensor.is_cuda() || map.count(tensor.device()) > 0) continue;
    throw std::runtime_error(
        "TensorPipe RPC backend only supports CPU tensors by default, please move your tensors "
        "to CPU before sending them over RPC, or call `set_device_map` on "
        "`TensorPipeRpcBackendOptions` to explicitly configure device mapping. Request device "
        "mapping is not available for destination " +
        to + " for device " + tensor.device().str() + " but received a tensor on that device.");
  }
}

// The map of `maps` toward worker `name`; an empty one when it names none.
const rpc::DeviceMap& MapToward(const std::unordered_map<std::string, rpc::DeviceMap>& maps,
                                const std::string& name) {
  static const rpc::DeviceMap kNone;
  auto it = maps.find(name);
  return it == maps.end() ? kNone : it->second;
}

std::chrono::milliseconds Millis(float seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

void Fail(rpc::JitFuture& future, const std::string& message) {
  future.setErrorIfNeeded(std::make_exception_ptr(std::runtime_error(message)));
}

}  // namespace

TpdAgent::TpdAgent(AgentOptions options)
    : rpc::RpcAgent(rpc::WorkerInfo(options.name, options.rank),
                    std::make_unique<rpc::RequestCallbackImpl>(),
                    Millis(options.rpc_timeout_seconds)),
      options_(std::move(options)),
      api_(options_.library),
      client_(reinterpret_cast<tpd_client*>(options_.client)),
      pool_(options_.num_worker_threads) {
  TORCH_CHECK(client_ != nullptr, "TpdAgent needs a tpd client");
  Learn(options_.workers);
}

void TpdAgent::Learn(const std::vector<std::pair<std::string, int64_t>>& members) const {
  std::lock_guard<std::mutex> lock(workers_mu_);
  for (const auto& [name, rank] : members) {
    if (by_name_.count(name) > 0) continue;
    by_name_[name] = workers_.size();
    by_id_[static_cast<rpc::worker_id_t>(rank)] = workers_.size();
    workers_.emplace_back(name, rank);
  }
}

std::optional<std::vector<std::pair<std::string, int64_t>>> TpdAgent::Refresh() const {
  // After shutdown the client is closed: what is known stays known.
  if (options_.is_static || !options_.members || stopped_) return std::nullopt;
  std::vector<std::pair<std::string, int64_t>> members = options_.members();
  Learn(members);
  return members;
}

const rpc::WorkerInfo* TpdAgent::Known(const std::string& name) const {
  std::lock_guard<std::mutex> lock(workers_mu_);
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &workers_[it->second];
}

const rpc::WorkerInfo* TpdAgent::Known(rpc::worker_id_t id) const {
  std::lock_guard<std::mutex> lock(workers_mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &workers_[it->second];
}

TpdAgent::~TpdAgent() {
  // torch's RpcAgent destructor would shut a running agent down itself, calling shutdownImpl
  // when it is pure virtual again (the process aborted): shut down here, as torch's TensorPipe
  // agent does in its destructor. An agent still running here belongs to a process exiting
  // without rpc.shutdown: it stops its threads and tells no one (the daemon ends the worker's
  // session with its process), and completes no future (Python may be gone).
  exiting_ = true;
  if (rpcAgentRunning_.load()) {
    shutdown();
  } else if (client_ != nullptr) {
    api_.client_close(client_);  // made, never started
  }
}

std::string TpdAgent::Where() const {
  return "name:" + workerInfo_.name_ + ",rank:" + std::to_string(workerInfo_.id_);
}

std::string TpdAgent::LastError() const {
  const char* error = api_.last_error();
  return error != nullptr ? error : "unknown error";
}

template <typename Attempt>
int TpdAgent::WithRoom(uint64_t bytes, std::chrono::steady_clock::time_point deadline,
                       Attempt attempt) {
  std::chrono::milliseconds pause(1);
  while (true) {
    const int code = attempt();
    if (code != TPD_RESOURCE_EXHAUSTED || bytes > options_.arena_bytes || stopped_ ||
        std::chrono::steady_clock::now() + pause > deadline) {
      return code;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

c10::intrusive_ptr<rpc::JitFuture> TpdAgent::send(const rpc::WorkerInfo& to,
                                                  c10::intrusive_ptr<rpc::Message> message,
                                                  float rpc_timeout_seconds,
                                                  const rpc::DeviceMap& device_map) {
  TORCH_CHECK(rpcAgentRunning_.load(), "the TPD agent of ", workerInfo_.name_,
              " is not running (RPC is shut down or not started)");
  // Futures on this worker's devices, as torch's agent makes them: their callbacks run on
  // streams that waited for the value's work.
  auto future = c10::make_intrusive<rpc::JitFuture>(at::AnyClassType::get(), options_.devices);
  // torch names a map of its own only for distributed autograd's gradients: the reverse of
  // the map their forward pass took, which the daemon knows as the callee's map toward this
  // worker. Any other map is not one the group negotiated.
  const rpc::DeviceMap& configured = MapToward(options_.device_maps, to.name_);
  uint32_t flags = 0;
  if (!device_map.empty() && device_map != configured) {
    if (MapToward(options_.reverse_device_maps, to.name_) != device_map) {
      Fail(*future, "the TPD backend moves tensors to " + to.name_ +
                        " by the device maps the group negotiated at init_rpc (this worker's "
                        "map toward it, or the reverse of its map toward this worker); this "
                        "call names another");
      return future;
    }
    flags = TPD_CALL_REVERSE_MAP;
  }
  CheckMapped(*message, device_map.empty() ? configured : device_map, to.name_);
  const std::chrono::milliseconds timeout =
      rpc_timeout_seconds == rpc::kUnsetRpcTimeout ? getRpcTimeout() : Millis(rpc_timeout_seconds);
  uint64_t tag;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tag = next_tag_++;
    message->setId(static_cast<int64_t>(tag));
  }
  Wire wire = Encode(*message);
  const std::vector<tpd_tensor> tensors = wire.Tensors();
  uint64_t bytes = wire.payload.size();  // what the arena holds: no CUDA tensor
  for (const tpd_tensor& tensor : tensors) {
    if (tensor.device_type == TPD_CPU) bytes += tensor.nbytes;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // CUDA storages stay until the call completes: the daemon reads them after it went.
    pending_[tag] = Pending{future, timeout.count(),
                            wire.HasCuda() ? std::move(wire.storages) : std::vector<at::Tensor>{}};
  }
  // timeout 0: no deadline, for torch and for tpd alike.
  const auto deadline = timeout.count() > 0 ? std::chrono::steady_clock::now() + timeout
                                            : std::chrono::steady_clock::time_point::max();
  const int code = WithRoom(bytes, deadline, [&] {
    return api_.call_async_flags(client_, options_.group.c_str(), to.name_.c_str(), kMethod,
                                 wire.payload.data(), wire.payload.size(), tensors.data(),
                                 static_cast<int>(tensors.size()), timeout.count() * 1000, tag,
                                 flags);
  });
  if (code != TPD_OK) {
    const std::string why = LastError();
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.erase(tag);
    }
    idle_.notify_all();
    Fail(*future, why);
  }
  return future;
}

void TpdAgent::TakeEvents() {
  while (true) {
    tpd_event* event = nullptr;
    const int code = api_.next_event(client_, TPD_QUEUE_REQUESTS | TPD_QUEUE_REPLIES,
                                     TPD_TIMEOUT_DEFAULT, &event);
    if (code == TPD_CANCELLED || stopped_) {
      if (event != nullptr) api_.event_free(event);
      return;
    }
    if (code != TPD_OK) continue;
    tpd_event_info info;
    api_.event_read(event, &info);
    if (info.kind == TPD_EVENT_REQUEST) {
      ++serving_;
      pool_.run([this, event] { Serve(event); });
    } else if (info.kind == TPD_EVENT_REPLY) {
      pool_.run([this, event] { Complete(event); });
    } else if (info.kind == TPD_EVENT_RELEASED) {
      std::lock_guard<std::mutex> lock(mu_);
      released_.erase(info.tag);  // the daemon has read the reply's CUDA storages
      api_.event_free(event);
    } else {
      api_.event_free(event);
    }
  }
}

void TpdAgent::Serve(tpd_event* request) {
  tpd_event_info info;
  api_.event_read(request, &info);
  c10::intrusive_ptr<rpc::Message> message;
  try {
    message = Decode(api_, request, info);
  } catch (const std::exception& e) {
    api_.reply_error(request, TPD_INVALID_ARGUMENT, e.what());
    api_.event_free(request);
    if (--serving_ == 0) idle_.notify_all();
    return;
  }
  const int64_t id = message->id();
  // The request runs on streams of its own on each of this worker's devices, as in torch's
  // agent (its CUDA tensors are ready on any stream: the daemon's copy has completed).
  std::vector<c10::Stream> streams;
  for (const c10::Device& device : options_.devices) {
    streams.push_back(c10::impl::VirtualGuardImpl(device.type())
                          .getStreamFromGlobalPool(device, /*isHighPriority=*/false));
  }
  c10::intrusive_ptr<rpc::JitFuture> response;
  try {
    response = (*cb_)(*message, std::move(streams));
  } catch (const std::exception& e) {
    response = c10::make_intrusive<rpc::JitFuture>(at::AnyClassType::get());
    response->markCompleted(rpc::createExceptionResponse(e, id));
  }
  response->addCallback([this, request, id](rpc::JitFuture& done) { Respond(request, id, done); });
}

void TpdAgent::Respond(tpd_event* request, int64_t id, rpc::JitFuture& response) {
  c10::intrusive_ptr<rpc::Message> message =
      response.hasError() ? rpc::createExceptionResponse(response.tryRetrieveErrorMessage(), id)
                          : response.value().toCustomClass<rpc::Message>();
  message->setId(id);
  Wire wire;
  std::vector<tpd_tensor> tensors;
  try {
    wire = Encode(*message);
    tensors = wire.Tensors();
  } catch (const std::exception& e) {
    wire = Encode(*rpc::createExceptionResponse(e, id));
    tensors.clear();
  }
  // CUDA storages are sent after the work queued on the current streams (torch's future runs
  // this callback on streams that waited for the response's work), and kept until the daemon
  // releases them.
  uint64_t release_tag = 0;
  if (wire.HasCuda()) {
    std::lock_guard<std::mutex> lock(mu_);
    release_tag = next_tag_++;
    released_[release_tag] = std::move(wire.storages);
  }
  // A caller gone meanwhile is no error here: the daemon dropped its call. A reply the arena
  // has no room for is not sent: the library answers the caller with the reason instead.
  if (api_.reply(request, wire.payload.data(), wire.payload.size(), tensors.data(),
                 static_cast<int>(tensors.size()), release_tag) != TPD_OK &&
      release_tag != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    released_.erase(release_tag);
  }
  api_.event_free(request);
  if (--serving_ == 0) idle_.notify_all();
}

void TpdAgent::Complete(tpd_event* reply) {
  tpd_event_info info;
  api_.event_read(reply, &info);
  Pending pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(info.tag);
    if (it == pending_.end()) {  // failed at shutdown already
      api_.event_free(reply);
      return;
    }
    pending = std::move(it->second);
    pending_.erase(it);
  }
  idle_.notify_all();
  if (info.code == TPD_OK) {
    try {
      c10::intrusive_ptr<rpc::Message> response = Decode(api_, reply, info);
      if (response->type() == rpc::MessageType::EXCEPTION) {
        // The callee's error, in its words (torch's agents fail the future with it).
        const std::vector<char>& text = response->payload();
        Fail(*pending.future, std::string(text.begin(), text.end()));
      } else {
        std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> storages = response->getStorages();
        pending.future->markCompleted(c10::IValue(std::move(response)), std::move(storages));
      }
    } catch (const std::exception& e) {
      Fail(*pending.future, e.what());
    }
  } else if (info.code == TPD_DEADLINE_EXCEEDED) {
    std::string text = rpc::kRpcTimeoutErrorStr;
    text.replace(text.find("{}"), 2, std::to_string(pending.timeout_ms));
    Fail(*pending.future, rpc::makeRPCError(text, rpc::RPCErrorType::TIMEOUT));
  } else {
    Fail(*pending.future, info.message);
  }
  api_.event_free(reply);
}

const rpc::WorkerInfo& TpdAgent::getWorkerInfo(const std::string& name) const {
  const rpc::WorkerInfo* known = Known(name);
  if (known == nullptr && Refresh()) known = Known(name);  // joined since, in a dynamic group
  if (known == nullptr) {
    throw std::runtime_error(Where() + " could not find destination name " + name);
  }
  return *known;
}

const rpc::WorkerInfo& TpdAgent::getWorkerInfo(rpc::worker_id_t id) const {
  const rpc::WorkerInfo* known = Known(id);
  if (known == nullptr && Refresh()) known = Known(id);
  if (known == nullptr) {
    throw std::runtime_error(Where() + " could not find destination id " + std::to_string(id));
  }
  return *known;
}

rpc::DeviceMap TpdAgent::getDeviceMap(const rpc::WorkerInfo& to) const {
  return MapToward(options_.device_maps, to.name_);
}

std::vector<rpc::WorkerInfo> TpdAgent::getWorkerInfos() const {
  std::optional<std::vector<std::pair<std::string, int64_t>>> now = Refresh();
  std::lock_guard<std::mutex> lock(workers_mu_);
  if (!now.has_value()) return std::vector<rpc::WorkerInfo>(workers_.begin(), workers_.end());
  // A dynamic group's members now: those that left are no longer listed.
  std::vector<rpc::WorkerInfo> infos;
  for (const auto& member : *now) infos.push_back(workers_[by_name_.at(member.first)]);
  return infos;
}

void TpdAgent::join(bool shutdown, float timeout) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto done = [&] { return pending_.empty(); };
    if (timeout > 0) {
      idle_.wait_for(lock, Millis(timeout), done);
    } else {
      idle_.wait(lock, done);
    }
  }
  if (!shutdown || !options_.is_static) return;
  char* json = nullptr;
  const int code =
      api_.barrier(client_, options_.group.c_str(), options_.name.c_str(),
                   timeout > 0 ? static_cast<int64_t>(timeout * 1e6) : TPD_TIMEOUT_DEFAULT, &json);
  api_.free(json);
  if (code != TPD_OK) throw std::runtime_error("RPC shutdown failed: " + LastError());
}

void TpdAgent::startImpl() {
  events_ = std::thread([this] { TakeEvents(); });
  if (options_.started) options_.started();
}

void TpdAgent::StopTakingEvents() {
  stopped_ = true;
  api_.stop_events(client_);
  if (events_.joinable()) events_.join();
}

void TpdAgent::FailPending() {
  std::unordered_map<uint64_t, Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(pending_);
  }
  idle_.notify_all();
  for (auto& [tag, call] : pending) {
    Fail(*call.future, "RPC agent of " + workerInfo_.name_ +
                           " is shutting down: the call got no answer before shutdown");
  }
}

void TpdAgent::StopAtExit() {
  if (!rpcAgentRunning_.load() || client_ == nullptr) return;
  StopTakingEvents();
  FailPending();  // wakes tasks that wait on a call
  pool_.waitWorkComplete();
}

void TpdAgent::shutdownImpl() {
  StopTakingEvents();
  if (exiting_) return;
  pool_.waitWorkComplete();
  FailPending();
  api_.leave(client_, options_.group.c_str(), options_.name.c_str());
  api_.client_close(client_);
  client_ = nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  released_.clear();  // the session ended: the daemon reads none of them any more
}

void TpdAgent::addGilWaitTime(std::chrono::microseconds wait) {
  gil_wait_us_ += wait.count();
  ++gil_waits_;
}

std::unordered_map<std::string, std::string> TpdAgent::getMetrics() {
  std::unordered_map<std::string, std::string> metrics;
  {
    std::lock_guard<std::mutex> lock(mu_);
    metrics["agent.num_pending_requests"] = std::to_string(pending_.size());
  }
  metrics["agent.num_requests_serving"] = std::to_string(serving_.load());
  metrics["agent.thread_pool_size"] = std::to_string(options_.num_worker_threads);
  metrics["agent.num_idle_threads"] = std::to_string(pool_.numAvailable());
  if (isGILProfilingEnabled()) {
    const int64_t waits = gil_waits_.load();
    metrics["agent.gil_average_wait_time_us"] =
        std::to_string(waits > 0 ? gil_wait_us_.load() / waits : 0);
  }
  return metrics;
}

}  // namespace tpd::torch_agent
