// Wake-ups across processes through a futex word in shared memory, after a short adaptive
// spin, so a busy consumer answers in well under a microsecond and an idle one sleeps.
//
// Protocol, for one producer and one consumer of a DoorbellWord:
//   producer (Ring):  publish the data (a release store, e.g. a ring's tail); full fence;
//                     if `sleeping` is set: seq += 1 (release), FUTEX_WAKE(seq).
//   consumer (Wait):  spin on ready() for the adaptive window (pause for pause_spin, then
//                     sched_yield between looks, so a producer on the same core can run);
//                     then sleeping = 1; full fence; s = seq; if ready(): done;
//                     FUTEX_WAIT(seq, s, remaining time); sleeping = 0; repeat until ready()
//                     or the deadline.
// The two fences order "publish, then look for a sleeper" against "announce sleep, then look
// for data": either the producer sees the consumer asleep and wakes it, or the consumer sees
// the data before it sleeps. A wake between the consumer's read of `seq` and its FUTEX_WAIT
// finds seq changed and the wait returns at once; a consumer that read `seq` after the bump
// also sees the data (the bump is a release, the read an acquire) and does not sleep. So seq
// moves only when someone sleeps, and a busy ring costs the producer a fence and one load of
// a cache line nobody writes, not a locked increment per push. The futex is shared (no
// FUTEX_PRIVATE_FLAG): the word lies in a MAP_SHARED mapping seen by two processes.
//
// Trust: the word is writable by the other process. A corrupted `seq` or `sleeping` costs
// only spurious wake-ups, a missed wake-up of the party that corrupted it, or a wasted
// FUTEX_WAKE; every Wait returns by its deadline whatever the word holds. Wait counts wake-ups
// that found nothing ready (spurious_wakeups()), which a daemon can use to end a session that
// keeps rattling its word.
//
// Thread safety: a Doorbell is used by one thread at a time (it keeps the spin window). One
// producer Doorbell and one consumer Doorbell may share a word, in any two processes.

#ifndef TPD_SHM_DOORBELL_H_
#define TPD_SHM_DOORBELL_H_

#include <atomic>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"

namespace tpd::shm {

// The shared part, one cache line.
struct alignas(64) DoorbellWord {
  std::atomic<uint32_t> seq;       // the futex word: bumped by a Ring that finds a sleeper
  std::atomic<uint32_t> sleeping;  // 1 while the consumer is (about to be) in FUTEX_WAIT
};
static_assert(sizeof(DoorbellWord) == 64);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex needs a plain u32");

// How long a consumer spins before it sleeps.
struct SpinOptions {
  // The adaptive window stays within [min_spin, max_spin]; max_spin zero sleeps at once.
  absl::Duration min_spin = absl::Microseconds(2);
  absl::Duration max_spin = absl::Microseconds(50);
  // The first part of the window spins with pause only; past it, every look also yields.
  absl::Duration pause_spin = absl::Microseconds(1);
};

// The adaptive part of the spin: a running average of how long recent waits took (spinning
// or sleeping). Spinning pays only when a typical wait ends within max_spin; then the window
// is about four times the typical wait, within [min_spin, max_spin]: waits between calls have
// a long tail (a p90 twice the p50), and every wait that outlasts the window costs a futex
// wake-up, which on a VM is most of a call's tail; a spin that ends early costs only the wait.
// When waits keep taking longer (an idle peer: about three in a row) the window drops to
// min_spin, so an idle consumer goes to sleep almost at once; one long wait alone does not
// turn the spin off.
// A plain value, apart from the clock so the rule can be tested on its own.
class SpinWindow {
 public:
  explicit SpinWindow(const SpinOptions& options);

  // Records a wait that took `waited_ns` from its start until the data was there (or its
  // deadline).
  void Learn(int64_t waited_ns);
  int64_t window_ns() const { return window_ns_; }
  int64_t pause_ns() const { return pause_ns_; }

 private:
  int64_t min_ns_;
  int64_t max_ns_;
  int64_t pause_ns_;
  int64_t estimate_ns_;
  int64_t window_ns_;
};

// Spins until ready() or the clock reaches `until_ns` (absl::GetCurrentTimeNanos), starting
// at `start_ns`: pause between looks until `yield_after_ns`, then sched_yield between looks, so
// a thread waiting for this very core (more runnable threads than cores) gets it at the first
// yield instead of after the whole spin. The clock is read every 16 looks only, and
// `*now_ns` is that last reading (accurate to a microsecond or so): a wait answered within 16
// looks costs no clock read. Returns whether ready() was true; one last look when the time
// is up. The doorbell's spin, and the client library's on its own queues and results.
bool SpinUntil(absl::FunctionRef<bool()> ready, int64_t start_ns, int64_t until_ns,
               int64_t yield_after_ns, int64_t* now_ns);

class Doorbell {
 public:
  // `word` lies in shared memory and outlives this object.
  explicit Doorbell(DoorbellWord* word, SpinOptions options = {});

  // Producer: the data was published (with a release store) before this call.
  void Ring();

  // Consumer: returns true as soon as ready() is true, false when `deadline` passed first
  // (ready() was false at the last look). ready() is called often and must be cheap; it may
  // return true for "something is wrong" so the caller finds the error.
  // `spin`, when given, is the adaptive window to spin for and learn from instead of this
  // doorbell's own (a waiter that knows this wait is of another kind).
  bool Wait(absl::FunctionRef<bool()> ready, absl::Time deadline, SpinWindow* spin = nullptr);

  // The spin window the next Wait starts with.
  absl::Duration spin_window() const { return absl::Nanoseconds(spin_.window_ns()); }
  // The counters may be read from any thread (a daemon's status), so they are atomics; only
  // the thread using the Doorbell writes them.
  // FUTEX_WAITs that returned (not by timeout) with nothing ready.
  uint64_t spurious_wakeups() const { return spurious_wakeups_.load(std::memory_order_relaxed); }
  // FUTEX_WAITs entered.
  uint64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }
  // FUTEX_WAKEs issued by Ring: the consumer was (about to be) asleep. Each costs a system call
  // here and a wake-up there, the price of a hop that did not find its peer spinning.
  uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }

 private:
  // One writer: a plain load and store, not a locked increment.
  static void Count(std::atomic<uint64_t>& counter) {
    counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }

  DoorbellWord* word_;
  SpinWindow spin_;
  std::atomic<uint64_t> spurious_wakeups_{0};
  std::atomic<uint64_t> sleeps_{0};
  std::atomic<uint64_t> wakeups_{0};
};

}  // namespace tpd::shm

#endif  // TPD_SHM_DOORBELL_H_
