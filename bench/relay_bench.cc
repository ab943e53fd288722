// B3 relay beside B1 raw TensorPipe, in the same run: client A → daemon A → daemon B →
// client B's echo handler and back, through two real tpd processes on loopback, beside a
// raw TensorPipe pipe echo between this process and a forked child over the transport and
// channel the daemons' own pipe chose.
//
//   bazel run -c opt //bench:relay_bench -- [--scale=1] [--gib] [--tsv=/tmp/relay.tsv]
//   relay_bench --tpd=/path/to/tpd ...   (outside bazel: the daemon binary to start)
//   --agent_transports=shm,uv            (the daemons' agent.transports; default: theirs)
//   --agent_channels=basic,mpt_uv        (the daemons' agent.channels; default: theirs)
//   --netns_b=/run/netns/B --host_a=10.77.0.1 --host_b=10.77.0.2
//                                        (daemon B and the raw pipe's server in network
//                                        namespace B, peer ports on those addresses: the
//                                        pipe is TCP over a veth pair, as between machines;
//                                        bench/netns_pair.sh makes them)
//
// Processes: this one holds clients A and C (daemon A) and client B (daemon B), and measures;
// two tpd daemons (fork/exec, own temporary socket, peer port on 127.0.0.1, log level debug
// so the agent logs which transport and channel its pipe uses); one forked child serving the
// raw pipe. Every row echoes: the message's tensors go there and come back.
//
// Rows, for each size (one tensor of SIZE; "64x1MiB" is 64 tensors of 1 MiB, "4096x16KiB" 4096
// of 16 KiB), one call at a
// time in a closed loop, after a warm-up, the kinds alternating in 4 blocks so drift hits all
// alike:
//   raw     B1: a tensorpipe::Message with the tensors to the child, which reads them into
//           its buffer and writes them back; read into a buffer allocated once.
//   arena   B3: A sends tensors it allocated in its arena (Client::AllocateTensor: no copy on
//           A's side); B's handler answers with arena tensors of the same shape it allocated
//           once (no copy on B's side). The zero-copy path end to end.
//   copied  B3: A sends tensors it owns (std::string: copied once into A's arena); B's
//           handler returns the received tensors (copied once into B's arena).
//   local   B2 with tensors, for the breakdown: A → daemon A → client C (same daemon), C
//           answering as B does in `arena`.
// GB/s = bytes of the tensors / p50 round trip (1e9 B/s; the echo carries them both ways,
// counted once, for raw, relay and torch rpc alike). Ratios: relay p50 / raw p50 and relay
// GB/s / raw GB/s. fwd/back: p50 of A's call → B's handler start and of B's handler end →
// A's reply (one host, one clock), for `arena` and `local`.
//
// Also per kind and size: minor page faults and CPU time (user + system) per call of all four
// processes; with --threads, CPU time and context switches per call by thread name.
// Diagnostics: --only=KIND measures one kind (for perf stat), --timeout_s=0 sends calls
// without a deadline, --raw_memory=memfd puts the raw pipe's buffers in memfd mappings.
//
// Output: a markdown table on stdout, and the same numbers as TSV (--tsv, one row per kind
// and size) in the format bench/torch_rpc_bench.py writes.

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <tensorpipe/tensorpipe.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/bench_daemon.h"
#include "bench/call_latency.h"
#include "bench/raw_pipe.h"
#include "client/client.h"

ABSL_FLAG(std::string, tpd, "",
          "tpd binary; empty: the one in this binary's runfiles, or next to it");
ABSL_FLAG(double, scale, 1.0, "multiplies every row's iteration count");
ABSL_FLAG(bool, gib, false, "add a 1 GiB row (arenas of 2.1 GiB per heap)");
ABSL_FLAG(std::string, sizes, "",
          "comma-separated row names to run (e.g. 0B,1MiB,64x1MiB); empty: all");
ABSL_FLAG(std::string, pair, "",
          "transport+channel of the raw baseline; empty: what the daemons' agent pipe chose");
ABSL_FLAG(int, mpt_lanes, 4, "lanes of mpt_uv, if the pipe uses it (the daemon's default)");
ABSL_FLAG(std::string, agent_transports, "",
          "the daemons' [agent] transports, e.g. shm,uv (empty: the daemon's default)");
ABSL_FLAG(std::string, agent_channels, "",
          "the daemons' [agent] channels, comma-separated (default: the daemon's)");
ABSL_FLAG(std::string, netns_b, "",
          "run daemon B and the raw pipe's server in this network namespace (/run/netns/NAME)");
ABSL_FLAG(std::string, host_a, "127.0.0.1",
          "daemon A's peer port and the raw client's listeners (mpt_uv lanes) on this address");
ABSL_FLAG(std::string, host_b, "127.0.0.1",
          "daemon B's peer port and the raw pipe's server on this address");
ABSL_FLAG(bool, local, true, "measure the `local` rows (a call to a client of the same daemon)");
ABSL_FLAG(std::string, raw_memory, "heap",
          "where the raw pipe's buffers live: heap (std::vector), or memfd (shared mappings of "
          "a memfd, the kind of memory the daemons' arenas are)");
ABSL_FLAG(std::string, only, "",
          "measure only this kind (raw, arena, copied or local), e.g. under perf stat; prints one "
          "row per size instead of the side-by-side table");
ABSL_FLAG(int, timeout_s, 300,
          "each call's timeout; 0: none (the daemons then keep no deadline for it)");
ABSL_FLAG(bool, threads, false,
          "also print, per kind and size, each thread name's CPU time and context switches per "
          "call (from /proc/PID/task/*/schedstat and status), summed over the processes involved");
ABSL_FLAG(std::string, tsv, "", "also write the rows as TSV to this file");
ABSL_FLAG(std::string, keep_logs, "", "copy the daemons' logs into this directory at the end");

namespace {

using Clock = std::chrono::steady_clock;
using tpd::bench::BenchDaemon;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

struct Stats {
  double p50 = 0, p90 = 0, p99 = 0;
};

Stats Summarize(std::vector<double> us) {
  Stats s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) { return us[static_cast<size_t>(p * (us.size() - 1))]; };
  s.p50 = pct(0.50);
  s.p90 = pct(0.90);
  s.p99 = pct(0.99);
  return s;
}

// One row of the table: `count` tensors of `size` bytes.
struct Case {
  std::string name;
  size_t size;
  int count;
  size_t bytes() const { return size * count; }
};

int Iterations(size_t bytes) {
  int n = bytes <= 4096          ? 2000
          : bytes <= 65536       ? 1000
          : bytes <= (1 << 20)   ? 200
          : bytes <= (2 << 20)   ? 120
          : bytes <= (8 << 20)   ? 40
          : bytes <= (64 << 20)  ? 12
          : bytes <= (256 << 20) ? 8
                                 : 4;
  n = static_cast<int>(n * absl::GetFlag(FLAGS_scale));
  return std::max(4, (n + 3) / 4 * 4);
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// `bytes` of a fresh memfd, mapped shared and written once (as the arenas are), or nullptr.
char* MapMemfd(size_t bytes, char fill) {
  const int fd = memfd_create("relay-bench-raw", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) return nullptr;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, fill, bytes);
  return static_cast<char*>(p);
}

// ---------------------------------------------------------------------------------------------
// The raw pipe's server: a child forked before any thread exists. It reads one line
// "transport channel lanes max_bytes memory" from `commands`, serves an echoing RawServer, writes
// its URL as one line to `answers`, and exits when `commands` closes.

struct RawChild {
  pid_t pid = -1;
  int commands = -1;  // write end
  int answers = -1;   // read end
};

[[noreturn]] void RawChildMain(int commands, int answers) {
  std::string line;
  char c;
  while (read(commands, &c, 1) == 1 && c != '\n') line.push_back(c);
  std::vector<std::string> words = absl::StrSplit(line, ' ');
  if (words.size() != 5) _exit(2);
  const std::string host = absl::GetFlag(FLAGS_host_b);
  const size_t max_bytes = std::stoull(words[3]);
  char* buffer = nullptr;
  if (words[4] == "memfd" && (buffer = MapMemfd(max_bytes, 0)) == nullptr) _exit(4);
  auto context =
      tpd::bench::RawContext(words[0], words[1], std::stoi(words[2]), "raw-server", host);
  auto server = std::make_unique<tpd::bench::RawServer>(*context, words[0] == "shm", max_bytes,
                                                        /*echo=*/true, buffer, host);
  const std::string url = server->url() + "\n";
  if (write(answers, url.data(), url.size()) != static_cast<ssize_t>(url.size())) _exit(3);
  while (read(commands, &c, 1) > 0) {
  }
  _exit(0);  // the parent is gone or done: no orderly close needed
}

RawChild ForkRawChild() {
  int to_child[2];
  int from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) std::abort();
  RawChild child;
  child.pid = fork();
  if (child.pid == 0) {
    if (const std::string netns = absl::GetFlag(FLAGS_netns_b);
        !netns.empty() && !tpd::bench::EnterNetns(netns)) {
      std::fprintf(stderr, "raw server: cannot enter %s: %s\n", netns.c_str(),
                   std::strerror(errno));
      _exit(5);
    }
    close(to_child[1]);
    close(from_child[0]);
    RawChildMain(to_child[0], from_child[1]);
  }
  close(to_child[0]);
  close(from_child[1]);
  child.commands = to_child[1];
  child.answers = from_child[0];
  return child;
}

// ---------------------------------------------------------------------------------------------
// tpd daemons as child processes.

// The config of relay node `index`: its peer port (--host_a, --host_b), its arena, the
// transports and channels asked.
std::string NodeConfig(int index, int64_t arena_bytes) {
  const std::string host = index == 0 ? absl::GetFlag(FLAGS_host_a) : absl::GetFlag(FLAGS_host_b);
  std::string config = tpd::bench::PeerConfig(absl::StrCat("relay-node", index), host, arena_bytes);
  const std::string transports = absl::GetFlag(FLAGS_agent_transports);
  const std::string channels = absl::GetFlag(FLAGS_agent_channels);
  if (transports.empty() && channels.empty()) return config;
  absl::StrAppend(&config, "[agent]\n");
  if (!transports.empty()) {
    absl::StrAppend(&config, "transports = ", tpd::bench::TomlStrings(transports), "\n");
  }
  if (!channels.empty()) {
    absl::StrAppend(&config, "channels = ", tpd::bench::TomlStrings(channels), "\n");
  }
  return config;
}

// "pipe to ready (shm + cma)" from the agent's debug log: {"shm", "cma"}.
std::pair<std::string, std::string> PipeChoice(const std::string& log) {
  const std::string marker = "pipe to ready (";
  const size_t at = log.find(marker);
  if (at == std::string::npos) return {};
  const size_t end = log.find(')', at);
  std::vector<std::string> parts =
      absl::StrSplit(log.substr(at + marker.size(), end - at - marker.size()), " + ");
  if (parts.size() != 2) return {};
  return {parts[0], parts[1]};
}

// ---------------------------------------------------------------------------------------------
// Handlers of clients B and C.

std::atomic<int64_t> g_handler_in_ns{0};
std::atomic<int64_t> g_handler_out_ns{0};

// Answers "echo_copy" with the received tensors (copied into the arena when sent) and
// "echo_arena" with arena tensors of the same shapes, allocated once per shape.
class EchoHandlers {
 public:
  explicit EchoHandlers(tpd::Client* client) : client_(client) {}

  absl::Status Register() {
    if (absl::Status s =
            client_->Handle("echo_copy",
                            [](const tpd::Message& request) -> absl::StatusOr<tpd::Message> {
                              g_handler_in_ns.store(NowNs());
                              tpd::Message reply;
                              reply.tensors = request.tensors;
                              g_handler_out_ns.store(NowNs());
                              return reply;
                            });
        !s.ok()) {
      return s;
    }
    return client_->Handle("echo_arena",
                           [this](const tpd::Message& request) -> absl::StatusOr<tpd::Message> {
                             g_handler_in_ns.store(NowNs());
                             absl::StatusOr<tpd::Message> reply = ArenaReply(request);
                             g_handler_out_ns.store(NowNs());
                             return reply;
                           });
  }

 private:
  absl::StatusOr<tpd::Message> ArenaReply(const tpd::Message& request) {
    absl::MutexLock lock(&mu_);
    const size_t count = request.tensors.size();
    const size_t size = count > 0 ? request.tensors[0].size() : 0;
    if (count != count_ || size != size_) {
      cached_.tensors.clear();
      for (size_t i = 0; i < count; ++i) {
        absl::StatusOr<tpd::Tensor> t =
            client_->AllocateTensor(tpd::shm::DType::kUInt8, {static_cast<int64_t>(size)});
        if (!t.ok()) return t.status();
        std::memset(t->mutable_data(), 'r', t->size());
        cached_.tensors.push_back(*std::move(t));
      }
      count_ = count;
      size_ = size;
    }
    return cached_;
  }

  tpd::Client* const client_;
  absl::Mutex mu_;
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;
  size_t size_ ABSL_GUARDED_BY(mu_) = 0;
  tpd::Message cached_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------------------------

// Minor page faults and CPU time (user + system) of some processes, from /proc/PID/stat.
struct ProcCost {
  double minor_faults = 0;
  double cpu_us = 0;
  ProcCost& operator+=(const ProcCost& o) {
    minor_faults += o.minor_faults;
    cpu_us += o.cpu_us;
    return *this;
  }
  ProcCost operator-(const ProcCost& o) const {
    return {minor_faults - o.minor_faults, cpu_us - o.cpu_us};
  }
};

ProcCost ReadCost(const std::vector<pid_t>& pids) {
  static const double tick_us = 1e6 / sysconf(_SC_CLK_TCK);
  ProcCost total;
  for (pid_t pid : pids) {
    const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    // After "pid (comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt
    // cmajflt utime stime ...
    std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
    if (fields.size() < 13) continue;
    total.minor_faults += std::stod(fields[7]);
    total.cpu_us += (std::stod(fields[11]) + std::stod(fields[12])) * tick_us;
  }
  return total;
}

// Per thread name (e.g. "tpd-session"), summed over threads and processes: CPU time and
// voluntary (slept) and involuntary (preempted or yielded) context switches.
struct ThreadCost {
  double cpu_us = 0;
  double voluntary = 0;
  double involuntary = 0;
};
using ThreadCosts = std::map<std::string, ThreadCost>;

ThreadCosts ReadThreadCosts(const std::vector<pid_t>& pids) {
  ThreadCosts costs;
  for (pid_t pid : pids) {
    const std::string dir = absl::StrCat("/proc/", pid, "/task");
    std::error_code error;
    for (const auto& task : std::filesystem::directory_iterator(dir, error)) {
      const std::string path = task.path().string();
      std::string comm = ReadFile(path + "/comm");
      while (!comm.empty() && comm.back() == '\n') comm.pop_back();
      ThreadCost& c = costs[comm];
      std::vector<std::string> schedstat = absl::StrSplit(ReadFile(path + "/schedstat"), ' ');
      if (!schedstat.empty() && !schedstat[0].empty()) c.cpu_us += std::stod(schedstat[0]) / 1e3;
      for (absl::string_view line : absl::StrSplit(ReadFile(path + "/status"), '\n')) {
        std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits(':', 1));
        if (kv.size() != 2) continue;
        if (kv[0] == "voluntary_ctxt_switches") c.voluntary += std::stod(kv[1]);
        if (kv[0] == "nonvoluntary_ctxt_switches") c.involuntary += std::stod(kv[1]);
      }
    }
  }
  return costs;
}

// after − before, per thread name (threads that ended in between are lost).
void AddDelta(const ThreadCosts& before, const ThreadCosts& after, ThreadCosts* sum) {
  for (const auto& [name, a] : after) {
    ThreadCost b;
    if (auto it = before.find(name); it != before.end()) b = it->second;
    ThreadCost& s = (*sum)[name];
    s.cpu_us += a.cpu_us - b.cpu_us;
    s.voluntary += a.voluntary - b.voluntary;
    s.involuntary += a.involuntary - b.involuntary;
  }
}

struct Kind {
  std::string name;  // raw, arena, copied, local
  std::vector<double> us;
  std::vector<double> fwd_us;
  std::vector<double> back_us;
  ProcCost cost;        // of this process, both daemons and the raw child, over the measured calls
  ThreadCosts threads;  // the same by thread name (--threads)
};

struct Row {
  Case c;
  int iterations;
  std::map<std::string, Stats> stats;  // by kind
  std::map<std::string, double> fwd_p50, back_p50;
  std::map<std::string, ProcCost> cost;  // per call
};

constexpr const char* kGroup = "relay";
constexpr absl::Duration kCallTimeout = absl::Seconds(300);

}  // namespace

int main(int argc, char** argv) {
  // Before any thread: the raw pipe's server process.
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  RawChild raw_child = ForkRawChild();

  std::vector<Case> cases = {
      {"0B", 0, 0},
      {"64B", 64, 1},
      {"4KiB", 4 << 10, 1},
      {"64KiB", 64 << 10, 1},
      {"1MiB", 1 << 20, 1},
      {"2MiB", 2 << 20, 1},
      {"8MiB", 8 << 20, 1},
      {"16MiB", 16 << 20, 1},
      {"64MiB", 64 << 20, 1},
      {"256MiB", size_t{256} << 20, 1},
      {"64x1MiB", 1 << 20, 64},
      {"4096x16KiB", 16 << 10, 4096},
  };
  if (absl::GetFlag(FLAGS_gib)) cases.insert(cases.end() - 2, {"1GiB", size_t{1} << 30, 1});
  if (const std::string only = absl::GetFlag(FLAGS_sizes); !only.empty()) {
    std::vector<std::string> names = absl::StrSplit(only, ',');
    std::vector<Case> picked;
    for (const Case& c : cases) {
      if (std::find(names.begin(), names.end(), c.name) != names.end()) picked.push_back(c);
    }
    cases = picked;
  }
  size_t max_bytes = 1;
  for (const Case& c : cases) max_bytes = std::max(max_bytes, c.bytes());
  // A sender's tx heap holds the case's arena tensors and one copied message at once.
  const int64_t arena_bytes = static_cast<int64_t>(2 * max_bytes + (64 << 20));

  const std::string tpd = tpd::bench::FindTpd(absl::GetFlag(FLAGS_tpd), argv[0]);
  if (tpd.empty()) {
    std::fprintf(stderr, "no tpd binary: pass --tpd=/path/to/tpd\n");
    return 2;
  }
  char dir_pattern[] = "/tmp/tpd-relay-bench-XXXXXX";
  const std::string dir = mkdtemp(dir_pattern);
  int rc = 1;
  {
    // Debug logs: the agent's tell which transport and channel its pipe uses.
    std::unique_ptr<BenchDaemon> started_a =
        BenchDaemon::Start(tpd, dir, "tpd0", NodeConfig(0, arena_bytes), "debug");
    std::unique_ptr<BenchDaemon> started_b =
        started_a ? BenchDaemon::Start(tpd, dir, "tpd1", NodeConfig(1, arena_bytes), "debug",
                                       absl::GetFlag(FLAGS_netns_b))
                  : nullptr;
    if (!started_a || !started_b) return 1;
    const BenchDaemon& daemon_a = *started_a;
    const BenchDaemon& daemon_b = *started_b;

    auto connect = [](const BenchDaemon& d) -> std::unique_ptr<tpd::Client> {
      auto client = tpd::Client::Connect(d.socket());
      if (!client.ok()) {
        std::fprintf(stderr, "connect %s: %s\n", d.socket().c_str(),
                     client.status().ToString().c_str());
        return nullptr;
      }
      return *std::move(client);
    };
    std::unique_ptr<tpd::Client> a = connect(daemon_a);
    std::unique_ptr<tpd::Client> b = connect(daemon_b);
    std::unique_ptr<tpd::Client> c = connect(daemon_a);
    if (!a || !b || !c) return 1;
    EchoHandlers b_handlers(b.get());
    EchoHandlers c_handlers(c.get());
    if (!b_handlers.Register().ok() || !c_handlers.Register().ok()) {
      std::fprintf(stderr, "cannot register handlers\n");
      return 1;
    }
    const std::string init_method = absl::StrCat("tcp://", a->Status()->peer_address());
    auto join = [&](tpd::Client* client, const std::string& name, int rank) {
      tpd::JoinOptions options;
      options.group = kGroup;
      options.name = name;
      options.rank = rank;
      options.world_size = 3;
      options.init_method = init_method;
      options.timeout = absl::Seconds(60);
      return client->Join(options).status();
    };
    auto joined_b = std::async(std::launch::async, [&] { return join(b.get(), "b", 1); });
    auto joined_c = std::async(std::launch::async, [&] { return join(c.get(), "c", 2); });
    const absl::Status joined_a = join(a.get(), "a", 0);
    if (!joined_a.ok() || !joined_b.get().ok() || !joined_c.get().ok()) {
      std::fprintf(stderr, "join failed: %s\n", joined_a.ToString().c_str());
      return 1;
    }

    // The first relay call opens the daemons' pipe; their logs say what it uses.
    for (int i = 0; i < 20; ++i) {
      absl::StatusOr<tpd::Message> reply = a->Call(kGroup, "b", "echo_copy", "", {}, kCallTimeout);
      if (!reply.ok()) {
        std::fprintf(stderr, "warm-up call: %s\n", reply.status().ToString().c_str());
        return 1;
      }
    }
    std::string transport, channel;
    if (const std::string pair = absl::GetFlag(FLAGS_pair); !pair.empty()) {
      std::vector<std::string> parts = absl::StrSplit(pair, '+');
      transport = parts[0];
      channel = parts.size() > 1 ? parts[1] : "basic";
    } else {
      std::tie(transport, channel) = PipeChoice(daemon_a.Log());
      if (transport.empty()) std::tie(transport, channel) = PipeChoice(daemon_b.Log());
      if (transport.empty()) {
        std::fprintf(stderr,
                     "the daemons' logs do not say which transport their pipe uses; "
                     "pass --pair\n");
        return 1;
      }
    }
    std::fprintf(stderr, "daemons' pipe: %s + %s (%s); raw baseline over the same\n",
                 transport.c_str(), channel.c_str(),
                 absl::GetFlag(FLAGS_pair).empty() ? "from the agent's log" : "--pair");

    // The raw pipe.
    const std::string command =
        absl::StrCat(transport, " ", channel, " ", absl::GetFlag(FLAGS_mpt_lanes), " ", max_bytes,
                     " ", absl::GetFlag(FLAGS_raw_memory), "\n");
    if (write(raw_child.commands, command.data(), command.size()) !=
        static_cast<ssize_t>(command.size())) {
      return 1;
    }
    std::string url;
    for (char ch; read(raw_child.answers, &ch, 1) == 1 && ch != '\n';) url.push_back(ch);
    if (url.empty()) {
      std::fprintf(stderr, "the raw pipe's server did not start\n");
      return 1;
    }
    auto raw_context = tpd::bench::RawContext(transport, channel, absl::GetFlag(FLAGS_mpt_lanes),
                                              "raw-client", absl::GetFlag(FLAGS_host_a));
    std::shared_ptr<tensorpipe::Pipe> pipe = raw_context->connect(url);
    const bool memfd = absl::GetFlag(FLAGS_raw_memory) == "memfd";
    std::vector<char> raw_heap(memfd ? 0 : 2 * max_bytes, 'x');
    char* const raw_data = memfd ? MapMemfd(max_bytes, 'x') : raw_heap.data();
    char* const raw_reply = memfd ? MapMemfd(max_bytes, 0) : raw_heap.data() + max_bytes;
    if (raw_data == nullptr || raw_reply == nullptr) {
      std::fprintf(stderr, "cannot map the raw pipe's buffers\n");
      return 1;
    }

    const std::vector<pid_t> pids = {getpid(), daemon_a.pid(), daemon_b.pid(), raw_child.pid};
    const int timeout_s = absl::GetFlag(FLAGS_timeout_s);
    const absl::Duration call_timeout = timeout_s > 0 ? absl::Seconds(timeout_s) : tpd::kNoTimeout;
    std::vector<Row> rows;
    std::vector<std::string> thread_lines;  // --threads
    for (const Case& cs : cases) {
      const int iterations = Iterations(cs.bytes());
      // The tensors A sends: owned (copied into the arena per call) and arena ones.
      std::vector<tpd::Tensor> owned;
      std::vector<tpd::Tensor> arena;
      for (int i = 0; i < cs.count; ++i) {
        owned.emplace_back(tpd::shm::DType::kUInt8,
                           std::vector<int64_t>{static_cast<int64_t>(cs.size)},
                           std::string(cs.size, static_cast<char>('a' + i % 26)));
        absl::StatusOr<tpd::Tensor> t =
            a->AllocateTensor(tpd::shm::DType::kUInt8, {static_cast<int64_t>(cs.size)});
        if (!t.ok()) {
          std::fprintf(stderr, "%s: arena tensor: %s\n", cs.name.c_str(),
                       t.status().ToString().c_str());
          return 1;
        }
        std::memset(t->mutable_data(), 'a' + i % 26, t->size());
        arena.push_back(*std::move(t));
      }
      std::vector<Kind> kinds = {{"raw"}, {"arena"}, {"copied"}};
      if (absl::GetFlag(FLAGS_local)) kinds.push_back({"local"});
      if (const std::string only = absl::GetFlag(FLAGS_only); !only.empty()) kinds = {{only}};

      // One round trip of `kind`; records it when `record`.
      auto once = [&](Kind& kind, bool record, bool verify) -> bool {
        const int64_t t0 = NowNs();
        int64_t t1 = 0;
        if (kind.name == "raw") {
          if (!tpd::bench::RawRoundTrip(*pipe, raw_data, cs.size, cs.count, raw_reply)) {
            std::fprintf(stderr, "%s raw: pipe error\n", cs.name.c_str());
            return false;
          }
          t1 = NowNs();
        } else {
          const bool copied = kind.name == "copied";
          const std::string worker = kind.name == "local" ? "c" : "b";
          absl::StatusOr<tpd::Message> reply =
              a->Call(kGroup, worker, copied ? "echo_copy" : "echo_arena", "",
                      copied ? owned : arena, call_timeout);
          t1 = NowNs();
          if (!reply.ok()) {
            std::fprintf(stderr, "%s %s: %s\n", cs.name.c_str(), kind.name.c_str(),
                         reply.status().ToString().c_str());
            return false;
          }
          if (reply->tensors.size() != static_cast<size_t>(cs.count)) {
            std::fprintf(stderr, "%s %s: %zu tensors back\n", cs.name.c_str(), kind.name.c_str(),
                         reply->tensors.size());
            return false;
          }
          for (int i = 0; verify && i < cs.count; ++i) {
            const bool same = reply->tensors[i].size() == cs.size &&
                              (!copied || reply->tensors[i].data() == owned[i].data());
            if (!same) {
              std::fprintf(stderr, "%s %s: tensor %d came back wrong\n", cs.name.c_str(),
                           kind.name.c_str(), i);
              return false;
            }
          }
          if (record) {
            kind.fwd_us.push_back((g_handler_in_ns.load() - t0) / 1e3);
            kind.back_us.push_back((t1 - g_handler_out_ns.load()) / 1e3);
          }
        }
        if (record) kind.us.push_back((t1 - t0) / 1e3);
        return true;
      };

      for (Kind& kind : kinds) {  // per-size warm-up; the first call checks the echo
        for (int i = 0; i < std::max(2, std::min(iterations / 4, 20)); ++i) {
          if (!once(kind, false, i == 0)) return 1;
        }
      }
      constexpr int kBlocks = 4;
      for (int block = 0; block < kBlocks; ++block) {
        for (Kind& kind : kinds) {
          const ProcCost before = ReadCost(pids);
          const ThreadCosts threads_before =
              absl::GetFlag(FLAGS_threads) ? ReadThreadCosts(pids) : ThreadCosts{};
          for (int i = 0; i < iterations / kBlocks; ++i) {
            if (!once(kind, true, false)) return 1;
          }
          kind.cost += ReadCost(pids) - before;
          if (absl::GetFlag(FLAGS_threads)) {
            AddDelta(threads_before, ReadThreadCosts(pids), &kind.threads);
          }
        }
      }
      Row row{cs, iterations};
      for (const Kind& kind : kinds) {
        row.stats[kind.name] = Summarize(kind.us);
        if (!kind.fwd_us.empty()) {
          row.fwd_p50[kind.name] = Summarize(kind.fwd_us).p50;
          row.back_p50[kind.name] = Summarize(kind.back_us).p50;
        }
        const double calls = static_cast<double>(kind.us.size());
        row.cost[kind.name] = {kind.cost.minor_faults / calls, kind.cost.cpu_us / calls};
        for (const auto& [name, t] : kind.threads) {
          if (t.cpu_us / calls < 0.5 && (t.voluntary + t.involuntary) / calls < 0.05) continue;
          thread_lines.push_back(absl::StrFormat("| %s | %s | %s | %.1f | %.2f | %.2f |", cs.name,
                                                 kind.name, name, t.cpu_us / calls,
                                                 t.voluntary / calls, t.involuntary / calls));
        }
      }
      std::fprintf(stderr, "  %-8s raw p50 %9.1f us, arena %9.1f us, copied %9.1f us\n",
                   cs.name.c_str(), row.stats["raw"].p50, row.stats["arena"].p50,
                   row.stats["copied"].p50);
      rows.push_back(std::move(row));
    }

    // The table.
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    const std::string pair = absl::StrCat(transport, "+", channel);
    const std::string agent_transports = absl::GetFlag(FLAGS_agent_transports);
    std::printf(
        "# relay_bench: host %s, %u cpus, daemons' agent.transports %s, their pipe %s, "
        "raw baseline %s (buffers: %s)\n",
        host, std::thread::hardware_concurrency(),
        agent_transports.empty() ? "(default)" : agent_transports.c_str(), pair.c_str(),
        pair.c_str(), absl::GetFlag(FLAGS_raw_memory).c_str());
    auto gbps = [](const Row& r, const std::string& kind) {
      return r.c.bytes() > 0 ? r.c.bytes() / (r.stats.at(kind).p50 * 1e3) : 0.0;
    };
    auto num = [](bool show, double v, const char* fmt = "%.2f") {
      if (!show) return std::string("-");
      char text[32];
      std::snprintf(text, sizeof(text), fmt, v);
      return std::string(text);
    };
    const bool local = absl::GetFlag(FLAGS_local);
    if (const std::string only = absl::GetFlag(FLAGS_only); !only.empty()) {
      std::printf(
          "| size | kind | p50 µs | p90 | p99 | GB/s | fwd/back p50 µs | minor faults per call "
          "| cpu µs per call |\n|---|---|---|---|---|---|---|---|---|\n");
      for (const Row& r : rows) {
        const Stats& st = r.stats.at(only);
        std::printf(
            "| %s | %s | %.1f | %.1f | %.1f | %s | %s | %.1f | %.0f |\n", r.c.name.c_str(),
            only.c_str(), st.p50, st.p90, st.p99, num(r.c.bytes() > 0, gbps(r, only)).c_str(),
            r.fwd_p50.count(only) > 0 ? absl::StrCat(num(true, r.fwd_p50.at(only), "%.1f"), " / ",
                                                     num(true, r.back_p50.at(only), "%.1f"))
                                            .c_str()
                                      : "-",
            r.cost.at(only).minor_faults, r.cost.at(only).cpu_us);
      }
    } else {
      std::printf(
          "| size | raw p50 µs | p90 | p99 | arena p50 µs | p90 | p99 | copied p50 µs | p90 | p99 "
          "| "
          "raw GB/s | arena GB/s | copied GB/s | arena/raw p50 | copied/raw p50 | arena/raw GB/s | "
          "copied/raw GB/s | arena fwd/back p50 µs |%s\n",
          local ? " local p50 µs | local fwd/back p50 µs |" : "");
      std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|%s\n",
                  local ? "---|---|" : "");
      for (const Row& r : rows) {
        const Stats& raw = r.stats.at("raw");
        const Stats& ar = r.stats.at("arena");
        const Stats& cp = r.stats.at("copied");
        const bool bw = r.c.bytes() > 0;
        std::printf(
            "| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %s | %s | "
            "%.2f | %.2f | %s | %s | %.1f / %.1f |",
            r.c.name.c_str(), raw.p50, raw.p90, raw.p99, ar.p50, ar.p90, ar.p99, cp.p50, cp.p90,
            cp.p99, num(bw, gbps(r, "raw")).c_str(), num(bw, gbps(r, "arena")).c_str(),
            num(bw, gbps(r, "copied")).c_str(), ar.p50 / raw.p50, cp.p50 / raw.p50,
            num(bw, gbps(r, "arena") / gbps(r, "raw")).c_str(),
            num(bw, gbps(r, "copied") / gbps(r, "raw")).c_str(), r.fwd_p50.at("arena"),
            r.back_p50.at("arena"));
        if (local) {
          std::printf(" %.1f | %.1f / %.1f |", r.stats.at("local").p50, r.fwd_p50.at("local"),
                      r.back_p50.at("local"));
        }
        std::printf("\n");
      }
      // What each call costs the processes involved (this one, both daemons, the raw child).
      std::printf(
          "\n| size | minor faults per call: raw | arena | copied |%s cpu µs per call: raw | "
          "arena | copied |%s\n",
          local ? " local |" : "", local ? " local |" : "");
      std::printf("|---|---|---|---|---|---|---|%s\n", local ? "---|---|" : "");
      for (const Row& r : rows) {
        std::printf("| %s |", r.c.name.c_str());
        for (const char* kind : {"raw", "arena", "copied", "local"}) {
          if (r.cost.count(kind)) std::printf(" %.1f |", r.cost.at(kind).minor_faults);
        }
        for (const char* kind : {"raw", "arena", "copied", "local"}) {
          if (r.cost.count(kind)) std::printf(" %.0f |", r.cost.at(kind).cpu_us);
        }
        std::printf("\n");
      }
    }
    // Where the daemons' time went, every case and kind together (pick one with --sizes).
    if (absl::StatusOr<tpd::v1::StatusResponse> status = a->Status(); status.ok()) {
      std::printf("\n");
      tpd::bench::PrintCallLatency("daemon A (the caller's)", *status);
    }
    if (absl::StatusOr<tpd::v1::StatusResponse> status = b->Status(); status.ok()) {
      tpd::bench::PrintCallLatency("daemon B (the callee's)", *status);
    }
    if (absl::GetFlag(FLAGS_threads)) {
      std::printf(
          "\n| size | kind | thread | cpu µs per call | slept per call | preempted or "
          "yielded per call |\n|---|---|---|---|---|---|\n");
      for (const std::string& line : thread_lines) std::printf("%s\n", line.c_str());
    }
    if (const std::string path = absl::GetFlag(FLAGS_tsv); !path.empty()) {
      std::ofstream tsv(path);
      tsv << "# relay_bench host=" << host << " cpus=" << std::thread::hardware_concurrency()
          << " agent_transports=" << (agent_transports.empty() ? "default" : agent_transports)
          << " pair=" << pair << " raw_memory=" << absl::GetFlag(FLAGS_raw_memory) << "\n";
      tsv << "bench\tkind\tsize\tbytes\ttensors\titerations\tp50_us\tp90_us\tp99_us\tgbps\t"
             "ratio_p50_vs_raw\tfwd_p50_us\tback_p50_us\tminor_faults_per_call\t"
             "cpu_us_per_call\n";
      for (const Row& r : rows) {
        for (const auto& [kind, s] : r.stats) {
          const bool bw = r.c.bytes() > 0;
          tsv << "relay_bench\t" << kind << "\t" << r.c.name << "\t" << r.c.bytes() << "\t"
              << r.c.count << "\t" << r.iterations << "\t" << num(true, s.p50, "%.1f") << "\t"
              << num(true, s.p90, "%.1f") << "\t" << num(true, s.p99, "%.1f") << "\t"
              << num(bw, gbps(r, kind), "%.3f") << "\t"
              << (r.stats.count("raw") > 0 ? num(true, s.p50 / r.stats.at("raw").p50) : "-") << "\t"
              << num(r.fwd_p50.count(kind) > 0, r.fwd_p50.count(kind) ? r.fwd_p50.at(kind) : 0,
                     "%.1f")
              << "\t"
              << num(r.back_p50.count(kind) > 0, r.back_p50.count(kind) ? r.back_p50.at(kind) : 0,
                     "%.1f")
              << "\t" << num(true, r.cost.at(kind).minor_faults, "%.1f") << "\t"
              << num(true, r.cost.at(kind).cpu_us, "%.0f") << "\n";
        }
      }
    }
    pipe->close();
    raw_context->close();
    raw_context->join();
    if (const std::string keep = absl::GetFlag(FLAGS_keep_logs); !keep.empty()) {
      std::filesystem::create_directories(keep);
      for (const BenchDaemon* d : {&daemon_a, &daemon_b}) {
        std::filesystem::copy_file(
            d->log_path(),
            std::filesystem::path(keep) / std::filesystem::path(d->log_path()).filename(),
            std::filesystem::copy_options::overwrite_existing);
      }
    }
    a.reset();
    b.reset();
    c.reset();
    rc = 0;
  }
  close(raw_child.commands);
  waitpid(raw_child.pid, nullptr, 0);
  std::filesystem::remove_all(dir);
  (void)args;
  return rc;
}
