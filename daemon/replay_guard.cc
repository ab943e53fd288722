#include "daemon/replay_guard.h"

#include "absl/strings/str_cat.h"

namespace tpd {
namespace {

bool TestBit(const std::array<uint64_t, ReplayGuard::kWindow / 64>& bits, uint64_t i) {
  return (bits[i / 64] >> (i % 64)) & 1;
}

void SetBit(std::array<uint64_t, ReplayGuard::kWindow / 64>* bits, uint64_t i) {
  (*bits)[i / 64] |= uint64_t{1} << (i % 64);
}

// Moves every bit `by` places up (toward older numbers); bits past the window fall off.
void Shift(std::array<uint64_t, ReplayGuard::kWindow / 64>* bits, uint64_t by) {
  if (by >= ReplayGuard::kWindow) {
    bits->fill(0);
    return;
  }
  constexpr int kWords = ReplayGuard::kWindow / 64;
  const int words = static_cast<int>(by / 64);
  const int shift = static_cast<int>(by % 64);
  for (int i = kWords - 1; i >= 0; --i) {
    const int from = i - words;
    uint64_t value = 0;
    if (from >= 0) value = (*bits)[from] << shift;
    if (from >= 1 && shift != 0) value |= (*bits)[from - 1] >> (64 - shift);
    (*bits)[i] = value;
  }
}

}  // namespace

ReplayGuard::ReplayGuard(size_t max_senders, absl::Time start)
    : max_senders_(std::max<size_t>(1, max_senders)), floor_ms_(absl::ToUnixMillis(start)) {}

absl::Status ReplayGuard::Accept(uint64_t sender, uint64_t sequence, int64_t timestamp_ms) {
  if (sequence == 0) return absl::UnauthenticatedError("replay: sequence number 0 is never sent");
  absl::MutexLock lock(&mu_);
  auto it = senders_.find(sender);
  if (it == senders_.end()) {
    if (timestamp_ms <= floor_ms_) {
      return absl::UnauthenticatedError(absl::StrCat(
          "replay: a call from unknown sender ", absl::Hex(sender, absl::kZeroPad16), " stamped ",
          timestamp_ms, " ms, not after ", floor_ms_,
          " ms (this daemon's start, or a sender it no longer tracks); the sender's next "
          "calls pass"));
    }
    if (senders_.size() >= max_senders_) {
      // Forget the least recently seen sender; its calls are now below the floor.
      const uint64_t oldest = lru_.back();
      lru_.pop_back();
      auto evicted = senders_.find(oldest);
      floor_ms_ = std::max(floor_ms_, evicted->second.newest_timestamp_ms);
      senders_.erase(evicted);
    }
    lru_.push_front(sender);
    Sender& fresh = senders_[sender];
    fresh.highest = sequence;
    SetBit(&fresh.seen, 0);
    fresh.newest_timestamp_ms = timestamp_ms;
    fresh.lru = lru_.begin();
    return absl::OkStatus();
  }
  Sender& known = it->second;
  if (sequence > known.highest) {
    Shift(&known.seen, sequence - known.highest);
    known.highest = sequence;
    SetBit(&known.seen, 0);
  } else {
    const uint64_t age = known.highest - sequence;
    if (age >= kWindow) {
      return absl::UnauthenticatedError(absl::StrCat(
          "replay: sequence number ", sequence, " of sender ", absl::Hex(sender, absl::kZeroPad16),
          " is older than the last ", kWindow, " (highest seen ", known.highest, ")"));
    }
    if (TestBit(known.seen, age)) {
      return absl::UnauthenticatedError(
          absl::StrCat("replay: sequence number ", sequence, " of sender ",
                       absl::Hex(sender, absl::kZeroPad16), " was already accepted"));
    }
    SetBit(&known.seen, age);
  }
  known.newest_timestamp_ms = std::max(known.newest_timestamp_ms, timestamp_ms);
  lru_.splice(lru_.begin(), lru_, known.lru);
  return absl::OkStatus();
}

size_t ReplayGuard::senders() const {
  absl::MutexLock lock(&mu_);
  return senders_.size();
}

}  // namespace tpd
