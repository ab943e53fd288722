#include "store/memory/memory_store.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace tpd::store {

// The view ChargedTo returns: every call as the writer it was made for.
class MemoryStore::Charged final : public Store {
 public:
  Charged(MemoryStore* store, uint32_t account, StoreShare share)
      : store_(store), share_(std::move(share)), writer_{account, &share_} {}

  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return store_->SetAs(writer_, key, value);
  }
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) override {
    return store_->MultiSetAs(writer_, keys, values);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    return store_->AddAs(writer_, key, delta);
  }
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override {
    return store_->CompareSetAs(writer_, key, expected, desired);
  }
  absl::Status Append(absl::string_view key, absl::string_view value) override {
    return store_->AppendAs(writer_, key, value);
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    return store_->Check(keys);
  }
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override { return store_->DeleteKey(key); }
  absl::StatusOr<int64_t> NumKeys(absl::string_view prefix) override {
    return store_->NumKeys(prefix);
  }
  absl::StatusOr<WaitId> WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                   WaitCallback done) override {
    return store_->WaitAsyncAs(writer_, std::move(keys), deadline, std::move(done));
  }
  void CancelWait(WaitId id) override { store_->CancelWait(id); }

 private:
  MemoryStore* const store_;
  const StoreShare share_;
  const Writer writer_;
};

MemoryStore::MemoryStore(MemoryStoreOptions options)
    : options_(options), waiters_(options.max_waiters), timer_([this] { TimerLoop(); }) {
  absl::MutexLock lock(&mu_);
  accounts_.push_back({"the daemon"});
}

MemoryStore::~MemoryStore() {
  Shutdown();
  {
    absl::MutexLock lock(&mu_);
    stop_timer_ = true;
    timer_cv_.Signal();
  }
  timer_.join();
}

void MemoryStore::Shutdown() {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    waiters_.EndAll(absl::UnavailableError("store is shutting down: the tpd daemon is stopping"),
                    &completions);
  }
  WaiterTable::Run(std::move(completions));
}

std::unique_ptr<Store> MemoryStore::ChargedTo(StoreShare share) {
  const uint32_t account = AccountOf(share.writer);
  return std::make_unique<Charged>(this, account, std::move(share));
}

uint32_t MemoryStore::AccountOf(const std::string& writer) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = account_of_.try_emplace(writer, static_cast<uint32_t>(accounts_.size()));
  if (inserted) accounts_.push_back({writer});
  return it->second;
}

absl::Status MemoryStore::RoomLocked(
    Writer writer, const std::vector<std::pair<absl::string_view, size_t>>& writes) const {
  // What the writes add to the store, and to the writer's account: a key charged to another
  // writer moves to this one whole.
  int64_t growth = 0;
  int64_t new_keys = 0;
  int64_t charged = 0;
  int64_t charged_keys = 0;
  for (const auto& [key, size] : writes) {
    const int64_t cost = static_cast<int64_t>(key.size() + size);
    auto it = data_.find(key);
    if (it == data_.end()) {
      growth += cost;
      ++new_keys;
    } else {
      growth += static_cast<int64_t>(size) - static_cast<int64_t>(it->second.value.size());
    }
    if (it != data_.end() && it->second.account == writer.account) {
      charged += static_cast<int64_t>(size) - static_cast<int64_t>(it->second.value.size());
    } else {
      charged += cost;
      ++charged_keys;
    }
  }
  if (growth > 0 && bytes_ + growth > options_.max_total_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store holds ", bytes_, " bytes and this write adds ", growth,
                     "; the limit store.max_total_bytes is ", options_.max_total_bytes,
                     " (delete keys, or raise the setting)"));
  }
  const int64_t keys = static_cast<int64_t>(data_.size());
  if (new_keys > 0 && keys + new_keys > options_.max_keys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store holds ", keys, " keys and this write adds ", new_keys,
                     "; the limit store.max_keys is ", options_.max_keys,
                     " (delete keys, or raise the setting)"));
  }
  const StoreShare* share = writer.share;
  if (share == nullptr) return absl::OkStatus();
  const Account& account = accounts_[writer.account];
  if (share->max_bytes > 0 && charged > 0 && account.bytes + charged > share->max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        share->writer, " holds ", account.bytes, " bytes of the store and this write adds ",
        charged, "; its share, store.max_bytes_", share->setting_suffix, ", is ", share->max_bytes,
        " (delete keys, or raise the setting)"));
  }
  if (share->max_keys > 0 && charged_keys > 0 && account.keys + charged_keys > share->max_keys) {
    return absl::ResourceExhaustedError(absl::StrCat(
        share->writer, " holds ", account.keys, " keys of the store and this write adds ",
        charged_keys, "; its share, store.max_keys_", share->setting_suffix, ", is ",
        share->max_keys, " (delete keys, or raise the setting)"));
  }
  return absl::OkStatus();
}

absl::Status MemoryStore::Set(absl::string_view key, absl::string_view value) {
  return SetAs(kDaemon, key, value);
}

absl::Status MemoryStore::MultiSet(const std::vector<std::string>& keys,
                                   const std::vector<std::string>& values) {
  return MultiSetAs(kDaemon, keys, values);
}

absl::StatusOr<int64_t> MemoryStore::Add(absl::string_view key, int64_t delta) {
  return AddAs(kDaemon, key, delta);
}

absl::StatusOr<std::string> MemoryStore::CompareSet(absl::string_view key,
                                                    absl::string_view expected,
                                                    absl::string_view desired) {
  return CompareSetAs(kDaemon, key, expected, desired);
}

absl::Status MemoryStore::Append(absl::string_view key, absl::string_view value) {
  return AppendAs(kDaemon, key, value);
}

absl::StatusOr<WaitId> MemoryStore::WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                              WaitCallback done) {
  return WaitAsyncAs(kDaemon, std::move(keys), deadline, std::move(done));
}

absl::Status MemoryStore::SetAs(Writer writer, absl::string_view key, absl::string_view value) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status room = RoomLocked(writer, {{key, value.size()}}); !room.ok()) return room;
    SetLocked(writer.account, std::string(key), std::string(value), &completions);
  }
  WaiterTable::Run(std::move(completions));
  return absl::OkStatus();
}

absl::Status MemoryStore::MultiSetAs(Writer writer, const std::vector<std::string>& keys,
                                     const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("multi_set needs one value per key: got %d keys and %d values", keys.size(),
                        values.size()));
  }
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::pair<absl::string_view, size_t>> writes;
    for (size_t i = 0; i < keys.size(); ++i) writes.emplace_back(keys[i], values[i].size());
    if (absl::Status room = RoomLocked(writer, writes); !room.ok()) return room;
    for (size_t i = 0; i < keys.size(); ++i) {
      SetLocked(writer.account, keys[i], values[i], &completions);
    }
  }
  WaiterTable::Run(std::move(completions));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MemoryStore::AddAs(Writer writer, absl::string_view key, int64_t delta) {
  std::vector<Completion> completions;
  int64_t sum = 0;
  {
    absl::MutexLock lock(&mu_);
    int64_t current = 0;
    auto it = data_.find(key);
    if (it != data_.end() && !absl::SimpleAtoi(it->second.value, &current)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "add: key \"", absl::CEscape(key), "\" holds a value that is not an integer: \"",
          absl::CEscape(it->second.value.substr(0, 64)), "\""));
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      return absl::InvalidArgumentError(absl::StrCat("add: key \"", absl::CEscape(key),
                                                     "\" would overflow int64 (", current, " + ",
                                                     delta, ")"));
    }
    std::string value = absl::StrCat(sum);
    if (absl::Status room = RoomLocked(writer, {{key, value.size()}}); !room.ok()) return room;
    SetLocked(writer.account, std::string(key), std::move(value), &completions);
  }
  WaiterTable::Run(std::move(completions));
  return sum;
}

absl::StatusOr<std::string> MemoryStore::CompareSetAs(Writer writer, absl::string_view key,
                                                      absl::string_view expected,
                                                      absl::string_view desired) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = data_.find(key);
    if (it == data_.end() ? !expected.empty() : it->second.value != expected) {
      return it == data_.end() ? std::string(expected) : it->second.value;
    }
    if (absl::Status room = RoomLocked(writer, {{key, desired.size()}}); !room.ok()) return room;
    SetLocked(writer.account, std::string(key), std::string(desired), &completions);
  }
  WaiterTable::Run(std::move(completions));
  return std::string(desired);
}

absl::Status MemoryStore::AppendAs(Writer writer, absl::string_view key, absl::string_view value) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = data_.find(key);
    const size_t current = it == data_.end() ? 0 : it->second.value.size();
    if (static_cast<int64_t>(current + value.size()) > options_.max_value_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "append would grow key \"", absl::CEscape(key), "\" to ", current + value.size(),
          " bytes; the limit store.max_value_bytes is ", options_.max_value_bytes));
    }
    if (absl::Status room = RoomLocked(writer, {{key, current + value.size()}}); !room.ok()) {
      return room;
    }
    std::string updated = it == data_.end() ? std::string() : it->second.value;
    updated.append(value.data(), value.size());
    SetLocked(writer.account, std::string(key), std::move(updated), &completions);
  }
  WaiterTable::Run(std::move(completions));
  return absl::OkStatus();
}

absl::StatusOr<bool> MemoryStore::Check(const std::vector<std::string>& keys) {
  absl::MutexLock lock(&mu_);
  for (const std::string& key : keys) {
    if (FindLocked(key) == nullptr) return false;
  }
  return true;
}

absl::StatusOr<bool> MemoryStore::DeleteKey(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  const int64_t cost = static_cast<int64_t>(it->first.size() + it->second.value.size());
  bytes_ -= cost;
  Account& account = accounts_[it->second.account];
  account.bytes -= cost;
  --account.keys;
  data_.erase(it);
  return true;
}

absl::StatusOr<int64_t> MemoryStore::NumKeys(absl::string_view prefix) {
  absl::MutexLock lock(&mu_);
  if (prefix.empty()) return static_cast<int64_t>(data_.size());
  int64_t count = 0;
  for (auto it = data_.lower_bound(prefix);
       it != data_.end() && absl::StartsWith(it->first, prefix); ++it) {
    ++count;
  }
  return count;
}

absl::StatusOr<WaitId> MemoryStore::WaitAsyncAs(Writer writer, std::vector<std::string> keys,
                                                absl::Time deadline, WaitCallback done) {
  std::vector<Completion> completions;
  WaitId id;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      return absl::UnavailableError("store is shutting down: the tpd daemon is stopping");
    }
    Account& account = accounts_[writer.account];
    const StoreShare* share = writer.share;
    if (share != nullptr && share->max_waiters > 0 && account.waiters >= share->max_waiters) {
      return absl::ResourceExhaustedError(
          absl::StrCat(share->writer, " has ", account.waiters, " store calls waiting; its share, ",
                       "store.max_waiters_", share->setting_suffix, ", is ", share->max_waiters,
                       " (retry later, or raise the setting)"));
    }
    // The wait leaves the writer's account when it ends, whichever way (it runs after mu_ is
    // released, as every completion does).
    WaitCallback counted = [this, account_id = writer.account, done = std::move(done)](
                               absl::StatusOr<std::vector<std::string>> result) mutable {
      {
        absl::MutexLock lock(&mu_);
        --accounts_[account_id].waiters;
      }
      done(std::move(result));
    };
    absl::StatusOr<WaitId> added = waiters_.Add(
        std::move(keys), deadline, std::move(counted),
        [this](const std::string& key) { return LookupHeld(key); }, &completions);
    if (!added.ok()) return added.status();
    ++account.waiters;
    id = *added;
    // The timer sleeps until the earliest deadline; wake it when this wait is now the first.
    if (waiters_.Contains(id) && waiters_.NextDeadline() == deadline) timer_cv_.Signal();
  }
  WaiterTable::Run(std::move(completions));
  return id;
}

void MemoryStore::CancelWait(WaitId id) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    waiters_.Cancel(id, &completions);
  }
  WaiterTable::Run(std::move(completions));
}

MemoryStoreStats MemoryStore::Stats() {
  absl::MutexLock lock(&mu_);
  MemoryStoreStats stats{static_cast<int64_t>(data_.size()), bytes_, waiters_.size(), {}};
  for (const Account& account : accounts_) {
    if (account.keys == 0 && account.waiters == 0) continue;
    stats.writers.push_back({account.writer, account.keys, account.bytes, account.waiters});
  }
  return stats;
}

void MemoryStore::SetLocked(uint32_t account, const std::string& key, std::string value,
                            std::vector<Completion>* out) {
  auto [it, inserted] = data_.try_emplace(key);
  Entry& entry = it->second;
  if (!inserted) {
    const int64_t old_cost = static_cast<int64_t>(key.size() + entry.value.size());
    bytes_ -= old_cost;
    accounts_[entry.account].bytes -= old_cost;
    --accounts_[entry.account].keys;
  }
  const int64_t cost = static_cast<int64_t>(key.size() + value.size());
  bytes_ += cost;
  entry.account = account;
  accounts_[account].bytes += cost;
  ++accounts_[account].keys;
  entry.value = std::move(value);
  waiters_.OnKeySet(
      key, [this](const std::string& k) { return LookupHeld(k); }, out);
}

const std::string* MemoryStore::FindLocked(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second.value;
}

const std::string* MemoryStore::LookupHeld(const std::string& key) {
  mu_.AssertHeld();
  return FindLocked(key);
}

void MemoryStore::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_timer_) {
    // With no wait pending the next deadline is InfiniteFuture: sleep until signalled.
    const absl::Time next = waiters_.NextDeadline();
    if (absl::Now() < next) {
      timer_cv_.WaitWithDeadline(&mu_, next);
      continue;
    }
    std::vector<Completion> completions;
    waiters_.ExpireUntil(
        absl::Now(), [this](const std::string& key) { return LookupHeld(key); }, &completions);
    mu_.Unlock();
    WaiterTable::Run(std::move(completions));
    mu_.Lock();
  }
}

}  // namespace tpd::store
