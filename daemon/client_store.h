// The daemon's store as local clients see it through the Store service: every key except
// the daemon's own ("tpd/...": group records, heartbeats), which only the daemon and token
// peers may write. A client can neither forge a group record nor count the daemon's keys;
// its own keys keep their names (no prefix shows up in its error messages).
//
// Thread safety: as thread-safe as the store it wraps; it holds no state of its own.

#ifndef TPD_DAEMON_CLIENT_STORE_H_
#define TPD_DAEMON_CLIENT_STORE_H_

#include <string>
#include <vector>

#include "store/store.h"

namespace tpd {

// Keys under this prefix belong to the daemon (see daemon/group/: "tpd/group/<g>/...",
// "tpd/node/<node>").
inline constexpr char kDaemonKeyPrefix[] = "tpd/";

class ClientStore : public store::Store {
 public:
  // `base` must outlive this object.
  explicit ClientStore(store::Store* base) : base_(base) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Append(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  // Counts the client's keys only.
  absl::StatusOr<int64_t> NumKeys(absl::string_view prefix) override;
  absl::StatusOr<store::WaitId> WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                          store::WaitCallback done) override;
  void CancelWait(store::WaitId id) override { base_->CancelWait(id); }

 private:
  store::Store* const base_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_CLIENT_STORE_H_
