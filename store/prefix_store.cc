#include "store/prefix_store.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tpd::store {

PrefixStore::PrefixStore(std::string prefix, Store* base)
    : prefix_(prefix.empty() ? "" : absl::StrCat(prefix, "/")), base_(base) {}

std::string PrefixStore::Key(absl::string_view key) const { return absl::StrCat(prefix_, key); }

std::vector<std::string> PrefixStore::Keys(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(Key(key));
  return out;
}

absl::Status PrefixStore::Set(absl::string_view key, absl::string_view value) {
  return base_->Set(Key(key), value);
}

absl::Status PrefixStore::MultiSet(const std::vector<std::string>& keys,
                                   const std::vector<std::string>& values) {
  return base_->MultiSet(Keys(keys), values);
}

absl::StatusOr<int64_t> PrefixStore::Add(absl::string_view key, int64_t delta) {
  return base_->Add(Key(key), delta);
}

absl::StatusOr<std::string> PrefixStore::CompareSet(absl::string_view key,
                                                    absl::string_view expected,
                                                    absl::string_view desired) {
  return base_->CompareSet(Key(key), expected, desired);
}

absl::Status PrefixStore::Append(absl::string_view key, absl::string_view value) {
  return base_->Append(Key(key), value);
}

absl::StatusOr<bool> PrefixStore::Check(const std::vector<std::string>& keys) {
  return base_->Check(Keys(keys));
}

absl::StatusOr<bool> PrefixStore::DeleteKey(absl::string_view key) {
  return base_->DeleteKey(Key(key));
}

absl::StatusOr<int64_t> PrefixStore::NumKeys(absl::string_view prefix) {
  return base_->NumKeys(Key(prefix));
}

absl::StatusOr<WaitId> PrefixStore::WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                              WaitCallback done) {
  return base_->WaitAsync(Keys(keys), deadline, std::move(done));
}

void PrefixStore::CancelWait(WaitId id) { base_->CancelWait(id); }

}  // namespace tpd::store
