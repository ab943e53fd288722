#include "store/etcd/etcd_rendezvous.h"

#include <utility>

namespace tpd::store {

absl::StatusOr<std::unique_ptr<Store>> OpenEtcdRendezvousStore(
    const std::vector<InitMethodEndpoint>& endpoints, const std::string& prefix,
    const EtcdRendezvousOptions& options) {
  std::vector<std::string> addresses;
  EtcdStoreOptions store_options = options.store;
  // With TLS each member's certificate is checked against the host the URL named.
  store_options.endpoint_hosts.clear();
  for (const InitMethodEndpoint& endpoint : endpoints) {
    store_options.endpoint_hosts.push_back(endpoint.host);
    absl::StatusOr<std::string> address = ResolveDialAddress(
        endpoint.host, endpoint.port, options.dial_networks, options.dial_networks_setting);
    if (!address.ok()) return address.status();
    addresses.push_back(*std::move(address));
  }
  absl::StatusOr<std::unique_ptr<EtcdStore>> store =
      EtcdStore::Create(std::move(addresses), prefix, std::move(store_options));
  if (!store.ok()) return store.status();
  return std::unique_ptr<Store>(*std::move(store));
}

}  // namespace tpd::store
