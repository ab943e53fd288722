// NodeLiveness over a store with leases and over one without. The leased store is a
// MemoryStore with leases a test expires by hand (etcd's own leases are exercised end to end
// in tests/store/etcd): what is checked here is the order of the key's writes against the
// node's incarnation, which a real cluster cannot make happen on demand.

#include "daemon/group/liveness.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/group/heartbeat.h"
#include "gtest/gtest.h"
#include "store/memory/memory_store.h"

namespace tpd::group {
namespace {

// Leases that live until Expire(): expiry deletes the keys bound to them, as etcd does.
class LeasedMemoryStore : public store::MemoryStore, public store::Leases {
 public:
  store::Leases* leases() override { return this; }

  absl::StatusOr<Grant> GrantLease(absl::Duration ttl) override {
    absl::MutexLock lock(&mu_);
    const int64_t id = next_++;
    live_[id] = {};
    return Grant{id, ttl};
  }
  absl::Status SetLeased(absl::string_view key, absl::string_view value, int64_t id) override {
    {
      absl::MutexLock lock(&mu_);
      auto it = live_.find(id);
      if (it == live_.end()) return absl::NotFoundError("requested lease not found");
      it->second.push_back(std::string(key));
    }
    return Set(key, value);
  }
  absl::Status KeepLeaseAlive(int64_t id) override {
    absl::MutexLock lock(&mu_);
    ++renewals_;
    return live_.count(id) > 0 ? absl::OkStatus() : absl::NotFoundError("the lease has expired");
  }
  absl::Status RevokeLease(int64_t id) override {
    Expire(id);
    return absl::OkStatus();
  }

  void Expire(int64_t id) {
    std::vector<std::string> keys;
    {
      absl::MutexLock lock(&mu_);
      auto it = live_.find(id);
      if (it == live_.end()) return;
      keys = std::move(it->second);
      live_.erase(it);
    }
    for (const std::string& key : keys) (void)DeleteKey(key);
  }
  int64_t renewals() {
    absl::MutexLock lock(&mu_);
    return renewals_;
  }

 private:
  absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::vector<std::string>> live_ ABSL_GUARDED_BY(mu_);
  int64_t renewals_ ABSL_GUARDED_BY(mu_) = 0;
};

constexpr absl::Duration kFresh = absl::Seconds(10);

// The callback of a lost lease: records the incarnation left and takes 9, as
// GroupManager::Reincarnate takes a new one.
std::function<void(uint64_t)> Reincarnate(std::vector<uint64_t>* lost,
                                          std::atomic<uint64_t>* incarnation) {
  return [lost, incarnation](uint64_t left) {
    lost->push_back(left);
    *incarnation = 9;
  };
}

uint64_t KeyIncarnation(store::Store& store) {
  absl::StatusOr<bool> present = store.Check({HeartbeatKey("n")});
  if (!present.ok() || !*present) return 0;
  return IncarnationOf(store.Get(HeartbeatKey("n"), absl::Now()).value_or(""));
}

TEST(NodeLivenessTest, WithoutLeasesEveryBeatWritesANewValue) {
  store::MemoryStore store;
  std::atomic<uint64_t> incarnation{7};
  NodeLiveness liveness(&store, "memory", "n", &incarnation, absl::Seconds(5), kFresh, nullptr);
  EXPECT_FALSE(liveness.leased());
  liveness.Beat();
  const std::string first = *store.Get(HeartbeatKey("n"), absl::Now());
  liveness.Beat();
  const std::string second = *store.Get(HeartbeatKey("n"), absl::Now());
  EXPECT_NE(first, second) << "peers judge a value that stops changing";
  EXPECT_EQ(IncarnationOf(second), 7u);
}

TEST(NodeLivenessTest, ALeasedKeyIsWrittenOnceAndThenOnlyRenewed) {
  LeasedMemoryStore store;
  std::atomic<uint64_t> incarnation{7};
  NodeLiveness liveness(&store, "memory", "n", &incarnation, absl::Seconds(5), kFresh, nullptr);
  ASSERT_TRUE(liveness.leased());
  ASSERT_TRUE(liveness.Announce(7).ok());
  const std::string written = *store.Get(HeartbeatKey("n"), absl::Now());
  for (int i = 0; i < 3; ++i) liveness.Beat();
  EXPECT_EQ(store.renewals(), 3);
  EXPECT_EQ(*store.Get(HeartbeatKey("n"), absl::Now()), written);
  EXPECT_EQ(liveness.Stats().lease, 1);
}

TEST(NodeLivenessTest, AnnouncingAnIncarnationTheNodeLeftIsAbortedAndWritesNothing) {
  LeasedMemoryStore store;
  std::atomic<uint64_t> incarnation{7};
  NodeLiveness liveness(&store, "memory", "n", &incarnation, absl::Seconds(5), kFresh, nullptr);
  ASSERT_TRUE(liveness.Announce(7).ok());
  incarnation = 8;  // another finding took a new incarnation
  liveness.Beat();
  ASSERT_EQ(KeyIncarnation(store), 8u);
  // A batch that loaded 7 before the change must not put 7 back over 8.
  EXPECT_EQ(liveness.Announce(7).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(KeyIncarnation(store), 8u);
}

TEST(NodeLivenessTest, ALostLeaseLeavesTheIncarnationItsKeyNamedAndTakesANewLease) {
  LeasedMemoryStore store;
  std::atomic<uint64_t> incarnation{7};
  std::vector<uint64_t> lost;
  NodeLiveness liveness(&store, "memory", "n", &incarnation, absl::Seconds(5), kFresh,
                        Reincarnate(&lost, &incarnation));
  ASSERT_TRUE(liveness.Announce(7).ok());
  store.Expire(liveness.Stats().lease);
  EXPECT_EQ(KeyIncarnation(store), 0u);
  liveness.Beat();
  EXPECT_EQ(lost, std::vector<uint64_t>({7}));
  EXPECT_EQ(KeyIncarnation(store), 9u) << "the new incarnation, under a new lease";
  EXPECT_EQ(liveness.Stats().lease, 2);
  EXPECT_EQ(liveness.Stats().leases_lost, 1);
}

TEST(NodeLivenessTest, AnAnnouncementAfterAStallFindsTheExpiredLeaseBeforeRecording) {
  LeasedMemoryStore store;
  std::atomic<uint64_t> incarnation{7};
  std::vector<uint64_t> lost;
  // A TTL so short that any announcement comes "long" after the last renewal.
  NodeLiveness liveness(&store, "memory", "n", &incarnation, absl::Nanoseconds(4), kFresh,
                        Reincarnate(&lost, &incarnation));
  ASSERT_TRUE(liveness.Announce(7).ok());
  store.Expire(liveness.Stats().lease);  // stalled past the TTL; no beat has run since
  absl::SleepFor(absl::Microseconds(10));
  // The key already names 7, but its lease is gone: members recorded now would be evicted.
  EXPECT_EQ(liveness.Announce(7).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(lost, std::vector<uint64_t>({7}));
  ASSERT_TRUE(liveness.Announce(9).ok());
  EXPECT_EQ(KeyIncarnation(store), 9u);
}

TEST(NodeLivenessTest, PeersKeysAreReadOncePerFreshnessWindowForEveryGroup) {
  store::MemoryStore store;
  std::atomic<uint64_t> incarnation{7};
  NodeLiveness liveness(&store, "memory", "n", &incarnation, absl::Seconds(5), kFresh, nullptr);
  ASSERT_TRUE(store.Set(HeartbeatKey("other"), "3:1").ok());
  absl::StatusOr<std::optional<std::string>> first = liveness.ReadPeer("other");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->value_or(""), "3:1");
  // A second group asking within the window gets the same read, not a new one.
  ASSERT_TRUE(store.Set(HeartbeatKey("other"), "3:2").ok());
  EXPECT_EQ(liveness.ReadPeer("other")->value_or(""), "3:1");
  // A key never written reads as absent.
  absl::StatusOr<std::optional<std::string>> absent = liveness.ReadPeer("nobody");
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_FALSE(absent->has_value());
  // With no window, every read goes to the store.
  NodeLiveness fresh(&store, "memory", "n", &incarnation, absl::Seconds(5), absl::ZeroDuration(),
                     nullptr);
  EXPECT_EQ(fresh.ReadPeer("other")->value_or(""), "3:2");
}

TEST(NodeLivenessTest, StopRevokesTheLeaseSoPeersSeeTheNodeGoneAtOnce) {
  LeasedMemoryStore store;
  std::atomic<uint64_t> incarnation{7};
  NodeLiveness liveness(&store, "memory", "n", &incarnation, absl::Seconds(5), kFresh, nullptr);
  ASSERT_TRUE(liveness.Announce(7).ok());
  liveness.Stop();
  EXPECT_EQ(KeyIncarnation(store), 0u);
}

}  // namespace
}  // namespace tpd::group
