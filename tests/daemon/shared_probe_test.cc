// SharedProbe (daemon/shared_probe.h): askers while a probe runs share its answer, askers
// within a second of it get that answer again without a probe, and a later one starts anew.

#include "daemon/shared_probe.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

TEST(SharedProbeTest, OneProbeAtATimeItsAnswerSharedAndKeptForASecond) {
  int started = 0;
  std::function<void(std::string)> finish;
  SharedProbe<std::string> probe([&](std::function<void(std::string)> done) {
    ++started;
    finish = std::move(done);
  });
  std::vector<std::string> answers;
  auto collect = [&](const std::string& answer) { answers.push_back(answer); };

  probe.Ask(collect);
  probe.Ask(collect);  // while the first runs: no second probe
  EXPECT_EQ(started, 1);
  EXPECT_TRUE(answers.empty());
  finish("first");
  EXPECT_EQ(answers, (std::vector<std::string>{"first", "first"}));

  probe.Ask(collect);  // within a second: the last answer, at once
  EXPECT_EQ(started, 1);
  EXPECT_EQ(answers.back(), "first");
  EXPECT_EQ(answers.size(), 3u);

  absl::SleepFor(absl::Milliseconds(1100));  // the second the answer is kept passes
  probe.Ask(collect);
  EXPECT_EQ(started, 2);
  EXPECT_EQ(answers.size(), 3u) << "waits for the new probe";
  finish("second");
  EXPECT_EQ(answers.back(), "second");
}

TEST(SharedProbeTest, AProbeThatFinishesAtOnceAnswersItsAsker) {
  SharedProbe<int> probe([](std::function<void(int)> done) { done(7); });
  int answer = 0;
  probe.Ask([&](const int& value) { answer = value; });
  EXPECT_EQ(answer, 7);
}

}  // namespace
}  // namespace tpd
