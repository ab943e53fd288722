// The one place where absl::Status becomes grpc::Status at the service edge.

#ifndef TPD_DAEMON_GRPC_STATUS_H_
#define TPD_DAEMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tpd {

// The canonical codes of absl and gRPC share their numbering, so the code carries over
// unchanged; the message is kept whole.
inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace tpd

#endif  // TPD_DAEMON_GRPC_STATUS_H_
