// Prometheus metrics (`[metrics] listen_address`, docs/operations.md "Monitor"): `/metrics`
// in the text format, built at each scrape from the same snapshot Admin.Status answers with,
// plus this process's own counters. Nothing is counted for Prometheus alone: the data path
// keeps the counters it kept for Status, and a scrape reads them as Status does, so a
// scraper costs the data path what a `tpctl status` does.
//
// Names and labels follow Prometheus' conventions: a `tpd_` prefix, units in the name
// (`_seconds`, `_bytes`), `_total` on counters; labels only from bounded sets (stage, gRPC
// method and code, uid, peer node, group phase, rendezvous store, CUDA route), never a
// session, a call, a key or a payload.
//
// Thread safety: MetricsServer is thread-safe; its HTTP threads call `snapshot` concurrently.

#ifndef TPD_DAEMON_METRICS_H_
#define TPD_DAEMON_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/process_stats.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"
#include "proto/admin.pb.h"

namespace tpd {

// The families of one Status snapshot and one process sample, in a stable order.
std::vector<prometheus::MetricFamily> StatusMetrics(const v1::StatusResponse& status,
                                                    const ProcessSample& process);

// The upper bounds, in seconds, of the `tpd_call_stage_seconds` buckets (+Inf comes last).
// Status's histograms have four buckets per power of two; each is counted under the first
// bound at or above its own upper bound, so a count is never placed below its true value.
const std::vector<double>& StageBucketBounds();

class MetricsServer {
 public:
  // Serves `/metrics` on `listen_address` ("127.0.0.1:9477"; port 0 picks one) with two HTTP
  // threads. `snapshot` is called once per scrape and must outlive the server.
  // UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen_address, std::function<v1::StatusResponse()> snapshot);
  ~MetricsServer();

  // host:port as bound, the port filled in.
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;

  std::string address_;
  std::shared_ptr<prometheus::Collectable> collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_METRICS_H_
