// tpd's TCP transport for TensorPipe: the agent's pipes and the mpt_uv channel's lanes run on
// it instead of TensorPipe's uv transport, so that nothing a stranger sends reaches
// TensorPipe's parsers (docs/security.md, "Agent pipes").
//
// Every connection it makes or accepts first runs a challenge/HMAC handshake on the raw
// socket, under the cluster token, which never travels:
//
//   acceptor  -> connector  nonce_a                                      32 bytes
//   connector -> acceptor   nonce_c, HMAC(token, "tpd-conn-v1 connect" nonce_a nonce_c)   64
//   acceptor  -> connector  HMAC(token, "tpd-conn-v1 accept" nonce_a nonce_c)             32
//
// Only then does a listener hand the connection to TensorPipe (its accept callback), and only
// then does a connecting side let TensorPipe's reads and writes through. A connection that
// sends a wrong MAC, closes early, or does not finish within `handshake_timeout` is closed and
// reported to `on_refused`; at most `max_handshakes` may be under way per listener (more are
// closed at once), so junk, port scans and silent connections cost one fd each for a bounded
// time and nothing else. The pipe handshake of agent/pipe_auth.h still runs on top.
//
// After the handshake a connection speaks TensorPipe's framing (an 8-byte length before each
// message), with lengths checked: a message longer than `max_message_bytes`, a fixed-length
// read that meets another length, a nop object that does not decode each fail that connection
// with an error instead of aborting the process.
//
// TensorPipe and groups know it as "uv" (URLs uv://host:port): it is the TCP transport the
// options name, with authentication. Its domain descriptor differs from TensorPipe's uv, so it
// never pairs with an agent that does not authenticate.
//
// Thread safety: thread-safe. Each context runs one thread ("tpd-tcp"), an epoll loop that
// does all socket I/O and runs every callback; calls from other threads are handed to it.

#ifndef TPD_AGENT_AUTH_TCP_H_
#define TPD_AGENT_AUTH_TCP_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"

namespace tensorpipe::transport {
class Context;
}  // namespace tensorpipe::transport

namespace tpd::agent {

struct AuthTcpOptions {
  // The cluster secret ([peer] token). Required.
  std::string token;
  absl::Duration handshake_timeout = absl::Seconds(10);
  // Accepted connections whose handshake is under way, per listener.
  size_t max_handshakes = 128;
  // The longest message a read without a given length takes (a nop object, a channel's
  // descriptor); fixed-length reads take exactly what was asked.
  uint64_t max_message_bytes = uint64_t{64} << 20;
  // Told why a connection was refused ("bad MAC from 10.0.0.7:5123"); called on the loop
  // thread, so it must not block. Optional.
  std::function<void(const std::string& why)> on_refused;
};

// A context of the transport; close() and join() it as any TensorPipe transport context.
std::shared_ptr<tensorpipe::transport::Context> CreateAuthTcp(AuthTcpOptions options);

// The domain descriptor of the transport: peers pair only with the same.
inline constexpr char kAuthTcpDomain[] = "tpd-auth-tcp-v1";

}  // namespace tpd::agent

#endif  // TPD_AGENT_AUTH_TCP_H_
