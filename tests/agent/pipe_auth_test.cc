// The pipe handshake's MACs: both roles differ, every transcript field is covered, the token
// never shows, and a dialed URL is ours only when it names our listener.

#include "agent/pipe_auth.h"

#include "gtest/gtest.h"

namespace tpd::agent {
namespace {

PipeTranscript Transcript() {
  PipeTranscript t;
  t.challenge_nonce = std::string(32, 'a');
  t.answer_nonce = std::string(32, 'c');
  t.acceptor_id = "node-a";
  t.acceptor_urls = {"uv://10.0.0.1:29501", "shm://tpd-agent-1"};
  t.dialed_url = "uv://10.0.0.1:29501";
  t.connector_id = "node-c";
  t.connector_urls = {"uv://10.0.0.3:29501"};
  return t;
}

TEST(PipeAuthTest, AnswerAndProofDifferAndVerify) {
  const PipeTranscript t = Transcript();
  const std::string answer = ComputePipeMac("token", PipeMacRole::kAnswer, t);
  const std::string proof = ComputePipeMac("token", PipeMacRole::kProof, t);
  EXPECT_EQ(answer.size(), 32u);
  EXPECT_NE(answer, proof) << "an answer must never pass for a proof";
  EXPECT_TRUE(VerifyPipeMac("token", PipeMacRole::kAnswer, t, answer));
  EXPECT_TRUE(VerifyPipeMac("token", PipeMacRole::kProof, t, proof));
  EXPECT_FALSE(VerifyPipeMac("token", PipeMacRole::kProof, t, answer));
  EXPECT_FALSE(VerifyPipeMac("other", PipeMacRole::kAnswer, t, answer));
  EXPECT_FALSE(VerifyPipeMac("token", PipeMacRole::kAnswer, t, answer.substr(0, 31)));
  EXPECT_EQ(answer.find("token"), std::string::npos);
}

TEST(PipeAuthTest, EveryTranscriptFieldChangesTheMac) {
  const std::string base = ComputePipeMac("token", PipeMacRole::kAnswer, Transcript());
  std::vector<void (*)(PipeTranscript&)> changes = {
      [](PipeTranscript& t) { t.challenge_nonce[0] = 'b'; },
      [](PipeTranscript& t) { t.answer_nonce[0] = 'b'; },
      [](PipeTranscript& t) { t.acceptor_id = "node-x"; },
      [](PipeTranscript& t) { t.acceptor_urls.pop_back(); },
      [](PipeTranscript& t) { t.dialed_url = "uv://10.0.0.9:29501"; },
      [](PipeTranscript& t) { t.connector_id = "node-x"; },
      [](PipeTranscript& t) { t.connector_urls.push_back("shm://x"); },
      // Moving bytes between neighbouring fields must not collide (length prefixes).
      [](PipeTranscript& t) {
        t.acceptor_id = "node-an";
        t.acceptor_urls[0] = "v://10.0.0.1:29501";
      },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    PipeTranscript t = Transcript();
    changes[i](t);
    EXPECT_NE(ComputePipeMac("token", PipeMacRole::kAnswer, t), base) << "change " << i;
  }
}

TEST(PipeAuthTest, NoncesAreFreshAndFullLength) {
  const std::string a = NewPipeNonce();
  const std::string b = NewPipeNonce();
  EXPECT_EQ(a.size(), kPipeNonceBytes);
  EXPECT_NE(a, b);
}

TEST(PipeAuthTest, DialedUrlIsOursOnlyForOurListener) {
  const std::vector<std::string> own = {"uv://10.0.0.1:29501", "shm://tpd-agent-1"};
  EXPECT_TRUE(DialedUrlIsOurs("uv://10.0.0.1:29501", own));
  EXPECT_TRUE(DialedUrlIsOurs("shm://tpd-agent-1", own));
  EXPECT_FALSE(DialedUrlIsOurs("uv://10.0.0.2:29501", own)) << "another host, same port";
  EXPECT_FALSE(DialedUrlIsOurs("uv://10.0.0.1:29502", own));
  EXPECT_FALSE(DialedUrlIsOurs("shm://tpd-agent-2", own));
  EXPECT_FALSE(DialedUrlIsOurs("", own));

  const std::vector<std::string> wildcard = {"uv://0.0.0.0:29501"};
  EXPECT_TRUE(DialedUrlIsOurs("uv://10.0.0.1:29501", wildcard));
  EXPECT_FALSE(DialedUrlIsOurs("uv://10.0.0.1:29502", wildcard));
  EXPECT_FALSE(DialedUrlIsOurs("ibv://10.0.0.1:29501", wildcard));
  EXPECT_TRUE(DialedUrlIsOurs("uv://[fe80::1]:7", {"uv://[::]:7"}));
}

}  // namespace
}  // namespace tpd::agent
