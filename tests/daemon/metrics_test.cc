// StatusMetrics: an Admin.Status snapshot as Prometheus families. Stage histograms become
// cumulative buckets on fixed bounds with no count placed below its own bucket; per-session
// figures are summed per uid; nothing that names a session (its handle, its pid) becomes a
// label; families keep Prometheus' naming (a counter ends in _total) and the text format
// prometheus-cpp writes carries them.

#include "daemon/metrics.h"

#include <map>
#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace tpd {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using ::testing::HasSubstr;
using ::testing::Not;

const MetricFamily* Find(const std::vector<MetricFamily>& families, const std::string& name) {
  for (const MetricFamily& family : families) {
    if (family.name == name) return &family;
  }
  return nullptr;
}

std::string LabelOf(const ClientMetric& metric, const std::string& name) {
  for (const ClientMetric::Label& label : metric.label) {
    if (label.name == name) return label.value;
  }
  return "";
}

v1::StatusResponse TwoSessionsOfOneUid() {
  v1::StatusResponse status;
  status.set_version("9.9.9");
  status.set_serving_status("SERVING");
  status.set_attached_session_count(2);
  v1::UidUse* use = status.add_uid_use();
  use->set_uid(1000);
  use->set_attached_sessions(2);
  use->set_segment_bytes(300);
  use->set_calls_in_flight(7);
  use->set_calls(40);
  use->set_bytes_sent(4096);
  use->set_call_errors(2);
  for (int i = 0; i < 2; ++i) {
    v1::AttachedSession* session = status.add_attached_sessions();
    session->set_uid(1000);
    session->set_pid(4242 + i);
    session->set_handle(i == 0 ? "s-handle-one" : "s-handle-two");
    session->set_calls_in_flight(3 + i);
    session->set_rx_heap_used(100);
    session->set_rx_heap_bytes(1000);
  }
  return status;
}

TEST(StatusMetricsTest, StageBucketsAreCumulativeAndNoCountLandsBelowItsBucket) {
  v1::StatusResponse status;
  v1::CallLatency* stage = status.add_call_latency();
  stage->set_stage("local.total");
  stage->set_count(7);
  stage->set_mean_us(20);
  // 3 calls in (8, 9.5] µs, 2 in (24, 26] µs, 1 at 1 s + a bit, 1 past a minute.
  for (auto [le_us, count] : std::map<double, uint64_t>{{9.5, 3}, {26, 2}, {1.1e6, 1}, {90e6, 1}}) {
    v1::LatencyBucket* bucket = stage->add_buckets();
    bucket->set_le_us(le_us);
    bucket->set_count(count);
  }
  const std::vector<MetricFamily> families = StatusMetrics(status, ProcessSample{});
  const MetricFamily* histogram = Find(families, "tpd_call_stage_seconds");
  ASSERT_NE(histogram, nullptr);
  EXPECT_EQ(histogram->type, MetricType::Histogram);
  ASSERT_EQ(histogram->metric.size(), 1u);
  const ClientMetric& metric = histogram->metric[0];
  EXPECT_EQ(LabelOf(metric, "stage"), "local.total");
  EXPECT_EQ(metric.histogram.sample_count, 7u);
  EXPECT_DOUBLE_EQ(metric.histogram.sample_sum, 7 * 20e-6);
  const std::vector<double>& bounds = StageBucketBounds();
  ASSERT_EQ(metric.histogram.bucket.size(), bounds.size());
  std::map<double, uint64_t> cumulative;
  for (const ClientMetric::Bucket& bucket : metric.histogram.bucket) {
    cumulative[bucket.upper_bound] = bucket.cumulative_count;
  }
  EXPECT_EQ(cumulative[5e-6], 0u) << "9.5 µs is never counted at or below 5 µs";
  EXPECT_EQ(cumulative[1e-5], 3u);
  EXPECT_EQ(cumulative[2.5e-5], 3u) << "26 µs belongs above 25 µs";
  EXPECT_EQ(cumulative[5e-5], 5u);
  EXPECT_EQ(cumulative[1], 5u);
  EXPECT_EQ(cumulative[2.5], 6u);
  EXPECT_EQ(cumulative[60], 6u) << "past the last bound a call shows only in +Inf (the count)";
  uint64_t previous = 0;
  for (const ClientMetric::Bucket& bucket : metric.histogram.bucket) {
    EXPECT_GE(bucket.cumulative_count, previous);
    previous = bucket.cumulative_count;
  }
}

TEST(StatusMetricsTest, SessionsAreSummedPerUidAndNeverNamed) {
  const std::vector<MetricFamily> families = StatusMetrics(TwoSessionsOfOneUid(), ProcessSample{});
  const MetricFamily* in_flight = Find(families, "tpd_uid_calls_in_flight");
  ASSERT_NE(in_flight, nullptr);
  ASSERT_EQ(in_flight->metric.size(), 1u);
  EXPECT_EQ(LabelOf(in_flight->metric[0], "uid"), "1000");
  EXPECT_EQ(in_flight->metric[0].gauge.value, 7);
  const MetricFamily* shm = Find(families, "tpd_uid_shared_memory_bytes");
  ASSERT_NE(shm, nullptr);
  EXPECT_EQ(shm->metric[0].gauge.value, 300);
  EXPECT_EQ(Find(families, "tpd_uid_rx_heap_used_bytes")->metric[0].gauge.value, 200);
  EXPECT_EQ(Find(families, "tpd_uid_calls_total")->metric[0].counter.value, 40);
  EXPECT_EQ(Find(families, "tpd_uid_sent_bytes_total")->metric[0].counter.value, 4096);
  EXPECT_EQ(Find(families, "tpd_uid_call_errors_total")->metric[0].counter.value, 2);

  const std::string page = prometheus::TextSerializer().Serialize(families);
  EXPECT_THAT(page, Not(HasSubstr("s-handle"))) << "a session's handle is not a label";
  EXPECT_THAT(page, Not(HasSubstr("4242"))) << "nor its pid";
  EXPECT_THAT(page, HasSubstr("tpd_build_info{version=\"9.9.9\"} 1"));
  EXPECT_THAT(page, HasSubstr("tpd_serving 1"));
}

TEST(StatusMetricsTest, CountersEndInTotalAndEveryFamilyHasHelp) {
  v1::StatusResponse status = TwoSessionsOfOneUid();
  (*status.mutable_call_errors())["DEADLINE_EXCEEDED"] = 2;
  (*status.mutable_control_calls())["Join"] = 5;
  (*status.mutable_store()->mutable_calls())["Set"] = 9;
  status.add_groups()->set_phase("FORMED");
  status.add_groups()->set_phase("FORMED");
  status.add_groups()->set_phase("FORMING");
  v1::AgentPeer* peer = status.mutable_agent()->add_peers();
  peer->set_node("node7");
  peer->set_pipe_state("ready");
  peer->set_bytes_sent(4096);
  v1::CudaCopyCount* copies = status.mutable_gpus()->add_copies();
  copies->set_route("cuda:0->cuda:1");
  copies->set_busy_us(2500000);
  status.mutable_limits()->set_open_files(12);
  const std::vector<MetricFamily> families = StatusMetrics(status, ProcessSample());
  for (const MetricFamily& family : families) {
    EXPECT_FALSE(family.help.empty()) << family.name;
    EXPECT_TRUE(absl::StartsWith(family.name, "tpd_") || absl::StartsWith(family.name, "process_"))
        << family.name;
    EXPECT_EQ(family.type == MetricType::Counter, absl::EndsWith(family.name, "_total"))
        << family.name << ": counters, and only counters, end in _total";
  }
  const std::string page = prometheus::TextSerializer().Serialize(families);
  EXPECT_THAT(page, HasSubstr("tpd_call_errors_total{code=\"DEADLINE_EXCEEDED\"} 2"));
  EXPECT_THAT(page, HasSubstr("tpd_control_calls_total{method=\"Join\"} 5"));
  EXPECT_THAT(page, HasSubstr("tpd_store_calls_total{method=\"Set\"} 9"));
  EXPECT_THAT(page, HasSubstr("tpd_groups{phase=\"FORMED\"} 2"));
  EXPECT_THAT(page, HasSubstr("tpd_groups{phase=\"FORMING\"} 1"));
  EXPECT_THAT(page, HasSubstr("tpd_agent_peer_sent_bytes_total{peer=\"node7\"} 4096"));
  EXPECT_THAT(page, HasSubstr("tpd_agent_pipes{state=\"ready\"} 1"));
  EXPECT_THAT(page, HasSubstr("tpd_cuda_copy_busy_seconds_total{route=\"cuda:0->cuda:1\"} 2.5"));
  EXPECT_THAT(page, HasSubstr("process_open_fds 12"));
}

TEST(StatusMetricsTest, ThisProcessIsSampledFromProc) {
  const ProcessSample sample = SampleThisProcess();
  EXPECT_GT(sample.resident_bytes, 0);
  EXPECT_GE(sample.virtual_bytes, sample.resident_bytes);
  EXPECT_GE(CountOpenFiles(), 3) << "stdin, stdout and stderr at least";
  EXPECT_GE(sample.threads, 1);
  const double now = static_cast<double>(time(nullptr));
  EXPECT_GT(sample.start_time_seconds, now - 3600) << "this test started within the hour";
  EXPECT_LE(sample.start_time_seconds, now + 1);
}

}  // namespace
}  // namespace tpd
