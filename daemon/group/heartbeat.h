// The heartbeat a daemon keeps in every rendezvous store it uses: key "tpd/node/<node>",
// value "<incarnation>:<counter>". Written by GroupManager, read by GroupTracker; a changing
// counter means alive, a new incarnation means restarted.

#ifndef TPD_DAEMON_GROUP_HEARTBEAT_H_
#define TPD_DAEMON_GROUP_HEARTBEAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace tpd::group {

inline std::string HeartbeatKey(absl::string_view node) { return absl::StrCat("tpd/node/", node); }

// Longest heartbeat value kept ("<incarnation>:<counter>" is at most 41 bytes): a longer one
// is not a heartbeat, and is never kept.
inline constexpr size_t kMaxHeartbeatBytes = 64;

inline std::string HeartbeatValue(uint64_t incarnation, int64_t counter) {
  return absl::StrCat(incarnation, ":", counter);
}

// The incarnation in a heartbeat value; 0 for a value that is not one.
inline uint64_t IncarnationOf(absl::string_view value) {
  uint64_t incarnation = 0;
  std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(value, ':');
  (void)absl::SimpleAtoi(parts.first, &incarnation);
  return incarnation;
}

}  // namespace tpd::group

#endif  // TPD_DAEMON_GROUP_HEARTBEAT_H_
