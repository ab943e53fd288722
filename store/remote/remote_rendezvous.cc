#include "store/remote/remote_rendezvous.h"

#include <utility>

namespace tpd::store {

absl::StatusOr<std::unique_ptr<Store>> OpenRemoteRendezvousStore(
    const std::string& host, int port, const RemoteRendezvousOptions& options) {
  absl::StatusOr<std::string> address =
      ResolveDialAddress(host, port, options.dial_networks, options.dial_networks_setting);
  if (!address.ok()) return address.status();
  RemoteStoreOptions store = options.store;
  // The certificate is checked against the name the URL gave, not the address it resolved to.
  store.tls_server_name = host;
  absl::StatusOr<std::unique_ptr<RemoteStore>> remote =
      RemoteStore::Create(*std::move(address), std::move(store));
  if (!remote.ok()) return remote.status();
  return std::unique_ptr<Store>(*std::move(remote));
}

}  // namespace tpd::store
