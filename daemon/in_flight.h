// Counts the gRPC calls in flight on the daemon's server, so shutdown can drain them and
// then close at once: gRPC's own Shutdown(deadline) also waits for idle client connections
// to go away, which would hold every SIGTERM for the whole grace period.
//
// Thread safety: thread-safe. The interceptors it creates run on gRPC's threads.

#ifndef TPD_DAEMON_IN_FLIGHT_H_
#define TPD_DAEMON_IN_FLIGHT_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/server_interceptor.h"

namespace tpd {

class InFlightCalls {
 public:
  // Counts every call of the server `builder` builds, from its start until gRPC destroys
  // it. The server must not outlive this object.
  void Install(grpc::ServerBuilder* builder);

  int64_t count() const;

  // Blocks until no call is in flight or `deadline` passes; true when idle.
  bool WaitIdle(absl::Time deadline);

 private:
  friend class InFlightInterceptor;
  void Begin();
  void End();

  mutable absl::Mutex mu_;
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tpd

#endif  // TPD_DAEMON_IN_FLIGHT_H_
