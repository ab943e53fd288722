// A latency histogram cheap enough to record every call: log-linear buckets (four per power
// of two, so a percentile read from it is within 25 % of the true value, and the maximum is
// exact), counted with relaxed atomics and no lock. Readers take a Snapshot at any time; a
// snapshot taken while values are recorded may miss the newest of them, never count one twice.
//
//   LatencyHistogram h;
//   h.Record(elapsed_ns);
//   LatencyHistogram::Snapshot s = h.Read();
//   s.Percentile(0.99);  // ns, the upper bound of the bucket holding the 99th percentile
//
// Thread safety: thread-safe.

#ifndef TPD_BASE_LATENCY_HISTOGRAM_H_
#define TPD_BASE_LATENCY_HISTOGRAM_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace tpd {

class LatencyHistogram {
 public:
  // Values at or past 2^40 ns (about 18 minutes) share the last bucket.
  static constexpr size_t kBuckets = 160;

  struct Snapshot {
    uint64_t count = 0;
    uint64_t sum_ns = 0;
    uint64_t max_ns = 0;
    std::array<uint64_t, kBuckets> buckets{};

    // The bucket's bound at or below which a fraction `q` (0 < q <= 1) of the values lie,
    // capped at the maximum; 0 when empty.
    uint64_t Percentile(double q) const;
    double MeanNs() const { return count == 0 ? 0 : static_cast<double>(sum_ns) / count; }
    // (bucket's upper bound in ns, capped at the maximum; count) for each bucket holding a
    // value, in order.
    std::vector<std::pair<uint64_t, uint64_t>> NonEmpty() const;
  };

  // Counts one value; negative values (a clock that stepped back) count as 0.
  void Record(int64_t ns);
  Snapshot Read() const;

  // The bucket `ns` falls in, and the first value past bucket `index` (its exclusive bound;
  // UINT64_MAX for the last).
  static size_t BucketOf(uint64_t ns);
  static uint64_t BucketEnd(size_t index);

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};
  std::atomic<uint64_t> max_ns_{0};
};

}  // namespace tpd

#endif  // TPD_BASE_LATENCY_HISTOGRAM_H_
