#include "daemon/router/pending_calls.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/wait_until.h"

namespace tpd::router {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

// The clock the calls are judged by; moved by hand.
class FakeClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration by) {
    absl::MutexLock lock(&mu_);
    now_ += by;
  }
  PendingCalls::Clock clock() {
    return [this] { return Now(); };
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

PendingCall Local(const std::string& caller, uint64_t caller_call_id, const std::string& callee,
                  absl::Time deadline = absl::InfiniteFuture()) {
  PendingCall call;
  call.caller = caller;
  call.caller_call_id = caller_call_id;
  call.callee = callee;
  call.worker = callee + "-worker";
  call.method = "m";
  call.deadline = deadline;
  return call;
}

PendingCall Remote(const std::string& callee, absl::Time deadline = absl::InfiniteFuture()) {
  PendingCall call;
  call.remote = agent::ReplyTo();
  call.callee = callee;
  call.deadline = deadline;
  return call;
}

std::vector<uint64_t> CallerIds(const std::vector<PendingCall>& calls) {
  std::vector<uint64_t> ids;
  for (const PendingCall& call : calls) ids.push_back(call.caller_call_id);
  return ids;
}

TEST(PendingCallsTest, IdsAreFreshAndACallIsTakenExactlyOnce) {
  PendingCalls calls;
  const uint64_t a = calls.Add(Local("s1", 7, "s2"));
  const uint64_t b = calls.Add(Local("s1", 8, "s2"));
  EXPECT_NE(a, b);
  EXPECT_EQ(calls.size(), 2u);
  std::optional<PendingCall> taken = calls.Take(a);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->caller_call_id, 7u);
  // Whoever comes second (a late reply, a cancel, the deadline) finds nothing.
  EXPECT_FALSE(calls.Take(a).has_value());
  EXPECT_FALSE(calls.TakeReply(a, "s2").has_value());
  EXPECT_FALSE(calls.TakeByCaller("s1", 7).has_value());
  EXPECT_EQ(calls.size(), 1u);
}

TEST(PendingCallsTest, OnlyTheCalleeSessionsReplyTakesACall) {
  PendingCalls calls;
  const uint64_t id = calls.Add(Local("s1", 1, "callee"));
  EXPECT_FALSE(calls.TakeReply(id, "someone-else").has_value());
  EXPECT_FALSE(calls.TakeReply(id + 100, "callee").has_value());
  EXPECT_TRUE(calls.TakeReply(id, "callee").has_value());
}

TEST(PendingCallsTest, ACancelFindsTheCallByItsCallersIdAndNeverARemoteOne) {
  PendingCalls calls;
  calls.Add(Local("s1", 5, "s2"));
  calls.Add(Remote("s2"));  // a remote caller has no local id to cancel by
  EXPECT_FALSE(calls.TakeByCaller("s1", 6).has_value());
  EXPECT_FALSE(calls.TakeByCaller("", 0).has_value());
  std::optional<PendingCall> cancelled = calls.TakeByCaller("s1", 5);
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ(cancelled->callee, "s2");
  EXPECT_EQ(calls.size(), 1u);
}

TEST(PendingCallsTest, DeadlinesComeDueByTheClockEarliestFirstAndGoWithTheirCalls) {
  FakeClock clock;
  PendingCalls calls(clock.clock());
  const absl::Time t0 = clock.Now();
  calls.Add(Local("s", 3, "c", t0 + absl::Seconds(3)));
  calls.Add(Local("s", 1, "c", t0 + absl::Seconds(1)));
  const uint64_t two = calls.Add(Local("s", 2, "c", t0 + absl::Seconds(2)));
  calls.Add(Local("s", 9, "c"));  // no deadline: never due
  EXPECT_TRUE(calls.TakeDue().empty());
  // A call answered before its deadline leaves no deadline behind.
  ASSERT_TRUE(calls.TakeReply(two, "c").has_value());
  clock.Advance(absl::Milliseconds(2500));
  EXPECT_THAT(CallerIds(calls.TakeDue()), ElementsAre(1));
  clock.Advance(absl::Hours(1));
  EXPECT_THAT(CallerIds(calls.TakeDue()), ElementsAre(3));
  EXPECT_TRUE(calls.TakeDue().empty());
  EXPECT_EQ(calls.size(), 1u);
  // A call whose deadline took it is gone for the reply and the cancel.
  EXPECT_FALSE(calls.TakeByCaller("s", 3).has_value());
}

TEST(PendingCallsTest, ASessionEndingTakesWhatItMadeAndWhatItServesOnly) {
  PendingCalls calls;
  calls.Add(Local("gone", 1, "other"));   // made by it
  calls.Add(Local("other", 2, "gone"));   // served by it
  calls.Add(Remote("gone"));              // served by it, for another daemon
  calls.Add(Local("other", 3, "third"));  // none of its business
  std::vector<PendingCall> taken = calls.TakeOfSession("gone");
  EXPECT_EQ(taken.size(), 3u);
  EXPECT_THAT(CallerIds(taken), UnorderedElementsAre(1, 2, 0));
  EXPECT_EQ(calls.size(), 1u);
  EXPECT_TRUE(calls.TakeByCaller("other", 3).has_value());
  EXPECT_FALSE(calls.TakeByCaller("gone", 1).has_value());
}

TEST(PendingCallsTest, AwaitNoneReturnsOnceTheLastCallIsTakenOrAtItsDeadline) {
  PendingCalls calls;
  const uint64_t id = calls.Add(Local("s", 1, "c"));
  EXPECT_EQ(calls.AwaitNone(absl::Now()), 1u);
  std::thread answer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    calls.Take(id);
  });
  EXPECT_EQ(calls.AwaitNone(absl::Now() + absl::Seconds(30)), 0u);
  answer.join();
}

TEST(PendingCallsTest, ServeDeadlinesAnswersDueCallsOnItsThreadUntilStopped) {
  PendingCalls calls;
  absl::Mutex mu;
  std::vector<uint64_t> due;
  std::thread timer([&] {
    calls.ServeDeadlines(
        [&](PendingCall call) {
          absl::MutexLock lock(&mu);
          due.push_back(call.caller_call_id);
        },
        absl::Seconds(1));
  });
  // Added while the timer sleeps with nothing due: an earlier deadline wakes it.
  absl::SleepFor(absl::Milliseconds(20));
  calls.Add(Local("s", 1, "c", absl::Now() + absl::Milliseconds(10)));
  calls.Add(Local("s", 2, "c", absl::InfiniteFuture()));
  EXPECT_TRUE(testing::WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return due.size() == 1;
  }));
  calls.Stop();
  timer.join();
  absl::MutexLock lock(&mu);
  EXPECT_THAT(due, ElementsAre(1));
  EXPECT_EQ(calls.size(), 1u);
}

}  // namespace
}  // namespace tpd::router
