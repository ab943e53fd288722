#include "tests/testing/proc_counts.h"

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "tests/testing/wait_until.h"

namespace tpd::testing {
namespace {

// Calls `each(name)` for every entry of `path` but . and ..; -1 if it cannot be opened.
template <typename F>
int ForEachEntry(const std::string& path, F each) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    if (each(entry->d_name)) ++count;
  }
  closedir(dir);
  return count;
}

}  // namespace

int CountFds(pid_t pid) {
  return ForEachEntry(absl::StrCat("/proc/", pid, "/fd"), [](const char*) { return true; });
}

int CountThreads(pid_t pid) {
  return ForEachEntry(absl::StrCat("/proc/", pid, "/task"), [](const char*) { return true; });
}

int CountThreadsOutsideGrpcPools(pid_t pid) {
  const std::string tasks = absl::StrCat("/proc/", pid, "/task/");
  return ForEachEntry(tasks, [&](const char* tid) {
    std::ifstream comm(tasks + tid + "/comm");
    std::string name;
    std::getline(comm, name);
    for (const char* pool : kGrpcPoolThreads) {
      if (absl::StartsWith(name, pool)) return false;
    }
    return true;
  });
}

int CountMemfdFds(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/fd/");
  return ForEachEntry(dir, [&](const char* name) {
    char target[256];
    const ssize_t n = readlink((dir + name).c_str(), target, sizeof(target) - 1);
    return n > 0 && absl::StartsWith(absl::string_view(target, n), "/memfd:");
  });
}

int CountMemfdMaps(pid_t pid, const std::string& name) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  if (!maps) return -1;
  std::string line;
  int count = 0;
  while (std::getline(maps, line)) {
    if (absl::StrContains(line, "/memfd:") && absl::StrContains(line, name)) ++count;
  }
  return count;
}

std::string DescribeThreadsAndMemfds(pid_t pid) {
  std::map<std::string, int> names;
  const std::string tasks = absl::StrCat("/proc/", pid, "/task/");
  ForEachEntry(tasks, [&](const char* tid) {
    std::ifstream comm(tasks + tid + "/comm");
    std::string name;
    std::getline(comm, name);
    ++names[name];
    return true;
  });
  std::vector<std::string> parts;
  for (const auto& [name, count] : names) {
    parts.push_back(count > 1 ? absl::StrCat(name, " x", count) : name);
  }
  std::vector<std::string> memfds;
  const std::string fds = absl::StrCat("/proc/", pid, "/fd/");
  ForEachEntry(fds, [&](const char* name) {
    char target[256];
    const ssize_t n = readlink((fds + name).c_str(), target, sizeof(target) - 1);
    if (n > 0 && absl::StartsWith(absl::string_view(target, n), "/memfd:")) {
      memfds.push_back(absl::StrCat(name, " -> ", absl::string_view(target, n)));
    }
    return true;
  });
  std::map<std::string, int> kinds;  // fd targets by kind: "socket", "pipe", a path...
  ForEachEntry(fds, [&](const char* name) {
    char target[256];
    const ssize_t n = readlink((fds + name).c_str(), target, sizeof(target) - 1);
    if (n <= 0) return false;
    std::string kind(target, n);
    if (const size_t colon = kind.find(":["); colon != std::string::npos) kind.resize(colon);
    ++kinds[kind];
    return true;
  });
  std::vector<std::string> fd_parts;
  for (const auto& [kind, count] : kinds) fd_parts.push_back(absl::StrCat(kind, " x", count));
  return absl::StrCat("threads: ", absl::StrJoin(parts, ", "),
                      "; memfd fds: ", memfds.empty() ? "none" : absl::StrJoin(memfds, ", "),
                      "; fds: ", absl::StrJoin(fd_parts, ", "));
}

bool ProcCounts::AtMost(const ProcCounts& baseline) const {
  return fds >= 0 && threads >= 0 && memfd_fds >= 0 && segment_maps >= 0 && fds <= baseline.fds &&
         threads <= baseline.threads && memfd_fds <= baseline.memfd_fds &&
         segment_maps <= baseline.segment_maps;
}

std::string ProcCounts::ToString() const {
  return absl::StrCat(fds, " fds, ", threads, " threads (outside gRPC's pools), ", memfd_fds,
                      " memfd fds, ", segment_maps, " segment mappings");
}

ProcCounts CountAll(pid_t pid) {
  ProcCounts counts;
  counts.fds = CountFds(pid);
  counts.threads = CountThreadsOutsideGrpcPools(pid);
  counts.memfd_fds = CountMemfdFds(pid);
  counts.segment_maps = CountMemfdMaps(pid, "tpd-session");
  return counts;
}

std::optional<ProcCounts> SettledCounts(pid_t pid) {
  ProcCounts last = CountAll(pid);
  const bool settled = WaitUntil(
      [&] {
        absl::SleepFor(absl::Milliseconds(200));
        const ProcCounts now = CountAll(pid);
        const bool still = now.AtMost(last) && last.AtMost(now);
        last = now;
        return still;
      },
      absl::Seconds(10), absl::ZeroDuration());
  if (!settled) return std::nullopt;
  return last;
}

::testing::AssertionResult BackToBaseline(pid_t pid, const ProcCounts& baseline,
                                          const std::string& at_baseline, absl::Duration timeout) {
  if (WaitUntil([&] { return CountAll(pid).AtMost(baseline); }, timeout)) {
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  failure << "daemon: " << CountAll(pid).ToString() << "; baseline " << baseline.ToString()
          << "\nnow " << DescribeThreadsAndMemfds(pid);
  if (!at_baseline.empty()) failure << "\nat baseline " << at_baseline;
  return failure;
}

}  // namespace tpd::testing
