#include "store/rendezvous/store_factory.h"

#include "absl/strings/str_cat.h"
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
      return absl::StrCat("etcd://", HostPort(method.host, method.port), method.path);
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
    case InitMethodScheme::kEtcd:
      break;
  }
  return absl::UnimplementedError(
      "etcd:// rendezvous is not available in this tpd release; use tcp://, env:// or file://");
}

}  // namespace tpd::store
