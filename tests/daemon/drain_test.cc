// NodeDrain with fake steps: one drain however often it is asked for (a second request, or a
// SIGTERM during an Admin.Drain, waits for the same one and gets the same result); a request
// after the end is answered at once; Status shows live progress while draining and what the
// drain left once drained.

#include "daemon/drain.h"

#include <atomic>
#include <future>
#include <string>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

struct FakeNode {
  std::atomic<int> finish_runs{0};
  std::atomic<int> leave_runs{0};
  std::atomic<int64_t> calls{3};
  std::atomic<int64_t> members{2};
  absl::Notification calls_done;  // the test lets the calls in flight end
  std::string reason;

  NodeDrain::Steps Steps() {
    NodeDrain::Steps steps;
    steps.finish_calls = [this](absl::Time, const std::string& requested_by) {
      ++finish_runs;
      reason = requested_by;
      calls_done.WaitForNotification();
      calls = 1;  // one was cut off
      return size_t{1};
    };
    steps.leave = [this](const std::string&) {
      ++leave_runs;
      members = 0;
    };
    steps.progress = [this] {
      NodeDrain::Progress progress;
      progress.calls_in_flight = calls;
      progress.members = members;
      progress.sessions_open = 4;
      return progress;
    };
    return steps;
  }
};

TEST(NodeDrainTest, AskedTwiceItDrainsOnceAndAnswersBoth) {
  FakeNode node;
  NodeDrain drain(node.Steps());
  EXPECT_EQ(drain.Status().state(), "serving");
  EXPECT_EQ(drain.Status().calls_in_flight(), 3) << "progress is live before a drain too";

  std::promise<v1::DrainStatus> first;
  drain.Request("Admin.Drain", absl::Seconds(5),
                [&](const v1::DrainStatus& status) { first.set_value(status); });
  auto stop = std::async(std::launch::async,
                         [&] { return drain.RequestAndWait("SIGTERM", absl::Seconds(1)); });
  const v1::DrainStatus during = drain.Status();
  EXPECT_EQ(during.state(), "draining");
  EXPECT_EQ(during.requested_by(), "Admin.Drain");
  EXPECT_EQ(during.calls_in_flight(), 3);
  EXPECT_EQ(during.members(), 2);
  EXPECT_GT(during.started_unix_ms(), 0);
  EXPECT_EQ(during.drained_unix_ms(), 0);

  node.calls_done.Notify();
  const v1::DrainStatus answered = first.get_future().get();
  const v1::DrainStatus stopped = stop.get();
  EXPECT_EQ(node.finish_runs, 1);
  EXPECT_EQ(node.leave_runs, 1);
  EXPECT_EQ(node.reason, "Admin.Drain") << "the first request's reason stays";
  for (const v1::DrainStatus& status : {answered, stopped, drain.Status()}) {
    EXPECT_EQ(status.state(), "drained");
    EXPECT_EQ(status.calls_cut_off(), 1);
    EXPECT_EQ(status.calls_in_flight(), 1);
    EXPECT_EQ(status.members(), 0);
    EXPECT_EQ(status.sessions_open(), 4);
    EXPECT_GE(status.drained_unix_ms(), status.started_unix_ms());
  }

  bool at_once = false;
  drain.Request("Admin.Drain", absl::Seconds(5),
                [&](const v1::DrainStatus& status) { at_once = status.state() == "drained"; });
  EXPECT_TRUE(at_once) << "a request after the end is answered on the caller's thread";
  EXPECT_EQ(node.finish_runs, 1);
}

}  // namespace
}  // namespace tpd
