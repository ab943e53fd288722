#include "base/latency_histogram.h"

#include <algorithm>
#include <cmath>

namespace tpd {

size_t LatencyHistogram::BucketOf(uint64_t ns) {
  if (ns < 4) return ns;
  // Octave e = floor(log2 ns) holds four buckets, split by the two bits after the leading one.
  const int e = 63 - __builtin_clzll(ns);
  const size_t index = 4 * static_cast<size_t>(e - 1) + ((ns >> (e - 2)) & 3);
  return std::min(index, kBuckets - 1);
}

uint64_t LatencyHistogram::BucketEnd(size_t index) {
  if (index < 4) return index + 1;
  if (index == kBuckets - 1) return UINT64_MAX;  // the last bucket takes everything past it
  const int e = static_cast<int>(index / 4) + 1;
  const uint64_t sub = index % 4;
  return (4 + sub + 1) << (e - 2);
}

void LatencyHistogram::Record(int64_t ns) {
  const uint64_t value = ns < 0 ? 0 : static_cast<uint64_t>(ns);
  buckets_[BucketOf(value)].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(value, std::memory_order_relaxed);
  uint64_t max = max_ns_.load(std::memory_order_relaxed);
  while (value > max && !max_ns_.compare_exchange_weak(max, value, std::memory_order_relaxed)) {
  }
}

LatencyHistogram::Snapshot LatencyHistogram::Read() const {
  Snapshot s;
  // The count is the buckets' sum, so percentiles agree with it even while values arrive.
  for (size_t i = 0; i < kBuckets; ++i) {
    s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    s.count += s.buckets[i];
  }
  s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
  s.max_ns = max_ns_.load(std::memory_order_relaxed);
  return s;
}

uint64_t LatencyHistogram::Snapshot::Percentile(double q) const {
  if (count == 0) return 0;
  const uint64_t rank =
      std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(count))));
  uint64_t seen = 0;
  for (size_t i = 0; i < kBuckets; ++i) {
    seen += buckets[i];
    if (seen >= rank) return std::min(BucketEnd(i) - 1, max_ns);
  }
  return max_ns;
}

std::vector<std::pair<uint64_t, uint64_t>> LatencyHistogram::Snapshot::NonEmpty() const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (size_t i = 0; i < kBuckets; ++i) {
    if (buckets[i] != 0) out.emplace_back(std::min(BucketEnd(i) - 1, max_ns), buckets[i]);
  }
  return out;
}

}  // namespace tpd
