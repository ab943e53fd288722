// CallEngine: the facade over calls_internal::Engine (client/engine.h).

#include "client/calls.h"

#include "client/engine.h"

namespace tpd {

CallEngine::CallEngine(std::shared_ptr<const shm::Segment> segment, int handler_threads,
                       int notice_fd)
    : engine_(std::make_shared<calls_internal::Engine>(std::move(segment), handler_threads,
                                                       notice_fd)) {}

// Responders and pending replies hold the engine only for the moment they answer; when this
// is the last hold and one of the engine's own threads drops it, the engine stops elsewhere.
CallEngine::~CallEngine() { calls_internal::ReleaseEngine(std::move(engine_)); }

void CallEngine::Handle(const std::string& method, Handler handler) {
  engine_->Handle(method, std::move(handler));
}

void CallEngine::HandleDeferred(const std::string& method, DeferredHandler handler) {
  engine_->HandleDeferred(method, std::move(handler));
}

void CallEngine::EnsureHandlerThreads(int threads) { engine_->EnsureHandlerThreads(threads); }

void CallEngine::Break(const absl::Status& why) { engine_->Break(why); }

absl::Status CallEngine::LendDevicePool(int device, uint64_t bytes) {
  return engine_->LendDevicePool(device, bytes);
}

absl::StatusOr<Tensor> CallEngine::AllocateTensor(shm::DType dtype, std::vector<int64_t> shape) {
  return engine_->AllocateTensor(dtype, std::move(shape));
}

CallFuture CallEngine::CallAsync(const std::string& group, const std::string& from,
                                 const std::string& worker, const std::string& method,
                                 std::string_view payload, absl::Span<const Tensor> tensors,
                                 absl::Duration timeout, uint16_t flags) {
  return engine_->CallAsync(group, from, worker, method, payload, tensors, timeout, flags);
}

absl::StatusOr<Message> CallEngine::Call(const std::string& group, const std::string& from,
                                         const std::string& worker, const std::string& method,
                                         std::string_view payload, absl::Span<const Tensor> tensors,
                                         absl::Duration timeout) {
  return engine_->Call(group, from, worker, method, payload, tensors, timeout);
}

absl::StatusOr<std::string> CallEngine::StoreCall(const std::string& group,
                                                  const std::string& method,
                                                  std::string_view request,
                                                  absl::Duration timeout) {
  return engine_->StoreCall(group, method, request, timeout);
}

void CallEngine::BeginLeave(const std::string& group, const std::string& worker) {
  engine_->BeginLeave(group, worker);
}

int CallEngine::DrainLeave(const std::string& group, const std::string& worker,
                           absl::Duration no_deadline_wait) {
  return engine_->DrainLeave(group, worker, no_deadline_wait);
}

void CallEngine::Rejoined(const std::string& group, const std::string& worker) {
  engine_->Rejoined(group, worker);
}

void CallEngine::EnableLentReaders(std::function<void()> waker) {
  engine_->EnableLentReaders(std::move(waker));
}

bool CallEngine::LentReaderWaits(int delta) { return engine_->LentReaderWaits(delta); }

bool CallEngine::ReadAsLent(absl::Time deadline, absl::FunctionRef<bool()> interrupted) {
  return engine_->ReadAsLent(deadline, interrupted);
}

bool CallEngine::SpinForTurn(absl::Time until, absl::FunctionRef<bool()> interrupted) {
  return engine_->SpinForTurn(until, interrupted);
}

void CallEngine::NudgeReader() const { engine_->NudgeReader(); }

CallEngineStats CallEngine::Stats() { return engine_->Stats(); }

}  // namespace tpd
