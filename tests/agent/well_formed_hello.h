// A well-formed pipe handshake message (v1::PipeHello) of each step, as a peer agent would send
// it: the seed the handshake's parsing tests refuse variations of.
//
// Thread safety: a pure function.

#ifndef TPD_TESTS_AGENT_WELL_FORMED_HELLO_H_
#define TPD_TESTS_AGENT_WELL_FORMED_HELLO_H_

#include "proto/agent.pb.h"

namespace tpd::agent {

// Version, step, and what the step carries: nonce, agent id, a URL and a transport domain
// (all but PROOF), a MAC (all but CHALLENGE). The MAC is not a valid one.
v1::PipeHello WellFormedHello(v1::PipeHello::Step step);

}  // namespace tpd::agent

#endif  // TPD_TESTS_AGENT_WELL_FORMED_HELLO_H_
