#include "daemon/session_limits.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tpd {
namespace {

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (int64_t{1} << 30));
}

}  // namespace

MachineFacts ReadMachineFacts() {
  MachineFacts facts;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_bytes > 0) facts.memory_bytes = int64_t{pages} * page_bytes;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  facts.cores = cores > 0 ? cores : 1;
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    facts.open_files = static_cast<int64_t>(files.rlim_cur);
  }
  return facts;
}

void RaiseOpenFileLimit() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur >= files.rlim_max) return;
  files.rlim_cur = files.rlim_max;
  (void)setrlimit(RLIMIT_NOFILE, &files);
}

DataConfig ResolveSessionLimits(DataConfig data, uint64_t segment_bytes,
                                const MachineFacts& machine, std::string* how) {
  std::string said;
  if (data.max_shared_memory_bytes == 0) {
    data.max_shared_memory_bytes =
        std::max<int64_t>(machine.memory_bytes / 2, static_cast<int64_t>(segment_bytes));
    absl::StrAppend(&said, "data.max_shared_memory_bytes ", Gib(data.max_shared_memory_bytes),
                    " (half of ", Gib(machine.memory_bytes), " of memory)");
  }
  if (data.max_sessions == 0) {
    const int64_t by_memory =
        data.max_shared_memory_bytes / std::max<int64_t>(static_cast<int64_t>(segment_bytes), 1);
    const int64_t by_cores = kSessionsPerCore * std::max<int64_t>(machine.cores, 1);
    int64_t sessions = std::min(by_memory, by_cores);
    std::string bound = by_memory <= by_cores
                            ? absl::StrCat("segments of ", segment_bytes >> 20, " MiB that fit")
                            : absl::StrCat(kSessionsPerCore, " per core of ", machine.cores);
    if (machine.open_files > 0) {
      const int64_t kept = std::min(kFilesKept, machine.open_files / 4);
      const int64_t by_files = (machine.open_files - kept) / kFilesPerSession;
      if (by_files < sessions) {
        sessions = by_files;
        bound = absl::StrCat("the open-file limit ", machine.open_files);
      }
    }
    data.max_sessions = std::clamp<int64_t>(sessions, 1, 65536);
    absl::StrAppend(&said, said.empty() ? "" : "; ", "data.max_sessions ", data.max_sessions, " (",
                    bound, ")");
  }
  if (data.max_sessions_per_uid == 0 || data.max_sessions_per_uid > data.max_sessions) {
    data.max_sessions_per_uid = data.max_sessions;
  }
  data.sessions_kept_free = std::min(data.sessions_kept_free, data.max_sessions / 2);
  if (how != nullptr) *how = std::move(said);
  return data;
}

}  // namespace tpd
