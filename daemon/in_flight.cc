#include "daemon/in_flight.h"

#include <vector>

namespace tpd {

// Lives exactly as long as its call: gRPC creates one per call and destroys it at the end.
class InFlightInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit InFlightInterceptor(InFlightCalls* calls) : calls_(calls) { calls_->Begin(); }
  ~InFlightInterceptor() override { calls_->End(); }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  InFlightCalls* const calls_;
};

namespace {

class Factory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(InFlightCalls* calls) : calls_(calls) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo*) override {
    return new InFlightInterceptor(calls_);
  }

 private:
  InFlightCalls* const calls_;
};

}  // namespace

void InFlightCalls::Install(grpc::ServerBuilder* builder) {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<Factory>(this));
  builder->experimental().SetInterceptorCreators(std::move(factories));
}

void InFlightCalls::Begin() {
  absl::MutexLock lock(&mu_);
  ++count_;
}

void InFlightCalls::End() {
  absl::MutexLock lock(&mu_);
  --count_;
}

int64_t InFlightCalls::count() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

bool InFlightCalls::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

}  // namespace tpd
