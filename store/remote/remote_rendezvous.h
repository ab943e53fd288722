// The remote backend's part of rendezvous: opening the store a tcp:// or env:// URL names,
// the store of the daemon whose peer port is host:port. The host comes from a local client,
// so it is resolved once and must lie inside the operator's dial networks; the store then
// dials that IP literal (dial_networks.h says why).
//
// Thread safety: a pure function of its arguments (plus DNS); call it from any thread.

#ifndef TPD_STORE_REMOTE_REMOTE_RENDEZVOUS_H_
#define TPD_STORE_REMOTE_REMOTE_RENDEZVOUS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/dial_networks.h"
#include "store/remote/remote_store.h"
#include "store/store.h"

namespace tpd::store {

struct RemoteRendezvousOptions {
  // Token, call timeout and TLS of every store opened (tls_server_name is set per host).
  RemoteStoreOptions store;
  // Where peer daemons may be.
  NetworkList dial_networks;
  // The setting that holds dial_networks, named in PERMISSION_DENIED.
  std::string dial_networks_setting = "[peer] dial_networks";
};

// A RemoteStore for the daemon at host:port. PERMISSION_DENIED when the host resolves to an
// address outside options.dial_networks; UNAVAILABLE when it does not resolve.
absl::StatusOr<std::unique_ptr<Store>> OpenRemoteRendezvousStore(
    const std::string& host, int port, const RemoteRendezvousOptions& options);

}  // namespace tpd::store

#endif  // TPD_STORE_REMOTE_REMOTE_RENDEZVOUS_H_
