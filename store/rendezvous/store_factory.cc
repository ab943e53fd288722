#include "store/rendezvous/store_factory.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "store/etcd/etcd_rendezvous.h"
#include "store/file/file_store.h"

namespace tpd::store {
namespace {

std::string HostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

}  // namespace

std::string RendezvousStoreName(const InitMethod& method) {
  switch (method.scheme) {
    case InitMethodScheme::kTcp:
    case InitMethodScheme::kEnv:
      return absl::StrCat("tcp://", HostPort(method.host, method.port));
    case InitMethodScheme::kFile:
      return absl::StrCat("file://", method.path);
    case InitMethodScheme::kEtcd:
      return absl::StrCat("etcd://",
                          absl::StrJoin(method.endpoints, ",",
                                        [](std::string* out, const InitMethodEndpoint& e) {
                                          out->append(HostPort(e.host, e.port));
                                        }),
                          method.path);
  }
  return "";
}

absl::StatusOr<std::unique_ptr<Store>> OpenRendezvousStore(const InitMethod& method,
                                                           const RendezvousOptions& options,
                                                           FileCreation creation) {
  switch (method.scheme) {
    case InitMethodScheme::kTcp:
    case InitMethodScheme::kEnv:
      return OpenRemoteRendezvousStore(method.host, method.port, options.remote);
    case InitMethodScheme::kFile: {
      absl::StatusOr<std::unique_ptr<FileStore>> file =
          FileStore::OpenUnder(options.file_dirs, method.path, creation);
      if (!file.ok()) return file.status();
      return std::unique_ptr<Store>(*std::move(file));
    }
    case InitMethodScheme::kEtcd: {
      EtcdRendezvousOptions etcd;
      etcd.store = options.etcd;
      etcd.dial_networks = options.remote.dial_networks;
      etcd.dial_networks_setting = options.remote.dial_networks_setting;
      return OpenEtcdRendezvousStore(method.endpoints, method.path, etcd);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("init_method scheme ", static_cast<int>(method.scheme), " has no store"));
}

}  // namespace tpd::store
