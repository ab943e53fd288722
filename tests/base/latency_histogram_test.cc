#include "base/latency_histogram.h"

#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tpd {
namespace {

TEST(LatencyHistogramTest, BucketsAreContiguousAndNarrow) {
  // Every value falls in a bucket whose bounds hold it, and no bucket is wider than a quarter
  // of its octave: percentiles read from buckets are within 25 %.
  for (uint64_t v : {0ull, 1ull, 3ull, 4ull, 5ull, 7ull, 8ull, 9ull, 1000ull, 1023ull, 1024ull,
                     1025ull, 123456789ull, (1ull << 39) + 17}) {
    const size_t i = LatencyHistogram::BucketOf(v);
    const uint64_t begin = i == 0 ? 0 : LatencyHistogram::BucketEnd(i - 1);
    EXPECT_LE(begin, v) << v;
    EXPECT_LT(v, LatencyHistogram::BucketEnd(i)) << v;
    if (v >= 4) EXPECT_LE(LatencyHistogram::BucketEnd(i) - begin, v / 4 + 1) << v;
  }
  for (size_t i = 1; i < LatencyHistogram::kBuckets; ++i) {
    EXPECT_GT(LatencyHistogram::BucketEnd(i), LatencyHistogram::BucketEnd(i - 1)) << i;
  }
}

TEST(LatencyHistogramTest, HugeAndNegativeValuesAreCountedNotLost) {
  LatencyHistogram h;
  h.Record(-5);
  h.Record(int64_t{1} << 50);
  const LatencyHistogram::Snapshot s = h.Read();
  EXPECT_EQ(s.count, 2u);
  EXPECT_EQ(s.buckets[0], 1u);
  EXPECT_EQ(s.buckets[LatencyHistogram::kBuckets - 1], 1u);
  EXPECT_EQ(s.max_ns, uint64_t{1} << 50);
  EXPECT_EQ(s.Percentile(1.0), uint64_t{1} << 50);
}

TEST(LatencyHistogramTest, PercentilesMeanAndMax) {
  LatencyHistogram h;
  EXPECT_EQ(h.Read().Percentile(0.5), 0u);
  // 90 values of 10 µs and 10 of 1 ms.
  for (int i = 0; i < 90; ++i) h.Record(10'000);
  for (int i = 0; i < 10; ++i) h.Record(1'000'000);
  const LatencyHistogram::Snapshot s = h.Read();
  EXPECT_EQ(s.count, 100u);
  EXPECT_EQ(s.max_ns, 1'000'000u);
  EXPECT_DOUBLE_EQ(s.MeanNs(), (90 * 10'000.0 + 10 * 1'000'000.0) / 100);
  EXPECT_GE(s.Percentile(0.5), 10'000u);
  EXPECT_LT(s.Percentile(0.5), 12'500u);
  EXPECT_LT(s.Percentile(0.9), 12'500u);
  EXPECT_EQ(s.Percentile(0.99), 1'000'000u);  // capped at the maximum
  const auto buckets = s.NonEmpty();
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].second, 90u);
  EXPECT_GE(buckets[0].first, 10'000u);
  EXPECT_EQ(buckets[1].second, 10u);
}

TEST(LatencyHistogramTest, ConcurrentRecordsAreAllCounted) {
  LatencyHistogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < 10000; ++i) h.Record(1000 * (t + 1) + i % 7);
    });
  }
  for (std::thread& t : threads) t.join();
  const LatencyHistogram::Snapshot s = h.Read();
  EXPECT_EQ(s.count, 40000u);
  EXPECT_EQ(s.max_ns, 4006u);
}

}  // namespace
}  // namespace tpd
