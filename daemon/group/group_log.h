// The versions of one group in its rendezvous store, as an append-only log that daemons race
// to extend: version n is the key "v/<n>" holding a serialized GroupRecord, created with
// c10d compare_set(key, "", record), which succeeds for exactly one writer. Whoever loses
// re-reads and retries, so concurrent joins through many daemons serialize without locks,
// and a watcher that waits for "v/<n+1>" sees every version in order, none skipped. "head"
// is a hint of the newest version that writers keep current; readers probe past it.
//
// Thread safety: thread-safe (stateless over a thread-safe Store).

#ifndef TPD_DAEMON_GROUP_GROUP_LOG_H_
#define TPD_DAEMON_GROUP_GROUP_LOG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/group_record.pb.h"
#include "store/store.h"

namespace tpd::group {

class GroupLog {
 public:
  // `store` is the group's namespace of its rendezvous store; it must outlive the log.
  GroupLog(store::Store* store, std::string group);

  // The newest record; version 0 with phase EMPTY when the group was never written. Every
  // record read is validated (ValidateGroupRecord): DATA_LOSS naming the key otherwise.
  absl::StatusOr<v1::GroupRecord> Latest();

  // Version `version` if the store holds it (nullopt if not); never waits. DATA_LOSS for a
  // record that is not a valid one of this group.
  absl::StatusOr<std::optional<v1::GroupRecord>> Read(int64_t version);

  // Stores `next` as version next.view().version(), which must be one past the newest.
  // True when this writer won the version; false when another did first (re-read, retry).
  absl::StatusOr<bool> TryAppend(const v1::GroupRecord& next);

  // Waits for version `version` without holding a thread; `done` runs once with it, or with
  // DEADLINE_EXCEEDED at `deadline`, or CANCELLED after CancelWait.
  absl::StatusOr<store::WaitId> WaitForVersion(
      int64_t version, absl::Time deadline,
      absl::AnyInvocable<void(absl::StatusOr<v1::GroupRecord>)> done);
  void CancelWait(store::WaitId id) { store_->CancelWait(id); }

  // Versions older than the newest by this many are deleted as new ones are written; a
  // watcher that falls further behind resynchronizes from Latest().
  static constexpr int64_t kVersionsKept = 256;

 private:
  absl::StatusOr<v1::GroupRecord> Parse(const std::string& bytes, int64_t version) const;

  store::Store* const store_;
  const std::string group_;
};

}  // namespace tpd::group

#endif  // TPD_DAEMON_GROUP_GROUP_LOG_H_
