#include "base/log_limiter.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace tpd {

bool LogLimiter::Admit(absl::string_view source, int64_t* held_back, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(source);
  if (it != sources_.end() && now - it->second.last_admitted < interval_) {
    ++it->second.held_back;
    return false;
  }
  if (it == sources_.end()) {
    if (sources_.size() >= max_sources_) {
      absl::erase_if(sources_, [&](const auto& entry) {
        return now - entry.second.last_admitted >= interval_;
      });
      if (sources_.size() >= max_sources_) sources_.clear();
    }
    it = sources_.emplace(std::string(source), State{}).first;
  }
  *held_back = it->second.held_back;
  it->second = State{now, 0};
  return true;
}

std::string HeldBack(int64_t held_back, absl::Duration interval) {
  if (held_back <= 0) return "";
  return absl::StrCat(" (", held_back, " more in the last ", absl::FormatDuration(interval), ")");
}

}  // namespace tpd
