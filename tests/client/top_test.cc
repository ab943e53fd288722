// tpctl top's frames from crafted snapshots: rates are differences over the interval, the
// interval's p50/p99 come from the differences of the stage histograms' buckets (not the
// since-start figures), and the first frame shows no rate.

#include "client/top.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;

void AddBucket(v1::CallLatency* stage, double le_us, uint64_t count) {
  v1::LatencyBucket* bucket = stage->add_buckets();
  bucket->set_le_us(le_us);
  bucket->set_count(count);
}

v1::StatusResponse Snapshot(uint64_t fast, uint64_t slow, uint64_t bytes, uint64_t calls) {
  v1::StatusResponse status;
  status.set_version("9.9");
  status.mutable_node()->set_name("n1");
  status.set_serving_status("SERVING");
  v1::CallLatency* stage = status.add_call_latency();
  stage->set_stage("local.total");
  stage->set_count(fast + slow);
  stage->set_p50_us(10);
  stage->set_p99_us(10);
  AddBucket(stage, 10, fast);
  AddBucket(stage, 1000, slow);
  v1::AgentPeer* peer = status.mutable_agent()->add_peers();
  peer->set_node("n2");
  peer->set_pipe_state("ready");
  peer->set_bytes_sent(bytes);
  peer->set_calls_sent(calls);
  v1::UidUse* use = status.add_uid_use();
  use->set_uid(1000);
  use->set_attached_sessions(2);
  use->set_segment_bytes(uint64_t{256} << 20);
  use->set_calls(calls);
  return status;
}

TEST(TopTest, IntervalPercentilesComeFromTheBucketsThatChanged) {
  // Since start 1000 fast calls; in the interval 100 slow ones only.
  const v1::StatusResponse before = Snapshot(1000, 0, 0, 0);
  const v1::StatusResponse now = Snapshot(1000, 100, 0, 0);
  EXPECT_EQ(IntervalPercentileUs(&before.call_latency(0), now.call_latency(0), 0.5), 1000);
  EXPECT_EQ(IntervalPercentileUs(nullptr, now.call_latency(0), 0.5), 10) << "since start";
  EXPECT_EQ(IntervalPercentileUs(&now.call_latency(0), now.call_latency(0), 0.5), 0)
      << "no call in the interval";
}

TEST(TopTest, RatesAreDifferencesOverTheInterval) {
  const v1::StatusResponse before = Snapshot(1000, 0, 1000000, 100);
  const v1::StatusResponse now = Snapshot(1200, 0, 5000000, 300);
  const std::string frame = RenderTop(&before, now, absl::Seconds(2));
  EXPECT_THAT(frame, HasSubstr("tpd 9.9 on node n1, SERVING"));
  EXPECT_THAT(frame, ::testing::ContainsRegex("local.total +100 +10.0 +10.0"));
  EXPECT_THAT(frame, ::testing::ContainsRegex("n2 +ready +2.0 MB/s"));
  EXPECT_THAT(frame, ::testing::ContainsRegex("1000 +2 +256 MiB +0 +100 /s"));
  const std::string first = RenderTop(nullptr, now, absl::ZeroDuration());
  EXPECT_THAT(first, HasSubstr("(since start)"));
  EXPECT_THAT(first, ::testing::ContainsRegex("n2 +ready +- +- +-"));
  EXPECT_THAT(first, ::testing::Not(::testing::ContainsRegex("[0-9] [kMG]?B?/s")));
}

}  // namespace
}  // namespace tpd
