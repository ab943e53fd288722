#include "daemon/control_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/control_limits.h"
#include "daemon/grpc_status.h"
#include "daemon/logging.h"
#include "daemon/router/session_handle.h"
#include "daemon/stream_reactor.h"

namespace tpd {
namespace {

// Feeds a tracker's events into a watch stream.
class WatchSink : public group::GroupWatcher {
 public:
  explicit WatchSink(std::shared_ptr<StreamSink<v1::GroupEvent>> sink) : sink_(std::move(sink)) {}
  void OnEvent(const v1::GroupEvent& event) override { sink_->Send(event); }

 private:
  std::shared_ptr<StreamSink<v1::GroupEvent>> sink_;
};

// UserSecretRequest.purpose: a label, not data.
constexpr size_t kMaxUserSecretPurposeBytes = 256;

}  // namespace

ControlService::ControlService(group::GroupManager* groups, CallStats* stats,
                               const GroupConfig& limits, int64_t max_open_sessions)
    : groups_(groups), stats_(stats), limits_(limits), max_open_sessions_(max_open_sessions) {}

void ControlService::CloseStreams(std::string why) {
  std::map<int64_t, std::function<void(const grpc::Status&)>> streams;
  grpc::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (closed_status_.ok()) {
      closed_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, std::move(why));
    }
    status = closed_status_;
    streams = std::move(streams_);
  }
  for (auto& [id, close] : streams) close(status);
}

bool ControlService::SessionOpen(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  return sessions_.count(session_id) != 0;
}

void ControlService::EndSession(const std::string& session_id, const std::string& why) {
  std::function<void(const grpc::Status&)> close;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    close = it->second;
  }
  // Members leave now, not when the client notices its stream ended.
  groups_->EndSession(session_id);
  close(grpc::Status(grpc::StatusCode::UNAVAILABLE, why));
}

std::function<void(const absl::Status&)> ControlService::Later(grpc::CallbackServerContext* context,
                                                               grpc::ServerUnaryReactor** reactor,
                                                               const char* method) {
  *reactor = context->DefaultReactor();
  grpc::ServerUnaryReactor* r = *reactor;
  return [r, method, stats = stats_](const absl::Status& status) {
    stats->Record(method, status);
    r->Finish(ToGrpcStatus(status));
  };
}

grpc::ServerWriteReactor<v1::SessionEvent>* ControlService::OpenSession(
    grpc::CallbackServerContext* context, const v1::OpenSessionRequest* request) {
  auto sink = std::make_shared<StreamSink<v1::SessionEvent>>();
  // Free text from the client: cut and escaped before it reaches logs and status.
  const std::string client =
      ClientDescription(request->client().empty() ? context->peer() : request->client());
  {
    absl::MutexLock lock(&mu_);
    if (closed_status_.ok() && static_cast<int64_t>(sessions_.size()) >= max_open_sessions_) {
      const absl::Status full = absl::ResourceExhaustedError(absl::StrCat(
          "data.max_open_sessions (", max_open_sessions_,
          ") sessions are open on this daemon; end some of them or raise the setting"));
      stats_->Record("OpenSession", full);
      auto* refused = new StreamReactor<v1::SessionEvent>(sink, nullptr, nullptr);
      sink->Close(ToGrpcStatus(full));
      return refused;
    }
  }
  const std::string id = groups_->OpenSession(client);
  const std::string handle = SessionHandle(id);
  int64_t stream;
  bool closed;
  grpc::Status closed_status;
  {
    absl::MutexLock lock(&mu_);
    closed = !closed_status_.ok();
    closed_status = closed_status_;
    stream = next_stream_++;
    if (!closed) {
      streams_[stream] = [sink](const grpc::Status& status) { sink->Close(status); };
      sessions_[id] = [sink](const grpc::Status& status) { sink->Close(status); };
    }
  }
  group::GroupManager* groups = groups_;
  // Runs once per session: when the stream is cancelled, and again (a no-op) when it is done.
  auto end = [this, groups, id] {
    groups->EndSession(id);
    bool ended;
    {
      absl::MutexLock lock(&mu_);
      ended = sessions_.erase(id) != 0;
    }
    if (ended && session_end_hook_) session_end_hook_(id);
  };
  auto* reactor =
      new StreamReactor<v1::SessionEvent>(sink, end, [this, end, handle, stream, client] {
        end();
        DaemonLog().info("[session {}] ended ({})", handle, client);
        absl::MutexLock lock(&mu_);
        streams_.erase(stream);
      });
  DaemonLog().info("[session {}] opened by {}", handle, client);
  v1::SessionEvent event;
  event.set_session_id(id);
  event.set_data_socket(data_socket_);
  event.set_session_handle(handle);
  sink->Send(std::move(event));
  if (closed) sink->Close(closed_status);
  stats_->Record("OpenSession", absl::OkStatus());
  return reactor;
}

namespace {

// A Join that may wait for a long time: when its client goes away (or its deadline passes)
// the join is withdrawn instead of leaving a member nobody waits for. The group answers the
// join exactly once (CANCELLED when withdrawn), which is what finishes the call.
class JoinReactor final : public grpc::ServerUnaryReactor {
 public:
  JoinReactor(group::GroupManager* groups, v1::JoinRequest request)
      : groups_(groups), request_(std::move(request)) {}
  void OnCancel() override { groups_->CancelJoin(request_); }
  void OnDone() override { delete this; }

 private:
  group::GroupManager* const groups_;
  const v1::JoinRequest request_;
};

}  // namespace

grpc::ServerUnaryReactor* ControlService::Join(grpc::CallbackServerContext* context,
                                               const v1::JoinRequest* request,
                                               v1::JoinResponse* response) {
  // Refused before the request is copied or any store is looked up.
  if (absl::Status checked = CheckJoinRequest(*request, limits_); !checked.ok()) {
    grpc::ServerUnaryReactor* reactor;
    Later(context, &reactor, "Join")(checked);
    return reactor;
  }
  auto* reactor = new JoinReactor(groups_, *request);
  groups_->Join(*request,
                [reactor, response, stats = stats_](absl::StatusOr<v1::JoinResponse> result) {
                  if (result.ok()) *response = *std::move(result);
                  stats->Record("Join", result.status());
                  reactor->Finish(ToGrpcStatus(result.status()));
                });
  return reactor;
}

grpc::ServerUnaryReactor* ControlService::Leave(grpc::CallbackServerContext* context,
                                                const v1::LeaveRequest* request,
                                                v1::LeaveResponse* response) {
  grpc::ServerUnaryReactor* reactor;
  auto finish = Later(context, &reactor, "Leave");
  if (absl::Status checked = CheckLeaveRequest(*request); !checked.ok()) {
    finish(checked);
    return reactor;
  }
  groups_->Leave(*request, [finish, response](absl::StatusOr<int64_t> version) {
    if (version.ok()) response->set_version(*version);
    finish(version.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* ControlService::Barrier(grpc::CallbackServerContext* context,
                                                  const v1::BarrierRequest* request,
                                                  v1::BarrierResponse* response) {
  grpc::ServerUnaryReactor* reactor;
  auto finish = Later(context, &reactor, "Barrier");
  if (absl::Status checked = CheckBarrierRequest(*request); !checked.ok()) {
    finish(checked);
    return reactor;
  }
  groups_->Barrier(*request, [finish, response](absl::StatusOr<std::vector<std::string>> gone) {
    if (gone.ok()) {
      for (std::string& name : *gone) response->add_gone(std::move(name));
    }
    finish(gone.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* ControlService::UserSecret(grpc::CallbackServerContext* context,
                                                     const v1::UserSecretRequest* request,
                                                     v1::UserSecretResponse* response) {
  grpc::ServerUnaryReactor* reactor;
  auto finish = Later(context, &reactor, "UserSecret");
  if (request->purpose().size() > kMaxUserSecretPurposeBytes) {
    finish(absl::InvalidArgumentError(
        absl::StrCat("UserSecretRequest.purpose is ", request->purpose().size(),
                     " bytes; the limit is ", kMaxUserSecretPurposeBytes)));
    return reactor;
  }
  absl::StatusOr<std::string> secret =
      groups_->UserSecret(request->session_id(), request->purpose());
  if (secret.ok()) response->set_secret(*std::move(secret));
  finish(secret.status());
  return reactor;
}

grpc::ServerUnaryReactor* ControlService::GetGroup(grpc::CallbackServerContext* context,
                                                   const v1::GetGroupRequest* request,
                                                   v1::GroupView* response) {
  grpc::ServerUnaryReactor* reactor;
  auto finish = Later(context, &reactor, "GetGroup");
  if (absl::Status checked =
          CheckGroupLookup("GetGroupRequest", request->group(), request->init_method());
      !checked.ok()) {
    finish(checked);
    return reactor;
  }
  groups_->GetGroup(request->group(), request->init_method(),
                    [finish, response](absl::StatusOr<v1::GroupView> view) {
                      if (view.ok()) *response = *std::move(view);
                      finish(view.status());
                    });
  return reactor;
}

grpc::ServerWriteReactor<v1::GroupEvent>* ControlService::WatchGroup(
    grpc::CallbackServerContext* context, const v1::WatchGroupRequest* request) {
  if (absl::Status checked =
          CheckGroupLookup("WatchGroupRequest", request->group(), request->init_method());
      !checked.ok()) {
    auto sink = std::make_shared<StreamSink<v1::GroupEvent>>();
    auto* reactor = new StreamReactor<v1::GroupEvent>(sink, nullptr, nullptr);
    stats_->Record("WatchGroup", checked);
    sink->Close(ToGrpcStatus(checked));
    return reactor;
  }
  auto sink = std::make_shared<StreamSink<v1::GroupEvent>>();
  absl::StatusOr<std::shared_ptr<group::GroupTracker>> tracker =
      groups_->Tracker(request->group(), request->init_method());
  std::shared_ptr<group::GroupWatcher> watcher;
  int64_t stream = -1;
  bool closed = false;
  grpc::Status closed_status;
  if (tracker.ok()) {
    watcher = std::make_shared<WatchSink>(sink);
    absl::MutexLock lock(&mu_);
    closed = !closed_status_.ok();
    closed_status = closed_status_;
    stream = next_stream_++;
    if (!closed) {
      streams_[stream] = [sink](const grpc::Status& status) { sink->Close(status); };
    }
  }
  auto* reactor =
      new StreamReactor<v1::GroupEvent>(sink, nullptr, [this, tracker, watcher, stream] {
        if (watcher != nullptr) (*tracker)->RemoveWatcher(watcher);
        absl::MutexLock lock(&mu_);
        streams_.erase(stream);
      });
  stats_->Record("WatchGroup", tracker.status());
  if (!tracker.ok()) {
    sink->Close(ToGrpcStatus(tracker.status()));
  } else if (closed) {
    sink->Close(closed_status);
  } else {
    (*tracker)->AddWatcher(watcher);
  }
  (void)context;
  return reactor;
}

grpc::ServerUnaryReactor* ControlService::ListGroups(grpc::CallbackServerContext* context,
                                                     const v1::ListGroupsRequest*,
                                                     v1::ListGroupsResponse* response) {
  grpc::ServerUnaryReactor* reactor;
  auto finish = Later(context, &reactor, "ListGroups");
  for (v1::GroupView& view : groups_->ListGroups()) *response->add_groups() = std::move(view);
  finish(absl::OkStatus());
  return reactor;
}

}  // namespace tpd
