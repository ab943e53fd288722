#include "daemon/group/group_log.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/group/membership.h"
#include "store/store.h"

namespace tpd::group {
namespace {

std::string VersionKey(int64_t version) { return absl::StrCat("v/", version); }

// How long a version whose write failed is waited for, in case the write lands late.
constexpr absl::Duration kLandingWait = absl::Seconds(2);
// How long a store that does not answer is asked again whether such a write landed.
constexpr absl::Duration kResolveTimeout = absl::Seconds(15);

// Whether a failed write may have been applied: its answer was lost, and the store does not
// know it refused it or never sent it.
bool MaybeApplied(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
      return !store::SurelyNotApplied(status);
    default:
      return false;  // refused: too large, not permitted, invalid, ...
  }
}

}  // namespace

GroupLog::GroupLog(store::Store* store, std::string group)
    : store_(store), group_(std::move(group)) {}

absl::StatusOr<v1::GroupRecord> GroupLog::Parse(const std::string& bytes, int64_t version) const {
  const std::string key = absl::StrCat("tpd/group/", group_, "/", VersionKey(version));
  v1::GroupRecord record;
  if (!record.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("group ", group_, ": record ", key,
                                            " in the rendezvous store is not a tpd group record"));
  }
  if (absl::Status status = ValidateGroupRecord(record, group_, version, key); !status.ok()) {
    return status;
  }
  return record;
}

absl::StatusOr<std::optional<v1::GroupRecord>> GroupLog::Read(int64_t version) {
  // A deadline of now: present or not, never a wait.
  absl::StatusOr<std::vector<std::string>> bytes =
      store_->MultiGet({VersionKey(version)}, absl::Now());
  if (bytes.status().code() == absl::StatusCode::kDeadlineExceeded) return std::nullopt;
  if (!bytes.ok()) return bytes.status();
  return Parse(bytes->front(), version);
}

absl::StatusOr<v1::GroupRecord> GroupLog::Latest() {
  int64_t head = 0;
  absl::StatusOr<bool> has_head = store_->Check({"head"});
  if (!has_head.ok()) return has_head.status();
  if (*has_head) {
    absl::StatusOr<std::vector<std::string>> text = store_->MultiGet({"head"}, absl::Now());
    if (text.ok() && (!absl::SimpleAtoi(text->front(), &head) || head < 0)) head = 0;
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
  absl::StatusOr<std::optional<v1::GroupRecord>> record = Read(head);
  if (!record.ok()) return record.status();
  if (!record->has_value()) {
    // The hint named a version that is not there (and none after it): a hint no writer of
    // this log left. Untrusted like every record; never wait on it.
    return absl::DataLossError(absl::StrCat("group ", group_, ": tpd/group/", group_,
                                            "/head names version ", head,
                                            ", which the rendezvous store does not hold"));
  }
  return **std::move(record);
}

absl::StatusOr<bool> GroupLog::TryAppend(const v1::GroupRecord& next) {
  const int64_t version = next.view().version();
  const std::string bytes = next.SerializeAsString();
  absl::StatusOr<std::string> stored = store_->CompareSet(VersionKey(version), "", bytes);
  if (!stored.ok() && MaybeApplied(stored.status())) {
    // The write may have landed although its answer was lost (a remote store's timeout, an
    // etcd leader that died after replicating it): read the version back, so a won version
    // is never mistaken for a failure. Taken for lost, it would leave a member whose join
    // was answered with an error in the group, or a member whose leave landed missing as if
    // evicted. Absent for kLandingWait, it did not land; while the store does not answer
    // (an etcd election), it is asked again up to kResolveTimeout.
    const absl::Time start = absl::Now();
    for (;;) {
      absl::StatusOr<bool> there = store_->Check({VersionKey(version)});
      if (there.ok() && *there) {
        absl::StatusOr<std::vector<std::string>> back =
            store_->MultiGet({VersionKey(version)}, absl::Now() + kLandingWait);
        if (back.ok()) {
          stored = std::move(back->front());
          break;
        }
      } else if (there.ok() && absl::Now() - start >= kLandingWait) {
        return stored.status();
      }
      if (absl::Now() - start >= kResolveTimeout) return stored.status();
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  if (!stored.ok()) return stored.status();
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
