// How many client sessions the node's data path admits, when the config leaves it to the
// machine (docs/security.md, "Per-user bounds"). A session attached to shared memory costs a
// segment of about twice data.arena_bytes (committed only as it is used), a router thread and a
// few descriptors; the defaults let one daemon serve every process of a big job of the node's
// one user (256 workers and more on a GPU node) while keeping places for a second user.
//
// Thread safety: pure functions, except ReadMachineFacts, which reads the running system.

#ifndef TPD_DAEMON_SESSION_LIMITS_H_
#define TPD_DAEMON_SESSION_LIMITS_H_

#include <cstdint>
#include <string>

#include "daemon/config.h"

namespace tpd {

// What the machine offers.
struct MachineFacts {
  int64_t memory_bytes = 0;  // physical memory
  int64_t cores = 0;         // online CPUs
  int64_t open_files = 0;    // the daemon's RLIMIT_NOFILE (soft)
};

MachineFacts ReadMachineFacts();

// Raises this process's soft open-file limit to its hard limit (systemd's LimitNOFILE, or the
// shell's): every attached session holds descriptors, and the soft default of 1024 would make
// the derived max_sessions small. Best effort.
void RaiseOpenFileLimit();

// Each attached session gets a thread; beyond this many per core they only queue for CPUs.
inline constexpr int64_t kSessionsPerCore = 64;
// Descriptors one attached session holds (its data connection, its process's pidfd, the
// router's doorbells), and those kept for everything else (gRPC, stores, the agent): this
// many, or a quarter of a lower limit.
inline constexpr int64_t kFilesPerSession = 8;
inline constexpr int64_t kFilesKept = 1024;

// `data` with its derived limits filled in, for sessions of `segment_bytes` each:
// max_shared_memory_bytes 0 -> half of memory; max_sessions 0 -> what that memory holds, at
// most kSessionsPerCore per core and what the open-file limit allows (at least 1);
// max_sessions_per_uid 0 -> max_sessions; sessions_kept_free at most half of max_sessions.
// `*how` (when not null) says, for the daemon's log, where each derived number came from.
DataConfig ResolveSessionLimits(DataConfig data, uint64_t segment_bytes,
                                const MachineFacts& machine, std::string* how = nullptr);

}  // namespace tpd

#endif  // TPD_DAEMON_SESSION_LIMITS_H_
