// B2: one local hop. An empty call from one client to another of the same in-process daemon
// through shared memory (Client::Call → daemon → Client::Handle → back), beside a one-byte
// round trip over a unix socketpair between two threads, measured in the same run.
//
//   bazel run -c opt //bench:call_bench -- --calls=20000

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/logging.h"

ABSL_FLAG(int, calls, 20000, "measured round trips of each kind");
ABSL_FLAG(int, warmup, 2000, "round trips before measuring");

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
  std::vector<double> local;
  for (int i = 0; i < warmup + calls; ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<tpd::Message> reply = a->Call("bench", "b", "empty", "", {}, absl::Seconds(10));
    if (!reply.ok()) {
      std::fprintf(stderr, "call %d: %s\n", i, reply.status().ToString().c_str());
      return 1;
    }
    if (i >= warmup) local.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  std::vector<double> pair = SocketpairRoundTrips(warmup, calls);
  std::printf("%-28s %8s %8s %8s\n", "round trip", "p50_us", "p99_us", "ratio");
  std::printf("%-28s %8.1f %8.1f %8.2f\n", "socketpair 1 B (baseline)", Percentile(pair, 0.5),
              Percentile(pair, 0.99), 1.0);
  std::printf("%-28s %8.1f %8.1f %8.2f\n", "local hop, empty call", Percentile(local, 0.5),
              Percentile(local, 0.99), Percentile(local, 0.5) / Percentile(pair, 0.5));
  a.reset();
  b.reset();
  (*daemon)->Shutdown();
  return 0;
}
