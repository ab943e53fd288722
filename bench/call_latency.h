// Prints a daemon's call_latency stages (Admin.Status) under a benchmark's table, so a run
// shows where inside the daemon its calls' time went.
//
// Thread safety: none needed (prints).

#ifndef TPD_BENCH_CALL_LATENCY_H_
#define TPD_BENCH_CALL_LATENCY_H_

#include <string>

#include "proto/admin.pb.h"

namespace tpd::bench {

// One line per stage whose name starts with `prefix` ("" for all), under `title`.
void PrintCallLatency(const std::string& title, const v1::StatusResponse& status,
                      const std::string& prefix = "");

}  // namespace tpd::bench

#endif  // TPD_BENCH_CALL_LATENCY_H_
