#include "daemon/group/group_log.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/group/membership.h"

namespace tpd::group {
namespace {

std::string VersionKey(int64_t version) { return absl::StrCat("v/", version); }

}  // namespace

GroupLog::GroupLog(store::Store* store, std::string group)
    : store_(store), group_(std::move(group)) {}

absl::StatusOr<v1::GroupRecord> GroupLog::Parse(const std::string& bytes, int64_t version) const {
  v1::GroupRecord record;
  if (!record.ParseFromString(bytes) || record.view().version() != version) {
    return absl::DataLossError(absl::StrCat("group ", group_, ": version ", version,
                                            " in the rendezvous store is not a tpd group record"));
  }
  return record;
}

absl::StatusOr<v1::GroupRecord> GroupLog::Latest() {
  int64_t head = 0;
  absl::StatusOr<bool> has_head = store_->Check({"head"});
  if (!has_head.ok()) return has_head.status();
  if (*has_head) {
    absl::StatusOr<std::string> text = store_->Get("head", absl::Now() + absl::Seconds(10));
    if (!text.ok()) return text.status();
    if (!absl::SimpleAtoi(*text, &head)) head = 0;
  }
  // The hint may lag (its writer died between the version and the hint) or point past a
  // version deleted long ago; walk forward from it to the last version present.
  while (true) {
    absl::StatusOr<bool> next = store_->Check({VersionKey(head + 1)});
    if (!next.ok()) return next.status();
    if (!*next) break;
    ++head;
  }
  if (head == 0) {
    v1::GroupRecord empty;
    empty.mutable_view()->set_group(group_);
    empty.mutable_view()->set_phase(kEmpty);
    return empty;
  }
  absl::StatusOr<std::string> bytes =
      store_->Get(VersionKey(head), absl::Now() + absl::Seconds(10));
  if (!bytes.ok()) return bytes.status();
  return Parse(*bytes, head);
}

absl::StatusOr<bool> GroupLog::TryAppend(const v1::GroupRecord& next) {
  const int64_t version = next.view().version();
  const std::string bytes = next.SerializeAsString();
  absl::StatusOr<std::string> stored = store_->CompareSet(VersionKey(version), "", bytes);
  if (!stored.ok()) {
    // The write may have landed although its answer was lost (a remote store's timeout):
    // read the version back, so a won version is never mistaken for a failure.
    absl::StatusOr<std::vector<std::string>> back =
        store_->MultiGet({VersionKey(version)}, absl::Now() + absl::Seconds(2));
    if (!back.ok()) return stored.status();
    stored = std::move(back->front());
  }
  if (*stored != bytes) return false;
  // Best effort: a lost hint or an undeleted old version only costs readers a few probes.
  (void)store_->Set("head", absl::StrCat(version));
  if (version > kVersionsKept) (void)store_->DeleteKey(VersionKey(version - kVersionsKept));
  return true;
}

absl::StatusOr<store::WaitId> GroupLog::WaitForVersion(
    int64_t version, absl::Time deadline,
    absl::AnyInvocable<void(absl::StatusOr<v1::GroupRecord>)> done) {
  return store_->WaitAsync({VersionKey(version)}, deadline,
                           [this, version, done = std::move(done)](
                               absl::StatusOr<std::vector<std::string>> values) mutable {
                             if (!values.ok()) {
                               done(values.status());
                               return;
                             }
                             done(Parse(values->front(), version));
                           });
}

}  // namespace tpd::group
