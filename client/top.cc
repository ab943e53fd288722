#include "client/top.h"

#include <cstdint>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tpd {
namespace {

// "1.2 MB/s"-style rates.
std::string Rate(double per_second, const char* unit) {
  if (per_second >= 1e9) return absl::StrFormat("%.1f G%s/s", per_second / 1e9, unit);
  if (per_second >= 1e6) return absl::StrFormat("%.1f M%s/s", per_second / 1e6, unit);
  if (per_second >= 1e3) return absl::StrFormat("%.1f k%s/s", per_second / 1e3, unit);
  return absl::StrFormat("%.0f %s/s", per_second, unit);
}

template <typename T, typename Key>
std::map<Key, const T*> ByKey(const google::protobuf::RepeatedPtrField<T>& items,
                              Key (*key)(const T&)) {
  std::map<Key, const T*> out;
  for (const T& item : items) out[key(item)] = &item;
  return out;
}

std::string StageKey(const v1::CallLatency& stage) { return stage.stage(); }
std::string PeerKey(const v1::AgentPeer& peer) { return peer.node(); }
int64_t UidKey(const v1::UidUse& use) { return use.uid(); }

template <typename Map>
auto Find(const Map& map, const typename Map::key_type& key) -> typename Map::mapped_type {
  auto it = map.find(key);
  return it == map.end() ? nullptr : it->second;
}

}  // namespace

double IntervalPercentileUs(const v1::CallLatency* before, const v1::CallLatency& now,
                            double quantile) {
  std::map<double, int64_t> counts;
  for (const v1::LatencyBucket& bucket : now.buckets()) counts[bucket.le_us()] += bucket.count();
  if (before != nullptr) {
    for (const v1::LatencyBucket& bucket : before->buckets()) {
      counts[bucket.le_us()] -= bucket.count();
    }
  }
  int64_t total = 0;
  for (const auto& [le, count] : counts) total += count > 0 ? count : 0;
  if (total == 0) return 0;
  const double rank = quantile * static_cast<double>(total);
  int64_t seen = 0;
  for (const auto& [le, count] : counts) {
    if (count <= 0) continue;
    seen += count;
    if (static_cast<double>(seen) >= rank) return le;
  }
  return counts.rbegin()->first;
}

std::string RenderTop(const v1::StatusResponse* before, const v1::StatusResponse& now,
                      absl::Duration elapsed) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  const bool rates = before != nullptr && seconds > 0;
  std::string out =
      absl::StrFormat("tpd %s on node %s, %s, up %ds; %d sessions attached, %d groups%s\n\n",
                      now.version(), now.node().name(), now.serving_status(),
                      static_cast<int64_t>(now.uptime_seconds()), now.attached_session_count(),
                      now.groups_size(), rates ? absl::StrFormat("; every %.1fs", seconds) : "");

  absl::StrAppend(
      &out, absl::StrFormat("%-18s %10s %10s %10s\n", "stage", "calls/s", "p50_us", "p99_us"));
  const auto stages_before = before != nullptr ? ByKey(before->call_latency(), &StageKey)
                                               : std::map<std::string, const v1::CallLatency*>();
  for (const v1::CallLatency& stage : now.call_latency()) {
    const v1::CallLatency* was = Find(stages_before, stage.stage());
    if (!rates) {
      absl::StrAppend(&out, absl::StrFormat("%-18s %10s %10.1f %10.1f  (since start)\n",
                                            stage.stage(), "-", stage.p50_us(), stage.p99_us()));
      continue;
    }
    const double calls =
        static_cast<double>(stage.count() - (was != nullptr ? was->count() : 0)) / seconds;
    absl::StrAppend(&out, absl::StrFormat("%-18s %10.0f %10.1f %10.1f\n", stage.stage(), calls,
                                          IntervalPercentileUs(was, stage, 0.5),
                                          IntervalPercentileUs(was, stage, 0.99)));
  }

  if (now.has_agent() && now.agent().peers_size() > 0) {
    absl::StrAppend(&out, absl::StrFormat("\n%-18s %-10s %12s %12s %8s %8s\n", "peer", "pipe",
                                          "sent", "received", "calls", "pending"));
    const auto peers_before = before != nullptr && before->has_agent()
                                  ? ByKey(before->agent().peers(), &PeerKey)
                                  : std::map<std::string, const v1::AgentPeer*>();
    for (const v1::AgentPeer& peer : now.agent().peers()) {
      const v1::AgentPeer* was = Find(peers_before, peer.node());
      auto per_second = [&](uint64_t value, uint64_t old) {
        return static_cast<double>(value - (was != nullptr ? old : 0)) / seconds;
      };
      absl::StrAppend(
          &out,
          absl::StrFormat(
              "%-18s %-10s %12s %12s %8s %8d\n", peer.node(), peer.pipe_state(),
              rates
                  ? Rate(per_second(peer.bytes_sent(), was != nullptr ? was->bytes_sent() : 0), "B")
                  : "-",
              rates ? Rate(per_second(peer.bytes_received(),
                                      was != nullptr ? was->bytes_received() : 0),
                           "B")
                    : "-",
              rates
                  ? Rate(per_second(peer.calls_sent(), was != nullptr ? was->calls_sent() : 0), "")
                  : "-",
              peer.calls_pending()));
    }
  }

  absl::StrAppend(&out, absl::StrFormat("\n%-10s %9s %14s %10s %12s %12s\n", "uid", "sessions",
                                        "shared mem", "in flight", "calls", "sent"));
  const auto uids_before = before != nullptr ? ByKey(before->uid_use(), &UidKey)
                                             : std::map<int64_t, const v1::UidUse*>();
  for (const v1::UidUse& use : now.uid_use()) {
    const v1::UidUse* was = Find(uids_before, use.uid());
    const double calls =
        rates ? static_cast<double>(use.calls() - (was != nullptr ? was->calls() : 0)) / seconds
              : 0;
    const double sent =
        rates ? static_cast<double>(use.bytes_sent() - (was != nullptr ? was->bytes_sent() : 0)) /
                    seconds
              : 0;
    absl::StrAppend(&out, absl::StrFormat("%-10d %9d %11d MiB %10d %12s %12s\n", use.uid(),
                                          use.attached_sessions(), use.segment_bytes() >> 20,
                                          use.calls_in_flight(), rates ? Rate(calls, "") : "-",
                                          rates ? Rate(sent, "B") : "-"));
  }
  return out;
}

}  // namespace tpd
