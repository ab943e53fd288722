#include "store/etcd/etcd_credentials.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tpd::store {
namespace {

// The whole of the file at `path`, which the setting `field` names.
absl::StatusOr<std::string> ReadSettingFile(const char* field, const std::string& path) {
  errno = 0;
  std::ifstream file(path);
  std::stringstream text;
  if (file) text << file.rdbuf();
  if (!file || text.str().empty()) {
    const int error = errno;
    return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read \"", path, "\"",
                                                   error != 0 ? ": " : " (empty?)",
                                                   error != 0 ? std::strerror(error) : ""));
  }
  return text.str();
}

absl::StatusOr<std::string> ReadPemSetting(const char* field, const std::string& path) {
  absl::StatusOr<std::string> pem = ReadSettingFile(field, path);
  if (pem.ok() && !absl::StrContains(*pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"", path, "\" holds no PEM block (-----BEGIN ...)"));
  }
  return pem;
}

absl::StatusOr<std::string> ReadPassword(const std::string& path) {
  constexpr char kField[] = "etcd.password_file";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": cannot read \"", path, "\": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": \"", path, "\" is not a regular file"));
  }
  if ((st.st_mode & 0007) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: \"%s\" is open to every user of this machine (mode %04o); the etcd password must "
        "not be: chmod 600 (or 640 for the daemon's group)",
        kField, path, st.st_mode & 07777));
  }
  absl::StatusOr<std::string> text = ReadSettingFile(kField, path);
  if (!text.ok()) return text.status();
  std::string password = *std::move(text);
  if (absl::EndsWith(password, "\n")) password.pop_back();
  if (absl::EndsWith(password, "\r")) password.pop_back();
  if (password.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": \"", path, "\" holds an empty password"));
  }
  return password;
}

}  // namespace

absl::StatusOr<EtcdCredentials> LoadEtcdCredentials(const EtcdCredentialFiles& files) {
  if (files.user.empty() != files.password_file.empty()) {
    return absl::InvalidArgumentError(
        files.user.empty()
            ? "etcd.user must be set with etcd.password_file"
            : "etcd.password_file must be set with etcd.user: a file holding the password");
  }
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError(files.cert_file.empty()
                                          ? "etcd.cert_file must be set with etcd.key_file"
                                          : "etcd.key_file must be set with etcd.cert_file");
  }
  EtcdCredentials credentials;
  credentials.user = files.user;
  if (!files.password_file.empty()) {
    absl::StatusOr<std::string> password = ReadPassword(files.password_file);
    if (!password.ok()) return password.status();
    credentials.password = *std::move(password);
  }
  for (auto [field, path, out] :
       {std::make_tuple("etcd.ca_file", &files.ca_file, &credentials.root_certs),
        std::make_tuple("etcd.cert_file", &files.cert_file, &credentials.cert_chain),
        std::make_tuple("etcd.key_file", &files.key_file, &credentials.private_key)}) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> pem = ReadPemSetting(field, *path);
    if (!pem.ok()) return pem.status();
    *out = *std::move(pem);
  }
  return credentials;
}

}  // namespace tpd::store
