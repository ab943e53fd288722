#include "shm/attach.h"

#include <string>

#include "gtest/gtest.h"

namespace tpd::shm {
namespace {

std::string Bytes(const std::array<uint8_t, kAttachRequestBytes>& a) {
  return std::string(reinterpret_cast<const char*>(a.data()), a.size());
}

TEST(AttachTest, RequestRoundTrips) {
  auto request = EncodeAttachRequest("0123456789abcdef0123456789abcdef");
  ASSERT_TRUE(request.ok());
  auto id = DecodeAttachRequest(Bytes(*request));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "0123456789abcdef0123456789abcdef");
}

TEST(AttachTest, EncodeRefusesMalformedIds) {
  EXPECT_FALSE(EncodeAttachRequest("").ok());
  EXPECT_FALSE(EncodeAttachRequest(std::string(kMaxSessionIdBytes + 1, 'a')).ok());
  EXPECT_FALSE(EncodeAttachRequest("ABC").ok());
  EXPECT_FALSE(EncodeAttachRequest(std::string("a\0b", 3)).ok());
}

TEST(AttachTest, DecodeRefusesGarbageWrongSizesAndTrailingBytes) {
  std::string good = Bytes(*EncodeAttachRequest("abc"));
  EXPECT_EQ(DecodeAttachRequest(std::string(kAttachRequestBytes, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(DecodeAttachRequest(good.substr(0, kAttachRequestBytes - 1)).ok());
  EXPECT_FALSE(DecodeAttachRequest(good + "x").ok());
  std::string version = good;
  version[8] = 9;
  EXPECT_NE(DecodeAttachRequest(version).status().message().find("version"), std::string::npos);
  std::string length = good;
  length[12] = static_cast<char>(200);
  EXPECT_FALSE(DecodeAttachRequest(length).ok());
  std::string trailing = good;
  trailing[40] = 'a';
  EXPECT_FALSE(DecodeAttachRequest(trailing).ok());
}

TEST(AttachTest, ReplyCarriesCodeMessageAndSize) {
  AttachReply ok;
  ok.segment_bytes = 1 << 20;
  auto encoded = EncodeAttachReply(ok);
  auto decoded =
      DecodeAttachReply(std::string(reinterpret_cast<const char*>(encoded.data()), encoded.size()));
  ASSERT_TRUE(decoded.ok());
  EXPECT_TRUE(decoded->status.ok());
  EXPECT_EQ(decoded->segment_bytes, 1u << 20);

  AttachReply refused;
  refused.status = absl::ResourceExhaustedError(std::string(500, 'm'));
  encoded = EncodeAttachReply(refused);
  decoded =
      DecodeAttachReply(std::string(reinterpret_cast<const char*>(encoded.data()), encoded.size()));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(decoded->status.message().size(), kMaxAttachMessageBytes);
  EXPECT_FALSE(DecodeAttachReply("short").ok());
}

TEST(AttachTest, DataSocketSitsBesideTheGrpcSocket) {
  EXPECT_EQ(DataSocketPath("/run/tpd/tpd.sock"), "/run/tpd/tpd.sock.data");
}

}  // namespace
}  // namespace tpd::shm
