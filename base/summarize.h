// Bounded renderings of untrusted or long lists for error messages and logs.
//
// A message that echoes a client's list (transports, keys) or a computed one (missing ranks,
// removed members) must stay small: gRPC carries a status message in metadata, and one past
// the metadata limit turns into a RESOURCE_EXHAUSTED about metadata that can take down the
// client's other calls on the same channel. Every such list goes through JoinSummarized, and
// every echoed string through Echo.
//
// Thread safety: pure functions of their arguments.

#ifndef TPD_BASE_SUMMARIZE_H_
#define TPD_BASE_SUMMARIZE_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace tpd {

// Items a message lists before it says "... and N more".
inline constexpr size_t kMaxListedItems = 10;
// Bytes of one echoed string before it is cut.
inline constexpr size_t kMaxEchoedBytes = 128;

// `text` C-escaped (so a newline or control character cannot forge a log line or a message
// line) after cutting it to `max_bytes`; "..." marks a cut.
std::string Echo(absl::string_view text, size_t max_bytes = kMaxEchoedBytes);

// Like absl::StrJoin(items, separator, formatter), but with at most `max_items` items, then
// `separator` and "... and N more" when there are more. `items` needs size() and iteration.
template <typename Range, typename Formatter>
std::string JoinSummarized(const Range& items, absl::string_view separator, Formatter&& formatter,
                           size_t max_items = kMaxListedItems) {
  std::string out;
  size_t shown = 0;
  for (const auto& item : items) {
    if (shown == max_items) break;
    if (shown > 0) out.append(separator.data(), separator.size());
    formatter(&out, item);
    ++shown;
  }
  const size_t total = static_cast<size_t>(items.size());
  if (total > shown) {
    if (shown > 0) out.append(separator.data(), separator.size());
    absl::StrAppend(&out, "... and ", total - shown, " more");
  }
  return out;
}

// The same with absl's default formatting (strings as they are, numbers in decimal).
template <typename Range>
std::string JoinSummarized(const Range& items, absl::string_view separator) {
  return JoinSummarized(items, separator, absl::AlphaNumFormatter());
}

// Strings each passed through Echo, e.g. for names a client sent.
template <typename Range>
std::string JoinEchoed(const Range& items, absl::string_view separator,
                       size_t max_items = kMaxListedItems) {
  return JoinSummarized(
      items, separator, [](std::string* out, absl::string_view item) { out->append(Echo(item)); },
      max_items);
}

}  // namespace tpd

#endif  // TPD_BASE_SUMMARIZE_H_
