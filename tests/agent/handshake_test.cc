#include "agent/handshake.h"

#include <string>
#include <vector>

#include "agent/pipe_auth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kToken[] = "cluster-token";

HelloSelf Acceptor() {
  return HelloSelf{"node-a",
                   {"uv://127.0.0.1:5000", "shm://tpd-agent-a"},
                   {{"uv", "tcp"}, {"shm", "host-a"}},
                   {{"basic", ""}}};
}

HelloSelf Connector() {
  return HelloSelf{
      "node-b", {"uv://127.0.0.2:6000"}, {{"uv", "tcp"}}, {{"basic", ""}, {"cma", "b"}}};
}

// One handshake's messages and both sides' transcripts, as far as each side got.
struct Handshake {
  v1::PipeHello challenge;
  PipeTranscript connector;
  v1::PipeHello answer;
  PipeTranscript acceptor;
  v1::PipeHello proof;

  // Runs a handshake in which the connector dialed `dialed` and signed with `connector_token`.
  explicit Handshake(const std::string& dialed = "uv://127.0.0.1:5000",
                     const std::string& connector_token = kToken) {
    challenge = ChallengeHello(Acceptor(), std::string(kPipeNonceBytes, 'a'));
    connector =
        ConnectorTranscript(challenge, Connector(), dialed, std::string(kPipeNonceBytes, 'c'));
    answer = AnswerHello(Connector(), connector, connector_token);
    acceptor = AcceptorTranscript(answer, Acceptor(), std::string(kPipeNonceBytes, 'a'));
    proof = ProofHello(acceptor, kToken);
  }
};

TEST(HandshakeTest, BothSidesAgreeOnTheTranscriptAndAcceptEachOther) {
  Handshake h;
  EXPECT_EQ(h.challenge.step(), v1::PipeHello::CHALLENGE);
  EXPECT_EQ(h.challenge.version(), kPipeAuthVersion);
  EXPECT_EQ(h.challenge.agent_id(), "node-a");
  EXPECT_EQ(h.challenge.mac(), "");
  EXPECT_EQ(h.challenge.transport_domains().at("shm"), "host-a");
  EXPECT_TRUE(CheckChallenge(h.challenge, "node-a", "uv://127.0.0.1:5000").ok());
  EXPECT_EQ(h.answer.step(), v1::PipeHello::ANSWER);
  EXPECT_EQ(h.answer.dialed_url(), "uv://127.0.0.1:5000");
  EXPECT_EQ(h.answer.channel_cpu_descriptors().at("cma"), "b");
  EXPECT_EQ(h.acceptor.challenge_nonce, h.connector.challenge_nonce);
  EXPECT_EQ(h.acceptor.answer_nonce, h.connector.answer_nonce);
  EXPECT_EQ(h.acceptor.acceptor_urls, h.connector.acceptor_urls);
  EXPECT_EQ(h.acceptor.connector_urls, h.connector.connector_urls);
  EXPECT_TRUE(CheckAnswer(h.answer, h.acceptor, Acceptor(), kToken).ok());
  EXPECT_EQ(h.proof.step(), v1::PipeHello::PROOF);
  EXPECT_TRUE(CheckProof(h.proof, h.connector, kToken).ok());
}

TEST(HandshakeTest, ConnectorRefusesAChallengeFromAnotherNode) {
  Handshake h;
  absl::Status refused = CheckChallenge(h.challenge, "node-c", "uv://127.0.0.1:5000");
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(refused.message(), "the agent at uv://127.0.0.1:5000 is \"node-a\", not \"node-c\"");
  // A peer without a node name (tests) accepts whoever answers.
  EXPECT_TRUE(CheckChallenge(h.challenge, "", "uv://127.0.0.1:5000").ok());
  // The claimed id is bounded in the message.
  v1::PipeHello long_id = h.challenge;
  long_id.set_agent_id(std::string(1000, 'x'));
  EXPECT_LT(CheckChallenge(long_id, "node-a", "uv://h:1").message().size(), 400u);
}

TEST(HandshakeTest, AcceptorRefusesAnAnswerUnderAnotherToken) {
  Handshake h("uv://127.0.0.1:5000", "another-token");
  absl::Status refused = CheckAnswer(h.answer, h.acceptor, Acceptor(), kToken);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(refused.message(), "bad MAC in its answer (another cluster token?)");
}

TEST(HandshakeTest, AcceptorRefusesAnAnswerChangedAfterItsMac) {
  Handshake h;
  v1::PipeHello changed = h.answer;
  changed.add_urls("uv://10.0.0.9:1");
  const PipeTranscript transcript =
      AcceptorTranscript(changed, Acceptor(), h.acceptor.challenge_nonce);
  EXPECT_THAT(CheckAnswer(changed, transcript, Acceptor(), kToken).message(),
              HasSubstr("bad MAC in its answer"));
  // An answer to another challenge (a replay) does not fit this one's nonce.
  const PipeTranscript fresh =
      AcceptorTranscript(h.answer, Acceptor(), std::string(kPipeNonceBytes, 'z'));
  EXPECT_THAT(CheckAnswer(h.answer, fresh, Acceptor(), kToken).message(),
              HasSubstr("bad MAC in its answer"));
}

TEST(HandshakeTest, AcceptorRefusesAnAnswerThatDialedSomeoneElse) {
  // A real connector (right token) that dialed a relay: its MAC holds, the address does not.
  Handshake h("uv://10.0.0.7:5000");
  absl::Status refused = CheckAnswer(h.answer, h.acceptor, Acceptor(), kToken);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(refused.message(),
            "it dialed uv://10.0.0.7:5000, which is not this agent's address "
            "uv://127.0.0.1:5000,shm://tpd-agent-a (a relayed handshake?)");
}

TEST(HandshakeTest, ConnectorRefusesAProofUnderAnotherTokenOrFromAnotherHandshake) {
  Handshake h;
  absl::Status refused = CheckProof(ProofHello(h.acceptor, "another-token"), h.connector, kToken);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(refused.message(), "bad MAC in its proof (another cluster token?)");
  // The answer's MAC never passes for a proof, nor a proof of another handshake.
  v1::PipeHello echoed = h.proof;
  echoed.set_mac(h.answer.mac());
  EXPECT_FALSE(CheckProof(echoed, h.connector, kToken).ok());
  Handshake other;
  PipeTranscript replayed = other.connector;
  replayed.answer_nonce = std::string(kPipeNonceBytes, 'd');
  EXPECT_FALSE(CheckProof(other.proof, replayed, kToken).ok());
}

TEST(HandshakeTest, OfferedNamesAreSortedAndBounded) {
  v1::PipeHello hello;
  (*hello.mutable_transport_domains())["uv"] = "";
  (*hello.mutable_transport_domains())["shm"] = "";
  (*hello.mutable_transport_domains())["ibv"] = "";
  EXPECT_THAT(OfferedNames(hello.transport_domains()), ElementsAre("ibv", "shm", "uv"));
  v1::PipeHello many;
  for (int i = 0; i < 100; ++i) {
    (*many.mutable_channel_cpu_descriptors())[std::string(100, 'a') + std::to_string(i)] = "";
  }
  const std::vector<std::string> names = OfferedNames(many.channel_cpu_descriptors());
  EXPECT_EQ(names.size(), 32u);
  for (const std::string& name : names) EXPECT_EQ(name.size(), 64u);
}

}  // namespace
}  // namespace tpd::agent
