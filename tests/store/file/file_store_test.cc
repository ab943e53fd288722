// Unit tests of FileStore. The c10d semantics every backend shares run here through the
// conformance suite (tests/store/store_conformance.cc); the tests below add what sharing one
// file brings: several stores and processes on one path, bad bytes in the file, and a file
// truncated under an open store.

#include "store/file/file_store.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/store.h"
#include "tests/store/store_conformance.h"

namespace tpd::store {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Awaits `store`'s poller having replayed the file up to `offset`; false after kSanityBound.
bool AwaitReplayed(FileStore& store, int64_t offset) {
  const absl::Time give_up = absl::Now() + kSanityBound;
  while (store.Stats().file_offset < offset) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Microseconds(100));
  }
  return true;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -1;
  return st.st_size;
}

// Appends `bytes` to the file behind the store's back, without its lock.
void AppendRaw(const std::string& path, const std::string& bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  close(fd);
}

// A fresh directory under /tmp, removed with everything in it when this goes.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/file_store_test.XXXXXX";
    EXPECT_NE(mkdtemp(pattern), nullptr) << strerror(errno);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A FileStore alone on a file in a directory of its own, for the conformance suite.
class FileStoreUnderTest : public StoreUnderTest {
 public:
  FileStoreUnderTest(std::unique_ptr<TempDir> dir, std::unique_ptr<FileStore> store)
      : dir_(std::move(dir)), store_(std::move(store)) {}
  Store& store() override { return *store_; }
  int64_t waiters() override { return store_->Stats().waiters; }

 private:
  std::unique_ptr<TempDir> dir_;  // declared first: outlives the store
  std::unique_ptr<FileStore> store_;
};

std::unique_ptr<StoreUnderTest> MakeFileStore(int64_t max_waiters) {
  auto dir = std::make_unique<TempDir>();
  FileStoreOptions options;
  options.max_waiters = max_waiters;
  absl::StatusOr<std::unique_ptr<FileStore>> store =
      FileStore::Open(dir->path() + "/store", options);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return nullptr;
  return std::make_unique<FileStoreUnderTest>(std::move(dir), *std::move(store));
}

INSTANTIATE_TEST_SUITE_P(FileStore, StoreConformanceTest,
                         ::testing::Values(StoreFactory(MakeFileStore)));

// Each test gets a fresh directory, removed afterwards.
class FileStoreTest : public ::testing::Test {
 protected:
  // Opens a store on the test's file; fails the test on error.
  std::unique_ptr<FileStore> OpenStore(FileStoreOptions options = {}) {
    absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::Open(path_, options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  TempDir temp_dir_;
  const std::string dir_ = temp_dir_.path();
  const std::string path_ = dir_ + "/store";
};

// --- c10d semantics beyond the conformance suite: other stores on the path, the file ------

TEST_F(FileStoreTest, BinaryKeysAndValuesRoundTrip) {
  const std::string key("k\0ey", 4);
  const std::string value("\0\xff\nTPDS", 7);
  {
    auto store = OpenStore();
    ASSERT_TRUE(store->Set(key, value).ok());
  }
  auto reopened = OpenStore();
  EXPECT_EQ(reopened->Get(key, LongDeadline()).value_or(""), value);
}

TEST_F(FileStoreTest, GetWaitsForASetFromAnotherFileStoreOnTheSamePath) {
  auto getter = OpenStore();
  auto setter = OpenStore();
  std::thread thread([&] {
    // Set only once the getter is parked, so the get really waits and the poller (not the
    // initial replay) has to find the key.
    ASSERT_TRUE(AwaitWaiters(*getter, 1));
    ASSERT_TRUE(setter->Set("key", "late value").ok());
  });
  absl::StatusOr<std::string> value = getter->Get("key", LongDeadline());
  thread.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "late value");
  EXPECT_EQ(getter->Stats().waiters, 0);
}

TEST_F(FileStoreTest, WaitAsyncOnKeysAnotherStoreAlreadySetCompletesBeforeReturning) {
  WaitResult result;
  auto writer = OpenStore();
  auto reader = OpenStore();
  ASSERT_TRUE(writer->Set("a", "1").ok());
  ASSERT_TRUE(reader->WaitAsync({"a"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(result.HasRun());
  EXPECT_THAT(result.result().value_or(std::vector<std::string>{}), ElementsAre("1"));
}

TEST_F(FileStoreTest, AddOnNonIntegerValueIsFailedPreconditionAndKeepsTheValue) {
  auto store = OpenStore();
  ASSERT_TRUE(store->Set("key", "not a number").ok());
  const int64_t size = FileSize(path_);
  absl::StatusOr<int64_t> sum = store->Add("key", 1);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition) << sum.status();
  EXPECT_THAT(sum.status().message(), HasSubstr("\"key\""));
  EXPECT_EQ(store->Get("key", LongDeadline()).value_or(""), "not a number");
  EXPECT_EQ(FileSize(path_), size);  // nothing written
}

TEST_F(FileStoreTest, CompareSetOnMissingKeyWithNonEmptyExpectedReturnsExpectedAndCreatesNothing) {
  auto store = OpenStore();
  absl::StatusOr<std::string> result = store->CompareSet("key", "expected", "desired");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "expected");
  EXPECT_FALSE(store->Check({"key"}).value_or(true));
  EXPECT_EQ(store->NumKeys("").value_or(-1), 0);
  EXPECT_EQ(FileSize(path_), 0);
}

TEST_F(FileStoreTest, DeleteKeyOfPresentKeyRemovesItAndReturnsTrue) {
  auto store = OpenStore();
  ASSERT_TRUE(store->Set("key", "value").ok());
  absl::StatusOr<bool> deleted = store->DeleteKey("key");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_TRUE(*deleted);
  EXPECT_FALSE(store->Check({"key"}).value_or(true));
  EXPECT_EQ(store->Stats().num_keys, 0);
  EXPECT_EQ(store->Stats().bytes, 0);
  // The tombstone is in the file: a store opened later does not see the key either.
  auto reopened = OpenStore();
  EXPECT_FALSE(reopened->Check({"key"}).value_or(true));
}

TEST_F(FileStoreTest, DeleteKeyOfAbsentKeyReturnsFalseAndWritesNothing) {
  auto store = OpenStore();
  ASSERT_TRUE(store->Set("other", "value").ok());
  const int64_t size = FileSize(path_);
  absl::StatusOr<bool> deleted = store->DeleteKey("key");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_FALSE(*deleted);
  EXPECT_EQ(store->NumKeys("").value_or(-1), 1);
  EXPECT_EQ(FileSize(path_), size);
}

TEST_F(FileStoreTest, DeleteKeyByAnotherStoreIsSeen) {
  auto first = OpenStore();
  auto second = OpenStore();
  ASSERT_TRUE(first->Set("key", "value").ok());
  EXPECT_TRUE(second->DeleteKey("key").value_or(false));
  EXPECT_FALSE(first->Check({"key"}).value_or(true));
  EXPECT_FALSE(first->DeleteKey("key").value_or(true));
}

TEST_F(FileStoreTest, MultiSetSetsEveryKeyInOneRecord) {
  auto store = OpenStore();
  ASSERT_TRUE(store->MultiSet({"a", "b", "c"}, {"1", "2", "3"}).ok());
  absl::StatusOr<std::vector<std::string>> values =
      store->MultiGet({"a", "b", "c"}, LongDeadline());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("1", "2", "3"));
  // Header, trailer, count, and three entries of (4 + 1 + 8 + 1) bytes: one record.
  EXPECT_EQ(FileSize(path_), 20 + 4 + 4 + 3 * 14);
}

TEST_F(FileStoreTest, AppendToExistingKeyConcatenatesAcrossStores) {
  auto first = OpenStore();
  auto second = OpenStore();
  ASSERT_TRUE(first->Set("key", "abc").ok());
  ASSERT_TRUE(second->Append("key", "def").ok());
  ASSERT_TRUE(first->Append("key", "ghi").ok());
  EXPECT_EQ(second->Get("key", LongDeadline()).value_or(""), "abcdefghi");
  EXPECT_EQ(OpenStore()->Get("key", LongDeadline()).value_or(""), "abcdefghi");
}

TEST_F(FileStoreTest, AppendPastMaxValueBytesIsResourceExhaustedAndChangesNothing) {
  FileStoreOptions options;
  options.max_value_bytes = 4;
  auto store = OpenStore(options);
  ASSERT_TRUE(store->Append("key", "abc").ok());
  absl::Status status = store->Append("key", "de");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("store.max_value_bytes"));
  EXPECT_EQ(store->Get("key", LongDeadline()).value_or(""), "abc");
}

TEST_F(FileStoreTest, WaitKeepsWaitingWhenASetKeyIsDeletedBeforeTheLastKeyArrives) {
  WaitResult result;
  auto waiter = OpenStore();
  auto writer = OpenStore();
  ASSERT_TRUE(waiter->WaitAsync({"a", "b", "c"}, LongDeadline(), result.Callback()).ok());
  ASSERT_TRUE(writer->Set("a", "1").ok());
  ASSERT_TRUE(writer->Set("b", "2").ok());
  ASSERT_TRUE(writer->DeleteKey("a").value_or(false));
  ASSERT_TRUE(writer->Set("c", "3").ok());
  // Every key has been set once, but "a" is gone again: once the waiter's poller has read
  // it all, the wait must still be pending.
  ASSERT_TRUE(AwaitReplayed(*waiter, FileSize(path_)));
  EXPECT_FALSE(result.HasRun());
  EXPECT_EQ(waiter->Stats().waiters, 1);

  ASSERT_TRUE(writer->Set("a", "again").ok());
  ASSERT_TRUE(result.Await());
  ASSERT_TRUE(result.result().ok()) << result.result().status();
  EXPECT_THAT(*result.result(), ElementsAre("again", "2", "3"));
  EXPECT_EQ(waiter->Stats().waiters, 0);
}

// --- Sharing one file -------------------------------------------------------------------

TEST_F(FileStoreTest, TwoFileStoresOnOnePathSeeEachOthersWrites) {
  auto first = OpenStore();
  auto second = OpenStore();
  ASSERT_TRUE(first->Set("from_first", "1").ok());
  ASSERT_TRUE(second->Set("from_second", "2").ok());
  ASSERT_TRUE(second->MultiSet({"m1", "m2"}, {"x", "y"}).ok());
  EXPECT_EQ(second->Get("from_first", LongDeadline()).value_or(""), "1");
  EXPECT_EQ(first->Get("from_second", LongDeadline()).value_or(""), "2");
  EXPECT_TRUE(first->Check({"m1", "m2"}).value_or(false));
  EXPECT_EQ(first->NumKeys("").value_or(-1), 4);
  EXPECT_EQ(second->Add("n", 1).value_or(-1), 1);
  EXPECT_EQ(first->Add("n", 1).value_or(-1), 2);
  EXPECT_EQ(first->CompareSet("from_second", "2", "3").value_or(""), "3");
  EXPECT_EQ(second->Get("from_second", LongDeadline()).value_or(""), "3");
}

TEST_F(FileStoreTest, ReopenedStoreReplaysTheWholeFile) {
  {
    auto store = OpenStore();
    ASSERT_TRUE(store->Set("a", "1").ok());
    ASSERT_TRUE(store->Add("n", 7).ok());
    ASSERT_TRUE(store->Append("s", "xy").ok());
    ASSERT_TRUE(store->Append("s", "z").ok());
    ASSERT_TRUE(store->Set("gone", "v").ok());
    ASSERT_TRUE(store->DeleteKey("gone").ok());
  }
  auto store = OpenStore();
  absl::StatusOr<std::vector<std::string>> values =
      store->MultiGet({"a", "n", "s"}, LongDeadline());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("1", "7", "xyz"));
  EXPECT_EQ(store->NumKeys("").value_or(-1), 3);
  EXPECT_EQ(store->Stats().file_offset, FileSize(path_));
}

TEST_F(FileStoreTest, ConcurrentAddsFromTwoFileStoresTimesFourThreadsSumExactly) {
  constexpr int kStores = 2;
  constexpr int kThreadsPerStore = 4;
  constexpr int kAddsPerThread = 250;
  std::vector<std::unique_ptr<FileStore>> stores;
  for (int s = 0; s < kStores; ++s) stores.push_back(OpenStore());
  std::vector<std::thread> threads;
  for (int s = 0; s < kStores; ++s) {
    for (int t = 0; t < kThreadsPerStore; ++t) {
      const int delta = s * kThreadsPerStore + t + 1;
      threads.emplace_back([store = stores[s].get(), delta] {
        for (int i = 0; i < kAddsPerThread; ++i) {
          ASSERT_TRUE(store->Add("counter", delta).ok());
        }
      });
    }
  }
  for (std::thread& thread : threads) thread.join();
  constexpr int kThreads = kStores * kThreadsPerStore;
  const int64_t expected = int64_t{kAddsPerThread} * kThreads * (kThreads + 1) / 2;
  EXPECT_EQ(stores[0]->Add("counter", 0).value_or(-1), expected);
  EXPECT_EQ(stores[1]->Add("counter", 0).value_or(-1), expected);
}

// The real multi-daemon case: separate processes, each with its own FileStore on the path.
TEST_F(FileStoreTest, AddsFromFourForkedProcessesSumExactlyAndEachResultIsUnique) {
  constexpr int kChildren = 4;
  constexpr int kAddsPerChild = 200;
  int start[2];
  ASSERT_EQ(pipe(start), 0);
  std::vector<pid_t> children;
  std::vector<int> results;  // read ends: each child reports the sums its adds returned
  for (int c = 0; c < kChildren; ++c) {
    int report[2];
    ASSERT_EQ(pipe(report), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << strerror(errno);
    if (pid == 0) {
      // Child: no gtest assertions here; the exit code tells the parent what went wrong.
      close(start[1]);
      close(report[0]);
      char byte;
      if (read(start[0], &byte, 1) != 0) _exit(10);  // EOF: every child starts at once
      absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::Open(path_);
      if (!store.ok()) _exit(11);
      std::vector<int64_t> sums;
      for (int i = 0; i < kAddsPerChild; ++i) {
        absl::StatusOr<int64_t> sum = (*store)->Add("counter", 1);
        if (!sum.ok()) _exit(12);
        sums.push_back(*sum);
      }
      store->reset();
      const ssize_t bytes = sums.size() * sizeof(int64_t);
      if (write(report[1], sums.data(), bytes) != bytes) _exit(13);
      _exit(0);
    }
    close(report[1]);
    children.push_back(pid);
    results.push_back(report[0]);
  }
  close(start[0]);
  close(start[1]);  // go

  std::set<int64_t> seen;
  for (int c = 0; c < kChildren; ++c) {
    std::vector<int64_t> sums(kAddsPerChild);
    const ssize_t bytes = sums.size() * sizeof(int64_t);
    ssize_t got = 0;
    while (got < bytes) {
      const ssize_t n = read(results[c], reinterpret_cast<char*>(sums.data()) + got, bytes - got);
      if (n <= 0) break;
      got += n;
    }
    close(results[c]);
    int status = 0;
    ASSERT_EQ(waitpid(children[c], &status, 0), children[c]);
    ASSERT_TRUE(WIFEXITED(status)) << "child " << c << " status " << status;
    ASSERT_EQ(WEXITSTATUS(status), 0) << "child " << c;
    ASSERT_EQ(got, bytes) << "child " << c;
    for (int64_t sum : sums) EXPECT_TRUE(seen.insert(sum).second) << "sum " << sum << " twice";
  }
  // Every add was applied on top of every earlier one: the sums are exactly 1..N.
  constexpr int64_t kTotal = int64_t{kChildren} * kAddsPerChild;
  EXPECT_EQ(seen.size(), static_cast<size_t>(kTotal));
  EXPECT_EQ(*seen.begin(), 1);
  EXPECT_EQ(*seen.rbegin(), kTotal);
  auto store = OpenStore();
  EXPECT_EQ(store->Add("counter", 0).value_or(-1), kTotal);
}

// --- Bad bytes in the file --------------------------------------------------------------

TEST_F(FileStoreTest, GarbageAppendedToTheFileIsIgnoredAndTheStoreKeepsWorking) {
  auto writer = OpenStore();
  auto reader = OpenStore();
  ASSERT_TRUE(writer->Set("before", "1").ok());
  // Plain junk, a fake header with the right magic but a bad checksum, and a header with a
  // huge length: none of it may crash a reader or hide later records.
  std::string garbage = "this is not a record\n";
  garbage += std::string("TPDS\x01\0\0\0\xff\xff\xff\xff\xff\xff\xff\x7f\0\0\0\0", 20);
  for (int i = 0; i < 5000; ++i) garbage.push_back(static_cast<char>((i * 7919) % 251));
  AppendRaw(path_, garbage);

  auto opened_after = OpenStore();
  EXPECT_EQ(opened_after->Get("before", LongDeadline()).value_or(""), "1");
  EXPECT_EQ(opened_after->NumKeys("").value_or(-1), 1);

  ASSERT_TRUE(writer->Set("after", "2").ok());
  EXPECT_EQ(reader->Get("after", LongDeadline()).value_or(""), "2");
  EXPECT_EQ(opened_after->Get("after", LongDeadline()).value_or(""), "2");
  EXPECT_EQ(reader->Add("counter", 1).value_or(-1), 1);
  EXPECT_EQ(opened_after->Add("counter", 1).value_or(-1), 2);
  EXPECT_EQ(writer->Add("counter", 1).value_or(-1), 3);

  auto fresh = OpenStore();
  EXPECT_EQ(fresh->NumKeys("").value_or(-1), 3);
  EXPECT_EQ(fresh->Get("counter", LongDeadline()).value_or(""), "3");
}

TEST_F(FileStoreTest, FileOfGarbageOpensAsAnEmptyStoreThatWorks) {
  std::string garbage;
  for (int i = 0; i < 100000; ++i) garbage.push_back(static_cast<char>((i * 31 + 7) % 256));
  {
    const int fd = open(path_.c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  AppendRaw(path_, garbage);
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->NumKeys("").value_or(-1), 0);
  ASSERT_TRUE(store->Set("key", "value").ok());
  EXPECT_EQ(OpenStore()->Get("key", LongDeadline()).value_or(""), "value");
  EXPECT_GT(FileSize(path_), static_cast<int64_t>(garbage.size()));  // garbage kept, not cut
}

TEST_F(FileStoreTest, TornLastRecordIsIgnoredAndLaterWritesAreSeen) {
  auto store = OpenStore();
  ASSERT_TRUE(store->Set("k1", "v1").ok());
  ASSERT_TRUE(store->Set("k2", "v2").ok());
  // A writer that died mid-record: cut the last record short.
  ASSERT_EQ(truncate(path_.c_str(), FileSize(path_) - 5), 0);

  auto reopened = OpenStore();
  EXPECT_TRUE(reopened->Check({"k1"}).value_or(false));
  EXPECT_FALSE(reopened->Check({"k2"}).value_or(true));
  ASSERT_TRUE(reopened->Set("k3", "v3").ok());

  // The store that had k2 notices the file shrank and replays it from the start.
  EXPECT_FALSE(store->Check({"k2"}).value_or(true));
  EXPECT_EQ(store->Get("k3", LongDeadline()).value_or(""), "v3");
  EXPECT_EQ(OpenStore()->NumKeys("").value_or(-1), 2);
}

TEST_F(FileStoreTest, FileTruncatedWhileOpenIsReplayedFromTheStart) {
  auto first = OpenStore();
  ASSERT_TRUE(first->Set("old", "x").ok());
  ASSERT_EQ(truncate(path_.c_str(), 0), 0);
  auto second = OpenStore();
  EXPECT_EQ(second->NumKeys("").value_or(-1), 0);
  // Longer than what `first` had replayed, so the file is not merely shorter: `first` must
  // notice that the bytes it replayed changed.
  const std::string value(200, 'v');
  ASSERT_TRUE(second->Set("new", value).ok());
  ASSERT_GT(FileSize(path_), first->Stats().file_offset);
  EXPECT_EQ(first->Get("new", LongDeadline()).value_or(""), value);
  EXPECT_FALSE(first->Check({"old"}).value_or(true));
  EXPECT_EQ(first->NumKeys("").value_or(-1), 1);
}

TEST_F(FileStoreTest, WaitingStoreSeesKeysAfterTheFileIsTruncatedAndRewritten) {
  WaitResult result;
  auto waiter = OpenStore();
  auto writer = OpenStore();
  ASSERT_TRUE(writer->Set("a", "1").ok());
  ASSERT_TRUE(waiter->WaitAsync({"a", "b"}, LongDeadline(), result.Callback()).ok());
  ASSERT_EQ(truncate(path_.c_str(), 0), 0);
  // The rewritten file is exactly as long as the one the waiter replayed; only its bytes
  // differ. "a" went with the truncation: the wait must not complete on the stale copy.
  ASSERT_TRUE(writer->Set("b", "2").ok());
  ASSERT_TRUE(writer->Check({"b"}).value_or(false));
  EXPECT_FALSE(writer->Check({"a"}).value_or(true));
  ASSERT_TRUE(writer->Set("a", "3").ok());
  ASSERT_TRUE(result.Await());
  EXPECT_THAT(result.result().value_or(std::vector<std::string>{}), ElementsAre("3", "2"));
}

TEST_F(FileStoreTest, FileHoldsOneChecksummedRecordPerSetInTheDocumentedLayout) {
  auto store = OpenStore();
  ASSERT_TRUE(store->Set("k", "v").ok());
  const int fd = open(path_.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char bytes[64];
  const ssize_t size = read(fd, bytes, sizeof(bytes));
  close(fd);
  ASSERT_EQ(size, 20 + 4 + (4 + 1 + 8 + 1) + 4);
  EXPECT_EQ(std::string(bytes, 4), "TPDS");
  EXPECT_EQ(bytes[4], 1);                  // set
  EXPECT_EQ(bytes[8], 4 + 4 + 1 + 8 + 1);  // payload length, little-endian
  EXPECT_EQ(bytes[20], 1);                 // one entry
  EXPECT_EQ(bytes[24], 1);                 // key length
  EXPECT_EQ(bytes[28], 'k');
  EXPECT_EQ(bytes[29], 1);  // value length
  EXPECT_EQ(bytes[37], 'v');
}

// --- Waits ------------------------------------------------------------------------------

TEST_F(FileStoreTest, CancelWaitEndsTheWaitWithCancelledExactlyOnce) {
  WaitResult result;
  auto store = OpenStore();
  absl::StatusOr<WaitId> id = store->WaitAsync({"key"}, LongDeadline(), result.Callback());
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(store->Stats().waiters, 1);
  EXPECT_FALSE(result.HasRun());

  store->CancelWait(*id);
  ASSERT_TRUE(result.HasRun());
  EXPECT_EQ(result.result().status().code(), absl::StatusCode::kCancelled)
      << result.result().status();
  EXPECT_EQ(store->Stats().waiters, 0);

  // Neither a second cancel nor the key arriving (here or from another store) runs the
  // callback again.
  store->CancelWait(*id);
  ASSERT_TRUE(store->Set("key", "value").ok());
  auto other = OpenStore();
  ASSERT_TRUE(other->Set("key", "again").ok());
  EXPECT_EQ(store->Get("key", LongDeadline()).value_or(""), "again");
  EXPECT_EQ(result.calls(), 1);
}

TEST_F(FileStoreTest, CallbackRunsExactlyOnceWhenSetCancelAndDeadlineRace) {
  constexpr int kRounds = 100;
  std::deque<WaitResult> results(kRounds);  // outlive the stores
  {
    auto store = OpenStore();
    auto other = OpenStore();
    for (int i = 0; i < kRounds; ++i) {
      const std::string key = absl::StrCat("race/", i);
      const absl::Time deadline = absl::Now() + absl::Microseconds(500 * (i % 5) - 500);
      absl::StatusOr<WaitId> id = store->WaitAsync({key}, deadline, results[i].Callback());
      ASSERT_TRUE(id.ok()) << id.status();
      // Even rounds set through this store, odd ones through another (found by polling).
      FileStore* setter_store = i % 2 == 0 ? store.get() : other.get();
      std::thread setter([setter_store, &key] { ASSERT_TRUE(setter_store->Set(key, "v").ok()); });
      std::thread canceller([&store, &id] { store->CancelWait(*id); });
      setter.join();
      canceller.join();
      ASSERT_TRUE(results[i].Await()) << "round " << i;
      const absl::StatusCode code = results[i].result().status().code();
      EXPECT_TRUE(code == absl::StatusCode::kOk || code == absl::StatusCode::kCancelled ||
                  code == absl::StatusCode::kDeadlineExceeded)
          << "round " << i << ": " << results[i].result().status();
    }
    EXPECT_TRUE(AwaitWaiters(*store, 0));
  }
  for (int i = 0; i < kRounds; ++i) EXPECT_EQ(results[i].calls(), 1) << "round " << i;
}

TEST_F(FileStoreTest, DestructionEndsPendingWaitsWithUnavailable) {
  WaitResult async_wait;
  absl::Status blocking_status;
  {
    auto store = OpenStore();
    ASSERT_TRUE(store->WaitAsync({"a"}, LongDeadline(), async_wait.Callback()).ok());
    std::thread blocking(
        [&store, &blocking_status] { blocking_status = store->Wait({"b"}, LongDeadline()); });
    ASSERT_TRUE(AwaitWaiters(*store, 2));
    // The blocking Wait returns as soon as its callback runs, which is inside the destructor;
    // join after the store is gone.
    store.reset();
    blocking.join();
  }
  EXPECT_EQ(blocking_status.code(), absl::StatusCode::kUnavailable) << blocking_status;
  ASSERT_TRUE(async_wait.HasRun());
  EXPECT_EQ(async_wait.result().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(async_wait.result().status().message(), HasSubstr(path_));
  EXPECT_EQ(async_wait.calls(), 1);
}

TEST_F(FileStoreTest, ShutdownEndsPendingWaitsWithUnavailableAndRefusesNewOnes) {
  WaitResult async_wait, after_shutdown;
  auto store = OpenStore();
  ASSERT_TRUE(store->Set("present", "v").ok());
  ASSERT_TRUE(store->WaitAsync({"a"}, LongDeadline(), async_wait.Callback()).ok());
  store->Shutdown();
  ASSERT_TRUE(async_wait.HasRun());
  EXPECT_EQ(async_wait.result().status().code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<WaitId> refused =
      store->WaitAsync({"a"}, LongDeadline(), after_shutdown.Callback());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_EQ(after_shutdown.calls(), 0);
  EXPECT_TRUE(store->Check({"present"}).value_or(false));
  EXPECT_TRUE(store->Set("still", "writable").ok());
}

// --- Open -------------------------------------------------------------------------------

TEST_F(FileStoreTest, OpenCreatesTheFileWithMode0600) {
  auto store = OpenStore();
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_EQ(st.st_size, 0);
}

TEST_F(FileStoreTest, OpenWithMissingParentDirectoryIsNotFoundNamingThePath) {
  const std::string path = dir_ + "/missing/store";
  absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::Open(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kNotFound) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path));
  struct stat st;
  EXPECT_NE(stat((dir_ + "/missing").c_str(), &st), 0);  // no directory created
}

TEST_F(FileStoreTest, OpenOfADirectoryIsFailedPreconditionNamingThePath) {
  absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::Open(dir_);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(dir_));
}

TEST_F(FileStoreTest, OpenOfAFileWithoutReadWriteAccessIsPermissionDeniedNamingThePath) {
  const int fd = open(path_.c_str(), O_WRONLY | O_CREAT, 0200);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(chmod(path_.c_str(), 0200), 0);  // whatever the umask
  ASSERT_EQ(chmod(dir_.c_str(), 0711), 0);
  // Root ignores file modes, so the Open runs in a child that drops to "nobody" when needed;
  // the exit code carries the verdict.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << strerror(errno);
  if (pid == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(10);
    absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::Open(path_);
    if (store.status().code() != absl::StatusCode::kPermissionDenied) _exit(11);
    if (store.status().message().find(path_) == absl::string_view::npos) _exit(12);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10: cannot drop root, 11: not PERMISSION_DENIED, 12: path not named";
}

TEST_F(FileStoreTest, OpenWithNonPositivePollIntervalIsInvalidArgument) {
  FileStoreOptions options;
  options.poll_interval = absl::ZeroDuration();
  EXPECT_EQ(FileStore::Open(path_, options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tpd::store
