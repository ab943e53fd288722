// Large memory copies on more than one core.
//
// One core copies about 6–12 GB/s; a server's memory takes several times that. A 16 MiB tensor
// copied by one thread costs 1.5–2.5 ms, and a CPU tensor from Python crosses up to four such
// copies on a round trip (docs/BENCHMARKS.md, "Issue 34"). CopyPool splits a copy of at least
// `parallel_from` bytes into chunks that the calling thread and up to `helpers` pool threads
// take in turn; below that, or when every helper is busy with someone else's copy, the caller
// copies alone, so a copy is never slower than memcpy by more than a queue hand-off.
//
//   tpd::CopyBytes(dst, src, n);  // the process's pool (CopyPool::Default())
//
// The helpers start at the first large copy (a process that never makes one has no extra
// threads) and sleep on a mutex between copies: no idle CPU. In a child forked after they
// started the pool's threads are gone; its copies run on the calling thread alone.
//
// Thread safety: Copy is thread-safe; concurrent copies share the helpers.

#ifndef TPD_BASE_PARALLEL_COPY_H_
#define TPD_BASE_PARALLEL_COPY_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tpd {

struct CopyPoolOptions {
  int helpers = 3;                 // threads besides the caller's
  size_t parallel_from = 1 << 20;  // smaller copies are one memcpy
  size_t chunk_bytes = 256 << 10;  // what one thread takes at a time
  // A copy takes one helper per this many bytes beyond the first (waking a helper costs about
  // what one core copies of 256 KiB; at 1 MiB more than one helper made copies slower).
  size_t bytes_per_thread = 512 << 10;
};

class CopyPool {
 public:
  explicit CopyPool(CopyPoolOptions options);
  ~CopyPool();  // joins the helpers; no Copy may be running
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  // The process's pool: a helper per core beyond the caller's, at most 7 (a 16-core host's
  // memory took 5–11× one core's rate at 16–64 MiB with 7: docs/BENCHMARKS.md, "Issue 34"),
  // never destroyed.
  static CopyPool& Default();

  // Copies `n` bytes from `src` to `dst`, which must not overlap.
  void Copy(void* dst, const void* src, size_t n);

  const CopyPoolOptions& options() const { return options_; }

 private:
  struct Job;

  void StartHelpersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HelperLoop();
  void DropJobLocked(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CopyPoolOptions options_;
  const pid_t owner_;  // the process whose helpers these are
  absl::Mutex mu_;
  std::deque<Job*> jobs_ ABSL_GUARDED_BY(mu_);  // copies that still want a helper
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_ ABSL_GUARDED_BY(mu_);
};

// CopyPool::Default().Copy(dst, src, n).
void CopyBytes(void* dst, const void* src, size_t n);

}  // namespace tpd

#endif  // TPD_BASE_PARALLEL_COPY_H_
