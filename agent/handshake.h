// The pipe handshake's pure parts (agent/pipe_auth.h has the protocol): the hellos each side
// writes, the transcript both MACs cover, and the checks of what the peer sent, each refusal
// an UNAUTHENTICATED status whose message says why. agent/pipe.h runs them on a pipe;
// tests/agent/handshake_test.cc runs them without one.
//
// Thread safety: stateless.

#ifndef TPD_AGENT_HANDSHAKE_H_
#define TPD_AGENT_HANDSHAKE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "agent/pipe_auth.h"
#include "proto/agent.pb.h"

namespace tpd::agent {

// What an agent says about itself in its CHALLENGE or ANSWER.
struct HelloSelf {
  std::string id;
  std::vector<std::string> urls;  // lowest priority first, as Agent::urls()
  std::map<std::string, std::string> transport_domains;
  std::map<std::string, std::string> channel_cpu_descriptors;
};

// Acceptor: the CHALLENGE it writes first, with its fresh nonce.
v1::PipeHello ChallengeHello(const HelloSelf& self, const std::string& nonce);

// Connector: whether the agent that challenged it is the node it dialed (an empty
// `expected_node` accepts any).
absl::Status CheckChallenge(const v1::PipeHello& challenge, const std::string& expected_node,
                            const std::string& dialed_url);
// Connector: the transcript of a handshake it answers with `answer_nonce`.
PipeTranscript ConnectorTranscript(const v1::PipeHello& challenge, const HelloSelf& self,
                                   const std::string& dialed_url, std::string answer_nonce);
// Connector: its ANSWER, MACed under `token`.
v1::PipeHello AnswerHello(const HelloSelf& self, const PipeTranscript& transcript,
                          absl::string_view token);

// Acceptor: the transcript of a handshake it challenged with `challenge_nonce`.
PipeTranscript AcceptorTranscript(const v1::PipeHello& answer, const HelloSelf& self,
                                  const std::string& challenge_nonce);
// Acceptor: whether the ANSWER's MAC holds (checked first: someone without the token learns
// nothing from which check failed) and it dialed one of our URLs.
absl::Status CheckAnswer(const v1::PipeHello& answer, const PipeTranscript& transcript,
                         const HelloSelf& self, absl::string_view token);
// Acceptor: its PROOF, once the answer passed.
v1::PipeHello ProofHello(const PipeTranscript& transcript, absl::string_view token);

// Connector: whether the PROOF's MAC holds.
absl::Status CheckProof(const v1::PipeHello& proof, const PipeTranscript& transcript,
                        absl::string_view token);

// The names a peer offered (a hello's transport or channel map), sorted (a proto map's order
// is unspecified), at most 32 of at most 64 bytes each: only Stats shows them.
std::vector<std::string> OfferedNames(const google::protobuf::Map<std::string, std::string>& field);
// A hello's map as Registry::PickTransport and PickChannel take it.
std::map<std::string, std::string> ToMap(
    const google::protobuf::Map<std::string, std::string>& field);

}  // namespace tpd::agent

#endif  // TPD_AGENT_HANDSHAKE_H_
