// The per-call MAC: what it covers, its header format, and that the token never shows in it.

#include "store/peer_mac.h"

#include "absl/strings/escaping.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/store.pb.h"

namespace tpd::store {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

PeerMacFields Fields() {
  v1::SetRequest request;
  request.set_key("k");
  request.set_value("v");
  PeerMacFields fields;
  fields.method = "/tpd.v1.Store/Set";
  fields.audience = "10.0.0.1:29400";
  fields.timestamp_ms = 1700000000123;
  fields.sender_id = 0x0123456789abcdef;
  fields.sequence = 7;
  fields.body_digest = RequestDigest(request);
  return fields;
}

TEST(PeerMacTest, IsAnHmacSha256OfEveryField) {
  const PeerMacFields fields = Fields();
  const std::string mac = ComputePeerMac("secret", fields);
  EXPECT_EQ(mac.size(), 32);
  EXPECT_EQ(mac, ComputePeerMac("secret", fields)) << "deterministic";
  EXPECT_NE(mac, ComputePeerMac("other", fields));
  auto changed = [&](auto change) {
    PeerMacFields copy = fields;
    change(&copy);
    return ComputePeerMac("secret", copy);
  };
  EXPECT_NE(mac, changed([](PeerMacFields* f) { f->method = "/tpd.v1.Store/Add"; }));
  EXPECT_NE(mac, changed([](PeerMacFields* f) { f->audience = "10.0.0.2:29400"; }));
  EXPECT_NE(mac, changed([](PeerMacFields* f) { ++f->timestamp_ms; }));
  EXPECT_NE(mac, changed([](PeerMacFields* f) { ++f->sender_id; }));
  EXPECT_NE(mac, changed([](PeerMacFields* f) { ++f->sequence; }));
  EXPECT_NE(mac, changed([](PeerMacFields* f) { f->body_digest[0] ^= 1; }));
  // Length prefixes: moving a byte from one field to the next changes the MAC.
  EXPECT_NE(mac, changed([](PeerMacFields* f) {
              f->method += "1";
              f->audience = "0.0.0.1:29400";
            }));
}

TEST(PeerMacTest, DigestCoversTheRequestBytes) {
  v1::SetRequest a;
  a.set_key("k");
  a.set_value("v");
  v1::SetRequest b = a;
  EXPECT_EQ(RequestDigest(a), RequestDigest(b));
  b.set_value("w");
  EXPECT_NE(RequestDigest(a), RequestDigest(b));
  EXPECT_EQ(RequestDigest(a).size(), 32);
}

TEST(PeerMacTest, HeaderRoundTripsAndNeverHoldsTheToken) {
  const PeerMacFields fields = Fields();
  const std::string mac = ComputePeerMac("cluster-secret", fields);
  const std::string header = FormatPeerAuthHeader(fields, mac);
  EXPECT_THAT(header, Not(HasSubstr("cluster-secret")));
  EXPECT_THAT(header, HasSubstr("tpd-mac-v1 aud=10.0.0.1:29400 ts=1700000000123 "
                                "sender=0123456789abcdef seq=7 mac="));
  absl::StatusOr<ParsedPeerAuth> parsed = ParsePeerAuthHeader(header);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->fields.audience, fields.audience);
  EXPECT_EQ(parsed->fields.timestamp_ms, fields.timestamp_ms);
  EXPECT_EQ(parsed->fields.sender_id, fields.sender_id);
  EXPECT_EQ(parsed->fields.sequence, fields.sequence);
  EXPECT_EQ(parsed->mac, mac);
}

TEST(PeerMacTest, MalformedHeadersAreInvalidArgument) {
  const std::string good = FormatPeerAuthHeader(Fields(), std::string(32, 'x'));
  for (const std::string& bad :
       {std::string(""), std::string("cluster-secret"), good.substr(0, good.size() - 1),
        std::string("tpd-mac-v2") + good.substr(10), good + " extra",
        std::string("tpd-mac-v1 aud= ts=1 sender=0123456789abcdef seq=1 mac=") +
            std::string(64, '0'),
        std::string("tpd-mac-v1 aud=a:1 ts=x sender=0123456789abcdef seq=1 mac=") +
            std::string(64, '0'),
        std::string("tpd-mac-v1 aud=a:1 ts=1 sender=01 seq=1 mac=") + std::string(64, '0'),
        std::string("tpd-mac-v1 aud=a:1 ts=1 sender=0123456789abcdef seq=-1 mac=") +
            std::string(64, '0'),
        std::string("tpd-mac-v1 aud=a:1 ts=1 sender=0123456789abcdef seq=1 mac=") +
            std::string(64, 'G')}) {
    EXPECT_EQ(ParsePeerAuthHeader(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(PeerMacTest, AUserACallIsMadeForIsUnderTheMacAndInTheHeader) {
  PeerMacFields fields = Fields();
  const std::string mac = ComputePeerMac("secret", fields);
  fields.on_behalf = StoreUser{65534, "node b"};
  const std::string for_user = ComputePeerMac("secret", fields);
  EXPECT_NE(for_user, mac) << "a call for a user is not the daemon's own";
  PeerMacFields other = fields;
  other.on_behalf->uid = 0;
  EXPECT_NE(ComputePeerMac("secret", other), for_user);
  other = fields;
  other.on_behalf->node = "node c";
  EXPECT_NE(ComputePeerMac("secret", other), for_user);

  // The node's name travels in hex: a name with spaces keeps the header's words apart.
  const std::string header = FormatPeerAuthHeader(fields, for_user);
  EXPECT_THAT(header, HasSubstr(" for=65534@6e6f64652062"));
  absl::StatusOr<ParsedPeerAuth> parsed = ParsePeerAuthHeader(header);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(parsed->fields.on_behalf.has_value());
  EXPECT_EQ(*parsed->fields.on_behalf, *fields.on_behalf);
  EXPECT_FALSE(ParsePeerAuthHeader(FormatPeerAuthHeader(Fields(), mac))->fields.on_behalf);

  const std::string base = FormatPeerAuthHeader(Fields(), mac);
  for (const std::string& bad :
       {std::string(" user=1@61"), std::string(" for=1"), std::string(" for=1@"),
        std::string(" for=x@61"), std::string(" for=-1@61"), std::string(" for=4294967296@61"),
        std::string(" for=1@6"), std::string(" for=1@zz"),
        std::string(" for=1@") + std::string(512, '6')}) {
    EXPECT_EQ(ParsePeerAuthHeader(base + bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(PeerMacTest, SignerCountsSequencesAndNamesItsAudience) {
  PeerCallSigner signer("secret", "127.0.0.1:4000");
  v1::SetRequest request;
  const absl::Time now = absl::FromUnixMillis(1700000000000);
  absl::StatusOr<ParsedPeerAuth> first = ParsePeerAuthHeader(signer.Sign("/m", request, now));
  absl::StatusOr<ParsedPeerAuth> second = ParsePeerAuthHeader(signer.Sign("/m", request, now));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->fields.sequence, 1);
  EXPECT_EQ(second->fields.sequence, 2);
  EXPECT_EQ(first->fields.sender_id, signer.sender_id());
  EXPECT_EQ(first->fields.audience, "127.0.0.1:4000");
  EXPECT_EQ(first->fields.timestamp_ms, 1700000000000);
  PeerMacFields expected = first->fields;
  expected.method = "/m";
  expected.body_digest = RequestDigest(request);
  EXPECT_EQ(first->mac, ComputePeerMac("secret", expected));
  EXPECT_NE(PeerCallSigner("secret", "a:1").sender_id(), signer.sender_id());
}

TEST(PeerMacTest, AReplyMacBindsTheAnswerToItsCallAndTheToken) {
  PeerCallSigner signer("secret", "127.0.0.1:4000");
  v1::SetRequest request;
  const SignedCall call = signer.SignCall("/m", request, std::nullopt);
  const SignedCall other = signer.SignCall("/m", request, std::nullopt);
  ASSERT_EQ(ParsePeerAuthHeader(call.header)->mac, call.mac);
  v1::GetResponse answer;
  answer.set_value("v");
  const std::string mac = ComputeReplyMac("secret", call.mac, answer);
  absl::StatusOr<std::string> parsed = ParsePeerReplyHeader(FormatPeerReplyHeader(mac));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, mac);
  // Another call, another token, another answer: another MAC.
  EXPECT_NE(ComputeReplyMac("secret", other.mac, answer), mac);
  EXPECT_NE(ComputeReplyMac("guess", call.mac, answer), mac);
  v1::GetResponse changed;
  changed.set_value("w");
  EXPECT_NE(ComputeReplyMac("secret", call.mac, changed), mac);
  for (const std::string& bad : {std::string(""), std::string("tpd-reply-v1 mac=00"),
                                 std::string("tpd-reply-v2 mac=") + std::string(64, '0'),
                                 std::string("tpd-reply-v1 mac=") + std::string(64, 'G')}) {
    EXPECT_EQ(ParsePeerReplyHeader(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace tpd::store
