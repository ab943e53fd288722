#include "daemon/journal_sink.h"

#include <sys/stat.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tpd {
namespace {

// syslog(3) priorities, as journald reads PRIORITY.
int Priority(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::critical:
      return 2;
    case spdlog::level::err:
      return 3;
    case spdlog::level::warn:
      return 4;
    case spdlog::level::info:
      return 6;
    default:
      return 7;
  }
}

// "session" → "TPD_SESSION"; empty for what is not a short lowercase word.
std::string FieldName(absl::string_view kind) {
  if (kind.empty() || kind.size() > 32) return "";
  for (char c : kind) {
    if (!absl::ascii_islower(c) && c != '_') return "";
  }
  return absl::StrCat("TPD_", absl::AsciiStrToUpper(kind));
}

}  // namespace

bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(stream, ':');
  uint64_t device = 0;
  uint64_t inode = 0;
  struct stat st {};
  return absl::SimpleAtoi(parts.first, &device) && absl::SimpleAtoi(parts.second, &inode) &&
         fstat(2, &st) == 0 && st.st_dev == device && st.st_ino == inode;
}

std::vector<std::string> JournalFields(absl::string_view component, spdlog::level::level_enum level,
                                       absl::string_view message) {
  std::vector<std::string> fields = {
      absl::StrCat("MESSAGE=", message), absl::StrCat("PRIORITY=", Priority(level)),
      "SYSLOG_IDENTIFIER=tpd", absl::StrCat("TPD_COMPONENT=", component)};
  // Leading tags: "[kind value] [kind value] text".
  absl::string_view rest = message;
  while (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) break;
    absl::string_view tag = rest.substr(1, close - 1);
    const size_t space = tag.find(' ');
    if (space != absl::string_view::npos) {
      if (std::string name = FieldName(tag.substr(0, space)); !name.empty()) {
        fields.push_back(absl::StrCat(name, "=", tag.substr(space + 1)));
      }
    }
    rest = absl::StripLeadingAsciiWhitespace(rest.substr(close + 1));
  }
  // "... uid 1000 ...": the first uid the line names.
  for (size_t at = message.find("uid "); at != absl::string_view::npos;
       at = message.find("uid ", at + 1)) {
    if (at > 0 && absl::ascii_isalnum(message[at - 1])) continue;
    absl::string_view digits = message.substr(at + 4);
    digits = digits.substr(0, digits.find_first_not_of("0123456789"));
    uint32_t uid = 0;
    if (!digits.empty() && absl::SimpleAtoi(digits, &uid)) {
      fields.push_back(absl::StrCat("TPD_UID=", uid));
      break;
    }
  }
  return fields;
}

void JournalSink::sink_it_(const spdlog::details::log_msg& msg) {
  const std::vector<std::string> fields =
      JournalFields(absl::string_view(msg.logger_name.data(), msg.logger_name.size()), msg.level,
                    absl::string_view(msg.payload.data(), msg.payload.size()));
  std::vector<iovec> iov;
  iov.reserve(fields.size());
  for (const std::string& field : fields) {
    iov.push_back({const_cast<char*>(field.data()), field.size()});
  }
  // A journal that does not take the entry loses it: there is nowhere else to say so.
  (void)sd_journal_sendv(iov.data(), static_cast<int>(iov.size()));
}

}  // namespace tpd
