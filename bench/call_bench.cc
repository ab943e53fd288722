// B2: one local hop. An empty call from one client to another of the same in-process daemon
// through shared memory (Client::Call → daemon → Client::Handle → back), beside a one-byte
// round trip over a unix socketpair between two threads, measured in the same run. Then a
// call carrying one tensor of --tensor_bytes, sent from a std::string (one copy into the
// arena) and from an arena tensor (Client::AllocateTensor: no copy on the caller's side);
// the daemon's copy into the callee's rx heap is in both. Last, with --scrape_hz, the empty call
// again while a Prometheus-like scraper reads the daemon's /metrics at each rate, beside the
// same calls with no scraper (alternated, twice).
//
//   bazel run -c opt //bench:call_bench -- --calls=20000

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/call_latency.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/logging.h"

ABSL_FLAG(int, calls, 20000, "measured round trips of each kind");
ABSL_FLAG(int, warmup, 2000, "round trips before measuring");
ABSL_FLAG(int, tensor_bytes, 1 << 20, "bytes of the tensor in the tensor calls");
ABSL_FLAG(int, tensor_calls, 2000, "measured round trips with a tensor, each way of sending");
ABSL_FLAG(std::string, scrape_hz, "1,100",
          "scrape rates of /metrics to measure the empty call under; empty: none");
ABSL_FLAG(double, scrape_seconds, 3, "how long each scraper phase (and its baseline) calls");

namespace {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

std::vector<double> SocketpairRoundTrips(int warmup, int calls) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::abort();
  std::thread echo([fd = fds[1], n = warmup + calls] {
    char byte;
    for (int i = 0; i < n; ++i) {
      if (read(fd, &byte, 1) != 1 || write(fd, &byte, 1) != 1) std::abort();
    }
  });
  std::vector<double> us;
  for (int i = 0; i < warmup + calls; ++i) {
    char byte = 1;
    const absl::Time start = absl::Now();
    if (write(fds[0], &byte, 1) != 1 || read(fds[0], &byte, 1) != 1) std::abort();
    if (i >= warmup) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  echo.join();
  close(fds[0]);
  close(fds[1]);
  return us;
}

// Reads http://127.0.0.1:port/metrics to the end, as a scraper does; the bytes read.
size_t Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  size_t total = 0;
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0) {
    const char request[] = "GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n";
    if (write(fd, request, sizeof(request) - 1) == sizeof(request) - 1) {
      char buffer[65536];
      for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) total += n;
    }
  }
  close(fd);
  return total;
}

// Scrapes at `hz` on a thread of its own until destroyed.
class Scraper {
 public:
  Scraper(int port, double hz) {
    if (hz <= 0) return;
    thread_ = std::thread([this, port, hz] {
      const absl::Duration period = absl::Seconds(1 / hz);
      for (absl::Time next = absl::Now(); !stop_; next += period) {
        if (Scrape(port) > 0) ++scrapes_;
        absl::SleepFor(next + period - absl::Now());
      }
    });
  }
  ~Scraper() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int scrapes() const { return scrapes_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> scrapes_{0};
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int calls = absl::GetFlag(FLAGS_calls);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  (void)tpd::InitLogging("warn");
  char dir_pattern[] = "/tmp/tpd-call-bench-XXXXXX";
  const char* dir = mkdtemp(dir_pattern);
  if (dir == nullptr) return 1;
  tpd::Config config;
  config.socket_path = absl::StrCat(dir, "/tpd.sock");
  config.log_level = "warn";
  config.peer.listen_address = "127.0.0.1:0";
  config.peer.token = "bench";
  config.peer.node_name = "call-bench";
  config.group.cuda_device_count = 0;
  config.metrics.listen_address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<tpd::Daemon>> daemon = tpd::Daemon::Start(config);
  if (!daemon.ok()) {
    std::fprintf(stderr, "cannot start the daemon: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<tpd::Client> a = *tpd::Client::Connect(config.socket_path);
  std::unique_ptr<tpd::Client> b = *tpd::Client::Connect(config.socket_path);
  tpd::JoinOptions join;
  join.group = "bench";
  join.init_method = absl::StrCat("tcp://", a->Status()->peer_address());
  join.name = "a";
  if (!a->Join(join).ok()) return 1;
  join.name = "b";
  if (!b->Join(join).ok()) return 1;
  if (!b->Handle("empty", [](const tpd::Message&) -> absl::StatusOr<tpd::Message> {
          return tpd::Message{};
        }).ok()) {
    return 1;
  }
  // One call; its round trip in µs, or a negative number after printing why it failed.
  auto timed_call = [&](const std::vector<tpd::Tensor>& tensors) -> double {
    const absl::Time start = absl::Now();
    absl::StatusOr<tpd::Message> reply =
        a->Call("bench", "b", "empty", "", tensors, absl::Seconds(10));
    if (!reply.ok()) {
      std::fprintf(stderr, "call: %s\n", reply.status().ToString().c_str());
      return -1;
    }
    return absl::ToDoubleMicroseconds(absl::Now() - start);
  };
  auto measure = [&](int n, const std::vector<tpd::Tensor>& tensors,
                     std::vector<double>* us) -> bool {
    for (int i = 0; i < warmup + n; ++i) {
      const double round_trip = timed_call(tensors);
      if (round_trip < 0) return false;
      if (i >= warmup) us->push_back(round_trip);
    }
    return true;
  };
  std::vector<double> local;
  const tpd::CallEngineStats caller_before =
      a->GetCallStats().value_or(tpd::CallEngineStats{});  // no engine until the first call
  const tpd::CallEngineStats callee_before = *b->GetCallStats();
  if (!measure(calls, {}, &local)) return 1;
  const tpd::CallEngineStats caller_after = *a->GetCallStats();
  const tpd::CallEngineStats callee_after = *b->GetCallStats();
  // The daemon's view of the empty calls (warm-up included), before the tensor calls join it.
  absl::StatusOr<tpd::v1::StatusResponse> empty_calls = a->Status();
  const int tensor_bytes = absl::GetFlag(FLAGS_tensor_bytes);
  const int tensor_calls = absl::GetFlag(FLAGS_tensor_calls);
  std::vector<double> copied;
  if (!measure(
          tensor_calls,
          {tpd::Tensor(tpd::shm::DType::kUInt8, {tensor_bytes}, std::string(tensor_bytes, 'x'))},
          &copied)) {
    return 1;
  }
  absl::StatusOr<tpd::Tensor> arena = a->AllocateTensor(tpd::shm::DType::kUInt8, {tensor_bytes});
  if (!arena.ok()) {
    std::fprintf(stderr, "arena tensor: %s\n", arena.status().ToString().c_str());
    return 1;
  }
  std::memset(arena->mutable_data(), 'x', arena->size());
  std::vector<double> in_place;
  if (!measure(tensor_calls, {*arena}, &in_place)) return 1;
  const tpd::CallEngineStats stats = *a->GetCallStats();
  const tpd::CallEngineStats callee = *b->GetCallStats();
  std::vector<double> pair = SocketpairRoundTrips(warmup, calls);
  std::printf("%-36s %8s %8s %8s %8s\n", "round trip", "p50_us", "p90_us", "p99_us", "ratio");
  std::printf("%-36s %8.1f %8.1f %8.1f %8.2f\n", "socketpair 1 B (baseline)", Percentile(pair, 0.5),
              Percentile(pair, 0.9), Percentile(pair, 0.99), 1.0);
  std::printf("%-36s %8.1f %8.1f %8.1f %8.2f\n", "local hop, empty call", Percentile(local, 0.5),
              Percentile(local, 0.9), Percentile(local, 0.99),
              Percentile(local, 0.5) / Percentile(pair, 0.5));
  const std::string size = absl::StrCat(tensor_bytes, " B");
  std::printf("%-36s %8.1f %8.1f %8.1f %8.2f\n",
              absl::StrCat("tensor ", size, ", copied in").c_str(), Percentile(copied, 0.5),
              Percentile(copied, 0.9), Percentile(copied, 0.99),
              Percentile(copied, 0.5) / Percentile(pair, 0.5));
  std::printf("%-36s %8.1f %8.1f %8.1f %8.2f\n", absl::StrCat("tensor ", size, ", arena").c_str(),
              Percentile(in_place, 0.5), Percentile(in_place, 0.9), Percentile(in_place, 0.99),
              Percentile(in_place, 0.5) / Percentile(pair, 0.5));
  std::printf("caller's arena: %llu tensors sent in place, %llu copied in\n",
              static_cast<unsigned long long>(stats.tensors_in_place),
              static_cast<unsigned long long>(stats.tensors_copied_in));
  // How the hand-offs went (all phases, warm-up included): calls the callee's reading thread
  // ran itself or gave to another without a wake-up, and releases that rode on the next
  // descriptor.
  std::printf(
      "callee: %llu calls run by the thread that read them, %llu handed to a spinning "
      "thread, %llu to a woken one\n",
      static_cast<unsigned long long>(callee.calls_run_by_reader),
      static_cast<unsigned long long>(callee.handoffs_to_spinner),
      static_cast<unsigned long long>(callee.handoffs_woken));
  std::printf(
      "releases deferred to the next push: caller %llu (%llu pushed alone), "
      "callee %llu (%llu pushed alone)\n",
      static_cast<unsigned long long>(stats.releases_deferred),
      static_cast<unsigned long long>(stats.release_flushes),
      static_cast<unsigned long long>(callee.releases_deferred),
      static_cast<unsigned long long>(callee.release_flushes));
  // Which of the empty calls' four ring hops found the other side asleep (warm-up included).
  // A hop that did costs a futex wake-up; one that found it spinning costs a cache line.
  const double n = warmup + calls;
  std::printf(
      "empty calls, per call: caller's reader slept %.3f, callee's reader %.3f; "
      "the daemon was woken by the caller %.3f, by the callee %.3f\n",
      (caller_after.reader_sleeps - caller_before.reader_sleeps) / n,
      (callee_after.reader_sleeps - callee_before.reader_sleeps) / n,
      (caller_after.daemon_wakeups - caller_before.daemon_wakeups) / n,
      (callee_after.daemon_wakeups - callee_before.daemon_wakeups) / n);
  if (empty_calls.ok()) tpd::bench::PrintCallLatency("empty calls", *empty_calls, "local.");

  // The empty call under a scraper: each rate beside no scraper, alternated twice, so drift
  // hits both.
  std::vector<double> rates;
  for (absl::string_view rate :
       absl::StrSplit(absl::GetFlag(FLAGS_scrape_hz), ',', absl::SkipEmpty())) {
    double hz = 0;
    if (absl::SimpleAtod(rate, &hz) && hz > 0) rates.push_back(hz);
  }
  int port = 0;
  if (empty_calls.ok()) {
    const std::string& address = empty_calls->metrics_address();
    (void)absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port);
  }
  const absl::Duration phase = absl::Seconds(absl::GetFlag(FLAGS_scrape_seconds));
  // Empty calls for `duration`, one after another.
  auto measure_for = [&](absl::Duration duration, std::vector<double>* us) {
    for (const absl::Time end = absl::Now() + duration; absl::Now() < end;) {
      const double round_trip = timed_call({});
      if (round_trip < 0) return false;
      us->push_back(round_trip);
    }
    return true;
  };
  if (!rates.empty() && port > 0) {
    std::printf("\nempty call under a /metrics scraper (%zu bytes a scrape), alternated twice:\n",
                Scrape(port));
    std::printf("%-22s %8s %8s %8s %8s %8s\n", "scraper (each phase)", "p50_us", "p99_us",
                "scrapes", "p50/none", "p99/none");
    for (int round = 0; round < 2; ++round) {
      for (double hz : rates) {
        std::vector<double> none;
        std::vector<double> scraped;
        if (!measure_for(phase, &none)) return 1;
        int scrapes = 0;
        {
          Scraper scraper(port, hz);
          if (!measure_for(phase, &scraped)) return 1;
          scrapes = scraper.scrapes();
        }
        std::printf("%-22s %8.1f %8.1f %8s\n", "none", Percentile(none, 0.5),
                    Percentile(none, 0.99), "-");
        std::printf("%-22s %8.1f %8.1f %8d %8.2f %8.2f\n", absl::StrCat(hz, " Hz").c_str(),
                    Percentile(scraped, 0.5), Percentile(scraped, 0.99), scrapes,
                    Percentile(scraped, 0.5) / Percentile(none, 0.5),
                    Percentile(scraped, 0.99) / Percentile(none, 0.99));
      }
    }
  }
  a.reset();
  b.reset();
  (*daemon)->Shutdown();
  return 0;
}
