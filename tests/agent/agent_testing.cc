#include "tests/agent/agent_testing.h"

#include <dirent.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/auth_tcp.h"
#include "tensorpipe/tensorpipe.h"
#include "tensorpipe/transport/connection.h"
#include "tensorpipe/transport/context.h"

namespace tpd::agent::testing {

AgentOptions TestOptions(const std::string& id, std::vector<std::string> transports,
                         std::vector<std::string> channels) {
  AgentOptions options;
  options.id = id;
  options.listen_address = "127.0.0.1:0";
  options.cluster_token = kTestToken;
  options.transports = std::move(transports);
  options.channels = std::move(channels);
  options.mpt_lanes = 2;
  return options;
}

PeerId PeerOf(const Agent& agent) { return PeerId{agent.id(), agent.address()}; }

uint64_t Checksum(const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

namespace {

void Fill(char* data, size_t size, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(data + i, &x, 8);
  }
  for (; i < size; ++i) data[i] = static_cast<char>(x >> (8 * (i % 8)));
}

}  // namespace

Message MakeMessage(const std::string& method, size_t payload_size,
                    const std::vector<size_t>& tensor_sizes, uint64_t seed) {
  auto storage = std::make_shared<std::vector<std::vector<char>>>();
  storage->emplace_back(payload_size);
  Fill(storage->back().data(), payload_size, seed);
  for (size_t i = 0; i < tensor_sizes.size(); ++i) {
    storage->emplace_back(tensor_sizes[i]);
    Fill(storage->back().data(), tensor_sizes[i], seed * 131 + i + 1);
  }
  Message message;
  message.header.set_method(method);
  message.header.set_group("test-group");
  message.header.set_source_worker("caller");
  message.header.set_target_worker("callee");
  message.payload = Buffer{(*storage)[0].data(), payload_size};
  for (size_t i = 0; i < tensor_sizes.size(); ++i) {
    v1::TensorDescriptor* descriptor = message.header.add_tensors();
    descriptor->set_dtype("uint8");
    descriptor->add_shape(static_cast<int64_t>(tensor_sizes[i]));
    descriptor->set_device("cpu");
    message.tensors.push_back(Buffer{(*storage)[i + 1].data(), tensor_sizes[i]});
  }
  message.keepalive = std::move(storage);
  return message;
}

std::vector<uint64_t> Checksums(const Message& message) {
  std::vector<uint64_t> sums;
  sums.push_back(Checksum(message.payload.data, message.payload.size));
  for (const Buffer& tensor : message.tensors) sums.push_back(Checksum(tensor.data, tensor.size));
  return sums;
}

absl::StatusOr<Message> CallAndWait(Agent& agent, const PeerId& peer, Message message,
                                    absl::Duration timeout, Allocator reply_allocator) {
  struct State {
    absl::Notification done;
    std::optional<absl::StatusOr<Message>> outcome;
  };
  auto state = std::make_shared<State>();
  agent.Send(
      peer, std::move(message), absl::Now() + timeout,
      [state](absl::StatusOr<Message> reply) {
        state->outcome = std::move(reply);
        state->done.Notify();
      },
      std::move(reply_allocator));
  if (!state->done.WaitForNotificationWithTimeout(timeout + absl::Seconds(30))) {
    return absl::InternalError("the call's done never ran (hung past its deadline)");
  }
  return *std::move(state->outcome);
}

EchoHandler::EchoHandler(Agent& agent) {
  Agent* target = &agent;
  auto requests = requests_;
  agent.SetHandler(Handler{nullptr, [target, requests](InboundRequest request) {
                             requests->fetch_add(1);
                             Message response;
                             response.header.set_method(request.message.header.method());
                             *response.header.mutable_tensors() = request.message.header.tensors();
                             response.payload = request.message.payload;
                             response.tensors = request.message.tensors;
                             response.keepalive = request.message.keepalive;
                             target->Respond(request.reply_to, std::move(response));
                           }});
}

int ThreadCount() {
  int count = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

RawContext::RawContext(const std::string& token)
    : context_(std::make_shared<tensorpipe::Context>()) {
  AuthTcpOptions tcp;
  tcp.token = token;
  context_->registerTransport(0, "uv", CreateAuthTcp(std::move(tcp)));
  context_->registerChannel(1000, "basic", tensorpipe::channel::basic::create());
}

RawContext::~RawContext() {
  context_->close();
  context_->join();
}

void ConnectProveAndClose(int port, const std::string& token) {
  AuthTcpOptions tcp;
  tcp.token = token;
  std::shared_ptr<tensorpipe::transport::Context> context = CreateAuthTcp(std::move(tcp));
  std::shared_ptr<tensorpipe::transport::Connection> connection =
      context->connect(absl::StrCat("127.0.0.1:", port));
  // The handshake takes well under a millisecond on loopback; the accepting side then waits
  // for TensorPipe's first packet, which never comes.
  absl::SleepFor(absl::Milliseconds(200));
  connection->close();
  context->close();
  context->join();
}

}  // namespace tpd::agent::testing
