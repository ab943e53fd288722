// Unit tests of the name rules for groups, workers and store namespaces.

#include "daemon/names.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(NamesTest, GroupNamesOfTheAllowedCharactersPass) {
  for (const char* name : {"", "train", "job-1.run_2:a@b", "A", "0"}) {
    EXPECT_TRUE(ValidateGroupName("JoinRequest.group", name).ok()) << name;
  }
  EXPECT_TRUE(ValidateGroupName("f", std::string(kMaxGroupNameBytes, 'g')).ok());
}

TEST(NamesTest, GroupNameWithANewlineNamesFieldCharacterAndRule) {
  absl::Status status = ValidateGroupName("JoinRequest.group", "evil\nline");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("JoinRequest.group"), HasSubstr("'\\n' at byte 4"),
                                      HasSubstr("[A-Za-z0-9._:@-]"), HasSubstr("128")));
  // The message itself is one line.
  EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos);
}

TEST(NamesTest, GroupNamesWithOtherForbiddenCharactersFail) {
  for (const std::string& name :
       {std::string("a/b"), std::string("a b"), std::string("a\0b", 3), std::string("\xc3\xa9"),
        std::string("a*"), std::string("../x")}) {
    EXPECT_EQ(ValidateGroupName("g", name).code(), absl::StatusCode::kInvalidArgument) << name;
  }
}

TEST(NamesTest, LongGroupNameNamesItsLengthAndTheLimit) {
  absl::Status status = ValidateGroupName("GetGroupRequest.group", std::string(129, 'g'));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("GetGroupRequest.group"), HasSubstr("129 bytes"), HasSubstr("128")));
  EXPECT_LT(status.message().size(), 400u);
}

TEST(NamesTest, WorkerNamesFollowPyTorchsRuleAndWording) {
  for (const char* name : {"w0", "worker-1_a:b", "A"}) {
    EXPECT_TRUE(ValidateWorkerName("JoinRequest.name", name).ok()) << name;
  }
  EXPECT_TRUE(ValidateWorkerName("n", std::string(127, 'w')).ok());
  for (const std::string& name : {std::string(""), std::string(128, 'w'), std::string("w.0"),
                                  std::string("w@x"), std::string("w 0"), std::string("w\n")}) {
    absl::Status status = ValidateWorkerName("JoinRequest.name", name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("JoinRequest.name"),
                      HasSubstr("Worker name must match ^[A-Za-z0-9-_:]*$, and must be non-empty "
                                "and shorter than 128 chars")))
        << name;
  }
  EXPECT_THAT(ValidateWorkerName("n", "w 0").message(), HasSubstr("' ' at byte 1"));
}

TEST(NamesTest, NamespacesArePrintableAndBounded) {
  EXPECT_TRUE(ValidateNamespace("SetRequest.namespace", "", 16).ok());
  EXPECT_TRUE(ValidateNamespace("SetRequest.namespace", "group/a b\xc3\xa9", 16).ok());
  EXPECT_TRUE(ValidateNamespace("SetRequest.namespace", std::string(16, 'n'), 16).ok());

  absl::Status long_one =
      ValidateNamespace("SetRequest.namespace", std::string(512 << 10, 'n'), 1024);
  EXPECT_EQ(long_one.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_one.message(),
              AllOf(HasSubstr("SetRequest.namespace"), HasSubstr("524288 bytes"),
                    HasSubstr("store.max_namespace_bytes is 1024")));
  EXPECT_LT(long_one.message().size(), 400u);

  for (const std::string& bad :
       {std::string("a\0b", 3), std::string("a\nb"), std::string("\t"), std::string("x\x7f")}) {
    absl::Status status = ValidateNamespace("CheckRequest.namespace", bad, 1024);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("CheckRequest.namespace"), HasSubstr("control characters")));
  }
}

}  // namespace
}  // namespace tpd
