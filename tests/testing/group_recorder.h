// What watchers of a group saw, for tests of membership under churn and faults: a
// GroupRecorder collects one WatchGroup stream's events on its own thread, and
// ExpectSameGapFreeVersions checks several daemons' recordings against each other.
//
// Thread safety: a GroupRecorder's methods may be called from any thread.

#ifndef TPD_TESTS_TESTING_GROUP_RECORDER_H_
#define TPD_TESTS_TESTING_GROUP_RECORDER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "proto/control.pb.h"

namespace tpd::testing {

class GroupRecorder {
 public:
  // Watches `group` through `client`, which must outlive the recorder.
  GroupRecorder(Client* client, const std::string& group, const std::string& init_method);
  // Cancels the watch and joins the reading thread.
  ~GroupRecorder();

  std::vector<v1::GroupEvent> events();
  // Waits until an event satisfies `pred`; false after `timeout`.
  bool WaitFor(const std::function<bool(const v1::GroupEvent&)>& pred, absl::Duration timeout);
  // Waits until an event of version `version` or later arrived; false after `timeout`.
  bool WaitForVersion(int64_t version, absl::Duration timeout);

 private:
  absl::Mutex mu_;
  std::vector<v1::GroupEvent> events_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<GroupWatch> watch_;
  std::thread thread_;
};

// Each recording is a snapshot followed by every later version once, in order (no gap, no
// repeat), and a version seen by several carries the same view everywhere (store names
// aside, which differ when a daemon serves the store itself).
void ExpectSameGapFreeVersions(const std::vector<std::vector<v1::GroupEvent>>& recordings);

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_GROUP_RECORDER_H_
