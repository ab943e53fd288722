#include "store/memory/memory_store.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace tpd::store {

MemoryStore::MemoryStore(MemoryStoreOptions options)
    : options_(options), waiters_(options.max_waiters), timer_([this] { TimerLoop(); }) {}

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

absl::Status MemoryStore::RoomLocked(
    const std::vector<std::pair<absl::string_view, size_t>>& writes) const {
  int64_t growth = 0;
  for (const auto& [key, size] : writes) {
    auto it = data_.find(key);
    growth += static_cast<int64_t>(size) -
              (it == data_.end() ? -static_cast<int64_t>(key.size())
                                 : static_cast<int64_t>(it->second.size()));
  }
  if (growth <= 0 || bytes_ + growth <= options_.max_total_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the store holds ", bytes_, " bytes and this write adds ", growth,
      "; the limit store.max_total_bytes is ", options_.max_total_bytes,
      " (delete keys, or raise the setting)"));
}

absl::Status MemoryStore::Set(absl::string_view key, absl::string_view value) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status room = RoomLocked({{key, value.size()}}); !room.ok()) return room;
    SetLocked(std::string(key), std::string(value), &completions);
  }
  WaiterTable::Run(std::move(completions));
  return absl::OkStatus();
}

absl::Status MemoryStore::MultiSet(const std::vector<std::string>& keys,
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
    if (absl::Status room = RoomLocked(writes); !room.ok()) return room;
    for (size_t i = 0; i < keys.size(); ++i) SetLocked(keys[i], values[i], &completions);
  }
  WaiterTable::Run(std::move(completions));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MemoryStore::Add(absl::string_view key, int64_t delta) {
  std::vector<Completion> completions;
  int64_t sum = 0;
  {
    absl::MutexLock lock(&mu_);
    int64_t current = 0;
    auto it = data_.find(key);
    if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "add: key \"", absl::CEscape(key), "\" holds a value that is not an integer: \"",
          absl::CEscape(it->second.substr(0, 64)), "\""));
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      return absl::InvalidArgumentError(absl::StrCat("add: key \"", absl::CEscape(key),
                                                     "\" would overflow int64 (", current, " + ",
                                                     delta, ")"));
    }
    std::string value = absl::StrCat(sum);
    if (absl::Status room = RoomLocked({{key, value.size()}}); !room.ok()) return room;
    SetLocked(std::string(key), std::move(value), &completions);
  }
  WaiterTable::Run(std::move(completions));
  return sum;
}

absl::StatusOr<std::string> MemoryStore::CompareSet(absl::string_view key,
                                                    absl::string_view expected,
                                                    absl::string_view desired) {
  std::vector<Completion> completions;
  std::string result;
  {
    absl::MutexLock lock(&mu_);
    auto it = data_.find(key);
    const bool swaps = it == data_.end() ? expected.empty() : it->second == expected;
    if (swaps) {
      if (absl::Status room = RoomLocked({{key, desired.size()}}); !room.ok()) return room;
    }
    if (it == data_.end()) {
      if (!expected.empty()) return std::string(expected);
      SetLocked(std::string(key), std::string(desired), &completions);
      result = std::string(desired);
    } else if (it->second == expected) {
      SetLocked(std::string(key), std::string(desired), &completions);
      result = std::string(desired);
    } else {
      return it->second;
    }
  }
  WaiterTable::Run(std::move(completions));
  return result;
}

absl::Status MemoryStore::Append(absl::string_view key, absl::string_view value) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = data_.find(key);
    const size_t current = it == data_.end() ? 0 : it->second.size();
    if (static_cast<int64_t>(current + value.size()) > options_.max_value_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "append would grow key \"", absl::CEscape(key), "\" to ", current + value.size(),
          " bytes; the limit store.max_value_bytes is ", options_.max_value_bytes));
    }
    if (absl::Status room = RoomLocked({{key, current + value.size()}}); !room.ok()) return room;
    std::string updated = it == data_.end() ? std::string() : it->second;
    updated.append(value.data(), value.size());
    SetLocked(std::string(key), std::move(updated), &completions);
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
  bytes_ -= it->first.size() + it->second.size();
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

absl::StatusOr<WaitId> MemoryStore::WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                              WaitCallback done) {
  std::vector<Completion> completions;
  WaitId id;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      return absl::UnavailableError("store is shutting down: the tpd daemon is stopping");
    }
    absl::StatusOr<WaitId> added = waiters_.Add(
        std::move(keys), deadline, std::move(done),
        [this](const std::string& key) { return LookupHeld(key); }, &completions);
    if (!added.ok()) return added.status();
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
  return {static_cast<int64_t>(data_.size()), bytes_, waiters_.size()};
}

void MemoryStore::SetLocked(const std::string& key, std::string value,
                            std::vector<Completion>* out) {
  auto [it, inserted] = data_.try_emplace(key);
  if (inserted) {
    bytes_ += key.size();
  } else {
    bytes_ -= it->second.size();
  }
  bytes_ += value.size();
  it->second = std::move(value);
  waiters_.OnKeySet(
      key, [this](const std::string& k) { return LookupHeld(k); }, out);
}

const std::string* MemoryStore::FindLocked(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
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
