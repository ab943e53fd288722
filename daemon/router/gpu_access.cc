#include "daemon/router/gpu_access.h"

#include <dirent.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace tpd {
namespace {

// The NVIDIA device nodes a CUDA process opens: nvidiactl and nvidia<N>.
std::vector<std::string> DeviceNodes(const std::string& device_dir) {
  std::vector<std::string> nodes;
  DIR* dir = opendir(device_dir.c_str());
  if (dir == nullptr) return nodes;
  while (dirent* entry = readdir(dir)) {
    const absl::string_view name = entry->d_name;
    absl::string_view digits = name;
    if (name == "nvidiactl" || (absl::ConsumePrefix(&digits, "nvidia") && !digits.empty() &&
                                std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit))) {
      nodes.push_back(absl::StrCat(device_dir, "/", name));
    }
  }
  closedir(dir);
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

// The user's groups: its primary group and its supplementary ones; none for a uid the user
// database does not know (only the "other" bits then apply).
std::vector<gid_t> GroupsOf(uid_t uid) {
  std::vector<char> buffer(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &pw, buffer.data(), buffer.size(), &found) != 0 || found == nullptr) {
    return {};
  }
  int count = 64;
  std::vector<gid_t> groups(count);
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) {
    groups.resize(count);
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) return {pw.pw_gid};
  }
  groups.resize(count);
  return groups;
}

}  // namespace

absl::Status CheckGpuAccess(uid_t uid, const std::string& device_dir) {
  if (uid == 0) return absl::OkStatus();
  const std::vector<gid_t> groups = GroupsOf(uid);
  for (const std::string& node : DeviceNodes(device_dir)) {
    struct stat st {};
    if (stat(node.c_str(), &st) != 0) continue;  // gone meanwhile: nothing to open
    mode_t bits;
    if (st.st_uid == uid) {
      bits = (st.st_mode >> 6) & 7;
    } else if (std::find(groups.begin(), groups.end(), st.st_gid) != groups.end()) {
      bits = (st.st_mode >> 3) & 7;
    } else {
      bits = st.st_mode & 7;
    }
    if ((bits & 6) != 6) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "uid %d may not open the node's GPUs itself (%s: mode %04o, owner %d, group %d), so "
          "the daemon opens no CUDA memory for it: give the user access to the GPUs (their "
          "group) or send host tensors",
          uid, node, st.st_mode & 07777, st.st_uid, st.st_gid));
    }
  }
  return absl::OkStatus();
}

}  // namespace tpd
