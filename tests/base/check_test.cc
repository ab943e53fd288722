#include "base/check.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

TEST(CheckTest, PassingChecksDoNothingAndEvaluateTheStatusOnce) {
  int calls = 0;
  auto ok = [&calls] {
    ++calls;
    return absl::OkStatus();
  };
  TPD_DCHECK(1 + 1 == 2);
  TPD_CHECK_OK(ok());
  EXPECT_EQ(calls, 1);
  TPD_CHECK_OK(absl::StatusOr<int>(7));
}

TEST(CheckTest, CheckOkAlwaysEvaluatesItsExpression) {
  // Unlike TPD_DCHECK's condition, the expression runs in every build: it is the work.
  int calls = 0;
  auto work = [&calls] {
    ++calls;
    return absl::OkStatus();
  };
  TPD_CHECK_OK(work());
  EXPECT_EQ(calls, 1);
}

#if TPD_DCHECK_IS_ON
TEST(CheckDeathTest, FailedDcheckAbortsNamingTheCondition) {
  const int answer = 41;
  EXPECT_DEATH(TPD_DCHECK(answer == 42), "check_test.cc:[0-9]+: TPD_DCHECK failed: answer == 42");
}

TEST(CheckDeathTest, FailedCheckOkAbortsWithTheStatus) {
  EXPECT_DEATH(TPD_CHECK_OK(absl::NotFoundError("no key \"k\"")),
               "TPD_CHECK_OK failed: absl::NotFoundError.*NOT_FOUND: no key \"k\"");
  EXPECT_DEATH(TPD_CHECK_OK(absl::StatusOr<int>(absl::InternalError("boom"))), "INTERNAL: boom");
}
#else
TEST(CheckTest, WithNdebugAFailedCheckOkIsLoggedAndTheProgramGoesOn) {
  TPD_CHECK_OK(absl::NotFoundError("no key"));
  TPD_DCHECK(false);  // compiled out
  SUCCEED();
}
#endif

}  // namespace
}  // namespace tpd
