// GroupWorker: one thread running many tasks' steps, woken by Wake, timed by each step's
// answer, and Remove as a barrier after which a task never runs again.

#include "daemon/group/group_worker.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/wait_until.h"

namespace tpd::group {
namespace {

// Counts its steps; each step asks to run again after `period` (InfiniteFuture: only when
// woken). Optionally blocks inside a step until released.
class CountingTask : public WorkerTask {
 public:
  explicit CountingTask(absl::Duration period = absl::InfiniteDuration()) : period_(period) {}
  absl::Time Step() override {
    ++steps_;
    if (block_) {
      entered_.Notify();
      release_.WaitForNotification();
    }
    return period_ == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + period_;
  }
  int steps() const { return steps_.load(); }
  void BlockNextStep() { block_ = true; }
  absl::Notification entered_, release_;

 private:
  const absl::Duration period_;
  std::atomic<int> steps_{0};
  std::atomic<bool> block_{false};
};

TEST(GroupWorkerTest, RunsANewTaskAtOnceThenOnlyWhenWoken) {
  auto worker = *GroupWorker::Start("test");
  CountingTask task;
  worker->Add(&task);
  ASSERT_TRUE(testing::WaitUntil([&] { return task.steps() == 1; }));
  worker->Wake(&task);
  ASSERT_TRUE(testing::WaitUntil([&] { return task.steps() == 2; }));
  worker->Remove(&task);
  worker->Wake(&task);  // a no-op once removed
  EXPECT_EQ(task.steps(), 2);
}

TEST(GroupWorkerTest, RunsEveryTaskByItsOwnSchedule) {
  auto worker = *GroupWorker::Start("test");
  CountingTask ticking(absl::Milliseconds(5));
  CountingTask idle;
  worker->Add(&ticking);
  worker->Add(&idle);
  ASSERT_TRUE(testing::WaitUntil([&] { return ticking.steps() >= 5; }));
  EXPECT_EQ(idle.steps(), 1);  // its first run only: nobody woke it
  worker->Remove(&ticking);
  worker->Remove(&idle);
}

TEST(GroupWorkerTest, RemoveWaitsForARunningStep) {
  auto worker = *GroupWorker::Start("test");
  CountingTask task;
  task.BlockNextStep();
  worker->Add(&task);
  task.entered_.WaitForNotification();
  std::atomic<bool> removed{false};
  std::thread remover([&] {
    worker->Remove(&task);
    removed = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(removed.load()) << "Remove returned while the task's step was running";
  task.release_.Notify();
  remover.join();
  EXPECT_TRUE(removed.load());
}

}  // namespace
}  // namespace tpd::group
