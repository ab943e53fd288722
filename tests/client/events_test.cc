#include "client/events.h"

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<ClientEvent> Event(ClientEvent::Kind kind, uint64_t tag) {
  auto event = std::make_unique<ClientEvent>();
  event->kind = kind;
  event->tag = tag;
  return event;
}

void Push(EventQueues& queues, ClientEvent::Kind kind, uint64_t tag) {
  std::unique_ptr<ClientEvent> event = Event(kind, tag);
  ASSERT_TRUE(queues.Push(event));
  EXPECT_EQ(event, nullptr);
}

// The tag of the next event of `mask`, or its error's code as a negative number.
int64_t NextTag(EventQueues& queues, int mask, absl::Duration timeout = absl::Seconds(30)) {
  absl::StatusOr<std::unique_ptr<ClientEvent>> event = queues.Next(mask, timeout, nullptr);
  if (!event.ok()) return -static_cast<int64_t>(event.status().code());
  return static_cast<int64_t>((*event)->tag);
}

constexpr int kBoth = EventQueues::kRequests | EventQueues::kReplies;

TEST(EventQueuesTest, EachQueueGivesItsOwnEventsInOrderRepliesFirst) {
  auto queues = std::make_shared<EventQueues>();
  Push(*queues, ClientEvent::kRequest, 1);
  Push(*queues, ClientEvent::kRequest, 2);
  Push(*queues, ClientEvent::kReply, 3);
  Push(*queues, ClientEvent::kReleased, 4);  // rides with the replies
  EXPECT_EQ(NextTag(*queues, EventQueues::kRequests), 1);
  EXPECT_EQ(NextTag(*queues, kBoth), 3);
  EXPECT_EQ(NextTag(*queues, EventQueues::kReplies), 4);
  EXPECT_EQ(NextTag(*queues, kBoth), 2);
}

TEST(EventQueuesTest, AMaskNamingNoQueueIsRefused) {
  auto queues = std::make_shared<EventQueues>();
  absl::StatusOr<std::unique_ptr<ClientEvent>> event = queues->Next(4, absl::Seconds(1), nullptr);
  EXPECT_EQ(event.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(event.status().message(), HasSubstr("queues 4 names no queue"));
}

TEST(EventQueuesTest, AWaitWithNothingForItsQueuesEndsAtItsTimeout) {
  auto queues = std::make_shared<EventQueues>();
  Push(*queues, ClientEvent::kReply, 1);  // not what it waits for
  absl::StatusOr<std::unique_ptr<ClientEvent>> event =
      queues->Next(EventQueues::kRequests, absl::Milliseconds(20), nullptr);
  EXPECT_EQ(event.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(event.status().message(), HasSubstr("no event within 20000 microseconds"));
  EXPECT_EQ(NextTag(*queues, EventQueues::kReplies), 1);
}

TEST(EventQueuesTest, EveryWaiterGetsOneEventPushedFromAnotherThread) {
  auto queues = std::make_shared<EventQueues>();
  constexpr int kWaiters = 4;
  absl::Mutex mu;
  std::multiset<int64_t> got;
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      const int64_t tag = NextTag(*queues, i % 2 == 0 ? EventQueues::kRequests : kBoth);
      absl::MutexLock lock(&mu);
      got.insert(tag);
    });
  }
  for (int tag = 1; tag <= kWaiters; ++tag) Push(*queues, ClientEvent::kRequest, tag);
  for (std::thread& waiter : waiters) waiter.join();
  EXPECT_EQ(got, (std::multiset<int64_t>{1, 2, 3, 4}));
}

TEST(EventQueuesTest, StopEndsTheWaitsRefusesPushesAndHandsBackWhatWasQueued) {
  auto queues = std::make_shared<EventQueues>();
  Push(*queues, ClientEvent::kRequest, 1);
  Push(*queues, ClientEvent::kReply, 2);
  EXPECT_EQ(NextTag(*queues, EventQueues::kRequests), 1);
  // Waiting for requests (or about to): the stop ends the wait either way.
  std::thread waiter([&] {
    EXPECT_EQ(NextTag(*queues, EventQueues::kRequests),
              -static_cast<int64_t>(absl::StatusCode::kCancelled));
  });
  std::deque<std::unique_ptr<ClientEvent>> dropped = queues->Stop();
  waiter.join();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0]->tag, 2u);

  std::unique_ptr<ClientEvent> late = Event(ClientEvent::kReply, 3);
  EXPECT_FALSE(queues->Push(late));
  ASSERT_NE(late, nullptr);  // left with the caller, who answers it
  EXPECT_EQ(NextTag(*queues, kBoth), -static_cast<int64_t>(absl::StatusCode::kCancelled));
}

TEST(HandedOutViewsTest, FindsOnlyRangesInsideAViewAndForgetsItWhenRemovedAsOftenAsAdded) {
  auto keep = std::make_shared<int>(1);
  std::string memory(1000, 'x');
  const char* at = memory.data() + 100;
  const Tensor view =
      calls_internal::TensorParts::Received(shm::DType::kUInt8, {100}, Device{}, keep, at, 100);
  HandedOutViews views;
  EXPECT_FALSE(views.Find(at, 10).has_value());
  views.Add(view);
  views.Add(view);
  std::optional<Tensor> whole = views.Find(at, 100);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->data().data(), at);
  EXPECT_EQ(whole->size(), 100u);
  EXPECT_EQ(whole->storage(), TensorStorage::kReceived);
  EXPECT_EQ(calls_internal::TensorParts::KeepOf(*whole), keep) << "it holds the view's block";
  std::optional<Tensor> inner = views.Find(at + 50, 50);
  ASSERT_TRUE(inner.has_value());
  EXPECT_EQ(inner->data().data(), at + 50);
  // A range reaching past the view, or starting before or after it, is not the view's.
  EXPECT_FALSE(views.Find(at + 50, 51).has_value());
  EXPECT_FALSE(views.Find(at - 1, 2).has_value());
  EXPECT_FALSE(views.Find(at + 100, 1).has_value());
  views.Remove(view);
  EXPECT_TRUE(views.Find(at, 1).has_value());
  views.Remove(view);
  EXPECT_FALSE(views.Find(at, 1).has_value());
  views.Remove(view);  // once more than added: nothing to forget
}

}  // namespace
}  // namespace tpd
