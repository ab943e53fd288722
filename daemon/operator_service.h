// tpd.v1.Admin on the operator socket ([daemon] operator_socket): Status as on the clients'
// socket, and Drain, which only this service serves. Who may call it is decided by the
// socket file's mode and group (root, the daemon's user, [daemon] operator_group): a process
// that cannot open the file never reaches this service.
//
// Thread safety: thread-safe.

#ifndef TPD_DAEMON_OPERATOR_SERVICE_H_
#define TPD_DAEMON_OPERATOR_SERVICE_H_

#include <functional>

#include "absl/time/time.h"
#include "daemon/admin_service.h"
#include "daemon/drain.h"
#include "proto/admin.grpc.pb.h"

namespace tpd {

class OperatorService final : public v1::Admin::CallbackService {
 public:
  // `admin` answers Status; `drain` runs drains, `default_timeout` bounding calls in flight
  // when a request names none; `exit` stops the daemon (after a Drain with exit has been
  // answered). Pointers outlive the service.
  OperatorService(AdminService* admin, NodeDrain* drain, absl::Duration default_timeout,
                  std::function<void()> exit);

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const v1::StatusRequest* request,
                                   v1::StatusResponse* response) override;
  grpc::ServerUnaryReactor* ProbePeers(grpc::CallbackServerContext* context,
                                       const v1::ProbePeersRequest* request,
                                       v1::ProbePeersResponse* response) override;
  grpc::ServerUnaryReactor* ProbeStores(grpc::CallbackServerContext* context,
                                        const v1::ProbeStoresRequest* request,
                                        v1::ProbeStoresResponse* response) override;
  // INVALID_ARGUMENT for a timeout outside 0..1 hour; otherwise answers once drained.
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const v1::DrainRequest* request,
                                  v1::DrainResponse* response) override;

 private:
  AdminService* const admin_;
  NodeDrain* const drain_;
  const absl::Duration default_timeout_;
  const std::function<void()> exit_;
};

}  // namespace tpd

#endif  // TPD_DAEMON_OPERATOR_SERVICE_H_
