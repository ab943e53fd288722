// Store operations per second over etcd: tpd's EtcdStore beside a bare etcd client making the
// same etcd calls, in the same run, against the same etcd.
//
//   bazel run -c opt //bench:etcd_store_bench -- --endpoints=127.0.0.1:2379 --threads=16
//
// For each operation, T threads call it in a loop for --seconds, first through a bare gRPC
// KV stub on one channel (the baseline: what etcd and gRPC give any client), then through one
// EtcdStore (c10d semantics, deadlines, failover, waits). Each thread uses its own key under
// a fresh prefix, so adds do not conflict. The ratio is EtcdStore's rate over the baseline's.
//
//   set          Put                      EtcdStore::Set
//   get          Range                    EtcdStore::Get (the key is present: one read)
//   add          Range, then a Txn on the key's mod revision with the Put   EtcdStore::Add
//   check        Range (count only)       EtcdStore::Check
//
// Debian ships neither etcd's own benchmark tool (tools/benchmark) nor an etcdctl command
// that measures a ceiling (etcdctl check perf holds a fixed rate), so the bare stub stands in
// for "etcd's own client".

#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "store/etcd/etcd_store.h"

ABSL_FLAG(std::string, endpoints, "127.0.0.1:2379", "etcd endpoints, comma-separated");
ABSL_FLAG(int, threads, 16, "threads calling at once");
ABSL_FLAG(double, seconds, 3, "seconds per operation and client");
ABSL_FLAG(int, value_bytes, 64, "bytes per value written");
ABSL_FLAG(std::vector<std::string>, ops, std::vector<std::string>({"set", "get", "add", "check"}),
          "operations to measure");

namespace {

using etcdserverpb::KV;

// Runs `op(thread index)` on `threads` threads for `seconds`; returns calls per second. A
// failed call stops the run with its message.
double Rate(int threads, absl::Duration seconds, const std::function<bool(int)>& op) {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> calls{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> workers;
  const absl::Time start = absl::Now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      int64_t mine = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (!op(t)) {
          failed = true;
          break;
        }
        ++mine;
      }
      calls += mine;
    });
  }
  absl::SleepFor(seconds);
  stop = true;
  for (std::thread& worker : workers) worker.join();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  if (failed) std::_Exit(1);
  return calls.load() / elapsed;
}

bool Ok(const grpc::Status& status, const char* what) {
  if (status.ok()) return true;
  std::fprintf(stderr, "bare %s failed: %s\n", what, status.error_message().c_str());
  return false;
}

bool Ok(const absl::Status& status, const char* what) {
  if (status.ok()) return true;
  std::fprintf(stderr, "EtcdStore %s failed: %s\n", what, status.ToString().c_str());
  return false;
}

// The bare client's operation `op` on key `key`.
bool Bare(KV::Stub& kv, const std::string& op, const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (op == "set") {
    etcdserverpb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    etcdserverpb::PutResponse response;
    return Ok(kv.Put(&context, request, &response), "put");
  }
  etcdserverpb::RangeRequest read;
  read.set_key(key);
  if (op == "check") read.set_count_only(true);
  etcdserverpb::RangeResponse range;
  if (!Ok(kv.Range(&context, read, &range), "range")) return false;
  if (op != "add") return true;
  int64_t current = 0;
  int64_t mod_revision = 0;
  if (range.kvs_size() > 0) {
    (void)absl::SimpleAtoi(range.kvs(0).value(), &current);
    mod_revision = range.kvs(0).mod_revision();
  }
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* compare = txn.add_compare();
  compare->set_key(key);
  compare->set_target(etcdserverpb::Compare::MOD);
  compare->set_result(etcdserverpb::Compare::EQUAL);
  compare->set_mod_revision(mod_revision);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(absl::StrCat(current + 1));
  etcdserverpb::TxnResponse response;
  grpc::ClientContext txn_context;
  txn_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return Ok(kv.Txn(&txn_context, txn, &response), "txn");
}

bool Store(tpd::store::EtcdStore& store, const std::string& op, const std::string& key,
           const std::string& value) {
  if (op == "set") return Ok(store.Set(key, value), "set");
  if (op == "get") return Ok(store.Get(key, absl::Now() + absl::Seconds(10)).status(), "get");
  if (op == "add") return Ok(store.Add(key, 1).status(), "add");
  return Ok(store.Check({key}).status(), "check");
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<std::string> endpoints =
      absl::StrSplit(absl::GetFlag(FLAGS_endpoints), ',', absl::SkipEmpty());
  const int threads = absl::GetFlag(FLAGS_threads);
  const absl::Duration seconds = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  const std::string value(absl::GetFlag(FLAGS_value_bytes), 'v');
  const std::string prefix =
      absl::StrCat("/tpd-etcd-bench-", absl::Uniform<uint32_t>(absl::BitGen()));
  absl::StatusOr<std::unique_ptr<tpd::store::EtcdStore>> store =
      tpd::store::EtcdStore::Create(endpoints, prefix);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  auto kv = KV::NewStub(grpc::CreateChannel(endpoints.front(), grpc::InsecureChannelCredentials()));
  auto key = [&](int t) { return absl::StrCat("k", t); };
  // Keys hold a number for add and exist for get and check, for both clients.
  for (int t = 0; t < threads; ++t) {
    if (!Ok((*store)->Set(key(t), "0"), "set")) return 1;
  }
  std::printf("%-6s %8s %14s %16s %7s\n", "op", "threads", "bare ops/s", "EtcdStore ops/s",
              "ratio");
  for (const std::string& op : absl::GetFlag(FLAGS_ops)) {
    if (op != "set" && op != "get" && op != "add" && op != "check") {
      std::fprintf(stderr, "--ops: unknown operation %s\n", op.c_str());
      return 1;
    }
    const double bare = Rate(threads, seconds, [&](int t) {
      // The bare client's keys are the store's, as etcd sees them.
      return Bare(*kv, op, absl::StrCat(prefix, "/", key(t)), op == "set" ? value : "");
    });
    const double ours = Rate(threads, seconds, [&](int t) {
      return Store(**store, op, key(t), op == "set" ? value : "");
    });
    std::printf("%-6s %8d %14.0f %16.0f %7.2f\n", op.c_str(), threads, bare, ours, ours / bare);
    std::fflush(stdout);
  }
  return 0;
}
