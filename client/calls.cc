#include "client/calls.h"

#include <pthread.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/shm/message.h"

namespace tpd {

namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(50);
constexpr absl::Duration kRingWait = absl::Seconds(5);
// How long past its deadline a call waits for the daemon's own DEADLINE_EXCEEDED.
constexpr absl::Duration kDeadlineGrace = absl::Seconds(2);

absl::StatusOr<uint64_t> TensorBytes(const Tensor& tensor, size_t index) {
  const uint64_t item = shm::ItemBytes(static_cast<uint8_t>(tensor.dtype));
  if (item == 0) return absl::InvalidArgumentError(absl::StrCat("tensor ", index, ": bad dtype"));
  if (tensor.shape.size() > shm::kMaxTensorDims) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", index, ": more than ",
                                                   int{shm::kMaxTensorDims}, " dims"));
  }
  uint64_t n = item;
  for (int64_t dim : tensor.shape) {
    if (dim < 0 || (dim != 0 && n > UINT64_MAX / static_cast<uint64_t>(dim))) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", index, ": bad shape"));
    }
    n *= static_cast<uint64_t>(dim);
  }
  if (n != tensor.data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", index, ": shape and dtype need ", n,
                                                   " bytes, data has ", tensor.data.size()));
  }
  return n;
}

}  // namespace

CallEngine::CallEngine(std::shared_ptr<const shm::Segment> segment, int handler_threads)
    : segment_(std::move(segment)),
      base_(segment_->base()),
      tx_("tx heap", segment_->layout().tx_heap),
      submissions_(base_, segment_->layout().submission, "submission ring"),
      completions_(base_, segment_->layout().completion, "completion ring") {
  reader_ = std::thread([this] { ReadLoop(); });
  for (int i = 0; i < handler_threads; ++i) pool_.emplace_back([this] { HandlerLoop(); });
}

CallEngine::~CallEngine() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  reader_.join();
  for (std::thread& thread : pool_) thread.join();
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  for (const auto& [id, waiter] : waiting_) ids.push_back(id);
  for (uint64_t id : ids) {
    Finish(id, absl::CancelledError("the client's shared memory was detached during the call"));
  }
}

void CallEngine::Finish(uint64_t id, absl::StatusOr<Message> result) {
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return;
  Waiter* waiter = it->second;
  if (waiter->promise != nullptr) {
    waiter->promise->set_value(std::move(result));
    waiting_.erase(it);
    delete waiter;
    return;
  }
  waiter->done = true;
  waiter->result = std::move(result);
  cv_.SignalAll();
}

void CallEngine::ExpireAsync() {
  const absl::Time now = absl::Now();
  std::vector<std::pair<uint64_t, std::string>> expired;
  for (const auto& [id, waiter] : waiting_) {
    if (waiter->promise != nullptr && waiter->give_up <= now) expired.push_back({id, waiter->what});
  }
  for (auto& [id, what] : expired) {
    Finish(id, absl::DeadlineExceededError(
                   absl::StrCat(what, " got no answer by its deadline (not even the daemon's)")));
  }
}

std::future<absl::StatusOr<Message>> CallEngine::CallAsync(const std::string& group,
                                                           const std::string& from,
                                                           const std::string& worker,
                                                           const std::string& method,
                                                           const Message& request,
                                                           absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto waiter = std::make_unique<Waiter>();
  waiter->promise = std::make_unique<std::promise<absl::StatusOr<Message>>>();
  waiter->give_up = deadline + kDeadlineGrace;
  waiter->what = absl::StrCat("call to worker '", worker, "' method '", method, "'");
  std::future<absl::StatusOr<Message>> future = waiter->promise->get_future();
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) {
      waiter->promise->set_value(broken_);
      return future;
    }
    id = next_call_id_++;
    waiting_[id] = waiter.release();
  }
  absl::Status submitted = Submit(shm::Op::kCall, id, absl::ToUnixNanos(deadline), 0, 0, group,
                                  worker, method, from, request);
  if (!submitted.ok()) {
    absl::MutexLock lock(&mu_);
    Finish(id, submitted);
  }
  return future;
}

void CallEngine::Handle(const std::string& method, Handler handler) {
  absl::MutexLock lock(&mu_);
  handlers_[method] = std::move(handler);
}

absl::Status CallEngine::Submit(shm::Op op, uint64_t call_id, int64_t deadline_ns,
                                uint16_t flags, uint32_t code, const std::string& n0,
                                const std::string& n1, const std::string& n2,
                                const std::string& n3, const Message& message) {
  if (n0.size() > shm::kMaxMessageName || n1.size() > shm::kMaxMessageName ||
      n2.size() > shm::kMaxMessageName || n3.size() > shm::kMaxMessageName) {
    return absl::InvalidArgumentError(
        absl::StrCat("group, worker and method names are at most ", shm::kMaxMessageName,
                     " bytes"));
  }
  if (message.tensors.size() > shm::kMaxTensorsPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", shm::kMaxTensorsPerMessage,
                                                   " tensors per message"));
  }
  const uint64_t prefix = shm::MessagePrefixBytes(n0.size(), n1.size(), n2.size(), n3.size());
  const uint64_t payload = prefix + message.payload.size();
  uint64_t total = shm::AlignUp(payload);
  const uint64_t table = total;
  total += shm::AlignUp(message.tensors.size() * sizeof(shm::TensorEntry));
  std::vector<uint64_t> at(message.tensors.size());
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    absl::StatusOr<uint64_t> bytes = TensorBytes(message.tensors[i], i);
    if (!bytes.ok()) return bytes.status();
    at[i] = total;
    total += shm::AlignUp(*bytes);
  }
  absl::MutexLock lock(&tx_mu_);
  absl::StatusOr<uint64_t> block = tx_.Allocate(total);
  if (!block.ok()) return block.status();
  uint8_t* out = base_ + *block;
  shm::WriteMessagePrefix(out, code, n0, n1, n2, n3);
  if (!message.payload.empty()) {
    std::memcpy(out + prefix, message.payload.data(), message.payload.size());
  }
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    const Tensor& tensor = message.tensors[i];
    shm::TensorEntry entry{};
    entry.dtype = static_cast<uint8_t>(tensor.dtype);
    entry.ndim = static_cast<uint8_t>(tensor.shape.size());
    for (size_t k = 0; k < tensor.shape.size(); ++k) entry.shape[k] = tensor.shape[k];
    entry.length = tensor.data.size();
    if (entry.length > 0) {
      entry.offset = *block + at[i];
      std::memcpy(out + at[i], tensor.data.data(), tensor.data.size());
    }
    std::memcpy(out + table + i * sizeof(entry), &entry, sizeof(entry));
  }
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(op);
  d.flags = flags;
  d.tensor_count = static_cast<uint32_t>(message.tensors.size());
  d.call_id = call_id;
  d.deadline_unix_ns = deadline_ns;
  d.payload_offset = *block;
  d.payload_length = payload;
  d.tensor_table_offset = message.tensors.empty() ? 0 : *block + table;
  absl::StatusOr<bool> pushed = submissions_.TryPush(d);
  if (pushed.ok() && !*pushed) {
    absl::StatusOr<bool> space = submissions_.WaitForSpace(absl::Now() + kRingWait);
    pushed = space.ok() ? submissions_.TryPush(d) : space.status();
  }
  if (!pushed.ok() || !*pushed) {
    (void)tx_.Free(*block);
    return pushed.ok() ? absl::UnavailableError(absl::StrCat("the submission ring stayed full for ",
                                                             absl::FormatDuration(kRingWait)))
                       : absl::UnavailableError(pushed.status().message());
  }
  return absl::OkStatus();
}

void CallEngine::SendRelease(uint64_t rx_offset) {
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(shm::Op::kRelease);
  d.call_id = 1;
  d.payload_offset = rx_offset;
  absl::MutexLock lock(&tx_mu_);
  absl::StatusOr<bool> pushed = submissions_.TryPush(d);
  if (pushed.ok() && !*pushed && submissions_.WaitForSpace(absl::Now() + kRingWait).ok()) {
    (void)submissions_.TryPush(d);
  }
}

absl::StatusOr<Message> CallEngine::Call(const std::string& group, const std::string& from,
                                         const std::string& worker, const std::string& method,
                                         const Message& request, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Waiter waiter;
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    id = next_call_id_++;
    waiting_[id] = &waiter;
  }
  absl::Status submitted = Submit(shm::Op::kCall, id, absl::ToUnixNanos(deadline), 0, 0, group,
                                  worker, method, from, request);
  absl::MutexLock lock(&mu_);
  if (!submitted.ok()) {
    waiting_.erase(id);
    return submitted;
  }
  const absl::Time give_up = deadline + kDeadlineGrace;
  while (!waiter.done && !stop_) {
    if (cv_.WaitWithDeadline(&mu_, give_up) && absl::Now() >= give_up) break;
  }
  waiting_.erase(id);
  if (waiter.done) return std::move(waiter.result);
  return absl::DeadlineExceededError(absl::StrCat(
      "call to worker '", worker, "' method '", method, "' got no answer within ",
      absl::FormatDuration(timeout + kDeadlineGrace), " (not even the daemon's)"));
}

void CallEngine::ReadLoop() {
  pthread_setname_np(pthread_self(), "tpd-calls");
  shm::Descriptor batch[64];
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    absl::StatusOr<bool> ready = completions_.WaitForData(absl::Now() + kPollInterval);
    absl::StatusOr<size_t> n = ready.ok() ? completions_.TryPopBatch(batch) : ready.status();
    if (!n.ok()) {
      absl::MutexLock lock(&mu_);
      broken_ = absl::UnavailableError(n.status().message());
      std::vector<uint64_t> ids;
      for (const auto& [id, waiter] : waiting_) ids.push_back(id);
      for (uint64_t id : ids) Finish(id, broken_);
      return;
    }
    for (size_t i = 0; i < *n; ++i) OnCompletion(batch[i]);
    absl::MutexLock lock(&mu_);
    ExpireAsync();
  }
}

void CallEngine::OnCompletion(const shm::Descriptor& d) {
  const shm::Layout& layout = segment_->layout();
  if (!shm::ValidateDescriptor(d, layout, shm::Direction::kCompletion).ok()) return;
  if (d.op == static_cast<uint8_t>(shm::Op::kRelease)) {
    absl::MutexLock lock(&tx_mu_);
    (void)tx_.Free(d.payload_offset);
    return;
  }
  if (d.op != static_cast<uint8_t>(shm::Op::kCall) && d.op != static_cast<uint8_t>(shm::Op::kReply)) {
    return;
  }
  absl::StatusOr<shm::ParsedMessage> parsed =
      shm::ParseMessage(base_, d.payload_offset, d.payload_length);
  absl::StatusOr<std::vector<shm::TensorEntry>> entries =
      parsed.ok() ? shm::ReadTensorTable(d, base_, layout, shm::Direction::kCompletion)
                  : parsed.status();
  absl::StatusOr<Message> message = absl::UnknownError("unset");
  if (!entries.ok()) {
    message = entries.status();
  } else {
    Message copy;
    copy.payload.assign(reinterpret_cast<const char*>(base_ + parsed->body_offset),
                        parsed->body_length);
    for (const shm::TensorEntry& entry : *entries) {
      Tensor tensor;
      tensor.dtype = static_cast<shm::DType>(entry.dtype);
      tensor.shape.assign(entry.shape, entry.shape + entry.ndim);
      if (entry.length > 0) {
        tensor.data.assign(reinterpret_cast<const char*>(base_ + entry.offset), entry.length);
      }
      copy.tensors.push_back(std::move(tensor));
    }
    message = std::move(copy);
  }
  if (d.payload_offset != 0) SendRelease(d.payload_offset);
  absl::MutexLock lock(&mu_);
  if (d.op == static_cast<uint8_t>(shm::Op::kReply)) {
    // A call given up on already is no longer waiting: Finish ignores it.
    if (message.ok() && (d.flags & shm::kFlagError) != 0) {
      const auto code = static_cast<absl::StatusCode>(parsed->code);
      Finish(d.call_id,
             absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
                          parsed->names[2]));
    } else {
      Finish(d.call_id, std::move(message));
    }
    return;
  }
  if (!message.ok()) return;  // a malformed call: the caller's deadline answers it
  message->caller = parsed->names[3];
  queue_.push_back({d.call_id, parsed->names[1], parsed->names[2], *std::move(message)});
  cv_.SignalAll();
}

void CallEngine::HandlerLoop() {
  pthread_setname_np(pthread_self(), "tpd-handler");
  while (true) {
    Incoming incoming;
    Handler handler;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
      if (stop_) return;
      incoming = std::move(queue_.front());
      queue_.pop_front();
      auto it = handlers_.find(incoming.method);
      if (it != handlers_.end()) handler = it->second;
    }
    absl::StatusOr<Message> reply =
        handler ? handler(incoming.request)
                : absl::UnimplementedError(absl::StrCat("no handler for method '", incoming.method,
                                                        "' (Client::Handle)"));
    absl::Status sent;
    if (reply.ok()) {
      sent = Submit(shm::Op::kReply, incoming.call_id, 0, 0, 0, "", "", "", "", *reply);
    } else {
      // Marked as remote: the caller sees whose handler answered so.
      sent = Submit(shm::Op::kReply, incoming.call_id, 0, shm::kFlagError,
                    static_cast<uint32_t>(reply.status().code()), "", "",
                    absl::StrCat("remote: worker '", incoming.worker, "' method '",
                                 incoming.method, "': ", reply.status().message()),
                    "", Message{});
    }
    if (!sent.ok()) {
      // Too big for the heap, say: tell the caller that instead.
      (void)Submit(shm::Op::kReply, incoming.call_id, 0, shm::kFlagError,
                   static_cast<uint32_t>(sent.code()), "", "",
                   absl::StrCat("the handler's reply could not be sent: ", sent.message()), "",
                   Message{});
    }
  }
}

}  // namespace tpd
