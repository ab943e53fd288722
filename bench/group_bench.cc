// Time to form a static group of N simulated ranks spread over D daemons on this machine,
// next to a baseline measured in the same run by the same clients and threads.
//
//   bazel run -c opt //bench:group_bench -- --ranks=1000,4000 --daemons=4
//
// Every row starts D real daemons in-process, each on its own temporary unix socket and its
// own peer port on 127.0.0.1; daemon 0's peer port serves the group's store
// (init_method = tcp://<daemon 0's peer address>), so daemons 1..D-1 reach it over TCP as
// they would on other hosts. A rank is one tpd::Client (its own connection and session) on
// daemon r % D. The N clients connect and open their sessions before anything is timed;
// then N threads, one per rank, wait at a start barrier and each issue one blocking call:
//
//   baseline  one Store.Set on the rank's own daemon: what the harness itself costs (N
//             threads waking, N unary calls over N connections on shared cores);
//   etcd      with an etcd:// --init_method only: one put per rank into that etcd, through
//             one EtcdStore per daemon shared by its ranks (as each daemon has one): the
//             cost of writing to the group's store once per rank;
//   join      Join(group "bench-<N>", name "w<r>", rank r, world_size N).
//
// Formation time runs from the barrier's release to the return of the last Join, each of
// which must come back FORMED with the same version. Rows print both times, their ratio and
// the per-rank latency percentiles. Clients and daemons are torn down between rows.
//
// Diagnostics (stderr): --watch reports when the FORMED version reached a watcher on daemon 0
// (agreement) as opposed to when the last rank had its answer; --heartbeat_trace polls when
// daemon 0 last saw each other daemon's heartbeat change (Admin.Status peers; the heartbeat
// keys themselves are the daemons' own, out of clients' reach). Both add a little load; the
// table in
// docs/BENCHMARKS.md is measured without them.

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/logging.h"
#include "store/etcd/etcd_store.h"
#include "store/rendezvous/init_method.h"

ABSL_FLAG(std::vector<std::string>, ranks, std::vector<std::string>({"1000", "4000"}),
          "world sizes to form, one row each");
ABSL_FLAG(int, daemons, 4, "daemons the ranks are spread over (rank r joins through r % D)");
ABSL_FLAG(std::string, log_level, "warn",
          "the daemons' log level (info logs every group version, with its whole change list)");
ABSL_FLAG(int, join_timeout_s, 300, "timeout of each Join");
ABSL_FLAG(std::string, init_method, "",
          "the group's store instead of daemon 0's peer port, e.g. etcd://127.0.0.1:2379/bench "
          "(an etcd started beforehand; the daemons' dial_networks admit loopback)");
ABSL_FLAG(bool, include_members, false,
          "Joins ask for answers with the member list (JoinOptions::include_members)");
ABSL_FLAG(bool, heartbeat_trace, false,
          "poll daemon 0's store every 100 ms during the Joins and report, per other daemon, the "
          "longest time its heartbeat key stayed unchanged (daemon 0 evicts a node after "
          "peer.heartbeat_timeout, 5 s by default)");
ABSL_FLAG(bool, watch, false,
          "also watch the group from daemon 0 and report when the FORMED version appeared "
          "(splits formation into agreement and answering the Joins; adds a watcher's load)");

namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// CLOCK_MONOTONIC seconds, to line a profile (perf record -k CLOCK_MONOTONIC) up with the
// timed window.
double MonotonicSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(p * (values.size() - 1))];
}

// Raises RLIMIT_NOFILE to its hard limit: every rank is a unix connection, and both of its
// ends live in this process.
void RaiseFileLimit(int ranks) {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  getrlimit(RLIMIT_NOFILE, &limit);
  // Two ends per connection, plus the peer connections, epoll and eventfds of gRPC.
  if (limit.rlim_cur < static_cast<rlim_t>(2 * ranks + 1000)) {
    std::fprintf(stderr,
                 "warning: RLIMIT_NOFILE is %llu, likely too low for %d ranks (needs ~%d)\n",
                 static_cast<unsigned long long>(limit.rlim_cur), ranks, 2 * ranks + 1000);
  }
}

// Lets N threads through together, phase after phase: each thread calls Arrive(phase) and
// blocks until the main thread calls Release(phase) once all N have arrived.
class StartBarrier {
 public:
  explicit StartBarrier(int n) : n_(n) {}

  void Arrive(int phase) {
    std::unique_lock<std::mutex> lock(mu_);
    if (++arrived_ == n_) cv_.notify_all();
    cv_.wait(lock, [&] { return released_ >= phase; });
  }
  // Waits for all N arrivals, then releases them; returns the release time.
  absl::Time Release(int phase) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return arrived_ == n_; });
    arrived_ = 0;
    released_ = phase;
    const absl::Time now = absl::Now();
    cv_.notify_all();
    return now;
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int released_ = 0;
};

struct Daemons {
  std::vector<std::unique_ptr<tpd::Daemon>> daemons;
  std::vector<std::string> sockets;
  std::string store_address;  // daemon 0's peer address

  ~Daemons() {
    // Daemons 1.. use daemon 0's store: stop them first.
    for (size_t i = daemons.size(); i-- > 0;) daemons[i]->Shutdown();
  }
};

bool StartDaemons(int count, int world_size, Daemons* out) {
  for (int d = 0; d < count; ++d) {
    char dir_pattern[] = "/tmp/tpd-group-bench-XXXXXX";
    const char* dir = mkdtemp(dir_pattern);
    if (dir == nullptr) {
      std::perror("mkdtemp");
      return false;
    }
    tpd::Config config;
    config.socket_path = absl::StrCat(dir, "/tpd.sock");
    config.log_level = absl::GetFlag(FLAGS_log_level);
    config.peer.listen_address = "127.0.0.1:0";
    config.peer.token = "bench";
    config.peer.node_name = absl::StrCat("bench-", world_size, "-node-", d);
    config.group.cuda_device_count = 0;
    if (absl::Status valid = tpd::ValidateConfig(config); !valid.ok()) {
      std::fprintf(stderr, "bad daemon config: %s\n", valid.ToString().c_str());
      return false;
    }
    absl::StatusOr<std::unique_ptr<tpd::Daemon>> daemon = tpd::Daemon::Start(config);
    if (!daemon.ok()) {
      std::fprintf(stderr, "cannot start daemon %d: %s\n", d, daemon.status().ToString().c_str());
      return false;
    }
    out->daemons.push_back(*std::move(daemon));
    out->sockets.push_back(config.socket_path);
  }
  absl::StatusOr<std::unique_ptr<tpd::Client>> admin = tpd::Client::Connect(out->sockets[0]);
  if (!admin.ok()) {
    std::fprintf(stderr, "cannot connect to daemon 0: %s\n", admin.status().ToString().c_str());
    return false;
  }
  absl::StatusOr<tpd::v1::StatusResponse> status = (*admin)->Status();
  if (!status.ok() || status->peer_address().empty()) {
    std::fprintf(stderr, "daemon 0 has no peer address: %s\n",
                 status.ok() ? "empty" : status.status().ToString().c_str());
    return false;
  }
  out->store_address = status->peer_address();
  return true;
}

// One EtcdStore per daemon on the etcd of `init_method`, or none when it is not etcd://.
std::vector<std::unique_ptr<tpd::store::EtcdStore>> EtcdStores(const std::string& init_method,
                                                               int count) {
  std::vector<std::unique_ptr<tpd::store::EtcdStore>> stores;
  absl::StatusOr<tpd::store::InitMethod> parsed =
      tpd::store::ParseInitMethod(init_method, std::nullopt, std::nullopt, {});
  if (!parsed.ok() || parsed->scheme != tpd::store::InitMethodScheme::kEtcd) return stores;
  std::vector<std::string> endpoints;
  for (const tpd::store::InitMethodEndpoint& endpoint : parsed->endpoints) {
    endpoints.push_back(absl::StrCat(endpoint.host, ":", endpoint.port));
  }
  for (int d = 0; d < count; ++d) {
    absl::StatusOr<std::unique_ptr<tpd::store::EtcdStore>> store =
        tpd::store::EtcdStore::Create(endpoints, absl::StrCat(parsed->path, "-baseline"));
    if (!store.ok()) {
      std::fprintf(stderr, "cannot open the etcd baseline store: %s\n",
                   store.status().ToString().c_str());
      std::_Exit(1);
    }
    stores.push_back(*std::move(store));
  }
  return stores;
}

struct Result {
  double formation_s = 0;
  double baseline_s = 0;
  double etcd_baseline_s = -1;  // with an etcd:// store: one put per rank
  std::vector<double> join_ms;
  std::vector<double> set_ms;
  int64_t version = 0;
  size_t response_bytes = 0;
  double formed_at_s = -1;  // --watch: when the FORMED version reached the watcher
};

// One row: returns false (having printed why) when any rank failed.
bool RunRow(int world_size, int daemon_count, Result* result) {
  const absl::Time row_start = absl::Now();
  Daemons daemons;
  if (!StartDaemons(daemon_count, world_size, &daemons)) return false;
  const std::string group = absl::StrCat("bench-", world_size);
  const std::string init_method = absl::GetFlag(FLAGS_init_method).empty()
                                      ? absl::StrCat("tcp://", daemons.store_address)
                                      : absl::GetFlag(FLAGS_init_method);
  std::vector<std::unique_ptr<tpd::store::EtcdStore>> etcd = EtcdStores(init_method, daemon_count);

  // Clients connect and open their sessions up front: neither is part of forming the group.
  // A Leave from a group the daemon does not know opens the session and changes nothing.
  std::vector<std::unique_ptr<tpd::Client>> clients;
  clients.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    absl::StatusOr<std::unique_ptr<tpd::Client>> client =
        tpd::Client::Connect(daemons.sockets[r % daemon_count]);
    if (!client.ok()) {
      std::fprintf(stderr, "rank %d cannot connect: %s\n", r, client.status().ToString().c_str());
      return false;
    }
    absl::Status opened = (*client)->Leave("bench-session-warmup", absl::StrCat("w", r));
    if (opened.code() != absl::StatusCode::kNotFound) {
      std::fprintf(stderr, "rank %d cannot open its session: %s\n", r, opened.ToString().c_str());
      return false;
    }
    clients.push_back(*std::move(client));
  }
  const absl::Time connected = absl::Now();

  std::unique_ptr<tpd::Client> watcher;
  std::unique_ptr<tpd::GroupWatch> watch;
  std::thread watch_thread;
  absl::Time formed_seen = absl::InfinitePast();
  if (absl::GetFlag(FLAGS_watch)) {
    watcher = *tpd::Client::Connect(daemons.sockets[0]);
    watch = watcher->Watch(group, init_method);
    watch_thread = std::thread([&] {
      tpd::v1::GroupEvent event;
      while (watch->Next(&event)) {
        if (event.group().phase() == "FORMED") {
          formed_seen = absl::Now();
          break;
        }
      }
    });
  }

  // --heartbeat_trace: the other daemons' heartbeats as daemon 0 sees them.
  struct Heartbeat {
    absl::Time first_seen = absl::InfinitePast();
    absl::Duration longest = absl::ZeroDuration();
  };
  std::vector<Heartbeat> heartbeats(daemon_count);
  absl::Duration longest_poll = absl::ZeroDuration();  // a stalled poller hides stalled beats
  std::atomic<bool> joins_done{false};
  std::thread heartbeat_thread;
  std::unique_ptr<tpd::Client> heartbeat_reader;
  if (absl::GetFlag(FLAGS_heartbeat_trace)) {
    heartbeat_reader = *tpd::Client::Connect(daemons.sockets[0]);
    heartbeat_thread = std::thread([&] {
      absl::Time last_poll = absl::Now();
      while (!joins_done.load()) {
        longest_poll = std::max(longest_poll, absl::Now() - last_poll);
        last_poll = absl::Now();
        absl::StatusOr<tpd::v1::StatusResponse> status = heartbeat_reader->Status();
        const absl::Time now = absl::Now();
        for (int d = 1; d < daemon_count && status.ok(); ++d) {
          const std::string node = absl::StrCat("bench-", world_size, "-node-", d);
          for (const tpd::v1::PeerInfo& peer : status->peers()) {
            if (peer.node() != node) continue;
            Heartbeat& beat = heartbeats[d];
            if (beat.first_seen == absl::InfinitePast()) beat.first_seen = now;
            beat.longest =
                std::max(beat.longest, now - absl::FromUnixMillis(peer.last_heartbeat_unix_ms()));
          }
        }
        absl::SleepFor(absl::Milliseconds(100));
      }
    });
  }

  // Phases: 1 warm-up Set (untimed), 2 baseline Set, 3 etcd put (etcd:// only), 4 Join.
  StartBarrier barrier(world_size);
  std::vector<absl::Time> set_end(world_size), etcd_end(world_size), join_end(world_size);
  std::vector<absl::Status> set_status(world_size);
  // What each rank's Join returned, summarized in its thread: a JoinResponse holds the whole
  // group (N members), so keeping all N of them would hold O(N^2) memory, which no real rank
  // process does.
  struct Joined {
    std::string error;  // empty: FORMED with rank r and N members
    int64_t version = -1;
    size_t bytes = 0;
  };
  std::vector<Joined> joined(world_size);
  result->set_ms.assign(world_size, 0);
  result->join_ms.assign(world_size, 0);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    try {
      threads.emplace_back([&, r] {
        tpd::Client* client = clients[r].get();
        const std::string key = absl::StrCat("bench/", world_size, "/", r);
        barrier.Arrive(1);
        absl::Status warm = client->Store().Set(key, "warm-up");
        barrier.Arrive(2);
        absl::Time t0 = absl::Now();
        set_status[r] = client->Store().Set(key, "baseline");
        set_end[r] = absl::Now();
        if (!warm.ok()) set_status[r] = warm;
        result->set_ms[r] = absl::ToDoubleMilliseconds(set_end[r] - t0);
        barrier.Arrive(3);
        if (!etcd.empty()) {
          absl::Status put = etcd[r % daemon_count]->Set(key, "baseline");
          etcd_end[r] = absl::Now();
          if (!put.ok() && set_status[r].ok()) set_status[r] = put;
        }
        tpd::JoinOptions options;
        options.group = group;
        options.name = absl::StrCat("w", r);
        options.rank = r;
        options.world_size = world_size;
        options.init_method = init_method;
        options.timeout = absl::Seconds(absl::GetFlag(FLAGS_join_timeout_s));
        options.include_members = absl::GetFlag(FLAGS_include_members);
        barrier.Arrive(4);
        t0 = absl::Now();
        absl::StatusOr<tpd::v1::JoinResponse> response = client->Join(options);
        join_end[r] = absl::Now();
        result->join_ms[r] = absl::ToDoubleMilliseconds(join_end[r] - t0);
        Joined& out = joined[r];
        if (!response.ok()) {
          out.error = response.status().ToString();
        } else if (response->group().phase() != "FORMED") {
          out.error = absl::StrCat("phase ", response->group().phase(), " (",
                                   response->group().reason(), ")");
        } else if (response->rank() != r) {
          out.error = absl::StrCat("got rank ", response->rank());
        } else if (response->group().members_size() != (options.include_members ? world_size : 0)) {
          out.error = absl::StrCat(response->group().members_size(), " members");
        } else {
          out.version = response->group().version();
          out.bytes = response->ByteSizeLong();
        }
      });
    } catch (const std::system_error& error) {
      // Every Join of a static group blocks until all N ranks joined, so N blocking Joins
      // need N threads: chunking them would deadlock. Stop here and say so.
      std::fprintf(stderr,
                   "cannot create thread %d of %d (%s): %d blocking Joins need %d threads; "
                   "raise ulimit -u / vm.max_map_count or run fewer ranks\n",
                   r, world_size, error.what(), world_size, world_size);
      std::_Exit(1);
    }
  }
  barrier.Release(1);
  const absl::Time baseline_start = barrier.Release(2);
  const absl::Time etcd_start = barrier.Release(3);
  const absl::Time join_start = barrier.Release(4);
  const double join_start_mono = MonotonicSeconds();
  for (std::thread& thread : threads) thread.join();
  const absl::Time joined_all = absl::Now();
  const double joined_all_mono = MonotonicSeconds();
  joins_done = true;
  if (heartbeat_thread.joinable()) heartbeat_thread.join();

  bool ok = true;
  for (int r = 0; r < world_size && ok; ++r) {
    if (!set_status[r].ok()) {
      std::fprintf(stderr, "rank %d: baseline Set failed: %s\n", r,
                   set_status[r].ToString().c_str());
      ok = false;
    }
  }
  int failures = 0;
  for (int r = 0; r < world_size; ++r) {
    std::string error = joined[r].error;
    if (error.empty() && joined[0].error.empty() && joined[r].version != joined[0].version) {
      error = absl::StrCat("version ", joined[r].version, " but rank 0 saw ", joined[0].version);
    }
    if (!error.empty()) {
      if (++failures <= 10) std::fprintf(stderr, "rank %d: Join: %s\n", r, error.c_str());
      ok = false;
    }
  }
  if (failures > 10) std::fprintf(stderr, "... %d ranks failed in all\n", failures);
  if (!ok) {
    // The watcher may wait for a FORMED that never comes.
    std::fflush(stderr);
    std::_Exit(1);
  }
  if (watch_thread.joinable()) {
    watch_thread.join();
    result->formed_at_s = Seconds(formed_seen - join_start);
    watch.reset();
    watcher.reset();
  }

  result->baseline_s = Seconds(*std::max_element(set_end.begin(), set_end.end()) - baseline_start);
  result->formation_s = Seconds(*std::max_element(join_end.begin(), join_end.end()) - join_start);
  if (!etcd.empty()) {
    result->etcd_baseline_s =
        Seconds(*std::max_element(etcd_end.begin(), etcd_end.end()) - etcd_start);
  }
  result->version = joined[0].version;
  result->response_bytes = joined[0].bytes;

  const absl::Time teardown = absl::Now();
  clients.clear();  // sessions end: every member leaves
  // ~Daemons shuts the daemons down (returning from this function).
  std::fprintf(stderr,
               "[%d ranks] setup (daemons, connections, sessions) %.2f s; all threads joined "
               "%.2f s after the release; ",
               world_size, Seconds(connected - row_start), Seconds(joined_all - join_start));
  std::fprintf(stderr, "clients closed in %.2f s\n", Seconds(absl::Now() - teardown));
  std::fprintf(
      stderr, "[%d ranks] timed window: %s to %s local time, %.6f,%.6f on CLOCK_MONOTONIC\n",
      world_size, absl::FormatTime("%H:%M:%E3S", join_start, absl::LocalTimeZone()).c_str(),
      absl::FormatTime("%H:%M:%E3S", joined_all, absl::LocalTimeZone()).c_str(), join_start_mono,
      joined_all_mono);
  std::fprintf(stderr, "[%d ranks] JoinResponse %zu bytes (%.1f MB for all ranks)", world_size,
               result->response_bytes, 1e-6 * result->response_bytes * world_size);
  if (result->formed_at_s >= 0) {
    std::fprintf(stderr, "; FORMED reached the watcher %.3f s after the release",
                 result->formed_at_s);
  }
  std::fprintf(stderr, "\n");
  for (int d = 1; d < daemon_count && absl::GetFlag(FLAGS_heartbeat_trace); ++d) {
    const Heartbeat& beat = heartbeats[d];
    if (beat.first_seen == absl::InfinitePast()) {
      std::fprintf(stderr, "[%d ranks] heartbeat of node %d: never seen by daemon 0\n", world_size,
                   d);
      continue;
    }
    std::fprintf(stderr,
                 "[%d ranks] heartbeat of node %d seen by daemon 0: first seen %.2f s after "
                 "the release, longest unchanged %.2f s\n",
                 world_size, d, Seconds(beat.first_seen - join_start), Seconds(beat.longest));
  }
  if (absl::GetFlag(FLAGS_heartbeat_trace)) {
    std::fprintf(stderr, "[%d ranks] heartbeat poller: longest interval between its polls %.2f s\n",
                 world_size, Seconds(longest_poll));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int daemon_count = absl::GetFlag(FLAGS_daemons);
  std::vector<int> sizes;
  for (const std::string& text : absl::GetFlag(FLAGS_ranks)) {
    int n = 0;
    if (!absl::SimpleAtoi(text, &n) || n <= 0) {
      std::fprintf(stderr, "--ranks: not a positive number: %s\n", text.c_str());
      return 1;
    }
    sizes.push_back(n);
  }
  if (daemon_count <= 0 || sizes.empty()) {
    std::fprintf(stderr, "need --daemons >= 1 and at least one --ranks value\n");
    return 1;
  }
  if (absl::Status status = tpd::InitLogging(absl::GetFlag(FLAGS_log_level)); !status.ok()) {
    std::fprintf(stderr, "--log_level: %s\n", status.ToString().c_str());
    return 1;
  }
  RaiseFileLimit(*std::max_element(sizes.begin(), sizes.end()));

  std::printf("%7s %7s %11s %11s %7s %9s %9s %9s %9s %8s %12s %10s\n", "ranks", "daemons",
              "formation_s", "baseline_s", "ratio", "join_p50", "join_p99", "set_p50", "set_p99",
              "version", "etcd_put_s", "etcd_ratio");
  std::fflush(stdout);
  for (int world_size : sizes) {
    Result result;
    if (!RunRow(world_size, daemon_count, &result)) return 1;
    std::printf("%7d %7d %11.3f %11.3f %7.1f %7.0fms %7.0fms %7.1fms %7.1fms %8lld", world_size,
                daemon_count, result.formation_s, result.baseline_s,
                result.formation_s / result.baseline_s, Percentile(result.join_ms, 0.50),
                Percentile(result.join_ms, 0.99), Percentile(result.set_ms, 0.50),
                Percentile(result.set_ms, 0.99), static_cast<long long>(result.version));
    if (result.etcd_baseline_s > 0) {
      std::printf(" %12.3f %10.1f\n", result.etcd_baseline_s,
                  result.formation_s / result.etcd_baseline_s);
    } else {
      std::printf(" %12s %10s\n", "-", "-");
    }
    std::fflush(stdout);
  }
  return 0;
}
