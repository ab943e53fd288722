#include "base/summarize.h"

#include "absl/strings/escaping.h"

namespace tpd {

std::string Echo(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, max_bytes)), "...");
}

}  // namespace tpd
