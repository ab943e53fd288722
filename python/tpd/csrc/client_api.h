// The functions of libtpd_client.so's C ABI the TPD agent uses, found in the copy of the
// library the Python package already loaded (tpd._capi): the agent and the package share one
// library and one client, and the extension links against no build of it.
//
// Thread safety: the table is filled once, in the constructor; the functions are the ABI's
// (client/c/tpd_client.h says which are thread-safe).

#ifndef TPD_PYTHON_CSRC_CLIENT_API_H_
#define TPD_PYTHON_CSRC_CLIENT_API_H_

#include <string>

#include "client/c/tpd_client.h"

namespace tpd::torch_agent {

struct ClientApi {
  // Resolves every function in the library at `path`; throws std::runtime_error naming the
  // library and the missing symbol, or an ABI version other than the one this was built for.
  explicit ClientApi(const std::string& path);

  decltype(&tpd_abi_version) abi_version;
  decltype(&tpd_last_error) last_error;
  decltype(&tpd_free) free;
  decltype(&tpd_client_close) client_close;
  decltype(&tpd_client_stop_events) stop_events;
  decltype(&tpd_leave) leave;
  decltype(&tpd_barrier) barrier;
  decltype(&tpd_next_event) next_event;
  decltype(&tpd_event_free) event_free;
  decltype(&tpd_event_read) event_read;
  decltype(&tpd_event_tensor) event_tensor;
  decltype(&tpd_event_tensor_dlpack) event_tensor_dlpack;
  decltype(&tpd_reply) reply;
  decltype(&tpd_reply_error) reply_error;
  decltype(&tpd_call_async_flags) call_async_flags;
};

}  // namespace tpd::torch_agent

#endif  // TPD_PYTHON_CSRC_CLIENT_API_H_
