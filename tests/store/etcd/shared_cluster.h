// One etcd cluster per test binary, shared by its tests; each store gets a prefix of its own,
// so every test starts with an empty store.
//
// Thread safety: call from tests (gtest's main thread or test threads), not concurrently with
// the end of the test program.

#ifndef TPD_TESTS_STORE_ETCD_SHARED_CLUSTER_H_
#define TPD_TESTS_STORE_ETCD_SHARED_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "store/etcd/etcd_store.h"
#include "tests/store/etcd/etcd_cluster.h"

namespace tpd::store::testing {

// The binary's cluster, made by `start` on the first call and stopped when the tests end (a
// gtest Environment); later calls return it whatever `start` they pass. nullptr, with a test
// failure naming why, when it cannot start.
EtcdCluster* SharedCluster(
    const std::function<absl::StatusOr<std::unique_ptr<EtcdCluster>>()>& start);

// A key prefix no other store of this process uses: `root` + "<pid>-<n>".
std::string FreshPrefix(absl::string_view root = "/tpd-test/");

// EtcdStore::Create, failing the test (and returning nullptr) on an error.
std::unique_ptr<EtcdStore> MakeStore(const std::vector<std::string>& endpoints,
                                     const std::string& prefix, EtcdStoreOptions options = {});

}  // namespace tpd::store::testing

#endif  // TPD_TESTS_STORE_ETCD_SHARED_CLUSTER_H_
