// GroupLog::TryAppend when the store's answer to a version's write is lost: a version that
// landed is taken as won, one that did not is a failure, and a write the store refused is
// not read back at all. The store is a MemoryStore whose CompareSet a test makes fail after
// (or instead of) applying it: the seam where etcd and the peer-port store lose answers.

#include "daemon/group/group_log.h"

#include <string>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "proto/group_record.pb.h"
#include "store/memory/memory_store.h"
#include "store/store.h"

namespace tpd::group {
namespace {

class LossyStore : public store::MemoryStore {
 public:
  enum class Mode { kNormal, kApplyThenLoseAnswer, kLoseRequest, kRefuse };

  void set_mode(Mode mode) {
    absl::MutexLock lock(&mu_);
    mode_ = mode;
  }
  int checks() {
    absl::MutexLock lock(&mu_);
    return checks_;
  }

  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override {
    Mode mode;
    {
      absl::MutexLock lock(&mu_);
      mode = mode_;
    }
    switch (mode) {
      case Mode::kNormal:
        return MemoryStore::CompareSet(key, expected, desired);
      case Mode::kApplyThenLoseAnswer:
        (void)MemoryStore::CompareSet(key, expected, desired);
        return absl::UnavailableError("the connection broke after the request was sent");
      case Mode::kLoseRequest:
        return absl::DeadlineExceededError("no answer");
      case Mode::kRefuse:
        return store::NotApplied(absl::ResourceExhaustedError("request is too large"));
    }
    return absl::InternalError("unreachable");
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    {
      absl::MutexLock lock(&mu_);
      ++checks_;
    }
    return MemoryStore::Check(keys);
  }

 private:
  absl::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kNormal;
  int checks_ ABSL_GUARDED_BY(mu_) = 0;
};

v1::GroupRecord Version(int64_t version) {
  v1::GroupRecord record;
  record.mutable_view()->set_group("g");
  record.mutable_view()->set_phase("EMPTY");
  record.mutable_view()->set_version(version);
  return record;
}

TEST(GroupLogTest, AVersionThatLandedThoughItsAnswerWasLostIsWon) {
  LossyStore store;
  GroupLog log(&store, "g");
  store.set_mode(LossyStore::Mode::kApplyThenLoseAnswer);
  absl::StatusOr<bool> won = log.TryAppend(Version(1));
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_TRUE(*won);
  store.set_mode(LossyStore::Mode::kNormal);
  ASSERT_TRUE(log.Latest().ok());
  EXPECT_EQ(log.Latest()->view().version(), 1);
}

TEST(GroupLogTest, AVersionThatNeverLandedIsTheWritesFailure) {
  LossyStore store;
  GroupLog log(&store, "g");
  store.set_mode(LossyStore::Mode::kLoseRequest);
  absl::StatusOr<bool> won = log.TryAppend(Version(1));  // read back for GroupLog's 2 s
  EXPECT_EQ(won.status().code(), absl::StatusCode::kDeadlineExceeded) << won.status();
  EXPECT_GT(store.checks(), 1) << "the version is looked for until it could have landed";
}

TEST(GroupLogTest, AWriteTheStoreRefusedIsNotReadBack) {
  LossyStore store;
  GroupLog log(&store, "g");
  store.set_mode(LossyStore::Mode::kRefuse);
  absl::StatusOr<bool> won = log.TryAppend(Version(1));
  EXPECT_EQ(won.status().code(), absl::StatusCode::kResourceExhausted) << won.status();
  EXPECT_EQ(store.checks(), 0);
}

}  // namespace
}  // namespace tpd::group
