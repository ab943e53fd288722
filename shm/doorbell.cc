#include "shm/doorbell.h"

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

#include "absl/time/clock.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TPD_SHM_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define TPD_SHM_PAUSE() asm volatile("yield" ::: "memory")
#else
#define TPD_SHM_PAUSE() \
  do {                  \
  } while (false)
#endif

namespace tpd::shm {
namespace {

// The spin window as a multiple of the typical wait (SpinWindow in the header). Twice let a
// fifth of B2's waits outlast it; four times cut the sleeps per call five- to tenfold at no
// measured CPU cost (docs/BENCHMARKS.md, "Issue 18, second session").
constexpr int64_t kWindowPerWait = 4;

uint32_t* FutexAddress(std::atomic<uint32_t>* word) {
  // std::atomic<uint32_t> is a lock-free u32 with the same representation (asserted in the
  // header), which is what the kernel reads.
  return reinterpret_cast<uint32_t*>(word);
}

// Shared (not FUTEX_PRIVATE_FLAG): the other party is another process.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  struct timespec timeout;
  timeout.tv_sec = timeout_ns / 1'000'000'000;
  timeout.tv_nsec = timeout_ns % 1'000'000'000;
  // Returns 0 (woken), or -1 with EAGAIN (the word changed), EINTR or ETIMEDOUT: the caller
  // looks at its condition and the clock in every case.
  syscall(SYS_futex, FutexAddress(word), FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, FutexAddress(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

SpinWindow::SpinWindow(const SpinOptions& options)
    : min_ns_(std::max<int64_t>(0, absl::ToInt64Nanoseconds(options.min_spin))),
      max_ns_(std::max<int64_t>(0, absl::ToInt64Nanoseconds(options.max_spin))),
      pause_ns_(std::max<int64_t>(0, absl::ToInt64Nanoseconds(options.pause_spin))) {
  min_ns_ = std::min(min_ns_, max_ns_);
  estimate_ns_ = max_ns_ / 2;
  window_ns_ = max_ns_;
}

void SpinWindow::Learn(int64_t waited_ns) {
  // Capped at twice max_spin: one long wait (a hiccup of the peer) leaves the spin on; it
  // takes about three in a row (an idle peer) to push the average past max_spin.
  const int64_t sample = std::clamp<int64_t>(waited_ns, 0, 2 * max_ns_ + 1);
  estimate_ns_ += (sample - estimate_ns_) / 4;
  if (estimate_ns_ > max_ns_) {
    window_ns_ = min_ns_;
  } else {
    window_ns_ = std::clamp(kWindowPerWait * estimate_ns_, min_ns_, max_ns_);
  }
}

bool SpinUntil(absl::FunctionRef<bool()> ready, int64_t start_ns, int64_t until_ns,
               int64_t yield_after_ns, int64_t* now_ns) {
  int64_t now = start_ns;
  for (uint32_t i = 1;; ++i) {
    if (ready()) break;
    if ((i & 15) == 0) {
      now = absl::GetCurrentTimeNanos();
      if (now >= until_ns) {
        *now_ns = now;
        return ready();
      }
    }
    if (now >= yield_after_ns) {
      sched_yield();
    } else {
      TPD_SHM_PAUSE();
    }
  }
  *now_ns = now;
  return true;
}

Doorbell::Doorbell(DoorbellWord* word, SpinOptions options) : word_(word), spin_(options) {}

void Doorbell::Ring() {
  // Orders the caller's publishing store before the load of `sleeping` (see the header).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (word_->sleeping.load(std::memory_order_relaxed) == 0) return;
  word_->seq.fetch_add(1, std::memory_order_release);
  FutexWake(&word_->seq);
  Count(wakeups_);
}

bool Doorbell::Wait(absl::FunctionRef<bool()> ready, absl::Time deadline, SpinWindow* spin) {
  SpinWindow& window = spin != nullptr ? *spin : spin_;
  if (ready()) {  // before any clock read: the common case of a busy ring
    window.Learn(0);
    return true;
  }
  const int64_t start = absl::GetCurrentTimeNanos();
  const int64_t deadline_ns = absl::ToUnixNanos(deadline);
  const int64_t spin_until = std::min(deadline_ns, start + window.window_ns());
  const int64_t yield_after = start + std::min(window.window_ns(), window.pause_ns());

  // A producer on another core answers within the pause phase; one waiting for this very
  // core gets it at the first yield.
  int64_t now = start;
  if (start < spin_until && SpinUntil(ready, start, spin_until, yield_after, &now)) {
    window.Learn(now - start);
    return true;
  }

  // Sleep, announcing it first so the producer knows to wake us.
  while (true) {
    word_->sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t seq = word_->seq.load(std::memory_order_acquire);
    if (ready()) break;
    now = absl::GetCurrentTimeNanos();
    if (now >= deadline_ns) {
      word_->sleeping.store(0, std::memory_order_relaxed);
      window.Learn(now - start);
      return false;
    }
    Count(sleeps_);
    FutexWait(&word_->seq, seq, deadline_ns - now);
    if (ready()) break;
    // Woken (or the word changed) with nothing to read, or the wait timed out: the loop
    // checks the deadline before sleeping again.
    if (absl::GetCurrentTimeNanos() < deadline_ns) Count(spurious_wakeups_);
  }
  word_->sleeping.store(0, std::memory_order_relaxed);
  window.Learn(absl::GetCurrentTimeNanos() - start);
  return true;
}

}  // namespace tpd::shm
