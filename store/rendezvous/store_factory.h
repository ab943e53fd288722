// Backends construct themselves: the init_method scheme -> store backend switch, so the
// daemon never names a backend. Each backend's own part lives in its folder (remote:
// store/remote/remote_rendezvous.h; file: store/file/; etcd: store/etcd/etcd_rendezvous.h).
//
// Thread safety: pure functions of their arguments (plus the I/O of opening a store); call
// them from any thread.

#ifndef TPD_STORE_RENDEZVOUS_STORE_FACTORY_H_
#define TPD_STORE_RENDEZVOUS_STORE_FACTORY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "store/etcd/etcd_credentials.h"
#include "store/etcd/etcd_store.h"
#include "store/file/path_policy.h"
#include "store/remote/remote_rendezvous.h"
#include "store/rendezvous/init_method.h"
#include "store/store.h"

namespace tpd::store {

struct RendezvousOptions {
  // tcp:// and env://.
  RemoteRendezvousOptions remote;
  // file://: the directories a client's path must lie under (group.file_rendezvous_dirs;
  // store/file/path_policy.h). Empty: no file:// rendezvous.
  std::vector<std::string> file_dirs;
  // etcd://: timeouts, waiter limit and credentials of every etcd store (the daemon's
  // [etcd] table, its files read by LoadEtcdCredentials). Its endpoints are dialed under
  // remote.dial_networks, like every address the daemon dials.
  EtcdStoreOptions etcd;
};

// The name of the store `method` names: one store per name is enough for every group in it
// ("tcp://host:port", "file:///path", "etcd://host:port,host:port/prefix"). No I/O.
std::string RendezvousStoreName(const InitMethod& method);

// Opens the store `method` names; the backend's error otherwise (PERMISSION_DENIED for a
// tcp:// host or an etcd:// endpoint outside the dial networks, a file store's open error).
// `creation` says whether a file:// store's file may be created (Join) or must already exist
// (GetGroup, WatchGroup: NOT_FOUND, nothing created).
absl::StatusOr<std::unique_ptr<Store>> OpenRendezvousStore(
    const InitMethod& method, const RendezvousOptions& options,
    FileCreation creation = FileCreation::kMustExist);

}  // namespace tpd::store

#endif  // TPD_STORE_RENDEZVOUS_STORE_FACTORY_H_
