#include "daemon/names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/summarize.h"

namespace tpd {
namespace {

bool IsGroupChar(char c) {
  return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == ':' || c == '@' || c == '-';
}

bool IsWorkerChar(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == ':'; }

// ASCII control characters: C0 and DEL.
bool IsControl(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return u < 0x20 || u == 0x7f;
}

// Position of the first character `allowed` refuses, or npos.
template <typename Allowed>
size_t FirstRefused(absl::string_view text, Allowed allowed) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (!allowed(text[i])) return i;
  }
  return absl::string_view::npos;
}

// "'\n' at byte 3", escaped so the message itself stays one clean line.
std::string Offending(absl::string_view text, size_t at) {
  return absl::StrCat("'", Echo(text.substr(at, 1)), "' at byte ", at);
}

}  // namespace

absl::Status ValidateGroupName(absl::string_view field, absl::string_view name) {
  if (name.empty()) return absl::OkStatus();  // the default group
  const std::string rule = absl::StrCat("group names are 1 to ", kMaxGroupNameBytes,
                                        " bytes of [A-Za-z0-9._:@-] (\"\" means \"default\")");
  if (name.size() > kMaxGroupNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": group name \"", Echo(name, 32),
                                                   "\" is ", name.size(), " bytes; ", rule));
  }
  if (size_t at = FirstRefused(name, IsGroupChar); at != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": group name \"", Echo(name), "\" has ",
                                                   Offending(name, at), "; ", rule));
  }
  return absl::OkStatus();
}

absl::Status ValidateWorkerName(absl::string_view field, absl::string_view name) {
  // PyTorch's WorkerInfo wording, then what exactly is wrong.
  const std::string rule = absl::StrCat(
      field, field.empty() ? "" : ": ",
      "Worker name must match ^[A-Za-z0-9-_:]*$, and must be non-empty and shorter than ",
      kMaxWorkerNameLength, " chars, but got \"");
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(rule, "\" (empty)"));
  if (name.size() >= kMaxWorkerNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(rule, Echo(name, 32), "\" (", name.size(), " chars)"));
  }
  if (size_t at = FirstRefused(name, IsWorkerChar); at != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(rule, Echo(name), "\" (", Offending(name, at), " is not allowed)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateNamespace(absl::string_view field, absl::string_view name_space,
                               int64_t max_bytes) {
  if (static_cast<int64_t>(name_space.size()) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": namespace \"", Echo(name_space, 32), "\" is ", name_space.size(),
                     " bytes; the limit store.max_namespace_bytes is ", max_bytes));
  }
  if (size_t at = FirstRefused(name_space, [](char c) { return !IsControl(c); });
      at != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": namespace \"", Echo(name_space), "\" has ", Offending(name_space, at),
        "; namespaces are printable text without control characters"));
  }
  return absl::OkStatus();
}

}  // namespace tpd
