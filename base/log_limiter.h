// Rate limits for log lines that a client or a peer can cause: at most one line per source
// (a session, a uid, a peer host) per interval, and the next line that goes says how many
// were held back meanwhile. A flood of bad input then costs the journal one line per source
// per interval instead of drowning the daemon's other lines under journald's own limit.
//
//   LogLimiter limiter(absl::Seconds(10));
//   int64_t held = 0;
//   if (limiter.Admit(handle, &held)) log.warn("[session {}] ...{}", handle, HeldBack(held));
//
// At most `max_sources` sources are remembered; past that, sources whose interval has passed
// are forgotten, and if none has, all are (bounded memory beats a perfect limit under a
// flood from many sources).
//
// Thread safety: thread-safe.

#ifndef TPD_BASE_LOG_LIMITER_H_
#define TPD_BASE_LOG_LIMITER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tpd {

class LogLimiter {
 public:
  explicit LogLimiter(absl::Duration interval, size_t max_sources = 4096)
      : interval_(interval), max_sources_(max_sources) {}

  // Whether a line about `source` may be written at `now`. When it may, `*held_back` is the
  // number of lines about it refused since the last one admitted.
  bool Admit(absl::string_view source, int64_t* held_back, absl::Time now = absl::Now());

  absl::Duration interval() const { return interval_; }

 private:
  struct State {
    absl::Time last_admitted;
    int64_t held_back = 0;
  };

  const absl::Duration interval_;
  const size_t max_sources_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, State> sources_ ABSL_GUARDED_BY(mu_);
};

// " (N more in the last <interval>)" when `held_back` > 0, else "": the tail of an admitted
// line.
std::string HeldBack(int64_t held_back, absl::Duration interval);

}  // namespace tpd

#endif  // TPD_BASE_LOG_LIMITER_H_
