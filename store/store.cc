#include "store/store.h"

#include <optional>
#include <utility>

#include "absl/synchronization/notification.h"

namespace tpd::store {

absl::StatusOr<std::vector<std::string>> Store::MultiGet(const std::vector<std::string>& keys,
                                                         absl::Time deadline) {
  absl::Notification done;
  std::optional<absl::StatusOr<std::vector<std::string>>> result;
  absl::StatusOr<WaitId> id =
      WaitAsync(keys, deadline, [&](absl::StatusOr<std::vector<std::string>> values) {
        result = std::move(values);
        done.Notify();
      });
  if (!id.ok()) return id.status();
  done.WaitForNotification();
  return *std::move(result);
}

absl::StatusOr<std::string> Store::Get(absl::string_view key, absl::Time deadline) {
  absl::StatusOr<std::vector<std::string>> values = MultiGet({std::string(key)}, deadline);
  if (!values.ok()) return values.status();
  return std::move(values->front());
}

absl::Status Store::Wait(const std::vector<std::string>& keys, absl::Time deadline) {
  return MultiGet(keys, deadline).status();
}

}  // namespace tpd::store
