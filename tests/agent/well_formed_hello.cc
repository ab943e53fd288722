#include "tests/agent/well_formed_hello.h"

#include <string>

#include "agent/pipe_auth.h"

namespace tpd::agent {

v1::PipeHello WellFormedHello(v1::PipeHello::Step step) {
  v1::PipeHello hello;
  hello.set_version(std::string(kPipeAuthVersion));
  hello.set_step(step);
  if (step != v1::PipeHello::PROOF) {
    hello.set_nonce(std::string(kPipeNonceBytes, 'n'));
    hello.set_agent_id("node-a");
    hello.add_urls("uv://127.0.0.1:4000");
    (*hello.mutable_transport_domains())["uv"] = "d";
  }
  if (step != v1::PipeHello::CHALLENGE) hello.set_mac(std::string(32, 'm'));
  return hello;
}

}  // namespace tpd::agent
