// What the call router is given by the daemon: this node's name, how it finds sessions and
// members, the agent, the limits and CUDA (daemon/router/call_router.h is the door that takes
// them).
//
// Thread safety: a plain struct; the functions in it are thread-safe and never called under a
// router lock.

#ifndef TPD_DAEMON_ROUTER_OPTIONS_H_
#define TPD_DAEMON_ROUTER_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "daemon/router/cuda_copies.h"
#include "proto/control.pb.h"

namespace tpd {

struct CallRouterOptions {
  // This daemon's node name: members recorded with it are local.
  std::string node;
  // The session holding worker `worker` of `group` on this daemon, if any.
  std::function<std::optional<std::string>(const std::string& group, const std::string& worker)>
      lookup;
  // Member `worker` of `group` as this daemon last read the group (any node), if any, and
  // the number of the version read (0: the group is not followed here).
  std::function<std::optional<v1::Member>(const std::string& group, const std::string& worker,
                                          int64_t* version)>
      member;
  // Runs `done(reached)` once this daemon has read `version` of `group`, or at `deadline`
  // (GroupManager::WhenVersion). Never called under a router lock.
  std::function<void(const std::string& group, int64_t version, absl::Time deadline,
                     std::function<void(bool reached)> done)>
      when_version;
  // The agent carrying calls to other daemons; null: calls stay on this node.
  agent::Agent* agent = nullptr;
  // The URLs to dial for a member's agent_address (read from the store, so untrusted), or
  // the error that refuses it (PERMISSION_DENIED naming the address and the setting).
  std::function<absl::StatusOr<std::string>(const std::string& agent_address)> check_address;
  // Ends a session whose ring is broken or that sent a descriptor with nothing to answer.
  std::function<void(const std::string& session_id, const std::string& why)> end_session;
  // Calls one session may have waiting for their replies; one more is RESOURCE_EXHAUSTED.
  int64_t max_calls_in_flight = 1024;
  // Answers and releases one session may leave waiting for room on its completion ring; one
  // more ends the session (its client has stopped reading).
  size_t max_unposted = 8192;
  // Calls to one session that may wait for room on its completion ring; one more is
  // RESOURCE_EXHAUSTED for its caller.
  size_t max_waiting_calls = 1024;
  // Member `from`'s negotiated device map toward member `to` of `group` (its reverse map,
  // which replies follow, when `reverse`), if it has one.
  std::function<std::optional<v1::DeviceMap>(const std::string& group, const std::string& from,
                                             const std::string& to, bool reverse)>
      device_map;
  // Copies of CUDA tensors on this node; null without a usable driver, and `no_cuda` says why
  // (calls that need a copy are then FAILED_PRECONDITION with it).
  CudaCopies* cuda = nullptr;
  std::string no_cuda;
  // Where the NVIDIA device nodes are, for CheckGpuAccess ([data] device_dir).
  std::string device_dir = "/dev";
  // CUDA tensors larger than this go to other nodes in chunks of this size; 0: whole.
  uint64_t cuda_chunk_bytes = 0;
  // Host tensors between sessions of one uid and gid are lent, not copied ([data]
  // share_memory; docs/security.md).
  bool share_memory = true;
  // Serves a Store call a session sent through its rings (Op::kStore: StoreService's
  // ServeLocal): `done` gets the status and the serialized response, once, on any thread.
  // Null: such calls are UNIMPLEMENTED.
  std::function<void(const std::string& session_id, const std::string& group,
                     const std::string& method, const std::string& request,
                     absl::AnyInvocable<void(absl::Status, std::string)> done)>
      store;
};

}  // namespace tpd

#endif  // TPD_DAEMON_ROUTER_OPTIONS_H_
