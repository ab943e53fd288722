#include "store/waiter_table.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/check.h"
#include "base/summarize.h"

namespace tpd::store {
namespace {

// At most kMaxListedItems keys, each cut to kMaxEchoedBytes: a wait may name a thousand long keys.
std::string QuotedKeys(const std::vector<std::string>& keys) {
  return absl::StrCat("[",
                      JoinSummarized(keys, ", ",
                                     [](std::string* out, const std::string& key) {
                                       absl::StrAppend(out, "\"", Echo(key), "\"");
                                     }),
                      "]");
}

}  // namespace

WaiterTable::WaiterTable(int64_t max_waiters) : max_waiters_(max_waiters) {}

absl::StatusOr<WaitId> WaiterTable::Add(std::vector<std::string> keys, absl::Time deadline,
                                        WaitCallback done, Lookup lookup,
                                        std::vector<Completion>* out) {
  if (size() >= max_waiters_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many waiting store calls: the limit store.max_waiters = ", max_waiters_,
                     " is reached; retry later or raise it in the config"));
  }
  const WaitId id = next_id_++;
  waiters_.emplace(id, Waiter{std::move(keys), absl::Now(), deadline, "", std::move(done)});
  deadlines_.emplace(deadline, id);
  Recheck(id, lookup, out);
  return id;
}

void WaiterTable::OnKeySet(const std::string& key, Lookup lookup, std::vector<Completion>* out) {
  auto parked = parked_.find(key);
  if (parked == parked_.end()) return;
  absl::flat_hash_set<WaitId> ids = std::move(parked->second);
  parked_.erase(parked);
  for (WaitId id : ids) {
    TPD_DCHECK(waiters_.contains(id));  // a finished wait leaves its key's parked set
    waiters_[id].parked_on.clear();
    Recheck(id, lookup, out);
  }
}

void WaiterTable::Cancel(WaitId id, std::vector<Completion>* out) {
  if (!waiters_.contains(id)) return;
  Finish(id, absl::CancelledError("wait cancelled by the caller"), out);
}

void WaiterTable::ExpireUntil(absl::Time now, Lookup lookup, std::vector<Completion>* out) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const WaitId id = deadlines_.begin()->second;
    TPD_DCHECK(waiters_.contains(id));  // deadlines_ holds exactly the pending waits
    const Waiter& waiter = waiters_[id];
    std::vector<std::string> missing;
    for (const std::string& key : waiter.keys) {
      if (lookup(key) == nullptr) missing.push_back(key);
    }
    Finish(
        id,
        absl::DeadlineExceededError(absl::StrCat(
            "timed out after ",
            absl::FormatDuration(absl::Ceil(waiter.deadline - waiter.start, absl::Milliseconds(1))),
            " waiting for keys ", QuotedKeys(missing))),
        out);
  }
}

void WaiterTable::EndAll(const absl::Status& status, std::vector<Completion>* out) {
  while (!waiters_.empty()) Finish(waiters_.begin()->first, status, out);
}

absl::Time WaiterTable::NextDeadline() const {
  return deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.begin()->first;
}

void WaiterTable::Run(std::vector<Completion> completions) {
  for (Completion& completion : completions) completion.done(std::move(completion.result));
}

void WaiterTable::Recheck(WaitId id, Lookup lookup, std::vector<Completion>* out) {
  TPD_DCHECK(waiters_.contains(id));
  Waiter& waiter = waiters_[id];
  std::vector<std::string> values;
  values.reserve(waiter.keys.size());
  for (const std::string& key : waiter.keys) {
    const std::string* value = lookup(key);
    if (value == nullptr) {
      waiter.parked_on = key;
      parked_[key].insert(id);
      return;
    }
    values.push_back(*value);
  }
  Finish(id, std::move(values), out);
}

void WaiterTable::Finish(WaitId id, absl::StatusOr<std::vector<std::string>> result,
                         std::vector<Completion>* out) {
  auto it = waiters_.find(id);
  TPD_DCHECK(it != waiters_.end());  // callers finish only pending waits, each once
  Waiter waiter = std::move(it->second);
  waiters_.erase(it);
  deadlines_.erase({waiter.deadline, id});
  auto parked = parked_.find(waiter.parked_on);
  if (parked != parked_.end() && parked->second.erase(id) > 0 && parked->second.empty()) {
    parked_.erase(parked);
  }
  out->push_back({std::move(waiter.done), std::move(result)});
}

}  // namespace tpd::store
