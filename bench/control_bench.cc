// B4: the control plane. Unary gRPC calls over the daemon's unix socket from 1, 16 and 64
// concurrent clients, beside a raw round trip over unix stream sockets measured in the same
// run at the same concurrency (the target: a control call ≤ 3× the raw socket round trip).
//
//   bazel run -c opt //bench:control_bench -- [--seconds=2]
//
// Rows, each at every concurrency, every client its own connection and thread calling in a
// closed loop (bench/closed_loop.h):
//   uds        1 byte there and back over a socketpair, echoed by a thread of its own per
//              client (the baseline);
//   bare       grpc.health.v1 Check on a gRPC server of this process with nothing else on it
//              (a socket of its own, default options): gRPC's own floor;
//   health     the same Check on the daemon's socket: the daemon's gRPC server, no tpd code;
//   get_group  Control.GetGroup of a group of one member (tpd::Client::GetGroup);
//   status     Admin.Status (what `tpctl status` and grpcurl read).
// Columns: ops/s, p50 and p99 latency, and p50 over the baseline's p50.
//
// The control service listens only on the unix socket: the peer port serves MAC-checked peer
// store calls, not control calls, so B4's TCP half has no tpd row here.

#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/closed_loop.h"
#include "bench/health_check.h"
#include "client/client.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"
#include "proto/admin.grpc.pb.h"

ABSL_FLAG(double, seconds, 2.0, "measured seconds per row (after a 0.3 s warm-up)");

namespace {

// Per client, a socketpair whose far end a thread echoes until the near end closes.
class Echoes {
 public:
  explicit Echoes(int clients) {
    for (int i = 0; i < clients; ++i) {
      int fds[2];
      if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
        std::perror("socketpair");
        std::exit(1);
      }
      near_.push_back(fds[0]);
      threads_.emplace_back([far = fds[1]] {
        char byte;
        while (read(far, &byte, 1) == 1 && write(far, &byte, 1) == 1) {
        }
        close(far);
      });
    }
  }
  ~Echoes() {
    for (int fd : near_) close(fd);
    for (std::thread& thread : threads_) thread.join();
  }

  bool RoundTrip(int i) const {
    char byte = 1;
    return write(near_[i], &byte, 1) == 1 && read(near_[i], &byte, 1) == 1;
  }

 private:
  std::vector<int> near_;
  std::vector<std::thread> threads_;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  char dir_pattern[] = "/tmp/tpd-bench-XXXXXX";
  const char* dir = mkdtemp(dir_pattern);
  if (dir == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  tpd::Config config;
  config.socket_path = absl::StrCat(dir, "/tpd.sock");
  config.data.max_sessions_per_uid = 128;
  // A peer port, for the tcp:// rendezvous of the group GetGroup reads.
  config.peer.listen_address = "127.0.0.1:0";
  config.peer.token = "bench";
  absl::StatusOr<std::unique_ptr<tpd::Daemon>> daemon = tpd::Daemon::Start(config);
  if (!daemon.ok()) {
    std::fprintf(stderr, "cannot start daemon: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  // The group GetGroup reads: one member, held by a client that stays for the whole run.
  std::unique_ptr<tpd::Client> member = *tpd::Client::Connect(config.socket_path);
  tpd::JoinOptions join;
  join.group = "b4";
  join.name = "w0";
  join.rank = 0;
  join.world_size = 1;
  join.init_method = absl::StrCat("tcp://", member->Status()->peer_address());
  if (absl::StatusOr<tpd::v1::JoinResponse> joined = member->Join(join); !joined.ok()) {
    std::fprintf(stderr, "cannot join group b4: %s\n", joined.status().ToString().c_str());
    return 1;
  }

  // gRPC with nothing of tpd's: its default health service alone on a socket of its own.
  const std::string bare_socket = absl::StrCat(config.socket_path, ".bare");
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder bare_builder;
  bare_builder.AddListeningPort(absl::StrCat("unix:", bare_socket),
                                grpc::InsecureServerCredentials());
  std::unique_ptr<grpc::Server> bare_server = bare_builder.BuildAndStart();
  if (bare_server == nullptr) {
    std::fprintf(stderr, "cannot start the bare gRPC server on %s\n", bare_socket.c_str());
    return 1;
  }

  std::printf("%-10s %7s %12s %9s %9s %12s\n", "row", "clients", "ops/s", "p50_us", "p99_us",
              "p50_vs_uds");
  const double seconds = absl::GetFlag(FLAGS_seconds);
  for (int clients : {1, 16, 64}) {
    std::vector<std::unique_ptr<tpd::Client>> users;
    std::vector<std::unique_ptr<grpc::health::v1::Health::Stub>> health;
    std::vector<std::unique_ptr<tpd::v1::Admin::Stub>> admin;
    std::vector<std::unique_ptr<grpc::health::v1::Health::Stub>> bare;
    for (int i = 0; i < clients; ++i) {
      users.push_back(*tpd::Client::Connect(config.socket_path));
      std::shared_ptr<grpc::Channel> channel = tpd::bench::OwnChannel(config.socket_path);
      health.push_back(grpc::health::v1::Health::NewStub(channel));
      admin.push_back(tpd::v1::Admin::NewStub(channel));
      bare.push_back(tpd::bench::OwnHealthStub(bare_socket));
    }
    tpd::bench::LoopRow baseline;
    {
      Echoes echoes(clients);
      baseline = tpd::bench::MeasureClosedLoop(clients, seconds,
                                               [&](int i) { return echoes.RoundTrip(i); });
    }
    auto print = [&](const char* row, const tpd::bench::LoopRow& r) {
      std::printf("%-10s %7d %12.0f %9.1f %9.1f %12.2f\n", row, clients, r.ops_per_second, r.p50_us,
                  r.p99_us, r.p50_us / baseline.p50_us);
      std::fflush(stdout);
    };
    print("uds", baseline);
    print("bare", tpd::bench::MeasureClosedLoop(
                      clients, seconds, [&](int i) { return tpd::bench::CheckHealth(*bare[i]); }));
    print("health", tpd::bench::MeasureClosedLoop(clients, seconds, [&](int i) {
            return tpd::bench::CheckHealth(*health[i]);
          }));
    print("get_group", tpd::bench::MeasureClosedLoop(
                           clients, seconds, [&](int i) { return users[i]->GetGroup("b4").ok(); }));
    print("status", tpd::bench::MeasureClosedLoop(clients, seconds, [&](int i) {
            grpc::ClientContext context;
            tpd::v1::StatusResponse response;
            return admin[i]->Status(&context, tpd::v1::StatusRequest(), &response).ok();
          }));
  }
  member.reset();
  bare_server->Shutdown();
  (*daemon)->Shutdown();
  return 0;
}
