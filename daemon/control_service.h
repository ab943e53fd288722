// tpd.v1.Control: sessions, Join/Leave/Barrier and group views for local clients, over the
// GroupManager. Streams (sessions, watches) are tracked so shutdown can end them at once.
//
// Thread safety: thread-safe; gRPC calls the handlers from its own threads.

#ifndef TPD_DAEMON_CONTROL_SERVICE_H_
#define TPD_DAEMON_CONTROL_SERVICE_H_

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/call_stats.h"
#include "daemon/config.h"
#include "daemon/group/group_manager.h"
#include "proto/control.grpc.pb.h"

namespace tpd {

class ControlService final : public v1::Control::CallbackService {
 public:
  // `groups` and `stats` must outlive the service. Requests past `limits` (names, world
  // size, option lists: daemon/control_limits.h) are refused before `groups` sees them, and
  // a session past `max_open_sessions` open at once is RESOURCE_EXHAUSTED.
  ControlService(group::GroupManager* groups, CallStats* stats, const GroupConfig& limits,
                 int64_t max_open_sessions);

  // Ends every open session and watch stream with UNAVAILABLE and `why` (shutdown, a
  // drain), so no stream holds the drain of in-flight calls for the whole grace period;
  // streams opened later end at once the same way. The first reason stays.
  void CloseStreams(std::string why = "the tpd daemon is shutting down");

  // Whether `session_id` names a session whose stream is open.
  bool SessionOpen(const std::string& session_id);
  // Ends the session `session_id` now (its members leave) and its stream with UNAVAILABLE
  // saying `why`; the session-end hook runs as for any session end. No-op when it ended.
  void EndSession(const std::string& session_id, const std::string& why);
  // Called with the id of every session that ends (stream gone, EndSession, shutdown), once,
  // from a gRPC thread, no lock held. Set before serving.
  void set_data_socket(std::string path) { data_socket_ = std::move(path); }
  void set_session_end_hook(std::function<void(const std::string&)> hook) {
    session_end_hook_ = std::move(hook);
  }

  grpc::ServerWriteReactor<v1::SessionEvent>* OpenSession(
      grpc::CallbackServerContext* context, const v1::OpenSessionRequest* request) override;
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const v1::BarrierRequest* request,
                                    v1::BarrierResponse* response) override;
  grpc::ServerUnaryReactor* UserSecret(grpc::CallbackServerContext* context,
                                       const v1::UserSecretRequest* request,
                                       v1::UserSecretResponse* response) override;
  grpc::ServerUnaryReactor* GetGroup(grpc::CallbackServerContext* context,
                                     const v1::GetGroupRequest* request,
                                     v1::GroupView* response) override;
  grpc::ServerWriteReactor<v1::GroupEvent>* WatchGroup(
      grpc::CallbackServerContext* context, const v1::WatchGroupRequest* request) override;
  grpc::ServerUnaryReactor* ListGroups(grpc::CallbackServerContext* context,
                                       const v1::ListGroupsRequest* request,
                                       v1::ListGroupsResponse* response) override;

 private:
  // Starts a unary call answered later; the returned function finishes it once.
  std::function<void(const absl::Status&)> Later(grpc::CallbackServerContext* context,
                                                 grpc::ServerUnaryReactor** reactor,
                                                 const char* method);

  group::GroupManager* const groups_;
  CallStats* const stats_;
  const GroupConfig limits_;
  const int64_t max_open_sessions_;

  absl::Mutex mu_;
  // OK while open; once CloseStreams ran, what every stream ends with.
  grpc::Status closed_status_ ABSL_GUARDED_BY(mu_);
  // Closers of the open streams.
  std::map<int64_t, std::function<void(const grpc::Status&)>> streams_ ABSL_GUARDED_BY(mu_);
  int64_t next_stream_ ABSL_GUARDED_BY(mu_) = 0;
  // Open sessions: session id -> closer of its stream.
  std::map<std::string, std::function<void(const grpc::Status&)>> sessions_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> session_end_hook_;
  std::string data_socket_;  // sent in each session's first event
};

}  // namespace tpd

#endif  // TPD_DAEMON_CONTROL_SERVICE_H_
