// What logs, errors and Admin.Status call a session. A session id is the session's only
// credential (Join, Leave, Barrier and the data socket's attach take it), so it is never
// printed; its handle is printed instead. The handle is a digest of the id: anyone may read
// it, and nothing can be done with it (docs/security.md, "Session ids and handles").
//
// Thread safety: a pure function of its argument.

#ifndef TPD_DAEMON_ROUTER_SESSION_HANDLE_H_
#define TPD_DAEMON_ROUTER_SESSION_HANDLE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tpd {

// "s-" and the first 12 hex digits of SHA-256("tpd-session-handle-v1" || id): 48 bits, enough
// to tell sessions apart in a log, and no help in guessing the 128-bit id.
std::string SessionHandle(absl::string_view session_id);

}  // namespace tpd

#endif  // TPD_DAEMON_ROUTER_SESSION_HANDLE_H_
