// The file store backend behind `file:///path` rendezvous: several daemons, in separate
// processes and possibly on different machines sharing an NFS-like file system, open the same
// path and see one store, as with PyTorch's c10d FileStore.
//
// Thread safety: thread-safe. Within one FileStore, `file_mu_` serializes use of the file and
// `mu_` guards the in-memory copy and the waiters (always taken in that order); across
// FileStores and processes, a POSIX record lock on the whole file serializes writers. Wait
// callbacks run after every lock is released. One poller thread per FileStore, started by the
// first wait that has to park, picks up other processes' writes and ends waits at their
// deadlines, so a waiter costs a map entry and no thread of its own.
//
// The file is an append-only log; every FileStore replays it into memory and then follows
// its tail. Every mutation, including Add, CompareSet, Append and DeleteKey, is done under an
// exclusive lock after replaying the tail, so the value it computes from is the latest one
// and no process loses an update: a counter equals the sum of every acknowledged Add. Reads
// (Check, NumKeys, Get/WaitAsync, the poller) replay the tail under a shared lock. Taking the
// lock is also what makes NFS safe: the Linux NFS client revalidates its cache when it takes
// a lock and flushes dirty pages before it drops one. flock() is not used: it does not reach
// the server on every NFS setup, fcntl record locks do.
//
// Locks are open-file-description locks (F_OFD_SETLKW), owned by the FileStore's own open()
// of the file, so two FileStores in one process exclude each other as two processes do. On a
// kernel without them the store falls back to classic per-process fcntl locks plus a
// process-wide mutex (a process's classic locks do not exclude its own threads, and any
// close() of the file drops them).
//
// File format (all integers little-endian), a sequence of records:
//
//   offset  size  field
//   0       4     magic "TPDS"
//   4       1     op: 1 = set, 2 = delete (a tombstone), 3 = append
//   5       3     zero
//   8       8     payload length P
//   16      4     CRC-32C of bytes 0..16 (so a garbage length is never trusted)
//   20      P     payload: u32 entry count N, then N entries of
//                   u32 key length, key bytes, and for set and append: u64 value length,
//                   value bytes
//   20+P    4     CRC-32C of the payload
//
// A set record carries every pair of one MultiSet, so readers apply all of them or none. Add
// and CompareSet write a set record holding the result; Append writes only the appended bytes
// (an append record), so repeated appends grow the file linearly. Writers append with one
// pwrite() at the end they replayed to, while holding the exclusive lock.
//
// Bad bytes: readers always hold a lock, so no record is ever half-written while they look;
// bytes that do not parse as a record (a writer that died mid-write, a torn tail, garbage
// written by someone else) are skipped up to the next valid record, and new records are
// appended after them. Open therefore succeeds on any regular file, and nothing is logged
// (this library has no logger); the store never crashes on file content. (Resynchronizing
// scans for the magic and both checksums, so only a torn record whose value itself holds a
// whole valid record could bring that inner record back.) A file that shrinks, or whose last
// 8 bytes before the replayed offset change, while the store has it open (someone truncated
// or rewrote it) is replayed from the start; waits then see the new content. Replacing the
// file (rm and recreate) is not noticed: the store keeps the inode it opened.
//
// Growth: nothing is ever compacted, deletes included (a tombstone is one more record). A
// one-key set, add or append adds 40 bytes plus key and value, so a counter bumped a million
// times costs ~55 MB, and every Open replays the whole log. Use a fresh path per job (as with
// PyTorch's FileStore) and delete the file afterwards; the store never deletes it.

#ifndef TPD_STORE_FILE_FILE_STORE_H_
#define TPD_STORE_FILE_FILE_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "store/file/path_policy.h"
#include "store/store.h"
#include "store/waiter_table.h"

namespace tpd::store {
namespace file_store_internal {
struct Record;  // one decoded log record; defined in file_store.cc
}  // namespace file_store_internal

struct FileStoreOptions {
  // How often the poller re-reads the file tail while waits are pending: the latency of a
  // wait on a key set by another process. Polling (rather than inotify) because inotify does
  // not see writes made on another NFS client.
  absl::Duration poll_interval = absl::Milliseconds(10);
  // Most waits pending at once; past it WaitAsync answers RESOURCE_EXHAUSTED.
  int64_t max_waiters = 100000;
  // Largest value Append may grow a key to; past it Append answers RESOURCE_EXHAUSTED.
  int64_t max_value_bytes = int64_t{1} << 30;
  // fdatasync() after every write, so an acknowledged write survives a machine crash. Off by
  // default: a daemon crash loses nothing already written to the page cache, and on NFS the
  // unlock after each write flushes it to the server.
  bool sync_writes = false;
};

struct FileStoreStats {
  int64_t num_keys = 0;
  int64_t bytes = 0;  // keys and values together
  int64_t waiters = 0;
  int64_t file_offset = 0;  // how far into the file this store has replayed
};

class FileStore : public Store {
 public:
  // Opens the store at `path`, creating the file (mode 0600, not its parent directories)
  // when missing, and replays it. Errors name the path: NOT_FOUND for a missing parent
  // directory, PERMISSION_DENIED, FAILED_PRECONDITION for something that is not a regular
  // file or a file system without POSIX record locks, INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<FileStore>> Open(const std::string& path,
                                                         FileStoreOptions options = {});

  // Opens the store at `path` for a file:// rendezvous a client named: only under
  // `allowed_dirs`, following no symbolic link, only a regular file, and creating it only
  // with FileCreation::kCreate (see path_policy.h, whose errors it returns).
  static absl::StatusOr<std::unique_ptr<FileStore>> OpenUnder(
      const std::vector<std::string>& allowed_dirs, const std::string& path, FileCreation creation,
      FileStoreOptions options = {});

  // Ends pending waits with UNAVAILABLE, joins the poller and closes the file. The file
  // stays; other FileStores on it are unaffected.
  ~FileStore() override;

  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  // Every call below that touches the file can fail with the errno of the failing system
  // call mapped to a code (UNAVAILABLE for I/O errors, RESOURCE_EXHAUSTED for a full disk),
  // with a message naming the path. A failed write leaves the file as it was.
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::Status MultiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Append(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys(absl::string_view prefix) override;
  // Replays the tail first, so keys another process set already complete the wait at once.
  absl::StatusOr<WaitId> WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                   WaitCallback done) override;
  void CancelWait(WaitId id) override;

  // Ends every pending wait with UNAVAILABLE and refuses new ones; writes and Check still
  // work. For daemon shutdown, as MemoryStore::Shutdown.
  void Shutdown();

  // From memory, without reading the file.
  FileStoreStats Stats();

  const std::string& path() const { return path_; }

 private:
  enum class LockMode { kOpenFileDescription, kProcess };

  // A finished wait, run after every lock is released.
  using Completion = WaiterTable::Completion;
  using Record = file_store_internal::Record;

  FileStore(std::string path, int fd, LockMode lock_mode, FileStoreOptions options);
  // The part of Open after open(): checks, lock probe, replay. Owns `fd` from here on.
  static absl::StatusOr<std::unique_ptr<FileStore>> OpenFd(const std::string& path, int fd,
                                                           FileStoreOptions options);

  // Takes `file_mu_` and the file lock (F_RDLCK or F_WRLCK), replays the tail, then runs
  // `body`; after releasing both, runs the waits that the replay or `body` completed.
  absl::Status Transact(int lock_type,
                        absl::FunctionRef<absl::Status(std::vector<Completion>*)> body);
  absl::Status LockFile(int lock_type) ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu_);
  void UnlockFile() ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu_);
  // Applies the records appended since `offset_`, skipping bytes that do not parse.
  // REQUIRES: the file lock is held.
  absl::Status ReplayLocked(std::vector<Completion>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu_);
  // Appends one record at `offset_` and applies it to memory.
  // REQUIRES: the exclusive file lock is held and the tail was just replayed.
  absl::Status WriteLocked(Record record, std::vector<Completion>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu_);
  // Remembers the bytes just before `offset_`, to notice the file being rewritten under us.
  absl::Status RememberTailLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu_);
  absl::Status FileError(int error_number, absl::string_view what) const;

  void ApplyLocked(Record record, std::vector<Completion>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets (or, with `append`, extends) `key` and rechecks the waits parked on it.
  void StoreLocked(std::string key, std::string value, bool append, std::vector<Completion>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The value of `key`, or nullptr when it is not set; the table's lookup.
  const std::string* FindLocked(const std::string& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PollLoop();

  const std::string path_;
  const LockMode lock_mode_;
  const FileStoreOptions options_;

  // Serializes this store's use of the file: its lock (an OFD lock is shared by every
  // thread of its owner) and the replay offset.
  absl::Mutex file_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  int fd_ ABSL_GUARDED_BY(file_mu_);
  // Bytes of the file replayed so far; records start here.
  int64_t offset_ ABSL_GUARDED_BY(file_mu_) = 0;
  // The (up to 8) bytes just before `offset_`; when they change, the file was rewritten.
  std::string tail_ ABSL_GUARDED_BY(file_mu_);

  absl::Mutex mu_;
  // Ordered, so NumKeys(prefix) walks only the keys under the prefix.
  std::map<std::string, std::string, std::less<>> data_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Mirror of `offset_` for Stats(), which must not wait for the file lock.
  int64_t replayed_ ABSL_GUARDED_BY(mu_) = 0;
  // Applying a record costs O(waits parked on its keys): see WaiterTable.
  WaiterTable waiters_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_poller_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar poller_cv_;
  std::thread poller_ ABSL_GUARDED_BY(mu_);  // started by the first wait that parks
};

}  // namespace tpd::store

#endif  // TPD_STORE_FILE_FILE_STORE_H_
