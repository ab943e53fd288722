// The agent's addresses before TensorPipe sees them: TensorPipe aborts the process on a host
// name, an unparsable URL or a port it cannot bind, so each is checked here first.
//
// Thread safety: stateless.

#ifndef TPD_AGENT_ADDRESS_H_
#define TPD_AGENT_ADDRESS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tpd::agent {

// "host:port" -> host, port and address family; IPv6 hosts in brackets. INVALID_ARGUMENT
// unless the host is an IP literal and the port 0..65535.
absl::Status SplitHostPort(absl::string_view address, std::string* host, std::string* port,
                           int* family);

// Whether TensorPipe can be given `url` without aborting: uv:// and ibv:// need an IP literal
// (and optional port); shm:// any non-empty name.
bool UrlIsSafe(absl::string_view url);

// Binds and listens on a throwaway socket where a listener will bind (UNAVAILABLE naming
// `option_text` if that fails), because TensorPipe aborts the process when its own bind fails.
absl::Status CheckBindable(const std::string& host, const std::string& port, int family,
                           const std::string& option_text);

}  // namespace tpd::agent

#endif  // TPD_AGENT_ADDRESS_H_
