// This process as the kernel sees it (/proc/self, getrlimit): for Admin.Status's limits and
// the `process_*` metrics every Prometheus client exports.
//
// Thread safety: stateless; reads the running system.

#ifndef TPD_DAEMON_PROCESS_STATS_H_
#define TPD_DAEMON_PROCESS_STATS_H_

#include <cstdint>

namespace tpd {

struct ProcessSample {
  double cpu_seconds = 0;
  double resident_bytes = 0;
  double virtual_bytes = 0;
  double threads = 0;
  double start_time_seconds = 0;  // Unix time
};
// CPU, memory, threads and start time (open files: CountOpenFiles, which Status reads).
ProcessSample SampleThisProcess();

// Descriptors this process holds open now (/proc/self/fd).
int64_t CountOpenFiles();

// What decides whether this process may read another's memory (process_vm_readv, as
// TensorPipe's cma channel does): Yama's ptrace_scope (-1 without Yama) and CAP_SYS_PTRACE.
struct PtraceFacts {
  int64_t yama_scope = -1;
  bool cap_sys_ptrace = false;
};
PtraceFacts ReadPtraceFacts();

// RLIMIT_MEMLOCK (soft) in bytes; -1 unlimited.
int64_t MemlockLimit();

}  // namespace tpd

#endif  // TPD_DAEMON_PROCESS_STATS_H_
