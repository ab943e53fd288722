#include "tests/store/etcd/shared_cluster.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tpd::store::testing {
namespace {

std::unique_ptr<EtcdCluster>& Slot() {
  static auto* cluster = new std::unique_ptr<EtcdCluster>();
  return *cluster;
}

// Stops the cluster when the tests end, while gtest still runs (a static's destructor would
// run after it, with the members' logs gone).
class StopCluster : public ::testing::Environment {
 public:
  void TearDown() override { Slot().reset(); }
};
::testing::Environment* const kStopCluster = ::testing::AddGlobalTestEnvironment(new StopCluster);

}  // namespace

EtcdCluster* SharedCluster(
    const std::function<absl::StatusOr<std::unique_ptr<EtcdCluster>>()>& start) {
  if (Slot() == nullptr) {
    absl::StatusOr<std::unique_ptr<EtcdCluster>> started = start();
    if (!started.ok()) {
      ADD_FAILURE() << started.status();
      return nullptr;
    }
    Slot() = *std::move(started);
  }
  return Slot().get();
}

std::string FreshPrefix(absl::string_view root) {
  static std::atomic<int> next{0};
  return absl::StrCat(root, getpid(), "-", next.fetch_add(1));
}

std::unique_ptr<EtcdStore> MakeStore(const std::vector<std::string>& endpoints,
                                     const std::string& prefix, EtcdStoreOptions options) {
  absl::StatusOr<std::unique_ptr<EtcdStore>> store =
      EtcdStore::Create(endpoints, prefix, std::move(options));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

}  // namespace tpd::store::testing
