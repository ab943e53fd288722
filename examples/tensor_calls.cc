// tensor_calls: workers of one group calling each other with tensors, the program to copy.
//
// Run one process per worker, each beside its node's daemon. Every worker joins one static
// group, serves "scale" (multiplies float32 tensors by a factor), calls every other worker
// with tensors of 1 KiB to 16 MiB, checks every element of every reply, and prints a line per
// peer and size. It exits 0 only if every check passed. tools/run.sh runs four of them on two
// daemons; by hand, one process per rank, each given its node's socket:
//
//   tensor_calls --socket /run/tpd/node0/tpd.sock --init_method tcp://127.0.0.1:29400
//                --rank 0 --world_size 4
//
// It is torch.distributed.rpc's init_rpc, rpc_sync and shutdown, with the agent in the daemon.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "client/client.h"

ABSL_FLAG(std::string, socket, "", "this node's daemon; empty: $TPD_SOCKET, then the default");
ABSL_FLAG(std::string, init_method, "", "where the group meets: tcp://<a daemon's peer port>");
ABSL_FLAG(std::string, group, "example", "the group's name");
ABSL_FLAG(int, rank, 0, "this worker's rank, 0 .. world_size-1");
ABSL_FLAG(int, world_size, 2, "workers in the group, on all nodes together");
ABSL_FLAG(int, calls, 20, "timed calls to each peer with each tensor size");

namespace {

using tpd::shm::DType;

// From latency-bound to bandwidth-bound.
constexpr int64_t kSizes[] = {1 << 10, 64 << 10, 1 << 20, 16 << 20};
// Tensors this big or bigger are built in the arena (see MakeInput); copying a smaller one
// costs little next to the round trip.
constexpr int64_t kArenaFrom = 64 << 10;

absl::Span<const float> Floats(const tpd::Tensor& t) {
  return {reinterpret_cast<const float*>(t.data().data()), t.size() / sizeof(float)};
}

// Serves "scale": replies with the request's float32 tensors times the factor in its payload.
// The request's tensors are read in place in shared memory, and the results are written
// straight into the arena, so neither is copied on this side.
absl::StatusOr<tpd::Message> Scale(tpd::Client& client, const tpd::Message& request) {
  float factor;
  if (!absl::SimpleAtof(request.payload, &factor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scale: '", request.payload, "' is not a factor"));
  }
  tpd::Message reply;
  for (const tpd::Tensor& in : request.tensors) {
    if (in.dtype() != DType::kFloat32) {
      return absl::InvalidArgumentError("scale takes float32 tensors only");
    }
    absl::StatusOr<tpd::Tensor> out = client.AllocateTensor(DType::kFloat32, in.shape());
    if (!out.ok()) return out.status();
    float* y = reinterpret_cast<float*>(out->mutable_data());
    for (float x : Floats(in)) *y++ = x * factor;
    reply.tensors.push_back(*std::move(out));
  }
  return reply;
}

// A float32 tensor of `bytes` holding small integers, so that scaling them is exact and a
// reply can be checked with ==. Call copies an ordinary tensor once into the shared arena;
// from kArenaFrom bytes on we build it in the arena instead, and Call sends it where it lies.
absl::StatusOr<tpd::Tensor> MakeInput(tpd::Client& client, int64_t bytes, int seed) {
  const int64_t n = bytes / sizeof(float);
  absl::StatusOr<tpd::Tensor> tensor = tpd::Tensor(DType::kFloat32, {n}, std::string(bytes, 0));
  if (bytes >= kArenaFrom) tensor = client.AllocateTensor(DType::kFloat32, {n});
  if (!tensor.ok()) return tensor;
  float* x = reinterpret_cast<float*>(tensor->mutable_data());
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((seed + i) % 4096);
  return tensor;
}

// Calls `peer`'s "scale" `calls` times with a tensor of `bytes`, checks every element of every
// reply, and returns the median round trip (the first call also sets up the pipe between the
// daemons, which the median leaves out).
absl::StatusOr<absl::Duration> TimeScale(tpd::Client& client, const std::string& group,
                                         const std::string& peer, int64_t bytes, int seed,
                                         int calls) {
  absl::StatusOr<tpd::Tensor> made = MakeInput(client, bytes, seed);
  if (!made.ok()) return made.status();
  const tpd::Tensor& input = *made;
  std::vector<absl::Duration> round_trips;
  for (int i = 0; i < calls; ++i) {
    const float factor = i + 1;  // a different answer every call: a stale reply fails
    const absl::Time start = absl::Now();
    absl::StatusOr<tpd::Message> reply =
        client.Call(group, peer, "scale", absl::StrCat(factor), {input});
    round_trips.push_back(absl::Now() - start);
    if (!reply.ok()) return reply.status();
    if (reply->tensors.size() != 1 || reply->tensors[0].shape() != input.shape()) {
      return absl::DataLossError(absl::StrCat("call ", i, ": the reply's tensors differ"));
    }
    absl::Span<const float> x = Floats(input);
    absl::Span<const float> y = Floats(reply->tensors[0]);
    for (size_t j = 0; j < x.size(); ++j) {
      if (y[j] != x[j] * factor) {
        return absl::DataLossError(
            absl::StrFormat("call %d: element %d is %g, expected %g", i, j, y[j], x[j] * factor));
      }
    }
  }
  std::sort(round_trips.begin(), round_trips.end());
  return round_trips[round_trips.size() / 2];
}

std::string SizeText(int64_t bytes) {
  return bytes >= (1 << 20) ? absl::StrCat(bytes >> 20, " MiB") : absl::StrCat(bytes >> 10, " KiB");
}

// Calls every other member of `group` with every size, printing a line for each; returns how
// many failed.
int CallEveryOtherWorker(tpd::Client& client, const tpd::v1::GroupView& group,
                         const std::string& me, int seed, int calls) {
  std::string from;  // "worker0 (node0)": the node of each member comes with the group
  for (const tpd::v1::Member& m : group.members()) {
    if (m.name() == me) from = absl::StrCat(m.name(), " (", m.node(), ")");
  }
  int passed = 0;
  int failed = 0;
  for (const tpd::v1::Member& peer : group.members()) {
    if (peer.name() == me) continue;
    for (int64_t bytes : kSizes) {
      absl::StatusOr<absl::Duration> p50 =
          TimeScale(client, group.group(), peer.name(), bytes, seed, calls);
      const std::string line = absl::StrFormat("%s -> %s (%s)  scale %6s", from, peer.name(),
                                               peer.node(), SizeText(bytes));
      if (p50.ok()) {
        // The tensor crosses twice per round trip: in the request and in the reply.
        absl::PrintF("%s  %d calls  p50 %8.3f ms  %6.3f GB/s  exact\n", line, calls,
                     absl::ToDoubleMilliseconds(*p50),
                     2.0 * bytes / absl::ToDoubleSeconds(*p50) / 1e9);
        ++passed;
      } else {
        absl::PrintF("%s  FAILED: %s\n", line, p50.status().ToString());
        ++failed;
      }
    }
  }
  absl::PrintF("%s: %d of %d checks passed\n", from, passed, passed + failed);
  return failed;
}

// Reports the step that failed; main's exit code.
int Fail(const std::string& worker, const std::string& step, const absl::Status& status) {
  absl::FPrintF(stderr, "%s: %s: %s\n", worker, step, status.ToString());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  tpd::JoinOptions join;
  join.group = absl::GetFlag(FLAGS_group);
  join.rank = absl::GetFlag(FLAGS_rank);
  join.world_size = absl::GetFlag(FLAGS_world_size);
  join.name = absl::StrCat("worker", *join.rank);
  join.init_method = absl::GetFlag(FLAGS_init_method);
  join.timeout = absl::Seconds(60);  // for every other rank to start
  const int calls = absl::GetFlag(FLAGS_calls);

  absl::StatusOr<std::unique_ptr<tpd::Client>> connected =
      tpd::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!connected.ok()) return Fail(join.name, "connecting", connected.status());
  tpd::Client& client = **connected;

  // Serve before joining: once the group forms, the others may call at once.
  if (absl::Status s = client.Handle(
          "scale", [&client](const tpd::Message& request) { return Scale(client, request); });
      !s.ok()) {
    return Fail(join.name, "handling scale", s);
  }
  // Blocks until all world_size ranks have joined, on whichever nodes.
  absl::StatusOr<tpd::v1::JoinResponse> joined = client.Join(join);
  if (!joined.ok()) return Fail(join.name, "joining", joined.status());
  // The answer leaves the member list out (a job of N ranks would receive N² entries); the
  // group's view has it, built once per version by this node's daemon.
  absl::StatusOr<tpd::v1::GroupView> group = client.GetGroup(join.group);
  if (!group.ok()) return Fail(join.name, "reading the group", group.status());

  // tpd routes a call to a worker on this node through shared memory, and one to another
  // node through the two daemons' agents. The workers take turns, so that each timing is one
  // caller's alone rather than all of them sharing the machine; a Barrier returns once every
  // member has entered the same round, so after the last one nobody calls us any more.
  int failed = 0;
  for (int turn = 0; turn < *join.world_size; ++turn) {
    if (turn == *join.rank) {
      failed = CallEveryOtherWorker(client, *group, join.name, *join.rank, calls);
    }
    if (absl::Status s = client.Barrier(join.group, join.name, absl::Seconds(120)); !s.ok()) {
      return Fail(join.name, "waiting for the others", s);
    }
  }
  // torch's rpc.shutdown().
  if (absl::Status s = client.Leave(join.group, join.name); !s.ok()) {
    return Fail(join.name, "leaving", s);
  }
  return failed == 0 ? 0 : 1;
}
