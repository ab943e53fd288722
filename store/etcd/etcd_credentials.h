// Reading who tpd is to etcd from the files the daemon's [etcd] config table names: the
// password from a file (never from the config itself, never logged), the CA and the client
// certificate and key as PEM. Read once, when the daemon starts, so a missing or unreadable
// file stops the daemon naming the setting instead of failing the first etcd:// group.
//
// Thread safety: a pure function of its arguments (plus reading the files); call it from any
// thread.

#ifndef TPD_STORE_ETCD_ETCD_CREDENTIALS_H_
#define TPD_STORE_ETCD_ETCD_CREDENTIALS_H_

#include <string>

#include "absl/status/statusor.h"
#include "store/etcd/etcd_store.h"

namespace tpd::store {

// The [etcd] settings (daemon/config.h), paths as written. Empty strings are unset.
struct EtcdCredentialFiles {
  std::string user;
  std::string password_file;
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// Reads the files. INVALID_ARGUMENT naming the setting ("etcd.password_file: ...") for a
// file that cannot be read, is empty, holds no PEM block (the TLS files), or, for the
// password file, is not a regular file or can be read or written by every user of the
// machine (chmod 600, or 640 for the daemon's group). The password is the file's text less
// one trailing newline; it appears in no message. A user without a password file (or the
// reverse) and a certificate without its key (or the reverse) are INVALID_ARGUMENT as well.
absl::StatusOr<EtcdCredentials> LoadEtcdCredentials(const EtcdCredentialFiles& files);

}  // namespace tpd::store

#endif  // TPD_STORE_ETCD_ETCD_CREDENTIALS_H_
