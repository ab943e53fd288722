// The journal's view of a log line (daemon/journal_sink.h): priorities as syslog numbers them,
// a field for each leading "[kind value]" tag and for the first "uid N", nothing from a tag
// without a value or a kind that is not a short lowercase word; and stderr is taken for the
// journal only when $JOURNAL_STREAM names it.

#include "daemon/journal_sink.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsSupersetOf;
using ::testing::Not;

TEST(JournalFieldsTest, TagsBecomeFieldsAndLevelsBecomePriorities) {
  EXPECT_THAT(JournalFields("daemon", spdlog::level::info,
                            "[session s-1f2e] attached to shared memory by pid 7 uid 1000 gid 5"),
              ElementsAre("MESSAGE=[session s-1f2e] attached to shared memory by pid 7 uid 1000 "
                          "gid 5",
                          "PRIORITY=6", "SYSLOG_IDENTIFIER=tpd", "TPD_COMPONENT=daemon",
                          "TPD_SESSION=s-1f2e", "TPD_UID=1000"));
  EXPECT_THAT(JournalFields("agent", spdlog::level::warn, "[group g] [peer node1] lost: why"),
              IsSupersetOf({"PRIORITY=4", "TPD_GROUP=g", "TPD_PEER=node1", "TPD_COMPONENT=agent"}));
  EXPECT_THAT(JournalFields("daemon", spdlog::level::err, "x"), Contains("PRIORITY=3"));
  EXPECT_THAT(JournalFields("daemon", spdlog::level::critical, "x"), Contains("PRIORITY=2"));
  EXPECT_THAT(JournalFields("daemon", spdlog::level::debug, "x"), Contains("PRIORITY=7"));
}

TEST(JournalFieldsTest, OnlyLeadingTagsWithAValueAndAPlainKindCount) {
  const std::vector<std::string> fields = JournalFields(
      "daemon", spdlog::level::info, "[drain] [Bad kind] [session s-1] then [group late] text");
  EXPECT_THAT(fields, Contains("TPD_SESSION=s-1"));
  EXPECT_THAT(fields, Not(Contains("TPD_GROUP=late"))) << "a tag after the text is text";
  EXPECT_EQ(fields.size(), 5u) << "[drain] has no value, \"Bad\" is no field name";
  EXPECT_THAT(JournalFields("daemon", spdlog::level::info, "euid 5, uid x, suid 3"),
              Not(Contains(::testing::HasSubstr("TPD_UID"))));
}

TEST(StderrIsJournalTest, OnlyWhenJournalStreamNamesStderr) {
  unsetenv("JOURNAL_STREAM");
  EXPECT_FALSE(StderrIsJournal());
  struct stat st {};
  ASSERT_EQ(fstat(2, &st), 0);
  setenv("JOURNAL_STREAM", absl::StrCat(st.st_dev, ":", st.st_ino).c_str(), 1);
  EXPECT_TRUE(StderrIsJournal());
  setenv("JOURNAL_STREAM", absl::StrCat(st.st_dev, ":", st.st_ino + 1).c_str(), 1);
  EXPECT_FALSE(StderrIsJournal()) << "a stream the process inherited but no longer writes to";
  setenv("JOURNAL_STREAM", "garbage", 1);
  EXPECT_FALSE(StderrIsJournal());
  unsetenv("JOURNAL_STREAM");
}

}  // namespace
}  // namespace tpd
