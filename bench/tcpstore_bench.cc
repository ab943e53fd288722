// B5's baseline: c10d's TCPStore with its C++ client, measured as bench/store_bench measures
// tpd's store (bench/closed_loop.h), one client thread and connection each, 1, 8 and 64 of
// them, against a TCPStore server in this process. Not built by Bazel (it needs torch's
// headers and libraries, which only the GPU machine's pip torch has): build it there with
// bench/build_tcpstore_bench.sh, run it beside store_bench in the same call.
//
//   tcpstore_bench [seconds]
//
// Ops, as store_bench's: set (c10d's set is not acknowledged, so each op is a set followed by
// a check of the key: one round trip that sees the write done), get, add, wait (on a key that
// exists). Output: one line per op and client count, "op clients ops/s p50_us p99_us".

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "bench/closed_loop.h"

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  c10d::TCPStoreOptions server_options;
  server_options.port = 0;
  server_options.isServer = true;
  server_options.waitWorkers = false;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server_options);
  const auto port = server->getPort();
  std::printf("%-8s %7s %12s %9s %9s\n", "op", "clients", "ops/s", "p50_us", "p99_us");
  for (int clients : {1, 8, 64}) {
    std::vector<c10::intrusive_ptr<c10d::TCPStore>> stores;
    for (int i = 0; i < clients; ++i) {
      c10d::TCPStoreOptions options;
      options.port = port;
      options.isServer = false;
      options.waitWorkers = false;
      stores.push_back(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options));
    }
    const std::vector<uint8_t> value(16, 'v');
    auto print = [&](const char* op, const tpd::bench::LoopRow& row) {
      std::printf("%-8s %7d %12.0f %9.1f %9.1f\n", op, clients, row.ops_per_second, row.p50_us,
                  row.p99_us);
      std::fflush(stdout);
    };
    print("set", tpd::bench::MeasureClosedLoop(clients, seconds, [&](int i) {
            const std::string key = "key" + std::to_string(i);
            stores[i]->set(key, value);
            return stores[i]->check({key});
          }));
    print("get", tpd::bench::MeasureClosedLoop(clients, seconds, [&](int i) {
            return stores[i]->get("key" + std::to_string(i)).size() == value.size();
          }));
    print("add", tpd::bench::MeasureClosedLoop(clients, seconds, [&](int i) {
            stores[i]->add("counter", 1);
            return true;
          }));
    print("wait", tpd::bench::MeasureClosedLoop(clients, seconds, [&](int i) {
            stores[i]->wait({"key" + std::to_string(i)});
            return true;
          }));
  }
  return 0;
}
