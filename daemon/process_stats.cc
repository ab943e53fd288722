#include "daemon/process_stats.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace tpd {

ProcessSample SampleThisProcess() {
  ProcessSample sample;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // /proc/self/stat: the fields after the command name's closing parenthesis, from field 3.
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  if (const size_t paren = stat.rfind(')'); paren != std::string::npos) {
    std::vector<absl::string_view> fields =
        absl::StrSplit(absl::string_view(stat).substr(paren + 2), ' ');
    auto field = [&](size_t number) {  // as proc(5) numbers them
      double value = 0;
      if (number >= 3 && number - 3 < fields.size()) {
        (void)absl::SimpleAtod(fields[number - 3], &value);
      }
      return value;
    };
    sample.cpu_seconds = (field(14) + field(15)) / ticks;
    sample.threads = field(20);
    sample.virtual_bytes = field(23);
    sample.resident_bytes = field(24) * page;
    // Boot time plus the start in ticks since boot.
    std::ifstream uptime_file("/proc/uptime");
    double uptime = 0;
    if (uptime_file >> uptime) {
      sample.start_time_seconds = absl::ToUnixSeconds(absl::Now()) - uptime + field(22) / ticks;
    }
  }
  return sample;
}

int64_t CountOpenFiles() {
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return 0;
  int64_t count = 0;
  while (const dirent* entry = readdir(fds)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(fds);
  return count - 1;  // not the one opendir holds
}

PtraceFacts ReadPtraceFacts() {
  PtraceFacts facts;
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (yama >> scope) facts.yama_scope = scope;
  // CapEff: the effective capabilities as hex; CAP_SYS_PTRACE is bit 19.
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    uint64_t caps = 0;
    if (absl::SimpleHexAtoi(absl::StripAsciiWhitespace(absl::string_view(line).substr(7)), &caps)) {
      facts.cap_sys_ptrace = (caps >> 19) & 1;
    }
  }
  return facts;
}

int64_t MemlockLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1;
  return static_cast<int64_t>(limit.rlim_cur);
}

}  // namespace tpd
