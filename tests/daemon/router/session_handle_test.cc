#include "daemon/router/session_handle.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

TEST(SessionHandleTest, IsShortStableAndNeverTheId) {
  const std::string id = "0123456789abcdef0123456789abcdef";
  const std::string handle = SessionHandle(id);
  EXPECT_THAT(handle, ::testing::MatchesRegex("s-[0-9a-f]{12}"));
  EXPECT_EQ(SessionHandle(id), handle);
  EXPECT_EQ(handle.find(id.substr(0, 8)), std::string::npos);
  EXPECT_NE(SessionHandle("0123456789abcdef0123456789abcdee"), handle);
}

}  // namespace
}  // namespace tpd
