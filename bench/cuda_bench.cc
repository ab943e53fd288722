// B6 (../shared/BENCHMARKS.md, docs/BENCHMARKS.md): CUDA tensors in calls on one node, beside
// raw driver copies measured in the same run by this process.
//
//   raw d2d        cuMemcpyAsync cuda:0 -> cuda:0, synchronized
//   raw peer       cuMemcpyAsync cuda:0 -> cuda:1 with peer access, synchronized
//   raw h2d / d2h  pinned host (cuMemHostAlloc) <-> cuda:0
//   tpd oneway     Call from a client on cuda:0 to a worker whose map sends cuda:0 -> cuda:1
//                  (cuda:0 -> cuda:0 with one GPU); the handler answers nothing
//   tpd echo       the same, the handler returning the tensor (back by the reverse map)
//   tpd cpu        the same size as a CPU arena tensor (the small-call comparison), and one
//                  event record + synchronize (what a CUDA call adds at least)
//   dcopy          the daemon's own time for a oneway call's copies (its Admin.Status busy_us
//                  for cuda:0 -> cuda:1, cuda:0 -> cpu with --remote), mean per call: the call's
//                  cost beyond its copies is oneway - dcopy
//   stages         where a oneway call's time goes, per size (a second table): the daemon's
//                  call_latency stages (Admin.Status), mean per call over that size's oneway
//                  calls, and the caller's own time (oneway's mean - local.total)
//   --remote       the callee on a second daemon: the staged path between nodes, beside the
//                  pinned H2D / D2H rates and the same bytes as a host tensor at every size
//                  (TensorPipe's CPU channel between the daemons, which the staged path rides);
//                  --chunk_bytes sets the daemons' [agent] cuda_chunk_bytes (0: unchunked),
//                  --channels their [agent] channels (which TensorPipe channel carries them)
//
// GB/s = bytes / p50 round trip. The torch side of B6 is bench/torch_cuda_rpc_bench.py, run
// in the same device session.
//
// The daemon runs as its own process (--tpd, default: `tpd` next to this binary), as in
// production: CUDA IPC cannot open a handle in the process that exported it.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_daemon.h"
#include "client/client.h"
#include "cuda/driver.h"

ABSL_FLAG(std::string, sizes, "0,4096,1048576,67108864,268435456", "tensor bytes, comma-separated");
ABSL_FLAG(int, iters, 30, "measured round trips per size (at least 5 for the largest)");
ABSL_FLAG(std::string, tpd, "", "the tpd binary (default: tpd next to this binary)");
ABSL_FLAG(int64_t, chunk_bytes, -1,
          "the daemons' [agent] cuda_chunk_bytes (0: staged tensors whole; -1: the default)");
ABSL_FLAG(std::string, channels, "",
          "the daemons' [agent] channels, comma-separated (empty: every one this build has)");
ABSL_FLAG(bool, remote, false,
          "put the callee on a second daemon of this host (a stand-in for a second node): the "
          "staged path, device -> pinned host -> TensorPipe -> pinned host -> device");
ABSL_FLAG(std::string, netns_b, "",
          "with --remote: run the second daemon in this network namespace (/run/netns/NAME; "
          "bench/netns_pair.sh), so the pipe is TCP as between machines");
ABSL_FLAG(std::string, host_a, "127.0.0.1", "the first daemon's peer port address");
ABSL_FLAG(std::string, host_b, "127.0.0.1", "with --remote: the second daemon's");

namespace {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

// p50 of `iters` timed runs of `once`, after 3 untimed ones, in microseconds.
template <typename F>
double TimedP50(int iters, F once) {
  std::vector<double> us;
  for (int i = 0; i < iters + 3; ++i) {
    const absl::Time start = absl::Now();
    once();
    if (i >= 3) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  return Percentile(us, 0.5);
}

int Iters(uint64_t bytes) {
  const int iters = absl::GetFlag(FLAGS_iters);
  return bytes >= (uint64_t{64} << 20) ? std::max(5, iters / 3) : iters;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);  // rows show as they are measured
  absl::StatusOr<const tpd::cuda::Driver*> loaded = tpd::cuda::Driver::Load();
  if (!loaded.ok()) {
    std::printf("no GPU: %s\n", loaded.status().ToString().c_str());
    return 0;
  }
  const tpd::cuda::Driver* driver = *loaded;
  const tpd::cuda::DriverApi& api = driver->api();
  int count = 0;
  api.device_get_count(&count);
  const int target = count >= 2 ? 1 : 0;
  std::vector<CUcontext> contexts(count);
  for (int d = 0; d < count; ++d) {
    CUdevice device;
    api.device_get(&device, d);
    api.device_primary_ctx_retain(&contexts[d], device);
  }
  if (target == 1) {
    api.ctx_set_current(contexts[0]);
    (void)api.ctx_enable_peer_access(contexts[1], 0);
    api.ctx_set_current(contexts[1]);
    (void)api.ctx_enable_peer_access(contexts[0], 0);
  }
  std::vector<uint64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    uint64_t n = 0;
    if (absl::SimpleAtoi(s, &n)) sizes.push_back(n);
  }
  const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());

  const std::string tpd_path = tpd::bench::FindTpd(absl::GetFlag(FLAGS_tpd), argv[0]);
  tpd::ClientOptions options;
  options.cuda_pool_bytes = 2 * largest + (uint64_t{16} << 20);
  options.connect_timeout = absl::Seconds(20);
  std::vector<std::unique_ptr<tpd::bench::BenchDaemon>> daemons;
  const bool remote = absl::GetFlag(FLAGS_remote);
  const int64_t chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  const std::string channels = absl::GetFlag(FLAGS_channels);
  // Between daemons the same bytes also go as a host tensor (TensorPipe's CPU channel alone,
  // what the staged path is limited by): the arena must hold the largest.
  const uint64_t arena_bytes =
      remote ? std::max<uint64_t>(uint64_t{64} << 20, 2 * largest + (uint64_t{16} << 20))
             : uint64_t{64} << 20;
  // Starts a daemon named `node` (peer port on `host`, in network namespace `netns` when set)
  // and connects a client to it.
  auto start = [&](const std::string& node, const std::string& host,
                   const std::string& netns) -> std::unique_ptr<tpd::Client> {
    char dir_pattern[] = "/tmp/tpd-cuda-bench-XXXXXX";
    const char* dir = mkdtemp(dir_pattern);
    if (dir == nullptr) return nullptr;
    std::string config = absl::StrCat(
        tpd::bench::PeerConfig(node, host, static_cast<int64_t>(arena_bytes)), "[agent]\n");
    if (chunk_bytes >= 0) absl::StrAppend(&config, "cuda_chunk_bytes = ", chunk_bytes, "\n");
    if (!channels.empty()) {
      absl::StrAppend(&config, "channels = ", tpd::bench::TomlStrings(channels), "\n");
    }
    std::unique_ptr<tpd::bench::BenchDaemon> daemon =
        tpd::bench::BenchDaemon::Start(tpd_path, dir, "tpd", config, "info", netns);
    if (daemon == nullptr) return nullptr;
    absl::StatusOr<std::unique_ptr<tpd::Client>> connected =
        tpd::Client::Connect(daemon->socket(), options);
    daemons.push_back(std::move(daemon));
    if (!connected.ok()) {
      std::fprintf(stderr, "connect %s: %s\n", daemons.back()->socket().c_str(),
                   connected.status().ToString().c_str());
      return nullptr;
    }
    return *std::move(connected);
  };
  auto stop = [&] { daemons.clear(); };
  std::unique_ptr<tpd::Client> a = start("cuda-bench", absl::GetFlag(FLAGS_host_a), "");
  std::unique_ptr<tpd::Client> b;
  if (remote) {
    b = start("cuda-bench-2", absl::GetFlag(FLAGS_host_b), absl::GetFlag(FLAGS_netns_b));
  } else if (a != nullptr) {
    b = *tpd::Client::Connect(a->socket_path(), options);
  }
  if (a == nullptr || b == nullptr) {
    stop();
    return 1;
  }
  tpd::JoinOptions join;
  join.group = "bench";
  join.init_method = absl::StrCat("tcp://", a->Status()->peer_address());
  join.name = "a";
  (*(*join.options.mutable_device_maps())["b"].mutable_devices())["cuda:0"] =
      absl::StrCat("cuda:", target);
  if (absl::Status s = a->Join(join).status(); !s.ok()) {
    std::fprintf(stderr, "join a: %s\n", s.ToString().c_str());
    return 1;
  }
  join.name = "b";
  join.options.clear_device_maps();
  if (absl::Status s = b->Join(join).status(); !s.ok()) {
    std::fprintf(stderr, "join b: %s\n", s.ToString().c_str());
    return 1;
  }
  (void)b->Handle(
      "oneway", [](const tpd::Message&) -> absl::StatusOr<tpd::Message> { return tpd::Message{}; });
  (void)b->Handle(
      "echo", [](const tpd::Message& request) -> absl::StatusOr<tpd::Message> { return request; });

  api.ctx_set_current(contexts[0]);
  CUdeviceptr src = 0, same = 0, peer = 0;
  void* pinned = nullptr;
  api.mem_alloc(&src, std::max<uint64_t>(largest, 1));
  api.mem_alloc(&same, std::max<uint64_t>(largest, 1));
  api.memset_d8(src, 7, std::max<uint64_t>(largest, 1));
  api.mem_host_alloc(&pinned, std::max<uint64_t>(largest, 1), 0);
  api.ctx_set_current(contexts[target]);
  api.mem_alloc(&peer, std::max<uint64_t>(largest, 1));
  api.ctx_set_current(contexts[0]);
  CUstream stream;
  api.stream_create(&stream, CU_STREAM_NON_BLOCKING);
  CUevent event;
  api.event_create(&event, CU_EVENT_DISABLE_TIMING);

  auto raw = [&](CUdeviceptr dst, CUdeviceptr from, uint64_t bytes) {
    return TimedP50(Iters(bytes), [&] {
      api.memcpy_async(dst, from, bytes, stream);
      api.stream_synchronize(stream);
    });
  };
  auto call = [&](const std::string& method, const std::vector<tpd::Tensor>& tensors,
                  uint64_t bytes) {
    return TimedP50(Iters(bytes), [&] {
      absl::StatusOr<tpd::Message> reply =
          a->Call("bench", "b", method, "", tensors, absl::Seconds(10));
      if (!reply.ok()) {
        std::fprintf(stderr, "%s %lu bytes: %s\n", method.c_str(),
                     static_cast<unsigned long>(bytes), reply.status().ToString().c_str());
        std::exit(1);
      }
    });
  };
  // The daemon's own time for the copies of one call (issue to completion seen, summed over
  // the call's copies by route: CudaCopyCount.busy_us), the mean over every call of `once`.
  const std::string route =
      remote ? std::string("cuda:0->cpu") : absl::StrCat("cuda:0->cuda:", target);
  auto busy_us = [&]() -> uint64_t {
    absl::StatusOr<tpd::v1::StatusResponse> status = a->Status();
    if (!status.ok()) return 0;
    for (const auto& counts : status->gpus().copies()) {
      if (counts.route() == route) return counts.busy_us();
    }
    return 0;
  };
  // Each local stage's (calls, total us) so far: a batch's mean per stage is the difference.
  using StageTotals = std::map<std::string, std::pair<uint64_t, double>>;
  auto stage_totals = [&]() {
    StageTotals totals;
    absl::StatusOr<tpd::v1::StatusResponse> status = a->Status();
    if (!status.ok()) return totals;
    for (const auto& stage : status->call_latency()) {
      totals[stage.stage()] = {stage.count(), stage.mean_us() * static_cast<double>(stage.count())};
    }
    return totals;
  };
  struct Breakdown {
    uint64_t bytes;
    double oneway_mean;
    StageTotals before, after;
  };
  std::vector<Breakdown> breakdowns;
  const double event_us = TimedP50(200, [&] {
    api.event_record(event, stream);
    api.event_synchronize(event);
  });
  std::printf("GPUs: %d, tpd maps cuda:0 -> cuda:%d%s; one event record + synchronize: %.1f us\n",
              count, target, remote ? " on a second daemon (staged)" : "", event_us);
  std::printf("%-12s %10s %10s %9s %10s %9s %10s %9s %10s %10s %9s %8s %8s\n", "bytes", "d2d_us",
              "peer_us", "peer_GB/s", "h2d_GB/s", "d2h_GB/s", "oneway_us", "GB/s", "dcopy_us",
              "echo_us", "cpu_us", "vs_peer", "vs_cpu");
  for (uint64_t bytes : sizes) {
    const double d2d = bytes > 0 ? raw(same, src, bytes) : 0;
    const double p2p = bytes > 0 ? raw(peer, src, bytes) : 0;
    const double h2d = bytes > 0 ? raw(src, reinterpret_cast<CUdeviceptr>(pinned), bytes) : 0;
    const double d2h = bytes > 0 ? raw(reinterpret_cast<CUdeviceptr>(pinned), src, bytes) : 0;
    const std::vector<tpd::Tensor> cuda = {
        tpd::Tensor::Cuda(tpd::shm::DType::kUInt8, {static_cast<int64_t>(bytes)}, src, 0)};
    const uint64_t busy_before = busy_us();
    Breakdown breakdown{bytes, 0, stage_totals(), {}};
    const absl::Time batch_start = absl::Now();
    const double oneway = call("oneway", cuda, bytes);
    breakdown.oneway_mean = absl::ToDoubleMicroseconds(absl::Now() - batch_start) /
                            static_cast<double>(Iters(bytes) + 3);
    breakdown.after = stage_totals();
    breakdowns.push_back(std::move(breakdown));
    const double copy_us =
        static_cast<double>(busy_us() - busy_before) / static_cast<double>(Iters(bytes) + 3);
    const double echo = call("echo", cuda, bytes);
    double cpu = 0;
    if (remote || bytes <= (uint64_t{16} << 20)) {
      absl::StatusOr<tpd::Tensor> arena =
          a->AllocateTensor(tpd::shm::DType::kUInt8, {static_cast<int64_t>(bytes)});
      if (arena.ok()) cpu = call("oneway", {*arena}, bytes);
    }
    auto gbps = [&](double us) { return us > 0 ? static_cast<double>(bytes) / us / 1e3 : 0.0; };
    // vs_cpu: the CUDA call's time over the same bytes' host-tensor call (1.0: moving them
    // from and to device memory costs nothing beyond the call itself).
    std::printf(
        "%-12lu %10.1f %10.1f %9.1f %10.1f %9.1f %10.1f %9.1f %10.1f %10.1f %9.1f %8.2f %8.2f\n",
        static_cast<unsigned long>(bytes), d2d, p2p, gbps(p2p), gbps(h2d), gbps(d2h), oneway,
        gbps(oneway), copy_us, echo, cpu, p2p > 0 ? p2p / oneway : 0.0,
        cpu > 0 ? oneway / cpu : 0.0);
  }
  // Remote calls pass the caller's daemon as remote.* stages, local ones as local.*.
  const std::vector<std::string> stages =
      remote
          ? std::vector<std::string>{"remote.send", "remote.wait", "remote.post", "remote.total"}
          : std::vector<std::string>{"local.deliver", "local.callee", "local.reply", "local.total"};
  std::printf(
      "where a oneway call's time goes, mean us per call (the caller's daemon's stages; "
      "caller: oneway's mean - %s)\n%-12s %10s",
      stages.back().c_str(), "bytes", "oneway");
  for (const std::string& stage : stages) std::printf(" %14s", stage.c_str());
  std::printf(" %10s\n", "caller");
  for (const Breakdown& breakdown : breakdowns) {
    std::printf("%-12lu %10.1f", static_cast<unsigned long>(breakdown.bytes),
                breakdown.oneway_mean);
    double total = 0;
    for (const std::string& stage : stages) {
      auto at = [&](const StageTotals& totals) {
        auto it = totals.find(stage);
        return it == totals.end() ? std::pair<uint64_t, double>{0, 0} : it->second;
      };
      const auto [calls_after, us_after] = at(breakdown.after);
      const auto [calls_before, us_before] = at(breakdown.before);
      const double mean =
          calls_after > calls_before
              ? (us_after - us_before) / static_cast<double>(calls_after - calls_before)
              : 0;
      std::printf(" %14.1f", mean);
      total = mean;
    }
    std::printf(" %10.1f\n", breakdown.oneway_mean - total);
  }
  absl::StatusOr<tpd::v1::StatusResponse> status = a->Status();
  if (status.ok()) {
    for (const auto& peer : status->agent().peers()) {
      std::printf("daemon pipe to %s: transport %s, channel %s\n", peer.node().c_str(),
                  peer.transport().c_str(), peer.channel().c_str());
    }
    for (const auto& route : status->gpus().copies()) {
      std::printf("daemon copies %s: %lu copies, %lu bytes\n", route.route().c_str(),
                  static_cast<unsigned long>(route.copies()),
                  static_cast<unsigned long>(route.bytes()));
    }
  }
  a.reset();
  b.reset();
  stop();
  return 0;
}
