#include "agent/handshake.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/wire.h"

namespace tpd::agent {

namespace {

std::vector<std::string> ToVector(const google::protobuf::RepeatedPtrField<std::string>& field) {
  return std::vector<std::string>(field.begin(), field.end());
}

// The fields a CHALLENGE and an ANSWER share: who speaks, where it listens, what it offers.
v1::PipeHello SelfHello(v1::PipeHello::Step step, const HelloSelf& self, const std::string& nonce) {
  v1::PipeHello hello;
  hello.set_version(std::string(kPipeAuthVersion));
  hello.set_step(step);
  hello.set_nonce(nonce);
  hello.set_agent_id(self.id);
  for (const std::string& url : self.urls) hello.add_urls(url);
  for (const auto& [name, domain] : self.transport_domains) {
    (*hello.mutable_transport_domains())[name] = domain;
  }
  for (const auto& [name, descriptor] : self.channel_cpu_descriptors) {
    (*hello.mutable_channel_cpu_descriptors())[name] = descriptor;
  }
  return hello;
}

}  // namespace

v1::PipeHello ChallengeHello(const HelloSelf& self, const std::string& nonce) {
  return SelfHello(v1::PipeHello::CHALLENGE, self, nonce);
}

absl::Status CheckChallenge(const v1::PipeHello& challenge, const std::string& expected_node,
                            const std::string& dialed_url) {
  if (expected_node.empty() || challenge.agent_id() == expected_node) return absl::OkStatus();
  return absl::UnauthenticatedError(absl::StrCat("the agent at ", dialed_url, " is \"",
                                                 challenge.agent_id().substr(0, kMaxIdBytes),
                                                 "\", not \"", expected_node, "\""));
}

PipeTranscript ConnectorTranscript(const v1::PipeHello& challenge, const HelloSelf& self,
                                   const std::string& dialed_url, std::string answer_nonce) {
  return PipeTranscript{challenge.nonce(),
                        std::move(answer_nonce),
                        challenge.agent_id(),
                        ToVector(challenge.urls()),
                        dialed_url,
                        self.id,
                        self.urls};
}

v1::PipeHello AnswerHello(const HelloSelf& self, const PipeTranscript& transcript,
                          absl::string_view token) {
  v1::PipeHello answer = SelfHello(v1::PipeHello::ANSWER, self, transcript.answer_nonce);
  answer.set_dialed_url(transcript.dialed_url);
  answer.set_mac(ComputePipeMac(token, PipeMacRole::kAnswer, transcript));
  return answer;
}

PipeTranscript AcceptorTranscript(const v1::PipeHello& answer, const HelloSelf& self,
                                  const std::string& challenge_nonce) {
  return PipeTranscript{
      challenge_nonce,   answer.nonce(),         self.id, self.urls, answer.dialed_url(),
      answer.agent_id(), ToVector(answer.urls())};
}

absl::Status CheckAnswer(const v1::PipeHello& answer, const PipeTranscript& transcript,
                         const HelloSelf& self, absl::string_view token) {
  if (!VerifyPipeMac(token, PipeMacRole::kAnswer, transcript, answer.mac())) {
    return absl::UnauthenticatedError("bad MAC in its answer (another cluster token?)");
  }
  if (!DialedUrlIsOurs(answer.dialed_url(), self.urls)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "it dialed ", answer.dialed_url().substr(0, 200), ", which is not this agent's address ",
        absl::StrJoin(self.urls, ","), " (a relayed handshake?)"));
  }
  return absl::OkStatus();
}

v1::PipeHello ProofHello(const PipeTranscript& transcript, absl::string_view token) {
  v1::PipeHello proof;
  proof.set_version(std::string(kPipeAuthVersion));
  proof.set_step(v1::PipeHello::PROOF);
  proof.set_mac(ComputePipeMac(token, PipeMacRole::kProof, transcript));
  return proof;
}

absl::Status CheckProof(const v1::PipeHello& proof, const PipeTranscript& transcript,
                        absl::string_view token) {
  if (!VerifyPipeMac(token, PipeMacRole::kProof, transcript, proof.mac())) {
    return absl::UnauthenticatedError("bad MAC in its proof (another cluster token?)");
  }
  return absl::OkStatus();
}

std::vector<std::string> OfferedNames(
    const google::protobuf::Map<std::string, std::string>& field) {
  std::vector<std::string> keys;
  for (const auto& [name, value] : field) {
    if (keys.size() == 32) break;
    keys.push_back(name.substr(0, 64));
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::map<std::string, std::string> ToMap(
    const google::protobuf::Map<std::string, std::string>& field) {
  return std::map<std::string, std::string>(field.begin(), field.end());
}

}  // namespace tpd::agent
