#include "store/etcd/etcd_rendezvous.h"

#include <utility>

namespace tpd::store {

absl::StatusOr<std::unique_ptr<Store>> OpenEtcdRendezvousStore(
    const std::vector<InitMethodEndpoint>& endpoints, const std::string& prefix,
    const EtcdRendezvousOptions& options) {
  std::vector<std::string> addresses;
  for (const InitMethodEndpoint& endpoint : endpoints) {
    absl::StatusOr<std::string> address = ResolveDialAddress(
        endpoint.host, endpoint.port, options.dial_networks, options.dial_networks_setting);
    if (!address.ok()) return address.status();
    addresses.push_back(*std::move(address));
  }
  absl::StatusOr<std::unique_ptr<EtcdStore>> store =
      EtcdStore::Create(std::move(addresses), prefix, options.store);
  if (!store.ok()) return store.status();
  return std::unique_ptr<Store>(*std::move(store));
}

}  // namespace tpd::store
