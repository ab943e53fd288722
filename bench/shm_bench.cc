// The shared-memory path between a client and its daemon, below any daemon logic: an empty
// descriptor's round trip between two processes through a session segment's rings, next to
// the baselines of the same run (one-core memcpy, a unix socketpair round trip).
//
//   bazel run -c opt //bench:shm_bench -- [--round_trips=20000] [--pin=true]
//
// Rows:
//   memcpy 1 MiB / 256 MiB   one core, buffers touched first; time per copy as GB/s (1e9 B/s)
//   uds                      a 1-byte write/read round trip over a socketpair (B0)
//   ring spin                both sides poll their ring, never sleep (the floor)
//   ring adaptive            the shipped policy: spin up to SpinOptions' window, then futex
//   ring futex               no spin: every wait sleeps on the futex (the wake-up cost)
//   idle consumer            CPU time a waiting consumer burns over 1 s with no traffic
//   heap alloc+free          HeapAllocator pairs of mixed sizes, beside malloc+free
// Each ring row: the client (this process) submits a `call` on the submission ring, the
// daemon (a forked child, holding the daemon's mapping) pops it, validates it as the daemon
// must, and pushes a `reply` on the completion ring; the client pops the reply. p50/p90/p99
// per round trip; ratios against ring spin and uds, and the round trip as an equivalent of
// one-core memcpy bytes (p50 × memcpy 1 MiB GB/s).

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "shm/descriptor.h"
#include "shm/doorbell.h"
#include "shm/heap.h"
#include "shm/ring.h"
#include "shm/segment.h"

ABSL_FLAG(int, round_trips, 20000, "measured round trips per ping-pong row (after 10% warm-up)");
ABSL_FLAG(int, memcpy_rounds, 20, "measured copies of 256 MiB (1 MiB: 100x as many)");
ABSL_FLAG(bool, pin, true,
          "pin the client to CPU 0 and the daemon child to CPU 1 (false: the scheduler may put "
          "both on one core)");
ABSL_FLAG(double, pause_spin_us, -1, "SpinOptions::pause_spin for the adaptive row (-1: default)");
ABSL_FLAG(double, max_spin_us, -1, "SpinOptions::max_spin for the adaptive row (-1: default)");

namespace {

using tpd::shm::Descriptor;
using tpd::shm::Op;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Pin(int cpu) {
  if (!absl::GetFlag(FLAGS_pin)) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)), &set);
  sched_setaffinity(0, sizeof(set), &set);
}

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0;
};

Percentiles Summarize(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  auto at = [&](double p) {
    return samples.empty() ? 0.0 : samples[static_cast<size_t>(p * (samples.size() - 1))];
  };
  return {at(0.50), at(0.90), at(0.99)};
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "shm_bench: %s\n", what.c_str());
  std::exit(1);
}

// One-core copies of `bytes`: percentiles of the time per copy, given as GB/s (so p99 is
// the slowest copies' rate).
Percentiles MemcpyGBps(size_t bytes, int rounds) {
  std::vector<char> from(bytes, 1), to(bytes, 2);  // touched: no page faults in the loop
  for (int i = 0; i < 3; ++i) std::memcpy(to.data(), from.data(), bytes);
  std::vector<double> ns;
  for (int i = 0; i < rounds; ++i) {
    from[i % bytes] = static_cast<char>(i);
    const int64_t start = NowNs();
    std::memcpy(to.data(), from.data(), bytes);
    ns.push_back(static_cast<double>(std::max<int64_t>(NowNs() - start, 1)));
    if (to[i % bytes] != from[i % bytes]) Die("memcpy check");
  }
  const Percentiles time = Summarize(ns);
  return {bytes / time.p50, bytes / time.p90, bytes / time.p99};  // bytes/ns = GB/s
}

pid_t Fork(const std::function<int()>& child) {
  const pid_t pid = fork();
  if (pid < 0) Die("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a spinning child must not outlive a failed run
    Pin(1);
    _exit(child());
  }
  return pid;
}

void Reap(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die("child failed with status " + std::to_string(status));
  }
}

// Round trips (µs) of one byte over a unix socketpair between two processes.
std::vector<double> UdsRoundTrips(int count) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) Die("socketpair");
  const pid_t pid = Fork([&] {
    close(fds[0]);
    char byte;
    while (read(fds[1], &byte, 1) == 1) {
      if (write(fds[1], &byte, 1) != 1) return 2;
    }
    return 0;
  });
  close(fds[1]);
  std::vector<double> samples;
  const int warmup = count / 10;
  for (int i = 0; i < warmup + count; ++i) {
    char byte = 'x';
    const int64_t start = NowNs();
    if (write(fds[0], &byte, 1) != 1 || read(fds[0], &byte, 1) != 1) Die("uds round trip");
    if (i >= warmup) samples.push_back((NowNs() - start) / 1e3);
  }
  close(fds[0]);
  Reap(pid);
  return samples;
}

enum class Mode { kSpin, kAdaptive, kFutex };

tpd::shm::SpinOptions SpinFor(Mode mode) {
  tpd::shm::SpinOptions options;  // kAdaptive: the defaults the library ships
  if (mode == Mode::kFutex) options.max_spin = absl::ZeroDuration();
  if (mode == Mode::kAdaptive && absl::GetFlag(FLAGS_pause_spin_us) >= 0) {
    options.pause_spin = absl::Microseconds(absl::GetFlag(FLAGS_pause_spin_us));
  }
  if (mode == Mode::kAdaptive && absl::GetFlag(FLAGS_max_spin_us) >= 0) {
    options.max_spin = absl::Microseconds(absl::GetFlag(FLAGS_max_spin_us));
  }
  return options;
}

tpd::shm::Segment NewSegment() {
  tpd::shm::SegmentLimits limits;
  limits.submission_slots = 256;
  limits.completion_slots = 256;
  limits.tx_heap_bytes = 1 << 20;
  limits.rx_heap_bytes = 1 << 20;
  absl::StatusOr<tpd::shm::Segment> segment = tpd::shm::Segment::Create(limits);
  if (!segment.ok()) Die(segment.status().ToString());
  return *std::move(segment);
}

// Pops one descriptor, waiting per `mode`; false on a ring error.
bool Pop(tpd::shm::RingConsumer& ring, Mode mode, Descriptor* out) {
  while (true) {
    absl::StatusOr<bool> popped = ring.TryPop(out);
    if (!popped.ok()) return false;
    if (*popped) return true;
    if (mode == Mode::kSpin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    if (!ring.WaitForData(absl::Now() + absl::Seconds(10)).ok()) return false;
  }
}

// Round trips (µs) of an empty call through the rings.
std::vector<double> RingRoundTrips(Mode mode, int count) {
  tpd::shm::Segment daemon = NewSegment();
  const tpd::shm::Layout& layout = daemon.layout();
  const pid_t pid = Fork([&] {
    // The daemon: consumes submissions, validates, answers on the completion ring.
    tpd::shm::RingConsumer submissions(daemon.base(), layout.submission, "submission ring",
                                       SpinFor(mode));
    tpd::shm::RingProducer completions(daemon.base(), layout.completion, "completion ring",
                                       SpinFor(mode));
    Descriptor in;
    while (Pop(submissions, mode, &in)) {
      if (in.op == static_cast<uint8_t>(Op::kCancel)) return 0;  // the end of the run
      if (!ValidateDescriptor(in, layout, tpd::shm::Direction::kSubmission).ok()) return 3;
      Descriptor reply{};
      reply.op = static_cast<uint8_t>(Op::kReply);
      reply.call_id = in.call_id;
      absl::StatusOr<bool> pushed = completions.TryPush(reply);
      if (!pushed.ok() || !*pushed) return 4;  // one in flight: never full
    }
    return 5;
  });
  // The client maps the segment from the fd, as a real client does.
  absl::StatusOr<tpd::shm::Segment> client = tpd::shm::Segment::Map(dup(daemon.fd()));
  if (!client.ok()) Die(client.status().ToString());
  tpd::shm::RingProducer submissions(client->base(), client->layout().submission, "submission ring",
                                     SpinFor(mode));
  tpd::shm::RingConsumer completions(client->base(), client->layout().completion, "completion ring",
                                     SpinFor(mode));
  std::vector<double> samples;
  const int warmup = count / 10;
  Descriptor call{};
  call.op = static_cast<uint8_t>(Op::kCall);
  Descriptor reply;
  for (int i = 0; i < warmup + count; ++i) {
    call.call_id = i + 1;
    const int64_t start = NowNs();
    absl::StatusOr<bool> pushed = submissions.TryPush(call);
    if (!pushed.ok() || !*pushed) Die("push");
    if (!Pop(completions, mode, &reply) || reply.call_id != call.call_id) Die("reply");
    if (i >= warmup) samples.push_back((NowNs() - start) / 1e3);
  }
  Descriptor stop{};
  stop.op = static_cast<uint8_t>(Op::kCancel);
  stop.call_id = 1;
  if (!submissions.TryPush(stop).ok()) Die("stop");
  Reap(pid);
  return samples;
}

// CPU milliseconds a consumer with the adaptive policy burns waiting 1 s on an idle ring
// (WaitForData with 100 ms deadlines, as a session thread would).
double IdleConsumerCpuMs() {
  tpd::shm::Segment daemon = NewSegment();
  const pid_t pid = Fork([&] {
    tpd::shm::RingConsumer submissions(daemon.base(), daemon.layout().submission,
                                       "submission ring");
    const absl::Time end = absl::Now() + absl::Seconds(1);
    while (absl::Now() < end) {
      if (!submissions.WaitForData(std::min(end, absl::Now() + absl::Milliseconds(100))).ok()) {
        return 6;
      }
    }
    return 0;
  });
  int status = 0;
  struct rusage usage;
  if (wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die("idle consumer");
  }
  return usage.ru_utime.tv_sec * 1e3 + usage.ru_utime.tv_usec / 1e3 + usage.ru_stime.tv_sec * 1e3 +
         usage.ru_stime.tv_usec / 1e3;
}

// Nanoseconds per allocate+free pair, with up to 64 blocks live, of sizes 64 B .. 64 KiB.
double AllocFreeNs(const std::function<uint64_t(uint64_t)>& allocate,
                   const std::function<void(uint64_t)>& release) {
  std::mt19937 rng(1);
  std::vector<uint64_t> live;
  constexpr int kPairs = 1'000'000;
  const int64_t start = NowNs();
  for (int i = 0; i < kPairs; ++i) {
    live.push_back(allocate(64u << (rng() % 11)));
    if (live.size() > 64) {
      const size_t victim = rng() % live.size();
      release(live[victim]);
      live[victim] = live.back();
      live.pop_back();
    }
  }
  const int64_t ns = NowNs() - start;
  for (uint64_t block : live) release(block);
  return static_cast<double>(ns) / kPairs;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int round_trips = absl::GetFlag(FLAGS_round_trips);
  const int memcpy_rounds = absl::GetFlag(FLAGS_memcpy_rounds);
  Pin(0);

  const Percentiles copy_1m = MemcpyGBps(1 << 20, memcpy_rounds * 100);
  const Percentiles copy_256m = MemcpyGBps(size_t{256} << 20, memcpy_rounds);
  const Percentiles uds = Summarize(UdsRoundTrips(round_trips));
  const Percentiles spin = Summarize(RingRoundTrips(Mode::kSpin, round_trips));
  const Percentiles adaptive = Summarize(RingRoundTrips(Mode::kAdaptive, round_trips));
  const Percentiles futex = Summarize(RingRoundTrips(Mode::kFutex, round_trips));
  const double idle_cpu_ms = IdleConsumerCpuMs();

  tpd::shm::HeapAllocator heap("bench heap", {0, uint64_t{1} << 30});
  const double heap_ns = AllocFreeNs([&](uint64_t bytes) { return *heap.Allocate(bytes); },
                                     [&](uint64_t offset) {
                                       if (!heap.Free(offset).ok()) Die("heap free");
                                     });
  const double malloc_ns =
      AllocFreeNs([](uint64_t bytes) { return reinterpret_cast<uint64_t>(std::malloc(bytes)); },
                  [](uint64_t block) { std::free(reinterpret_cast<void*>(block)); });

  std::printf("| row | p50 | p90 | p99 | unit |\n|---|---|---|---|---|\n");
  auto row = [](const char* name, const Percentiles& p, const char* unit) {
    std::printf("| %s | %.2f | %.2f | %.2f | %s |\n", name, p.p50, p.p90, p.p99, unit);
  };
  row("memcpy 1 MiB (baseline)", copy_1m, "GB/s");
  row("memcpy 256 MiB (baseline)", copy_256m, "GB/s");
  row("uds round trip (baseline)", uds, "µs");
  row("ring spin round trip", spin, "µs");
  row("ring adaptive round trip", adaptive, "µs");
  row("ring futex round trip", futex, "µs");

  std::printf(
      "\n| ring row | p50 vs spin | p50 vs uds | p50 as memcpy bytes (1 MiB rate) |\n"
      "|---|---|---|---|\n");
  auto ratios = [&](const char* name, const Percentiles& p) {
    std::printf("| %s | %.2f | %.3f | %.0f B |\n", name, p.p50 / spin.p50, p.p50 / uds.p50,
                p.p50 * 1e3 * copy_1m.p50);
  };
  ratios("spin", spin);
  ratios("adaptive", adaptive);
  ratios("futex", futex);

  std::printf("\nidle consumer (adaptive, 1 s, 100 ms waits): %.2f ms CPU (%.3f%% of a core)\n",
              idle_cpu_ms, idle_cpu_ms / 10.0);
  std::printf("heap alloc+free: %.0f ns per pair; malloc+free: %.0f ns (ratio %.2f)\n", heap_ns,
              malloc_ns, heap_ns / malloc_ns);
  return 0;
}
