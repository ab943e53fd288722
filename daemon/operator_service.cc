#include "daemon/operator_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/logging.h"

namespace tpd {
namespace {

constexpr int64_t kMaxDrainTimeoutMs = 3600 * 1000;

// Runs `after` once gRPC is done with the call: its answer has been sent.
class AnswerThen final : public grpc::ServerUnaryReactor {
 public:
  explicit AnswerThen(std::function<void()> after) : after_(std::move(after)) {}
  void OnDone() override {
    if (after_) after_();
    delete this;
  }

 private:
  const std::function<void()> after_;
};

}  // namespace

OperatorService::OperatorService(AdminService* admin, NodeDrain* drain,
                                 absl::Duration default_timeout, std::function<void()> exit)
    : admin_(admin), drain_(drain), default_timeout_(default_timeout), exit_(std::move(exit)) {}

grpc::ServerUnaryReactor* OperatorService::Status(grpc::CallbackServerContext* context,
                                                  const v1::StatusRequest*,
                                                  v1::StatusResponse* response) {
  admin_->Fill(response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* OperatorService::ProbePeers(grpc::CallbackServerContext* context,
                                                      const v1::ProbePeersRequest*,
                                                      v1::ProbePeersResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  admin_->Probe([reactor, response](const v1::ProbePeersResponse& answer) {
    *response = answer;
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* OperatorService::ProbeStores(grpc::CallbackServerContext* context,
                                                       const v1::ProbeStoresRequest*,
                                                       v1::ProbeStoresResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  admin_->ProbeStoreClusters([reactor, response](const v1::ProbeStoresResponse& answer) {
    *response = answer;
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* OperatorService::Drain(grpc::CallbackServerContext*,
                                                 const v1::DrainRequest* request,
                                                 v1::DrainResponse* response) {
  const bool exit = request->exit();
  auto* reactor = new AnswerThen(exit ? exit_ : nullptr);
  if (request->timeout_ms() < 0 || request->timeout_ms() > kMaxDrainTimeoutMs) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("DrainRequest.timeout_ms must be 0 ([daemon] shutdown_grace_ms) .. ",
                     kMaxDrainTimeoutMs, " (1 hour), got ", request->timeout_ms())));
    return reactor;
  }
  const absl::Duration timeout =
      request->timeout_ms() == 0 ? default_timeout_ : absl::Milliseconds(request->timeout_ms());
  drain_->Request("Admin.Drain", timeout, [reactor, response, exit](const v1::DrainStatus& s) {
    *response->mutable_drain() = s;
    if (exit) DaemonLog().info("[drain] exiting, as the drain request asked");
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace tpd
