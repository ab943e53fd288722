// Tier B1 (raw TensorPipe) and the agent's overhead over it, in the same run: for each
// transport/channel pair, a minimal TensorPipe pipe ping-pong beside the Agent's
// request/response over the same transport and channel.
//
//   bazel run -c opt //bench:agent_bench -- [--pairs=uv+basic,shm+cma] [--scale=1]
//
// Both sides live in this process (two TensorPipe contexts, or two agents), as two daemons on
// one host would, sharing its cores. Each row is a closed loop of one call at a time:
//   latency   an empty message there and an empty answer back (raw: no metadata; agent: its
//             header and the pipe's authentication done beforehand);
//   bandwidth one tensor of SIZE there (into a buffer allocated once, on both paths), an empty
//             answer back; GB/s = SIZE / median round trip (1e9 bytes/s, payload counted
//             once; the median, because a shared machine's stalls swing the mean).
// Raw and agent alternate in blocks after a warm-up, so drift hits both alike. Ratios:
// agent p50 / raw p50 (latency, 1.00 = no overhead) and agent GB/s / raw GB/s.

#include <tensorpipe/tensorpipe.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/agent.h"
#include "agent/registry.h"
#include "bench/raw_pipe.h"

ABSL_FLAG(std::string, pairs, "uv+basic,uv+mpt_uv,shm+basic,shm+cma",
          "transport+channel pairs to measure (shm rows bootstrap on uv, as daemons do)");
ABSL_FLAG(double, scale, 1.0, "multiplies every row's iteration count");
ABSL_FLAG(int, mpt_lanes, 4, "lanes of mpt_uv");

namespace {

using tpd::agent::Agent;
using tpd::agent::AgentOptions;
using tpd::agent::Buffer;
using tpd::agent::Destination;
using tpd::agent::Handler;
using tpd::agent::InboundRequest;
using tpd::agent::Message;
using tpd::agent::PeerId;
using tpd::bench::RawContext;
using tpd::bench::RawRoundTrip;
using tpd::bench::RawServer;

constexpr absl::Duration kCallTimeout = absl::Seconds(60);

struct Sample {
  std::vector<double> us;  // round trips
};

struct Stats {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};

Stats Summarize(std::vector<double> us) {
  Stats s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) { return us[static_cast<size_t>(p * (us.size() - 1))]; };
  s.p50 = pct(0.50);
  s.p90 = pct(0.90);
  s.p99 = pct(0.99);
  double sum = 0;
  for (double v : us) sum += v;
  s.mean = sum / us.size();
  return s;
}

// ---------------------------------------------------------------------------------------------
// The agent: a handler that places the tensor in a buffer allocated once and answers empty.

AgentOptions Options(const std::string& id, const std::string& transport,
                     const std::string& channel) {
  AgentOptions options;
  options.id = id;
  options.cluster_token = "bench-token";
  options.transports =
      transport == "shm" ? std::vector<std::string>{"uv", "shm"} : std::vector<std::string>{"uv"};
  options.channels = {channel};
  options.mpt_lanes = absl::GetFlag(FLAGS_mpt_lanes);
  return options;
}

bool AgentRoundTrip(Agent& agent, const PeerId& peer, char* data, size_t size) {
  Message message;
  message.header.set_method("bench");
  message.header.set_group("bench");
  message.header.set_source_worker("client");
  message.header.set_target_worker("server");
  if (size > 0) {
    auto* tensor = message.header.add_tensors();
    tensor->set_dtype("uint8");
    tensor->add_shape(static_cast<int64_t>(size));
    tensor->set_device("cpu");
    message.tensors.push_back(Buffer{data, size});
  }
  absl::Notification done;
  bool ok = false;
  agent.Send(peer, std::move(message), absl::Now() + kCallTimeout,
             [&](absl::StatusOr<Message> reply) {
               ok = reply.ok();
               if (!ok)
                 std::fprintf(stderr, "call failed: %s\n", reply.status().ToString().c_str());
               done.Notify();
             });
  done.WaitForNotification();
  return ok;
}

// ---------------------------------------------------------------------------------------------

struct Row {
  std::string pair;
  size_t size;
  Stats raw;
  Stats agent;
};

std::string SizeName(size_t size) {
  if (size == 0) return "0 B";
  if (size % (1 << 20) == 0) return absl::StrCat(size >> 20, " MiB");
  if (size % (1 << 10) == 0) return absl::StrCat(size >> 10, " KiB");
  return absl::StrCat(size, " B");
}

int Iterations(size_t size) {
  int n = size == 0           ? 3000
          : size <= 65536     ? 1500
          : size <= (1 << 20) ? 300
          : size <= (8 << 20) ? 60
                              : 12;
  return std::max(4, static_cast<int>(n * absl::GetFlag(FLAGS_scale)));
}

bool MeasurePair(const std::string& transport, const std::string& channel,
                 const std::vector<size_t>& sizes, std::vector<Row>* rows) {
  const size_t max_size = *std::max_element(sizes.begin(), sizes.end());
  std::vector<char> data(std::max<size_t>(max_size, 1));
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131);

  // Raw pipe.
  auto server_context =
      RawContext(transport, channel, absl::GetFlag(FLAGS_mpt_lanes), "raw-server");
  auto client_context =
      RawContext(transport, channel, absl::GetFlag(FLAGS_mpt_lanes), "raw-client");
  auto server = std::make_unique<RawServer>(*server_context, transport == "shm", max_size);
  std::shared_ptr<tensorpipe::Pipe> pipe = client_context->connect(server->url());

  // Agents.
  auto server_agent = Agent::Create(Options("bench-server", transport, channel));
  auto client_agent = Agent::Create(Options("bench-client", transport, channel));
  if (!server_agent.ok() || !client_agent.ok()) {
    std::fprintf(stderr, "%s+%s: cannot create agents: %s %s\n", transport.c_str(), channel.c_str(),
                 server_agent.status().ToString().c_str(),
                 client_agent.status().ToString().c_str());
    return false;
  }
  Agent* server_raw = server_agent->get();
  auto inbox = std::make_shared<std::vector<char>>(std::max<size_t>(max_size, 1));
  (*server_agent)
      ->SetHandler(
          Handler{[inbox](const tpd::v1::AgentMessage&, size_t payload,
                          absl::Span<const size_t> tensors) -> absl::StatusOr<Destination> {
                    Destination d;
                    d.payload = payload > 0 ? inbox->data() : nullptr;
                    for (size_t i = 0; i < tensors.size(); ++i) d.tensors.push_back(inbox->data());
                    return d;
                  },
                  [server_raw](InboundRequest request) {
                    server_raw->Respond(request.reply_to, Message{});
                  }});
  const PeerId peer{(*server_agent)->id(), (*server_agent)->address()};

  // Warm-up: opens and authenticates the pipes, and faults in the buffers.
  for (int i = 0; i < 50; ++i) {
    if (!RawRoundTrip(*pipe, data.data(), std::min<size_t>(max_size, 1 << 20)) ||
        !AgentRoundTrip(**client_agent, peer, data.data(), std::min<size_t>(max_size, 1 << 20))) {
      std::fprintf(stderr, "%s+%s: warm-up failed\n", transport.c_str(), channel.c_str());
      return false;
    }
  }
  const auto stats = (*client_agent)->Stats();
  if (!stats.peers.empty()) {
    std::fprintf(stderr, "%s+%s: agent pipe uses %s + %s\n", transport.c_str(), channel.c_str(),
                 stats.peers[0].transport.c_str(), stats.peers[0].channel.c_str());
  }

  for (size_t size : sizes) {
    const int iterations = Iterations(size);
    std::vector<double> raw_us;
    std::vector<double> agent_us;
    for (int i = 0; i < std::min(iterations, 20); ++i) {  // per-size warm-up
      RawRoundTrip(*pipe, data.data(), size);
      AgentRoundTrip(**client_agent, peer, data.data(), size);
    }
    constexpr int kBlocks = 4;
    for (int block = 0; block < kBlocks; ++block) {
      for (int i = 0; i < iterations / kBlocks; ++i) {
        const absl::Time t0 = absl::Now();
        if (!RawRoundTrip(*pipe, data.data(), size)) return false;
        raw_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      }
      for (int i = 0; i < iterations / kBlocks; ++i) {
        const absl::Time t0 = absl::Now();
        if (!AgentRoundTrip(**client_agent, peer, data.data(), size)) return false;
        agent_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      }
    }
    rows->push_back(
        {absl::StrCat(transport, "+", channel), size, Summarize(raw_us), Summarize(agent_us)});
    const Row& row = rows->back();
    std::fprintf(stderr, "  %s %s: raw p50 %.1f us, agent p50 %.1f us\n", row.pair.c_str(),
                 SizeName(size).c_str(), row.raw.p50, row.agent.p50);
  }

  pipe->close();
  server.reset();
  client_agent->reset();
  server_agent->reset();
  client_context->close();
  server_context->close();
  client_context->join();
  server_context->join();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<size_t> sizes = {0, 4 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20};
  std::vector<Row> rows;
  for (absl::string_view pair : absl::StrSplit(absl::GetFlag(FLAGS_pairs), ',')) {
    std::vector<std::string> parts = absl::StrSplit(pair, '+');
    if (parts.size() != 2) {
      std::fprintf(stderr, "bad pair \"%s\" (want transport+channel)\n", std::string(pair).c_str());
      return 2;
    }
    if (!MeasurePair(parts[0], parts[1], sizes, &rows)) return 1;
  }
  std::printf(
      "| pair | size | raw p50 µs | raw p90 | raw p99 | agent p50 µs | agent p90 | agent p99 | "
      "raw GB/s | agent GB/s | agent/raw p50 | agent/raw GB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  auto number = [](bool show, double value) {
    if (!show) return std::string("-");
    char text[32];
    std::snprintf(text, sizeof(text), "%.2f", value);
    return std::string(text);
  };
  for (const Row& row : rows) {
    const bool bandwidth = row.size > 0;
    const double raw_gbps = bandwidth ? row.size / (row.raw.p50 * 1e3) : 0;
    const double agent_gbps = bandwidth ? row.size / (row.agent.p50 * 1e3) : 0;
    std::printf("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %s | %.2f | %s |\n",
                row.pair.c_str(), SizeName(row.size).c_str(), row.raw.p50, row.raw.p90, row.raw.p99,
                row.agent.p50, row.agent.p90, row.agent.p99, number(bandwidth, raw_gbps).c_str(),
                number(bandwidth, agent_gbps).c_str(), row.agent.p50 / row.raw.p50,
                number(bandwidth, agent_gbps / raw_gbps).c_str());
  }
  return 0;
}
