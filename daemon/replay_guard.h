// Replay protection for peer calls: each sender (a RemoteStore of another daemon, named by a
// random 64-bit id) numbers its calls 1, 2, 3, ...; a sequence number is accepted once. As in
// IPsec's anti-replay window, the guard keeps, per sender, the highest number seen and a
// bitmap of the kWindow numbers below it, so calls that overtake each other on the way are
// still accepted, and numbers older than the window are refused.
//
// The sender table is bounded: past max_senders the least recently seen sender is forgotten.
// A forgotten sender's old calls must not become acceptable again, so the guard keeps a floor:
// a sender it does not know is accepted only with a timestamp above the newest timestamp of
// any sender it forgot, and above the guard's creation time (a restarted daemon does not take
// calls recorded before it started). Together with the caller's timestamp check (a call
// older than the allowed skew is refused before it gets here) a call is accepted at most once.
//
// Thread safety: thread-safe.

#ifndef TPD_DAEMON_REPLAY_GUARD_H_
#define TPD_DAEMON_REPLAY_GUARD_H_

#include <array>
#include <cstdint>
#include <list>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tpd {

class ReplayGuard {
 public:
  // Sequence numbers accepted below a sender's highest.
  static constexpr uint64_t kWindow = 1024;

  ReplayGuard(size_t max_senders, absl::Time start);

  // Accepts (sender, sequence) once; `timestamp_ms` is the call's authenticated timestamp.
  // UNAUTHENTICATED naming the reason otherwise ("replay: ...").
  absl::Status Accept(uint64_t sender, uint64_t sequence, int64_t timestamp_ms);

  size_t senders() const;

 private:
  struct Sender {
    uint64_t highest = 0;
    // Bit i set: sequence (highest - i) was seen.
    std::array<uint64_t, kWindow / 64> seen{};
    int64_t newest_timestamp_ms = 0;
    std::list<uint64_t>::iterator lru;  // position in lru_
  };

  const size_t max_senders_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Sender> senders_ ABSL_GUARDED_BY(mu_);
  std::list<uint64_t> lru_ ABSL_GUARDED_BY(mu_);  // most recently seen first
  int64_t floor_ms_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpd

#endif  // TPD_DAEMON_REPLAY_GUARD_H_
