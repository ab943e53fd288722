// Limits on what a local client may send to tpd.v1.Control, checked at the service edge
// before the group manager acts on a request: names (daemon/names.h), world_size, the length
// of every list in a Join's options and env, and of every string in them. A request past a
// limit answers INVALID_ARGUMENT naming the request field and the config setting, so
// nothing a client sends can grow the daemon's memory, its records in the rendezvous store,
// or an error message without bound.
//
// Thread safety: pure functions of their arguments.

#ifndef TPD_DAEMON_CONTROL_LIMITS_H_
#define TPD_DAEMON_CONTROL_LIMITS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "daemon/config.h"
#include "proto/control.pb.h"

namespace tpd {

// Longest init_method accepted: a file:// path is at most PATH_MAX bytes on Linux.
inline constexpr size_t kMaxInitMethodBytes = 4096;
// Longest OpenSessionRequest.client kept for logs and status; longer text is cut.
inline constexpr size_t kMaxClientDescriptionBytes = 256;
// Longest JoinRequest.secret (a group's secret; 32 random bytes are plenty).
inline constexpr size_t kMaxGroupSecretBytes = 1024;
// Longest JoinRequest.abandon (the reason a rank cannot take part).
inline constexpr size_t kMaxAbandonBytes = 1024;

absl::Status CheckJoinRequest(const v1::JoinRequest& request, const GroupConfig& limits);
absl::Status CheckLeaveRequest(const v1::LeaveRequest& request);
absl::Status CheckBarrierRequest(const v1::BarrierRequest& request);
// GetGroup and WatchGroup; `method` names the request type in messages ("GetGroupRequest").
absl::Status CheckGroupLookup(const char* method, const std::string& group,
                              const std::string& init_method);

// OpenSessionRequest.client as logged: cut and escaped, so it cannot forge log lines.
std::string ClientDescription(const std::string& client);

}  // namespace tpd

#endif  // TPD_DAEMON_CONTROL_LIMITS_H_
