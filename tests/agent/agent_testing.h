// Helpers for the agent's tests and benchmark: options, messages with checksummed contents, a
// blocking call, and an echo handler.
//
// Thread safety: the free functions are thread-safe; EchoHandler's counters are atomic.

#ifndef TPD_TESTS_AGENT_AGENT_TESTING_H_
#define TPD_TESTS_AGENT_AGENT_TESTING_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/agent.h"

namespace tensorpipe {
class Context;
}  // namespace tensorpipe

namespace tpd::agent::testing {

inline constexpr char kTestToken[] = "agent-test-token";

// Options for an agent named `id` on 127.0.0.1 (a free port) with the test token, allowed
// only `transports` and `channels` (empty: all).
AgentOptions TestOptions(const std::string& id, std::vector<std::string> transports = {},
                         std::vector<std::string> channels = {});

// How to reach `agent`.
PeerId PeerOf(const Agent& agent);

// FNV-1a, 64 bits.
uint64_t Checksum(const void* data, size_t size);

// A message whose bytes live in the object (keepalive owns them): a payload of
// `payload_size` and one tensor per entry of `tensor_sizes`, filled from `seed` so every
// call's contents differ.
Message MakeMessage(const std::string& method, size_t payload_size,
                    const std::vector<size_t>& tensor_sizes, uint64_t seed);

// Checksums of payload and every tensor, in order.
std::vector<uint64_t> Checksums(const Message& message);

// Send and wait for the outcome (bounded by `timeout` plus a margin).
absl::StatusOr<Message> CallAndWait(Agent& agent, const PeerId& peer, Message message,
                                    absl::Duration timeout = absl::Seconds(120),
                                    Allocator reply_allocator = nullptr);

// Installs on `agent` a handler that answers every request with its own payload and tensors
// (no copy: the response holds the request's keepalive), right on the TensorPipe thread.
class EchoHandler {
 public:
  explicit EchoHandler(Agent& agent);
  int64_t requests() const { return requests_->load(); }

 private:
  std::shared_ptr<std::atomic<int64_t>> requests_ = std::make_shared<std::atomic<int64_t>>(0);
};

// Number of threads of this process (/proc/self/task).
int ThreadCount();

// A TensorPipe context for tests that play a peer by hand (basic channel): its "uv" is tpd's
// transport (agent/auth_tcp.h) under `token`, the agents' own, so with the test token it gets
// past an agent's transport handshake and meets the pipe handshake (agent/pipe_auth.h); with
// another token it is a stranger the transport refuses.
class RawContext {
 public:
  explicit RawContext(const std::string& token = kTestToken);
  ~RawContext();
  tensorpipe::Context& context() { return *context_; }

 private:
  std::shared_ptr<tensorpipe::Context> context_;
};

// Opens a connection to 127.0.0.1:`port` that proves `token`, and closes it before sending
// TensorPipe's first packet, as a peer agent shutting down at once does.
void ConnectProveAndClose(int port, const std::string& token = kTestToken);

}  // namespace tpd::agent::testing

#endif  // TPD_TESTS_AGENT_AGENT_TESTING_H_
