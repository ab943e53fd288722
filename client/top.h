// `tpctl top`: a live view of one daemon, redrawn every interval from two Admin.Status
// snapshots: calls/s and p50/p99 per stage over the interval, bytes/s to and from each peer
// daemon, sessions, memory and calls/s per local user. Plain text and ANSI clear-screen: no
// curses.
//
// Thread safety: a pure function.

#ifndef TPD_CLIENT_TOP_H_
#define TPD_CLIENT_TOP_H_

#include <string>

#include "absl/time/time.h"
#include "proto/admin.pb.h"

namespace tpd {

// One frame: what changed from `before` to `now`, `elapsed` apart. With no `before` (the
// first frame), rates and interval percentiles are left out.
std::string RenderTop(const v1::StatusResponse* before, const v1::StatusResponse& now,
                      absl::Duration elapsed);

// The `quantile` (0..1) of the calls that passed `stage` between the snapshots, from the
// differences of their histogram buckets: the upper bound of the bucket it falls in, µs. 0
// when no call passed.
double IntervalPercentileUs(const v1::CallLatency* before, const v1::CallLatency& now,
                            double quantile);

}  // namespace tpd

#endif  // TPD_CLIENT_TOP_H_
