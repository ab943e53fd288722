// `tpctl doctor`: what stands in the way on this node, each finding with what to do. It reads
// the daemon's own view (Admin.Status: its limits, its transports and channels and why each is
// on or off, its GPUs, its peers and rendezvous stores) and what it measures when asked (its
// peers pinged, its etcd clusters' members asked), so it needs no privilege beyond the socket
// and sees what the daemon sees.
//
// Thread safety: a pure function.

#ifndef TPD_CLIENT_DOCTOR_H_
#define TPD_CLIENT_DOCTOR_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/admin.pb.h"

namespace tpd {

struct Finding {
  enum class Level { kOk, kNote, kWarning, kProblem };
  std::string check;  // "open files", "transport uv", "peer node7", ...
  Level level = Level::kOk;
  std::string detail;  // what was found, with the numbers
  std::string fix;     // what to do; empty when nothing need be done
};

// "ok", "note", "warning", "PROBLEM".
const char* LevelName(Finding::Level level);

// What the daemon measured when asked; either may be missing (nullptr).
struct Probes {
  const v1::ProbePeersResponse* peers = nullptr;    // Admin.ProbePeers
  const v1::ProbeStoresResponse* stores = nullptr;  // Admin.ProbeStores
};

// Every finding about the daemon `status` describes, as of `now`, in a stable order; with
// `probes`, also each peer's round trip and clock, and the members of each etcd cluster
// behind a rendezvous store.
std::vector<Finding> Diagnose(const v1::StatusResponse& status, const Probes& probes,
                              absl::Time now);

}  // namespace tpd

#endif  // TPD_CLIENT_DOCTOR_H_
