#include "daemon/client_store.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tpd {
namespace {

// PERMISSION_DENIED for a key of the daemon's (namespaces arrive here already prefixed, so
// namespace "tpd" is covered too).
absl::Status Allowed(absl::string_view key) {
  if (!absl::StartsWith(key, kDaemonKeyPrefix)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("key \"", absl::CEscape(key.substr(0, 64)),
                   "\" is reserved: keys under \"tpd/\" of the root namespace belong to the tpd "
                   "daemon (group records, heartbeats); use another key or a namespace"));
}

absl::Status AllAllowed(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    if (absl::Status status = Allowed(key); !status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ClientStore::Set(absl::string_view key, absl::string_view value) {
  if (absl::Status status = Allowed(key); !status.ok()) return status;
  return base_->Set(key, value);
}

absl::Status ClientStore::MultiSet(const std::vector<std::string>& keys,
                                   const std::vector<std::string>& values) {
  if (absl::Status status = AllAllowed(keys); !status.ok()) return status;
  return base_->MultiSet(keys, values);
}

absl::StatusOr<int64_t> ClientStore::Add(absl::string_view key, int64_t delta) {
  if (absl::Status status = Allowed(key); !status.ok()) return status;
  return base_->Add(key, delta);
}

absl::StatusOr<std::string> ClientStore::CompareSet(absl::string_view key,
                                                    absl::string_view expected,
                                                    absl::string_view desired) {
  if (absl::Status status = Allowed(key); !status.ok()) return status;
  return base_->CompareSet(key, expected, desired);
}

absl::Status ClientStore::Append(absl::string_view key, absl::string_view value) {
  if (absl::Status status = Allowed(key); !status.ok()) return status;
  return base_->Append(key, value);
}

absl::StatusOr<bool> ClientStore::Check(const std::vector<std::string>& keys) {
  if (absl::Status status = AllAllowed(keys); !status.ok()) return status;
  return base_->Check(keys);
}

absl::StatusOr<bool> ClientStore::DeleteKey(absl::string_view key) {
  if (absl::Status status = Allowed(key); !status.ok()) return status;
  return base_->DeleteKey(key);
}

absl::StatusOr<int64_t> ClientStore::NumKeys(absl::string_view prefix) {
  if (absl::StartsWith(prefix, kDaemonKeyPrefix)) return 0;
  absl::StatusOr<int64_t> all = base_->NumKeys(prefix);
  if (!all.ok() || !absl::StartsWith(kDaemonKeyPrefix, prefix)) return all;
  // `prefix` ("" or "t", "tp", "tpd") also covers the daemon's keys: leave them out.
  absl::StatusOr<int64_t> daemon = base_->NumKeys(kDaemonKeyPrefix);
  if (!daemon.ok()) return daemon.status();
  return std::max<int64_t>(0, *all - *daemon);
}

absl::StatusOr<store::WaitId> ClientStore::WaitAsync(std::vector<std::string> keys,
                                                     absl::Time deadline,
                                                     store::WaitCallback done) {
  if (absl::Status status = AllAllowed(keys); !status.ok()) return status;
  return base_->WaitAsync(std::move(keys), deadline, std::move(done));
}

}  // namespace tpd
