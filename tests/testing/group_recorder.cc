#include "tests/testing/group_recorder.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tpd::testing {

GroupRecorder::GroupRecorder(Client* client, const std::string& group,
                             const std::string& init_method)
    : watch_(client->Watch(group, init_method)), thread_([this] {
        v1::GroupEvent event;
        while (watch_->Next(&event)) {
          absl::MutexLock lock(&mu_);
          events_.push_back(event);
        }
      }) {}

GroupRecorder::~GroupRecorder() {
  watch_->Cancel();  // the reading thread's Next returns false
  thread_.join();
}

std::vector<v1::GroupEvent> GroupRecorder::events() {
  absl::MutexLock lock(&mu_);
  return events_;
}

bool GroupRecorder::WaitFor(const std::function<bool(const v1::GroupEvent&)>& pred,
                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    for (const v1::GroupEvent& event : events()) {
      if (pred(event)) return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

bool GroupRecorder::WaitForVersion(int64_t version, absl::Duration timeout) {
  return WaitFor([version](const v1::GroupEvent& e) { return e.group().version() >= version; },
                 timeout);
}

void ExpectSameGapFreeVersions(const std::vector<std::vector<v1::GroupEvent>>& recordings) {
  std::string traces;
  for (size_t r = 0; r < recordings.size(); ++r) {
    absl::StrAppend(&traces, "watcher ", r, ":");
    for (const v1::GroupEvent& e : recordings[r]) {
      absl::StrAppend(&traces, " ", e.group().version(), e.kind());
    }
    absl::StrAppend(&traces, "\n");
  }
  SCOPED_TRACE(traces);
  std::map<int64_t, std::string> views;  // version -> the first recording's view, store cleared
  for (size_t r = 0; r < recordings.size(); ++r) {
    const std::vector<v1::GroupEvent>& events = recordings[r];
    for (size_t i = 0; i < events.size(); ++i) {
      if (i > 0) {
        EXPECT_EQ(events[i].group().version(), events[i - 1].group().version() + 1)
            << "gap or reorder on watcher " << r;
      }
      v1::GroupView view = events[i].group();
      view.clear_store();
      const std::string bytes = view.SerializeAsString();
      auto [it, first] = views.emplace(view.version(), bytes);
      if (!first) {
        EXPECT_EQ(it->second, bytes) << "version " << view.version() << " differs on watcher " << r;
      }
    }
  }
}

}  // namespace tpd::testing
