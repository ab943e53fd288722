// PeerAuth's verdict on a peer call's MAC: a good call passes once; a tampered request, another
// token, a replay, a stale timestamp or another daemon's audience are refused with
// UNAUTHENTICATED naming what was wrong.

#include "daemon/peer_auth.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/store.pb.h"
#include "store/peer_mac.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;

constexpr char kMethod[] = "/tpd.v1.Store/Set";
constexpr int kPort = 29400;
const absl::Time kStart = absl::FromUnixMillis(1'700'000'000'000);
const absl::Time kNow = kStart + absl::Seconds(60);

class PeerAuthTest : public ::testing::Test {
 protected:
  PeerAuthTest() : auth_(Options(), kStart) {
    request_.set_key("tpd/node/a");
    request_.set_value("1:2");
  }

  static PeerAuthOptions Options() {
    PeerAuthOptions options;
    options.token = "cluster-secret";
    options.port = kPort;
    options.max_skew = absl::Seconds(30);
    return options;
  }

  absl::Status Check(const std::string& header, const v1::SetRequest& request,
                     absl::Time now = kNow) {
    return auth_.Check(header, kMethod, request, now);
  }

  void ExpectRefused(const absl::Status& status, const std::string& reason) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
    EXPECT_THAT(status.message(), HasSubstr(reason));
    EXPECT_THAT(status.message(), HasSubstr(kMethod));
  }

  PeerAuth auth_;
  v1::SetRequest request_;
  store::PeerCallSigner signer_{"cluster-secret", "10.0.0.1:29400"};
};

TEST_F(PeerAuthTest, AGoodCallPassesOnce) {
  const std::string header = signer_.Sign(kMethod, request_, kNow);
  EXPECT_TRUE(Check(header, request_).ok()) << Check(header, request_);
  ExpectRefused(Check(header, request_), "replay");
  EXPECT_TRUE(Check(signer_.Sign(kMethod, request_, kNow), request_).ok());
}

TEST_F(PeerAuthTest, NoMacIsRefused) {
  ExpectRefused(auth_.Check(std::nullopt, kMethod, request_, kNow), "no MAC");
  ExpectRefused(Check("cluster-secret", request_), "no MAC");
}

TEST_F(PeerAuthTest, TamperedBodyIsABadMac) {
  const std::string header = signer_.Sign(kMethod, request_, kNow);
  v1::SetRequest tampered = request_;
  tampered.set_value("9:9");
  ExpectRefused(Check(header, tampered), "bad MAC");
  // Nor does the signature carry over to another method.
  absl::Status other = auth_.Check(header, "/tpd.v1.Store/DeleteKey", request_, kNow);
  EXPECT_EQ(other.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(other.message(), HasSubstr("bad MAC"));
}

TEST_F(PeerAuthTest, AnotherTokenIsABadMac) {
  store::PeerCallSigner stranger("guessed-token", "10.0.0.1:29400");
  ExpectRefused(Check(stranger.Sign(kMethod, request_, kNow), request_), "bad MAC");
}

TEST_F(PeerAuthTest, AMacEditedInTheHeaderIsABadMac) {
  std::string header = signer_.Sign(kMethod, request_, kNow);
  header.back() = header.back() == '0' ? '1' : '0';
  ExpectRefused(Check(header, request_), "bad MAC");
}

TEST_F(PeerAuthTest, ACallForAUserNamesItAndTheUserCannotBeChangedOnTheWay) {
  const store::StoreUser user{65534, "node-b"};
  std::optional<store::StoreUser> named;
  const std::string header = signer_.SignCall(kMethod, request_, user, kNow).header;
  ASSERT_TRUE(auth_.Check(header, kMethod, request_, kNow, &named).ok());
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(*named, user);
  // The daemon's own call names no one.
  ASSERT_TRUE(
      auth_.Check(signer_.Sign(kMethod, request_, kNow), kMethod, request_, kNow, &named).ok());
  EXPECT_FALSE(named.has_value());
  // Someone on the path who charges the call to another user (uid 0: "6e6f64652d62" is
  // node-b), or drops the user to make it the daemon's own, breaks the MAC.
  std::string to_root = signer_.SignCall(kMethod, request_, user, kNow).header;
  to_root.replace(to_root.find("for=65534@"), 10, "for=0@");
  ExpectRefused(Check(to_root, request_), "bad MAC");
  std::string dropped = signer_.SignCall(kMethod, request_, user, kNow).header;
  dropped.erase(dropped.find(" for="));
  ExpectRefused(Check(dropped, request_), "bad MAC");
}

TEST_F(PeerAuthTest, StaleTimestampsAreRefused) {
  ExpectRefused(Check(signer_.Sign(kMethod, request_, kNow - absl::Seconds(31)), request_),
                "stale timestamp");
  ExpectRefused(Check(signer_.Sign(kMethod, request_, kNow + absl::Seconds(31)), request_),
                "stale timestamp");
  EXPECT_TRUE(Check(signer_.Sign(kMethod, request_, kNow - absl::Seconds(29)), request_).ok());
}

TEST_F(PeerAuthTest, AWrongAudienceIsRefused) {
  store::PeerCallSigner elsewhere("cluster-secret", "10.0.0.1:29401");
  ExpectRefused(Check(elsewhere.Sign(kMethod, request_, kNow), request_), "wrong audience");
}

TEST_F(PeerAuthTest, ThePortBoundLaterIsTheAudience) {
  PeerAuthOptions options = Options();
  options.port = 0;
  PeerAuth auth(options, kStart);
  store::PeerCallSigner signer("cluster-secret", "[::1]:41000");
  EXPECT_FALSE(auth.Check(signer.Sign(kMethod, request_, kNow), kMethod, request_, kNow).ok());
  auth.set_port(41000);
  EXPECT_TRUE(auth.Check(signer.Sign(kMethod, request_, kNow), kMethod, request_, kNow).ok());
}

TEST_F(PeerAuthTest, CallsSignedBeforeThisDaemonStartedAreRefused) {
  ExpectRefused(Check(signer_.Sign(kMethod, request_, kStart - absl::Seconds(1)), request_,
                      kStart + absl::Seconds(1)),
                "replay");
}

}  // namespace
}  // namespace tpd
