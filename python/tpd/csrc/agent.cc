#include "python/tpd/csrc/agent.h"

#include <torch/csrc/distributed/rpc/request_callback_impl.h>
#include <torch/csrc/distributed/rpc/utils.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <stdexcept>

namespace tpd::torch_agent {
namespace {

constexpr char kMethod[] = "torch.rpc";

// A torch message on tpd: the header is the call's payload, and torch's wire encoding of the
// message's payload and tensors travels as one tensor of bytes, which the library copies into
// the shared arena and the receiver reads where it lands (one copy fewer each way than a
// payload of both).
struct Header {
  uint32_t magic;
  int32_t type;  // rpc::MessageType
  int64_t id;
};
constexpr uint32_t kMagic = 0x4d445054;  // "TPDM"

struct Wire {
  Header header;
  std::string body;

  tpd_tensor Tensor() const {
    tpd_tensor tensor{};
    tensor.dtype = TPD_UINT8;
    tensor.ndim = 1;
    tensor.shape[0] = static_cast<int64_t>(body.size());
    tensor.data = body.data();
    tensor.nbytes = body.size();
    tensor.device_type = TPD_CPU;
    return tensor;
  }
};

Wire Encode(const rpc::Message& message) {
  for (const at::Tensor& tensor : message.tensors()) {
    TORCH_CHECK(tensor.device().is_cpu(),
                "the TPD backend sends CPU tensors only (issue 32: CUDA tensors through "
                "device maps are not built yet); got a tensor on ",
                tensor.device());
  }
  return Wire{Header{kMagic, static_cast<int32_t>(message.type()), message.id()},
              rpc::wireSerialize(message.payload(), message.tensors())};
}

// The message a peer sent (`info` read from `event`); throws std::runtime_error for an event
// that carries none.
c10::intrusive_ptr<rpc::Message> Decode(const ClientApi& api, const tpd_event* event,
                                        const tpd_event_info& info) {
  Header header;
  tpd_tensor body;
  if (info.payload_size != sizeof(header) || info.num_tensors != 1 ||
      api.event_tensor(event, 0, &body) != TPD_OK || body.dtype != TPD_UINT8 ||
      body.ndim != 1 || body.device_type != TPD_CPU) {
    throw std::runtime_error("not a TPD message: a " + std::to_string(info.payload_size) +
                             "-byte payload and " + std::to_string(info.num_tensors) +
                             " tensors, not a header and torch's encoding");
  }
  std::memcpy(&header, info.payload, sizeof(header));
  if (header.magic != kMagic) throw std::runtime_error("not a TPD message (bad magic)");
  auto [payload, tensors] = rpc::wireDeserialize(body.data, body.nbytes);
  return c10::make_intrusive<rpc::Message>(std::move(payload), std::move(tensors),
                                           static_cast<rpc::MessageType>(header.type), header.id);
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
  for (const auto& [name, rank] : options_.workers) {
    by_name_[name] = workers_.size();
    by_id_[static_cast<rpc::worker_id_t>(rank)] = workers_.size();
    workers_.emplace_back(name, rank);
  }
}

TpdAgent::~TpdAgent() {
  // A started agent that was never shut down (the process exits without rpc.shutdown): stop
  // its threads.
  if (events_.joinable()) {
    stopped_ = true;
    api_.stop_events(client_);
    events_.join();
  }
  if (client_ != nullptr) api_.client_close(client_);
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
                                                  const rpc::DeviceMap& /*device_map*/) {
  TORCH_CHECK(rpcAgentRunning_.load(), "the TPD agent of ", workerInfo_.name_,
              " is not running (RPC is shut down or not started)");
  auto future = c10::make_intrusive<rpc::JitFuture>(at::AnyClassType::get());
  const std::chrono::milliseconds timeout = rpc_timeout_seconds == rpc::kUnsetRpcTimeout
                                                ? getRpcTimeout()
                                                : Millis(rpc_timeout_seconds);
  uint64_t tag;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tag = next_tag_++;
    message->setId(static_cast<int64_t>(tag));
  }
  const Wire wire = Encode(*message);
  const tpd_tensor body = wire.Tensor();
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[tag] = Pending{future, timeout.count()};
  }
  // timeout 0: no deadline, for torch and for tpd alike.
  const auto deadline = timeout.count() > 0 ? std::chrono::steady_clock::now() + timeout
                                            : std::chrono::steady_clock::time_point::max();
  const int code = WithRoom(wire.body.size(), deadline, [&] {
    return api_.call_async(client_, options_.group.c_str(), to.name_.c_str(), kMethod,
                           reinterpret_cast<const char*>(&wire.header), sizeof(wire.header),
                           &body, 1, timeout.count() * 1000, tag);
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
  c10::intrusive_ptr<rpc::JitFuture> response;
  try {
    response = (*cb_)(*message, {});
  } catch (const std::exception& e) {
    response = c10::make_intrusive<rpc::JitFuture>(at::AnyClassType::get());
    response->markCompleted(rpc::createExceptionResponse(e, id));
  }
  response->addCallback(
      [this, request, id](rpc::JitFuture& done) { Respond(request, id, done); });
}

void TpdAgent::Respond(tpd_event* request, int64_t id, rpc::JitFuture& response) {
  c10::intrusive_ptr<rpc::Message> message =
      response.hasError() ? rpc::createExceptionResponse(response.tryRetrieveErrorMessage(), id)
                          : response.value().toCustomClass<rpc::Message>();
  message->setId(id);
  Wire wire;
  try {
    wire = Encode(*message);
  } catch (const std::exception& e) {
    wire = Encode(*rpc::createExceptionResponse(e, id));
  }
  const tpd_tensor body = wire.Tensor();
  // A caller gone meanwhile is no error here: the daemon dropped its call. A reply the arena
  // has no room for is not sent: the library answers the caller with the reason instead.
  api_.reply(request, reinterpret_cast<const char*>(&wire.header), sizeof(wire.header), &body, 1,
             0);
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
        pending.future->markCompleted(c10::IValue(std::move(response)));
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
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    throw std::runtime_error(Where() + " could not find destination name " + name);
  }
  return workers_[it->second];
}

const rpc::WorkerInfo& TpdAgent::getWorkerInfo(rpc::worker_id_t id) const {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) {
    throw std::runtime_error(Where() + " could not find destination id " + std::to_string(id));
  }
  return workers_[it->second];
}

std::vector<rpc::WorkerInfo> TpdAgent::getWorkerInfos() const { return workers_; }

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
}

void TpdAgent::shutdownImpl() {
  stopped_ = true;
  api_.stop_events(client_);
  if (events_.joinable()) events_.join();
  pool_.waitWorkComplete();
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
  api_.leave(client_, options_.group.c_str(), options_.name.c_str());
  api_.client_close(client_);
  client_ = nullptr;
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
