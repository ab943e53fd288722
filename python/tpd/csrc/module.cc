// tpd._C: the TPD agent's Python binding. A subclass of torch's RpcAgent binding, so torch's
// own functions (_set_and_start_rpc_agent, get_worker_info, get_debug_info, ...) take it.

#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "python/tpd/csrc/agent.h"

namespace py = pybind11;

namespace {

// Runs `f`, turning torch's c10::Error into std::runtime_error, which this module's own pybind
// raises as RuntimeError. (A c10::Error left to cross into torch's translator from a module
// built apart from torch crashed torch 2.11's Python with SIGSEGV.)
template <typename F>
auto Translated(F f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw std::runtime_error(e.what_without_backtrace());
  }
}

// A Python object kept by C++: dropped with the GIL (or left to the process's end once the
// interpreter is gone).
std::shared_ptr<py::object> Held(py::object object) {
  return std::shared_ptr<py::object>(new py::object(std::move(object)), [](py::object* held) {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    delete held;
  });
}

// A dynamic group's members, from `members`, a Python callable returning [(name, rank)]:
// called from any thread, taking the GIL.
std::function<std::vector<std::pair<std::string, int64_t>>()> Members(py::object members) {
  return [held = Held(std::move(members))] {
    py::gil_scoped_acquire gil;
    return (*held)().cast<std::vector<std::pair<std::string, int64_t>>>();
  };
}

// `started`, a Python callable, run once the agent started (torch's init_rpc has set its own
// state by then).
std::function<void()> Started(py::object started) {
  return [held = Held(std::move(started))] {
    py::gil_scoped_acquire gil;
    (*held)();
  };
}

// Device maps per worker as negotiation reports them: {"cuda:0": "cuda:1"}.
using DeviceMaps = std::unordered_map<std::string, std::unordered_map<std::string, std::string>>;

std::unordered_map<std::string, torch::distributed::rpc::DeviceMap> ToTorch(
    const DeviceMaps& maps) {
  std::unordered_map<std::string, torch::distributed::rpc::DeviceMap> out;
  for (const auto& [worker, map] : maps) {
    torch::distributed::rpc::DeviceMap& to = out[worker];
    for (const auto& [from, target] : map) to.emplace(c10::Device(from), c10::Device(target));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using torch::distributed::rpc::worker_id_t;
  using tpd::torch_agent::AgentOptions;
  using tpd::torch_agent::TpdAgent;
  // RpcAgent's Python type is made by torch.distributed.rpc's import.
  py::module::import("torch.distributed.rpc");
  m.attr("TORCH_VERSION") = TORCH_VERSION;
  py::class_<TpdAgent, torch::distributed::rpc::RpcAgent, std::shared_ptr<TpdAgent>>(m, "TpdAgent")
      .def(py::init([](std::string library, uintptr_t client, std::string group, std::string name,
                       int64_t rank, bool is_static,
                       std::vector<std::pair<std::string, int64_t>> workers, int num_worker_threads,
                       float rpc_timeout_seconds, uint64_t arena_bytes, py::object members,
                       py::object started, std::vector<std::string> devices, DeviceMaps device_maps,
                       DeviceMaps reverse_device_maps) {
             AgentOptions options;
             options.library = std::move(library);
             options.client = client;
             options.group = std::move(group);
             options.name = std::move(name);
             options.rank = rank;
             options.is_static = is_static;
             options.workers = std::move(workers);
             options.num_worker_threads = num_worker_threads;
             options.rpc_timeout_seconds = rpc_timeout_seconds;
             options.arena_bytes = arena_bytes;
             for (const std::string& device : devices) options.devices.emplace_back(device);
             options.device_maps = ToTorch(device_maps);
             options.reverse_device_maps = ToTorch(reverse_device_maps);
             if (!members.is_none()) options.members = Members(std::move(members));
             if (!started.is_none()) options.started = Started(std::move(started));
             return std::make_shared<TpdAgent>(std::move(options));
           }),
           py::arg("library"), py::arg("client"), py::arg("group"), py::arg("name"),
           py::arg("rank"), py::arg("is_static"), py::arg("workers"), py::arg("num_worker_threads"),
           py::arg("rpc_timeout_seconds"), py::arg("arena_bytes"), py::arg("members") = py::none(),
           py::arg("started") = py::none(), py::arg("devices") = std::vector<std::string>{},
           py::arg("device_maps") = DeviceMaps{}, py::arg("reverse_device_maps") = DeviceMaps{})
      // torch's RpcAgent binding has no get_worker_info(id): this attribute replaces it, so
      // it carries all three (this worker, by name, by id), as torch's agents bind them.
      .def(
          "get_worker_info", [](const TpdAgent& agent) { return agent.getWorkerInfo(); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "get_worker_info",
          [](const TpdAgent& agent, const std::string& name) {
            return Translated([&] { return agent.getWorkerInfo(name); });
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "get_worker_info",
          [](const TpdAgent& agent, worker_id_t id) {
            return Translated([&] { return agent.getWorkerInfo(id); });
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "join",
          [](TpdAgent& agent, bool shutdown, float timeout) {
            Translated([&] { agent.join(shutdown, timeout); });
          },
          py::call_guard<py::gil_scoped_release>(), py::arg("shutdown") = false,
          py::arg("timeout") = 0)
      .def(
          "shutdown", [](TpdAgent& agent) { Translated([&] { agent.shutdown(); }); },
          py::call_guard<py::gil_scoped_release>())
      .def("_stop_at_exit", &TpdAgent::StopAtExit, py::call_guard<py::gil_scoped_release>());
}
