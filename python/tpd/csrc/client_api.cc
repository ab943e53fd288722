#include "python/tpd/csrc/client_api.h"

#include <dlfcn.h>

#include <stdexcept>

namespace tpd::torch_agent {
namespace {

template <typename Function>
void Resolve(void* library, const std::string& path, const char* name, Function* out) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    throw std::runtime_error(path + " has no " + name + ": not a tpd client library this " +
                             "extension can use (rebuild them together)");
  }
  *out = reinterpret_cast<Function>(symbol);
}

}  // namespace

ClientApi::ClientApi(const std::string& path) {
  // The package loaded it already; this takes another reference to the same copy, which is
  // never dropped (the agent's threads may call into it until the process exits).
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("cannot load the tpd client library " + path + ": " +
                             (why != nullptr ? why : "unknown error"));
  }
  Resolve(library, path, "tpd_abi_version", &abi_version);
  if (const int version = abi_version(); version != TPD_ABI_VERSION) {
    throw std::runtime_error(path + " has ABI version " + std::to_string(version) +
                             ", tpd's torch extension was built for " +
                             std::to_string(TPD_ABI_VERSION) + ": rebuild them together");
  }
  Resolve(library, path, "tpd_last_error", &last_error);
  Resolve(library, path, "tpd_free", &free);
  Resolve(library, path, "tpd_client_close", &client_close);
  Resolve(library, path, "tpd_client_stop_events", &stop_events);
  Resolve(library, path, "tpd_leave", &leave);
  Resolve(library, path, "tpd_barrier", &barrier);
  Resolve(library, path, "tpd_next_event", &next_event);
  Resolve(library, path, "tpd_event_free", &event_free);
  Resolve(library, path, "tpd_event_read", &event_read);
  Resolve(library, path, "tpd_event_tensor", &event_tensor);
  Resolve(library, path, "tpd_event_tensor_dlpack", &event_tensor_dlpack);
  Resolve(library, path, "tpd_reply", &reply);
  Resolve(library, path, "tpd_reply_error", &reply_error);
  Resolve(library, path, "tpd_call_async_flags", &call_async_flags);
}

}  // namespace tpd::torch_agent
