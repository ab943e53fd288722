#include "agent/types.h"

#include "absl/strings/str_cat.h"

namespace tpd::agent {

const char* PipeStateName(PipeState state) {
  switch (state) {
    case PipeState::kNone:
      return "none";
    case PipeState::kConnecting:
      return "connecting";
    case PipeState::kReady:
      return "ready";
    case PipeState::kFailed:
      return "failed";
  }
  return "?";
}

std::string PeerId::ToString() const {
  if (node.empty()) return absl::StrCat("peer (", address, ")");
  return absl::StrCat(node, " (", address, ")");
}

}  // namespace tpd::agent
