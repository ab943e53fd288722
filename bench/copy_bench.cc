// Large copies on more than one core (base/parallel_copy.h) beside one memcpy, in one run.
//
//   bazel run -c opt //bench:copy_bench -- [--sizes_mib=1,4,16,64,256] [--helpers=1,2,3,5,7]
//
// For each size: memcpy on one core (the baseline), then CopyPool with each helper count and
// chunk size (copies from 256 KiB on, a helper per chunk beyond the first), both buffers touched
// first (as an arena and a receive heap are, being reused). With --cold_mib, each copy takes the
// next of as many buffer pairs as fill that many MiB, so its bytes are not in the caches (as a
// call's tensor and heap block mostly are not). Rows: median time per copy, GB/s (1e9 B/s) and the
// speed-up over memcpy of the same size.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/parallel_copy.h"

ABSL_FLAG(std::string, sizes_mib, "1,4,16,64,256", "copy sizes in MiB");
ABSL_FLAG(std::string, helpers, "1,2,3,5,7", "helper counts to measure");
ABSL_FLAG(std::string, chunks_kib, "256,1024", "chunk sizes in KiB to measure");
ABSL_FLAG(int, rounds, 30, "copies measured per row (after 3 warm-up copies)");
ABSL_FLAG(int, cold_mib, 0, "rotate through buffer pairs filling this many MiB (0: one pair)");

namespace {

std::vector<size_t> List(const std::string& text) {
  std::vector<size_t> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    size_t value = 0;
    if (absl::SimpleAtoi(item, &value)) out.push_back(value);
  }
  return out;
}

template <typename Copy>
double MedianSeconds(Copy copy, int rounds) {
  for (int i = 0; i < 3; ++i) copy();
  std::vector<double> times;
  for (int i = 0; i < rounds; ++i) {
    const auto start = std::chrono::steady_clock::now();
    copy();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  std::printf("%-10s %-22s %12s %9s %9s\n", "size", "copier", "median us", "GB/s", "vs memcpy");
  for (size_t mib : List(absl::GetFlag(FLAGS_sizes_mib))) {
    const size_t n = mib << 20;
    const size_t pairs =
        std::max<size_t>(1, (size_t(absl::GetFlag(FLAGS_cold_mib)) << 20) / (2 * n));
    std::vector<std::vector<char>> srcs(pairs, std::vector<char>(n, 1));
    std::vector<std::vector<char>> dsts(pairs, std::vector<char>(n, 2));
    size_t next = 0;
    auto pair = [&] {
      next = (next + 1) % pairs;
      return std::make_pair(dsts[next].data(), srcs[next].data());
    };
    const double base = MedianSeconds(
        [&] {
          auto [dst, src] = pair();
          std::memcpy(dst, src, n);
        },
        rounds);
    std::printf("%-10s %-22s %12.1f %9.2f %9s\n", (std::to_string(mib) + " MiB").c_str(), "memcpy",
                base * 1e6, n / base / 1e9, "1.00x");
    for (size_t kib : List(absl::GetFlag(FLAGS_chunks_kib))) {
      for (size_t helpers : List(absl::GetFlag(FLAGS_helpers))) {
        tpd::CopyPool pool({static_cast<int>(helpers), 1 << 18, kib << 10, kib << 10});
        const double t = MedianSeconds(
            [&] {
              auto [dst, src] = pair();
              pool.Copy(dst, src, n);
            },
            rounds);
        const std::string name =
            "pool " + std::to_string(helpers) + "+1, " + std::to_string(kib) + " KiB";
        std::printf("%-10s %-22s %12.1f %9.2f %8.2fx\n", "", name.c_str(), t * 1e6, n / t / 1e9,
                    base / t);
      }
    }
  }
  return 0;
}
