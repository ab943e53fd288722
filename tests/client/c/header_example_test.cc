// Runs the header's example (extracted by the BUILD file) where no daemon listens: it must
// build as C, link against libtpd_client.so, and take its error branch with the library's
// message naming the socket it tried.

#include <cstdlib>
#include <string>

#include "client/c/tpd_client.h"
#include "gtest/gtest.h"

extern "C" int header_example(void);

namespace {

TEST(HeaderExampleTest, BuildsAndReportsAMissingDaemon) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  const std::string socket = std::string(tmp) + "/no-daemon.sock";
  ASSERT_EQ(setenv("TPD_SOCKET", socket.c_str(), 1), 0);
  EXPECT_EQ(header_example(), 1);
  EXPECT_NE(std::string(tpd_last_error()).find("no-daemon.sock"), std::string::npos)
      << tpd_last_error();
}

}  // namespace
