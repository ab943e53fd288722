// Whether a local user could open this node's NVIDIA GPUs itself, judged as the kernel would
// judge its open(2) of the device nodes: read and write permission on /dev/nvidiactl and every
// /dev/nvidia<N>, by their mode bits, owner and group against the user's uid, primary group
// and supplementary groups (the group database).
//
// The daemon runs as root and opens the CUDA memory a client names (legacy IPC handles, which
// anyone with GPU access can forge), so it does that only for clients whose user could open
// the GPUs without it (docs/security.md, "CUDA memory of clients"): for the others it would
// be a confused deputy, reading and writing device memory they could not reach.
//
// Thread safety: a pure function of the file system and the user database.

#ifndef TPD_DAEMON_ROUTER_GPU_ACCESS_H_
#define TPD_DAEMON_ROUTER_GPU_ACCESS_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace tpd {

// OK when `uid` may open every NVIDIA device node in `device_dir` (root may; a node with no
// device nodes has nothing to guard); else PERMISSION_DENIED naming the node, its mode, owner
// and group, and the uid.
absl::Status CheckGpuAccess(uid_t uid, const std::string& device_dir = "/dev");

}  // namespace tpd

#endif  // TPD_DAEMON_ROUTER_GPU_ACCESS_H_
