// A namespace over another store: every key is stored as "<prefix>/<key>", so groups (and
// the Store service's `namespace_`) never see each other's keys. Like c10d's PrefixStore,
// nesting prefixes nests namespaces. The empty prefix is the base store itself.
//
// Thread safety: as thread-safe as the store it wraps; it holds no state of its own.

#ifndef TPD_STORE_PREFIX_STORE_H_
#define TPD_STORE_PREFIX_STORE_H_

#include <string>
#include <vector>

#include "store/store.h"

namespace tpd::store {

class PrefixStore : public Store {
 public:
  // `base` must outlive this object.
  PrefixStore(std::string prefix, Store* base);

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Append(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys(absl::string_view prefix) override;
  absl::StatusOr<WaitId> WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                   WaitCallback done) override;
  void CancelWait(WaitId id) override;

 private:
  std::string Key(absl::string_view key) const;
  std::vector<std::string> Keys(const std::vector<std::string>& keys) const;

  const std::string prefix_;  // with the trailing '/', or empty
  Store* const base_;
};

}  // namespace tpd::store

#endif  // TPD_STORE_PREFIX_STORE_H_
