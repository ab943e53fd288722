#include "store/memory/memory_store.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tpd::store {
namespace {

std::string QuotedKeys(const std::vector<std::string>& keys) {
  return absl::StrCat(
      "[", absl::StrJoin(keys, ", ", [](std::string* out, const std::string& key) {
        absl::StrAppend(out, "\"", absl::CEscape(key), "\"");
      }),
      "]");
}

}  // namespace

MemoryStore::MemoryStore(MemoryStoreOptions options)
    : options_(options), timer_([this] { TimerLoop(); }) {}

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
    while (!waiters_.empty()) {
      completions.push_back(FinishLocked(
          waiters_.begin()->first,
          absl::UnavailableError("store is shutting down: the tpd daemon is stopping")));
    }
  }
  Run(std::move(completions));
}

void MemoryStore::Run(std::vector<Completion> completions) {
  for (auto& [done, result] : completions) done(std::move(result));
}

absl::Status MemoryStore::Set(absl::string_view key, absl::string_view value) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    SetLocked(std::string(key), std::string(value), &completions);
  }
  Run(std::move(completions));
  return absl::OkStatus();
}

absl::Status MemoryStore::MultiSet(const std::vector<std::string>& keys,
                                   const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "multi_set needs one value per key: got %d keys and %d values", keys.size(),
        values.size()));
  }
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); ++i) SetLocked(keys[i], values[i], &completions);
  }
  Run(std::move(completions));
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
      return absl::FailedPreconditionError(
          absl::StrCat("add: key \"", absl::CEscape(key),
                       "\" holds a value that is not an integer: \"",
                       absl::CEscape(it->second.substr(0, 64)), "\""));
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      return absl::InvalidArgumentError(absl::StrCat("add: key \"", absl::CEscape(key),
                                                     "\" would overflow int64 (", current,
                                                     " + ", delta, ")"));
    }
    SetLocked(std::string(key), absl::StrCat(sum), &completions);
  }
  Run(std::move(completions));
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
  Run(std::move(completions));
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
    std::string updated = it == data_.end() ? std::string() : it->second;
    updated.append(value.data(), value.size());
    SetLocked(std::string(key), std::move(updated), &completions);
  }
  Run(std::move(completions));
  return absl::OkStatus();
}

absl::StatusOr<bool> MemoryStore::Check(const std::vector<std::string>& keys) {
  absl::MutexLock lock(&mu_);
  return MissingKeysLocked(keys).empty();
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

absl::StatusOr<WaitId> MemoryStore::WaitAsync(std::vector<std::string> keys,
                                              absl::Time deadline, WaitCallback done) {
  std::vector<Completion> completions;
  WaitId id;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      return absl::UnavailableError("store is shutting down: the tpd daemon is stopping");
    }
    if (static_cast<int64_t>(waiters_.size()) >= options_.max_waiters) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "too many waiting store calls: the limit store.max_waiters = ",
          options_.max_waiters, " is reached; retry later or raise it in the config"));
    }
    id = next_id_++;
    const absl::Time now = absl::Now();
    waiters_.emplace(id, Waiter{std::move(keys), now, deadline, "", std::move(done)});
    deadlines_.emplace(deadline, id);
    if (deadlines_.begin()->second == id) timer_cv_.Signal();
    RecheckLocked(id, &completions);
  }
  Run(std::move(completions));
  return id;
}

void MemoryStore::CancelWait(WaitId id) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    if (!waiters_.contains(id)) return;
    completions.push_back(FinishLocked(id, absl::CancelledError("wait cancelled by the caller")));
  }
  Run(std::move(completions));
}

MemoryStoreStats MemoryStore::Stats() {
  absl::MutexLock lock(&mu_);
  return {static_cast<int64_t>(data_.size()), bytes_, static_cast<int64_t>(waiters_.size())};
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

  auto parked = parked_.find(key);
  if (parked == parked_.end()) return;
  absl::flat_hash_set<WaitId> ids = std::move(parked->second);
  parked_.erase(parked);
  for (WaitId id : ids) {
    waiters_[id].parked_on.clear();
    RecheckLocked(id, out);
  }
}

void MemoryStore::RecheckLocked(WaitId id, std::vector<Completion>* out) {
  Waiter& waiter = waiters_[id];
  std::vector<std::string> values;
  values.reserve(waiter.keys.size());
  for (const std::string& key : waiter.keys) {
    auto it = data_.find(key);
    if (it == data_.end()) {
      waiter.parked_on = key;
      parked_[key].insert(id);
      return;
    }
    values.push_back(it->second);
  }
  out->push_back(FinishLocked(id, std::move(values)));
}

MemoryStore::Completion MemoryStore::FinishLocked(
    WaitId id, absl::StatusOr<std::vector<std::string>> result) {
  auto it = waiters_.find(id);
  Waiter waiter = std::move(it->second);
  waiters_.erase(it);
  deadlines_.erase({waiter.deadline, id});
  auto parked = parked_.find(waiter.parked_on);
  if (parked != parked_.end() && parked->second.erase(id) > 0 && parked->second.empty()) {
    parked_.erase(parked);
  }
  return {std::move(waiter.done), std::move(result)};
}

std::vector<std::string> MemoryStore::MissingKeysLocked(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (data_.find(key) == data_.end()) missing.push_back(key);
  }
  return missing;
}

void MemoryStore::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_timer_) {
    if (deadlines_.empty()) {
      timer_cv_.Wait(&mu_);
      continue;
    }
    const absl::Time next = deadlines_.begin()->first;
    if (absl::Now() < next) {
      timer_cv_.WaitWithDeadline(&mu_, next);
      continue;
    }
    std::vector<Completion> completions;
    const absl::Time now = absl::Now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const WaitId id = deadlines_.begin()->second;
      const Waiter& waiter = waiters_[id];
      completions.push_back(FinishLocked(
          id, absl::DeadlineExceededError(absl::StrCat(
                  "timed out after ", absl::FormatDuration(absl::Ceil(waiter.deadline - waiter.start, absl::Milliseconds(1))),
                  " waiting for keys ", QuotedKeys(MissingKeysLocked(waiter.keys))))));
    }
    mu_.Unlock();
    Run(std::move(completions));
    mu_.Lock();
  }
}

}  // namespace tpd::store
