// The etcd backend's part of rendezvous: opening the store an etcd:// URL names. The
// endpoints come from a local client, so each host is resolved once and must lie inside the
// operator's dial networks, as for tcp:// (base/dial_networks.h); the store then dials
// those IP literals.
//
// Thread safety: a pure function of its arguments (plus DNS); call it from any thread.

#ifndef TPD_STORE_ETCD_ETCD_RENDEZVOUS_H_
#define TPD_STORE_ETCD_ETCD_RENDEZVOUS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/dial_networks.h"
#include "store/etcd/etcd_store.h"
#include "store/rendezvous/init_method.h"
#include "store/store.h"

namespace tpd::store {

struct EtcdRendezvousOptions {
  // Timeouts, waiter limit and credentials of every etcd store opened.
  EtcdStoreOptions store;
  // Where etcd members may be, and the setting that holds it (named in PERMISSION_DENIED).
  NetworkList dial_networks;
  std::string dial_networks_setting = "[peer] dial_networks";
};

// An EtcdStore over `endpoints` with keys under `prefix`. PERMISSION_DENIED when an endpoint
// resolves to an address outside options.dial_networks; UNAVAILABLE when one does not
// resolve. Connects lazily: an etcd that is down fails the first call, not this.
absl::StatusOr<std::unique_ptr<Store>> OpenEtcdRendezvousStore(
    const std::vector<InitMethodEndpoint>& endpoints, const std::string& prefix,
    const EtcdRendezvousOptions& options);

}  // namespace tpd::store

#endif  // TPD_STORE_ETCD_ETCD_RENDEZVOUS_H_
