// The empty unary call the benchmarks put beside their rows: grpc.health.v1 Check over a unix
// socket, each caller on a connection of its own (a shared channel would put every caller on
// one connection and measure its queue).
//
// Thread safety: a stub may be used from any thread.

#ifndef TPD_BENCH_HEALTH_CHECK_H_
#define TPD_BENCH_HEALTH_CHECK_H_

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"

namespace tpd::bench {

// A channel of its own to the unix socket at `path`.
inline std::shared_ptr<grpc::Channel> OwnChannel(const std::string& path) {
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  return grpc::CreateCustomChannel(absl::StrCat("unix:", path), grpc::InsecureChannelCredentials(),
                                   args);
}

inline std::unique_ptr<grpc::health::v1::Health::Stub> OwnHealthStub(const std::string& path) {
  return grpc::health::v1::Health::NewStub(OwnChannel(path));
}

// One empty Check; false when it failed.
inline bool CheckHealth(grpc::health::v1::Health::Stub& stub) {
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  return stub.Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok();
}

}  // namespace tpd::bench

#endif  // TPD_BENCH_HEALTH_CHECK_H_
