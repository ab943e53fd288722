// TpdAgent: torch's RpcAgent whose transport is the node's tpd daemon, so everything torch
// builds above its agent (RRefs, distributed autograd, DistributedOptimizer, RemoteModule,
// TorchScript calls, the profiler) runs on tpd. `import tpd.backend` registers it as
// BackendType.TPD (docs/python.md, "Two ways in").
//
// A torch Message travels as one tpd call of method "torch.rpc" to the worker's name in the
// job's group: its payload a header (magic, message type, message id), the message's payload
// and its tensors' metadata (torch's jit pickle, as rpc/utils.h wireSerialize writes it); its
// tensors each storage the message's tensors use, which the receiver's tensors view where it
// landed (as torch's TensorPipe agent splits a message). CUDA storages go by pointer after the
// sender's current streams, to the devices the group's device maps name. Its answer comes back
// as the call's reply in the same form, or as a tpd error, which fails the future in torch's
// words (timeouts: RPCErrorType::TIMEOUT).
//
// Workers: a static group's are the group's at init; a dynamic group's agent asks the daemon
// (AgentOptions::members) for workers it does not know yet.
//
// Threads: one event thread takes the client's events (requests to serve, replies to calls)
// and hands each to a pool of num_worker_threads threads, which run torch's request callback
// and complete the futures of calls, as torch's TensorPipe agent does: a callback that waits on
// another RPC never blocks the thread that would deliver its reply.
//
// Errors Python may see are std::runtime_error (RuntimeError), not c10::Error: torch 2.11's
// Python crashed translating a c10::Error this module threw from its binding.
//
// Thread safety: thread-safe; torch calls send from any thread.

#ifndef TPD_PYTHON_CSRC_AGENT_H_
#define TPD_PYTHON_CSRC_AGENT_H_

#include <c10/core/thread_pool.h>
#include <torch/csrc/distributed/rpc/rpc_agent.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "python/tpd/csrc/client_api.h"

namespace tpd::torch_agent {

namespace rpc = ::torch::distributed::rpc;

struct AgentOptions {
  std::string library;  // libtpd_client.so, as tpd._capi loaded it
  // The worker's tpd_client*, joined to `group` as `name` and serving method "torch.rpc"
  // (requests wait in its queue until start()). The agent owns it from here and closes it.
  uintptr_t client = 0;
  std::string group;
  std::string name;
  int64_t rank = 0;
  bool is_static = true;  // world_size given: shutdown waits for every rank (tpd's barrier)
  std::vector<std::pair<std::string, int64_t>> workers;  // name, rank: the group's members
  // In a dynamic group (not is_static), the group's members now, asked when a name or id is
  // not known yet (a worker that joined since) and for getWorkerInfos (which lists those in
  // the group now). Called from any thread; never under the agent's locks.
  std::function<std::vector<std::pair<std::string, int64_t>>()> members;
  // Run once the agent started, on the thread that started it (tpd.backend's adjustment of
  // torch's Python state for dynamic groups).
  std::function<void()> started;
  // What the group's negotiation gave this worker (JoinResponse.negotiated): its devices and
  // its device map toward each worker, as torch's TensorPipe agent reports them.
  std::vector<c10::Device> devices;
  std::unordered_map<std::string, rpc::DeviceMap> device_maps;
  // Per worker, the reverse of its map toward this one: the map torch names for the gradients
  // distributed autograd sends it back (sent with TPD_CALL_REVERSE_MAP).
  std::unordered_map<std::string, rpc::DeviceMap> reverse_device_maps;
  int num_worker_threads = 16;
  float rpc_timeout_seconds = 60;
  // The client's shared arena (tx heap): a message that fits it but finds no room now waits
  // for calls in flight to give theirs back; a larger one fails at once.
  uint64_t arena_bytes = 0;
};

class TpdAgent final : public rpc::RpcAgent {
 public:
  explicit TpdAgent(AgentOptions options);
  // Shuts the agent down if it runs (a process that exits without rpc.shutdown: quietly, see
  // the .cc) and closes the client.
  ~TpdAgent() override;

  c10::intrusive_ptr<rpc::JitFuture> send(const rpc::WorkerInfo& to,
                                          c10::intrusive_ptr<rpc::Message> message,
                                          float rpc_timeout_seconds,
                                          const rpc::DeviceMap& device_map) override;

  using rpc::RpcAgent::getWorkerInfo;
  const rpc::WorkerInfo& getWorkerInfo(const std::string& name) const override;
  const rpc::WorkerInfo& getWorkerInfo(rpc::worker_id_t id) const override;
  std::vector<rpc::WorkerInfo> getWorkerInfos() const override;
  rpc::DeviceMap getDeviceMap(const rpc::WorkerInfo& to) const override;
  const std::vector<c10::Device>& getDevices() const override { return options_.devices; }

  // Waits until this worker's calls are answered; with `shutdown` in a static group, then until
  // every rank got there too (tpd's barrier: ranks that died count as arrived).
  void join(bool shutdown, float timeout) override;
  void sync() override {}
  void startImpl() override;
  // Stops taking events, fails the calls still waiting ("RPC agent ... is shutting down"),
  // leaves the group and closes the client.
  void shutdownImpl() override;
  std::unordered_map<std::string, std::string> getMetrics() override;

  // At the interpreter's exit with the agent still running (a program that ends without
  // rpc.shutdown()): stops taking events, fails the calls still waiting and waits for the
  // pool's tasks, with the GIL released by the caller, so that no thread of the agent calls
  // into Python once it finalizes (Python ends such a thread with pthread_exit, which aborts
  // the process when it unwinds through torch's frames). tpd.backend runs it from atexit.
  void StopAtExit();

 private:
  struct Pending {
    c10::intrusive_ptr<rpc::JitFuture> future;
    int64_t timeout_ms;
    std::vector<at::Tensor> cuda_storages;  // the daemon reads them until the call completes
  };

  // How long torch's Python handlers waited for the GIL (with enableGILProfiling): the
  // metric agent.gil_average_wait_time_us, as torch's agents report it.
  void addGilWaitTime(std::chrono::microseconds wait) override;
  // Runs `attempt` (a call or reply of `bytes`) until it is not refused for want of room in
  // the arena, or `deadline` passes; returns its last code.
  template <typename Attempt>
  int WithRoom(uint64_t bytes, std::chrono::steady_clock::time_point deadline, Attempt attempt);
  void TakeEvents();
  // Stops the event thread: no request or reply is taken after this returns.
  void StopTakingEvents();
  // Fails every call still waiting for its reply (shutdown).
  void FailPending();
  void Serve(tpd_event* request);
  void Respond(tpd_event* request, int64_t id, rpc::JitFuture& response);
  void Complete(tpd_event* reply);
  std::string LastError() const;
  // "name:<worker>,rank:<id>", as torch's agents start their lookup errors.
  std::string Where() const;

  // Adds the workers of `members` not known yet.
  void Learn(const std::vector<std::pair<std::string, int64_t>>& members) const;
  // In a dynamic group: the group's members now, learned; nullopt in a static group.
  std::optional<std::vector<std::pair<std::string, int64_t>>> Refresh() const;
  // The known worker `name` / `id`, or null.
  const rpc::WorkerInfo* Known(const std::string& name) const;
  const rpc::WorkerInfo* Known(rpc::worker_id_t id) const;

  const AgentOptions options_;
  const ClientApi api_;
  tpd_client* client_;  // null once closed (shutdownImpl)

  // Every worker known (a deque: torch keeps references to them), and where each is.
  mutable std::mutex workers_mu_;
  mutable std::deque<rpc::WorkerInfo> workers_;                 // guarded by workers_mu_
  mutable std::unordered_map<std::string, size_t> by_name_;     // guarded by workers_mu_
  mutable std::unordered_map<rpc::worker_id_t, size_t> by_id_;  // guarded by workers_mu_

  c10::ThreadPool pool_;
  std::thread events_;
  std::atomic<bool> stopped_{false};
  bool exiting_ = false;  // destroyed while running: see ~TpdAgent

  std::mutex mu_;
  std::condition_variable idle_;
  uint64_t next_tag_ = 1;                          // guarded by mu_
  std::unordered_map<uint64_t, Pending> pending_;  // guarded by mu_
  // The CUDA storages of replies sent, by release tag, until the daemon read them
  // (TPD_EVENT_RELEASED).
  std::unordered_map<uint64_t, std::vector<at::Tensor>> released_;  // guarded by mu_
  std::atomic<int64_t> serving_{0};  // requests taken, not yet answered
  std::atomic<int64_t> gil_waits_{0};
  std::atomic<int64_t> gil_wait_us_{0};
};

}  // namespace tpd::torch_agent

#endif  // TPD_PYTHON_CSRC_AGENT_H_
