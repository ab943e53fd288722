#include "store/file/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "absl/memory/memory.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace tpd::store {
namespace {

// The record layout; see the file format in file_store.h.
constexpr char kMagic[4] = {'T', 'P', 'D', 'S'};
constexpr int64_t kHeaderSize = 20;
constexpr int64_t kTrailerSize = 4;
constexpr int64_t kMinRecordSize = kHeaderSize + 4 + kTrailerSize;  // an empty entry list
constexpr uint8_t kOpSet = 1;
constexpr uint8_t kOpDelete = 2;
constexpr uint8_t kOpAppend = 3;
// How much of the file one read() brings in while replaying.
constexpr int64_t kReadChunk = int64_t{1} << 20;
// How many bytes before the replay offset are remembered to notice a rewritten file.
constexpr size_t kTailCheckSize = 8;
// PreadFully's answer when the file ended early: it shrank while we held the lock, which
// only a program that ignores the lock can do.
constexpr int kShortRead = -1;

constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

// CRC-32C (Castagnoli), bytewise: records are small and this is far from the hot path.
uint32_t Crc32c(absl::string_view data) {
  uint32_t crc = ~uint32_t{0};
  for (unsigned char byte : data) crc = kCrc32cTable[(crc ^ byte) & 0xff] ^ (crc >> 8);
  return ~crc;
}

void PutU32(std::string* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(value >> (8 * i)));
}
void PutU64(std::string* out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(value >> (8 * i)));
}
uint32_t GetU32(const char* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= uint32_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return value;
}
uint64_t GetU64(const char* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return value;
}

std::string ErrnoText(int error_number) {
  if (error_number == kShortRead) {
    return "the file shrank while locked (is a program writing it without the lock?)";
  }
  char buffer[256];
  // The GNU strerror_r: returns the message, maybe in `buffer`, maybe a static string.
  return strerror_r(error_number, buffer, sizeof(buffer));
}

absl::StatusCode ErrnoCode(int error_number) {
  switch (error_number) {
    case ENOENT:
      return absl::StatusCode::kNotFound;
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case EISDIR:
    case ENOTDIR:
    case ELOOP:
    case ENXIO:
    case ENOLCK:
    case EINVAL:
      return absl::StatusCode::kFailedPrecondition;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EMFILE:
    case ENFILE:
      return absl::StatusCode::kResourceExhausted;
    case kShortRead:
    case EIO:
    case ESTALE:
    case EAGAIN:
    case EINTR:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::ErrnoToStatusCode(error_number);
  }
}

absl::Status PathError(absl::string_view path, int error_number, absl::string_view what) {
  std::string hint;
  if (error_number == ENOLCK) {
    hint =
        "; the file system has no POSIX record locks (on NFSv3 run rpc.statd and do not "
        "mount with nolock)";
  } else if (error_number == ENOENT) {
    hint = "; the parent directory must exist (the store creates only the file)";
  }
  return absl::Status(ErrnoCode(error_number),
                      absl::StrCat("file store \"", absl::CEscape(path), "\": ", what, ": ",
                                   ErrnoText(error_number), hint));
}

// Reads exactly `size` bytes at `offset`; 0, an errno, or kShortRead.
int PreadFully(int fd, char* out, int64_t size, int64_t offset) {
  int64_t done = 0;
  while (done < size) {
    const ssize_t n = pread(fd, out + done, size - done, offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return kShortRead;
    done += n;
  }
  return 0;
}

int PwriteFully(int fd, absl::string_view data, int64_t offset) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = pwrite(fd, data.data() + done, data.size() - done, offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += n;
  }
  return 0;
}

// Classic fcntl locks belong to the process, so in that fallback every FileStore of the
// process serializes its locked sections (and its close(), which would drop them) here.
absl::Mutex& ProcessLockMutex() {
  static absl::Mutex* const mu = new absl::Mutex;
  return *mu;
}

// A window over the file, [0, size) as it was when the lock was taken, read in large chunks
// so replaying many small records costs few system calls.
class FileReader {
 public:
  FileReader(int fd, int64_t size) : fd_(fd), size_(size) {}

  // Makes [offset, offset + n) readable through `out`, valid until the next call.
  // REQUIRES: offset + n <= size.
  int Read(int64_t offset, int64_t n, absl::string_view* out) {
    if (offset < start_ || offset + n > start_ + static_cast<int64_t>(buffer_.size())) {
      start_ = offset;
      buffer_.resize(std::min(std::max(n, kReadChunk), size_ - offset));
      const int error = PreadFully(fd_, buffer_.data(), buffer_.size(), offset);
      if (error != 0) {
        buffer_.clear();
        return error;
      }
    }
    *out = absl::string_view(buffer_).substr(offset - start_, n);
    return 0;
  }

  int64_t size() const { return size_; }

 private:
  const int fd_;
  const int64_t size_;
  int64_t start_ = 0;
  std::string buffer_;
};

}  // namespace

namespace file_store_internal {

struct Record {
  uint8_t op = kOpSet;
  std::vector<std::pair<std::string, std::string>> entries;  // values empty for deletes
};

}  // namespace file_store_internal

namespace {

using file_store_internal::Record;

bool HasValues(uint8_t op) { return op == kOpSet || op == kOpAppend; }

std::string Encode(const Record& record) {
  std::string payload;
  PutU32(&payload, record.entries.size());
  for (const auto& [key, value] : record.entries) {
    PutU32(&payload, key.size());
    payload.append(key);
    if (HasValues(record.op)) {
      PutU64(&payload, value.size());
      payload.append(value);
    }
  }
  std::string out(kMagic, sizeof(kMagic));
  out.reserve(kHeaderSize + payload.size() + kTrailerSize);
  out.push_back(static_cast<char>(record.op));
  out.append(3, '\0');
  PutU64(&out, payload.size());
  PutU32(&out, Crc32c(out));
  out.append(payload);
  PutU32(&out, Crc32c(payload));
  return out;
}

// Parses an already checksummed payload; false when its lengths do not add up.
bool DecodePayload(uint8_t op, absl::string_view payload, Record* record) {
  record->op = op;
  record->entries.clear();
  if (payload.size() < 4) return false;
  const uint32_t count = GetU32(payload.data());
  payload.remove_prefix(4);
  for (uint32_t i = 0; i < count; ++i) {
    if (payload.size() < 4) return false;
    const uint64_t key_size = GetU32(payload.data());
    payload.remove_prefix(4);
    if (payload.size() < key_size) return false;
    std::string key(payload.substr(0, key_size));
    payload.remove_prefix(key_size);
    std::string value;
    if (HasValues(op)) {
      if (payload.size() < 8) return false;
      const uint64_t value_size = GetU64(payload.data());
      payload.remove_prefix(8);
      if (payload.size() < value_size) return false;
      value = std::string(payload.substr(0, value_size));
      payload.remove_prefix(value_size);
    }
    record->entries.emplace_back(std::move(key), std::move(value));
  }
  return payload.empty();
}

// Parses the record at `offset` into `record` and sets `*size` to its length, or to 0 when
// the bytes there are not a complete, intact record. Returns an errno (0 on success).
int ParseAt(FileReader& reader, int64_t offset, Record* record, int64_t* size) {
  *size = 0;
  const int64_t left = reader.size() - offset;
  if (left < kMinRecordSize) return 0;
  absl::string_view header;
  if (int error = reader.Read(offset, kHeaderSize, &header); error != 0) return error;
  const uint8_t op = static_cast<uint8_t>(header[4]);
  if (header.substr(0, 4) != absl::string_view(kMagic, 4) ||
      (op != kOpSet && op != kOpDelete && op != kOpAppend) || header[5] != 0 || header[6] != 0 ||
      header[7] != 0 || GetU32(header.data() + 16) != Crc32c(header.substr(0, 16))) {
    return 0;
  }
  const uint64_t payload_size = GetU64(header.data() + 8);
  if (payload_size > static_cast<uint64_t>(left - kHeaderSize - kTrailerSize)) return 0;
  absl::string_view body;
  if (int error = reader.Read(offset + kHeaderSize, payload_size + kTrailerSize, &body);
      error != 0) {
    return error;
  }
  const absl::string_view payload = body.substr(0, payload_size);
  if (GetU32(body.data() + payload_size) != Crc32c(payload)) return 0;
  if (!DecodePayload(op, payload, record)) return 0;
  *size = kHeaderSize + payload_size + kTrailerSize;
  return 0;
}

// The offset of the first intact record at or after `from` (the file size when none).
int FindRecord(FileReader& reader, int64_t from, int64_t* found) {
  const absl::string_view magic(kMagic, sizeof(kMagic));
  int64_t offset = from;
  while (reader.size() - offset >= kMinRecordSize) {
    const int64_t length = std::min(kReadChunk, reader.size() - offset);
    absl::string_view chunk;
    if (int error = reader.Read(offset, length, &chunk); error != 0) return error;
    const size_t hit = chunk.find(magic);
    if (hit == absl::string_view::npos) {
      // The magic may straddle the chunk's end: step back over its first three bytes.
      offset += std::max<int64_t>(1, length - (sizeof(kMagic) - 1));
      continue;
    }
    Record record;
    int64_t size = 0;
    if (int error = ParseAt(reader, offset + hit, &record, &size); error != 0) return error;
    if (size > 0) {
      *found = offset + hit;
      return 0;
    }
    offset += hit + 1;
  }
  *found = reader.size();
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& path,
                                                           FileStoreOptions options) {
  if (path.empty()) return absl::InvalidArgumentError("file store: the path is empty");
  if (options.poll_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("file store \"", absl::CEscape(path),
                                                   "\": poll_interval must be positive, got ",
                                                   absl::FormatDuration(options.poll_interval)));
  }
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return PathError(path, errno, "cannot open or create the file");
  return OpenFd(path, fd, options);
}

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::OpenUnder(
    const std::vector<std::string>& allowed_dirs, const std::string& path, FileCreation creation,
    FileStoreOptions options) {
  if (options.poll_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("file store \"", absl::CEscape(path),
                                                   "\": poll_interval must be positive, got ",
                                                   absl::FormatDuration(options.poll_interval)));
  }
  absl::StatusOr<int> fd = OpenRendezvousFile(allowed_dirs, path, creation);
  if (!fd.ok()) return fd.status();
  return OpenFd(path, *fd, options);
}

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::OpenFd(const std::string& path, int fd,
                                                             FileStoreOptions options) {
  // Closing any descriptor of the file drops classic locks this process holds on it.
  auto close_fd = [fd] {
    absl::MutexLock lock(&ProcessLockMutex());
    close(fd);
  };
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close_fd();
    return PathError(path, error, "fstat");
  }
  if (!S_ISREG(st.st_mode)) {
    close_fd();
    return absl::FailedPreconditionError(
        absl::StrCat("file store \"", absl::CEscape(path),
                     "\": not a regular file; name a file on a shared "
                     "file system (file:///path/to/file)"));
  }
  // Probe for open-file-description locks (Linux 3.15+); EINVAL means the kernel lacks them.
  struct flock probe = {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  LockMode mode = LockMode::kOpenFileDescription;
  if (fcntl(fd, F_OFD_GETLK, &probe) != 0) {
    if (errno != EINVAL) {
      const int error = errno;
      close_fd();
      return PathError(path, error, "cannot query record locks");
    }
    mode = LockMode::kProcess;
  }
  std::unique_ptr<FileStore> store(new FileStore(path, fd, mode, options));
  // Replay what is there; this also fails early on a file system without working locks.
  absl::Status replayed =
      store->Transact(F_RDLCK, [](std::vector<Completion>*) { return absl::OkStatus(); });
  if (!replayed.ok()) return replayed;
  return store;
}

FileStore::FileStore(std::string path, int fd, LockMode lock_mode, FileStoreOptions options)
    : path_(std::move(path)),
      lock_mode_(lock_mode),
      options_(options),
      fd_(fd),
      waiters_(options.max_waiters) {}

FileStore::~FileStore() {
  Shutdown();
  std::thread poller;
  {
    absl::MutexLock lock(&mu_);
    stop_poller_ = true;
    poller_cv_.Signal();
    poller = std::move(poller_);
  }
  if (poller.joinable()) poller.join();
  absl::MutexLock file_lock(&file_mu_);
  if (lock_mode_ == LockMode::kProcess) {
    absl::MutexLock lock(&ProcessLockMutex());
    close(fd_);
  } else {
    close(fd_);
  }
}

void FileStore::Shutdown() {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    waiters_.EndAll(
        absl::UnavailableError(absl::StrCat("file store \"", absl::CEscape(path_),
                                            "\" is shutting down: the tpd daemon is stopping")),
        &completions);
  }
  WaiterTable::Run(std::move(completions));
}

absl::Status FileStore::FileError(int error_number, absl::string_view what) const {
  return PathError(path_, error_number, what);
}

absl::Status FileStore::Transact(int lock_type,
                                 absl::FunctionRef<absl::Status(std::vector<Completion>*)> body) {
  std::vector<Completion> completions;
  absl::Status status;
  {
    absl::MutexLock lock(&file_mu_);
    status = LockFile(lock_type);
    if (status.ok()) {
      status = ReplayLocked(&completions);
      if (status.ok()) status = body(&completions);
      UnlockFile();
    }
  }
  WaiterTable::Run(std::move(completions));
  return status;
}

// Takes ProcessLockMutex() only in the process-lock fallback and leaves it held for
// UnlockFile: a lock held across functions on a condition, which the analysis cannot follow.
absl::Status FileStore::LockFile(int lock_type) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  struct flock lock = {};
  lock.l_type = static_cast<short>(lock_type);
  lock.l_whence = SEEK_SET;  // l_start = 0, l_len = 0: the whole file, however long it grows
  int command = F_OFD_SETLKW;
  if (lock_mode_ == LockMode::kProcess) {
    ProcessLockMutex().Lock();
    command = F_SETLKW;
  }
  while (fcntl(fd_, command, &lock) != 0) {
    if (errno == EINTR) continue;
    const int error = errno;
    if (lock_mode_ == LockMode::kProcess) ProcessLockMutex().Unlock();
    return FileError(error, "cannot lock the file");
  }
  return absl::OkStatus();
}

void FileStore::UnlockFile() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  struct flock lock = {};
  lock.l_type = F_UNLCK;
  lock.l_whence = SEEK_SET;
  // Unlocking cannot fail in a way we could act on; a closed descriptor drops the lock anyway.
  if (lock_mode_ == LockMode::kProcess) {
    fcntl(fd_, F_SETLK, &lock);
    ProcessLockMutex().Unlock();
  } else {
    fcntl(fd_, F_OFD_SETLK, &lock);
  }
}

absl::Status FileStore::ReplayLocked(std::vector<Completion>* out) {
  struct stat st;
  if (fstat(fd_, &st) != 0) return FileError(errno, "fstat");
  const int64_t size = st.st_size;
  // Someone truncated or rewrote the file: what we replayed is gone, so start over.
  bool rewritten = size < offset_;
  if (!rewritten && !tail_.empty()) {
    std::string now(tail_.size(), '\0');
    const int error = PreadFully(fd_, now.data(), now.size(), offset_ - tail_.size());
    if (error != 0) return FileError(error, "read");
    rewritten = now != tail_;
  }
  if (rewritten) {
    offset_ = 0;
    tail_.clear();
    absl::MutexLock lock(&mu_);
    data_.clear();
    bytes_ = 0;
    replayed_ = 0;
  }
  if (size == offset_) return absl::OkStatus();

  FileReader reader(fd_, size);
  int64_t position = offset_;
  int error = 0;
  while (position < size) {
    Record record;
    int64_t record_size = 0;
    error = ParseAt(reader, position, &record, &record_size);
    if (error != 0) break;
    if (record_size > 0) {
      absl::MutexLock lock(&mu_);
      ApplyLocked(std::move(record), out);
      position += record_size;
      continue;
    }
    // Not a record. Every writer holds the exclusive lock while it writes and we hold a
    // lock now, so these bytes are final: debris of a writer that died mid-write, or
    // garbage. Skip to the next intact record; writers append after the debris.
    error = FindRecord(reader, position + 1, &position);
    if (error != 0) break;
  }
  offset_ = position;
  {
    absl::MutexLock lock(&mu_);
    replayed_ = offset_;
  }
  absl::Status remembered = RememberTailLocked();
  if (error != 0) return FileError(error, "read");
  return remembered;
}

absl::Status FileStore::RememberTailLocked() {
  tail_.assign(std::min<int64_t>(offset_, kTailCheckSize), '\0');
  const int error = PreadFully(fd_, tail_.data(), tail_.size(), offset_ - tail_.size());
  if (error == 0) return absl::OkStatus();
  // Without the check bytes the next replay cannot tell a rewrite; replay it all again.
  offset_ = 0;
  tail_.clear();
  absl::MutexLock lock(&mu_);
  data_.clear();
  bytes_ = 0;
  replayed_ = 0;
  return FileError(error, "read");
}

absl::Status FileStore::WriteLocked(Record record, std::vector<Completion>* out) {
  const std::string bytes = Encode(record);
  if (int error = PwriteFully(fd_, bytes, offset_); error != 0) {
    // Cut off any part that did land, so the log stays clean; if that fails too, readers
    // skip the torn bytes.
    if (ftruncate(fd_, offset_) != 0) {
      // Nothing more to do: the torn record is skipped as debris by every reader.
    }
    return FileError(error, "cannot append to the file");
  }
  offset_ += bytes.size();
  tail_ = bytes.substr(bytes.size() - kTailCheckSize);
  {
    absl::MutexLock lock(&mu_);
    ApplyLocked(std::move(record), out);
    replayed_ = offset_;
  }
  // The record is in the file and applied either way; a failed sync only means it may not
  // survive a machine crash, which the caller is told.
  if (options_.sync_writes && fdatasync(fd_) != 0) return FileError(errno, "fdatasync");
  return absl::OkStatus();
}

absl::Status FileStore::Set(absl::string_view key, absl::string_view value) {
  Record record{kOpSet, {{std::string(key), std::string(value)}}};
  return Transact(F_WRLCK, [&](std::vector<Completion>* out) {
    file_mu_.AssertHeld();  // Transact runs the body under file_mu_
    return WriteLocked(std::move(record), out);
  });
}

absl::Status FileStore::MultiSet(const std::vector<std::string>& keys,
                                 const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("multi_set needs one value per key: got %d keys and %d values", keys.size(),
                        values.size()));
  }
  Record record{kOpSet, {}};
  record.entries.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) record.entries.emplace_back(keys[i], values[i]);
  return Transact(F_WRLCK, [&](std::vector<Completion>* out) {
    file_mu_.AssertHeld();  // Transact runs the body under file_mu_
    return WriteLocked(std::move(record), out);
  });
}

absl::StatusOr<int64_t> FileStore::Add(absl::string_view key, int64_t delta) {
  int64_t sum = 0;
  absl::Status status = Transact(F_WRLCK, [&](std::vector<Completion>* out) -> absl::Status {
    file_mu_.AssertHeld();  // Transact runs the body under file_mu_
    // Under the exclusive lock, just after replaying: `current` is the latest value of
    // every process, so no add is lost.
    int64_t current = 0;
    {
      absl::MutexLock lock(&mu_);
      auto it = data_.find(key);
      if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "add: key \"", absl::CEscape(key), "\" holds a value that is not an integer: \"",
            absl::CEscape(it->second.substr(0, 64)), "\""));
      }
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      return absl::InvalidArgumentError(absl::StrCat("add: key \"", absl::CEscape(key),
                                                     "\" would overflow int64 (", current, " + ",
                                                     delta, ")"));
    }
    return WriteLocked(Record{kOpSet, {{std::string(key), absl::StrCat(sum)}}}, out);
  });
  if (!status.ok()) return status;
  return sum;
}

absl::StatusOr<std::string> FileStore::CompareSet(absl::string_view key, absl::string_view expected,
                                                  absl::string_view desired) {
  std::string result;
  absl::Status status = Transact(F_WRLCK, [&](std::vector<Completion>* out) -> absl::Status {
    file_mu_.AssertHeld();  // Transact runs the body under file_mu_
    {
      absl::MutexLock lock(&mu_);
      auto it = data_.find(key);
      if (it == data_.end() && !expected.empty()) {
        result = std::string(expected);
        return absl::OkStatus();
      }
      if (it != data_.end() && it->second != expected) {
        result = it->second;
        return absl::OkStatus();
      }
    }
    result = std::string(desired);
    return WriteLocked(Record{kOpSet, {{std::string(key), std::string(desired)}}}, out);
  });
  if (!status.ok()) return status;
  return result;
}

absl::Status FileStore::Append(absl::string_view key, absl::string_view value) {
  return Transact(F_WRLCK, [&](std::vector<Completion>* out) -> absl::Status {
    file_mu_.AssertHeld();  // Transact runs the body under file_mu_
    {
      absl::MutexLock lock(&mu_);
      auto it = data_.find(key);
      const size_t current = it == data_.end() ? 0 : it->second.size();
      if (static_cast<int64_t>(current + value.size()) > options_.max_value_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "append would grow key \"", absl::CEscape(key), "\" to ", current + value.size(),
            " bytes; the limit store.max_value_bytes is ", options_.max_value_bytes));
      }
    }
    return WriteLocked(Record{kOpAppend, {{std::string(key), std::string(value)}}}, out);
  });
}

absl::StatusOr<bool> FileStore::Check(const std::vector<std::string>& keys) {
  bool present = false;
  absl::Status status = Transact(F_RDLCK, [&](std::vector<Completion>*) {
    absl::MutexLock lock(&mu_);
    present = true;
    for (const std::string& key : keys) present = present && FindLocked(key) != nullptr;
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return present;
}

absl::StatusOr<bool> FileStore::DeleteKey(absl::string_view key) {
  bool existed = false;
  absl::Status status = Transact(F_WRLCK, [&](std::vector<Completion>* out) -> absl::Status {
    file_mu_.AssertHeld();  // Transact runs the body under file_mu_
    {
      absl::MutexLock lock(&mu_);
      existed = data_.find(key) != data_.end();
    }
    if (!existed) return absl::OkStatus();
    return WriteLocked(Record{kOpDelete, {{std::string(key), ""}}}, out);
  });
  if (!status.ok()) return status;
  return existed;
}

absl::StatusOr<int64_t> FileStore::NumKeys(absl::string_view prefix) {
  int64_t count = 0;
  absl::Status status = Transact(F_RDLCK, [&](std::vector<Completion>*) {
    absl::MutexLock lock(&mu_);
    if (prefix.empty()) {
      count = data_.size();
    } else {
      for (auto it = data_.lower_bound(prefix);
           it != data_.end() && absl::StartsWith(it->first, prefix); ++it) {
        ++count;
      }
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return count;
}

absl::StatusOr<WaitId> FileStore::WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                            WaitCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      return absl::UnavailableError(
          absl::StrCat("file store \"", absl::CEscape(path_),
                       "\" is shutting down: the tpd daemon is stopping"));
    }
  }
  // Catch up with other processes first, so keys already in the file complete the wait now
  // instead of one poll interval later.
  absl::Status replayed =
      Transact(F_RDLCK, [](std::vector<Completion>*) { return absl::OkStatus(); });
  if (!replayed.ok()) return replayed;

  std::vector<Completion> completions;
  WaitId id;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      return absl::UnavailableError(
          absl::StrCat("file store \"", absl::CEscape(path_),
                       "\" is shutting down: the tpd daemon is stopping"));
    }
    absl::StatusOr<WaitId> added = waiters_.Add(
        std::move(keys), deadline, std::move(done),
        [this](const std::string& key) {
          mu_.AssertHeld();  // the table calls its lookup only under mu_
          return FindLocked(key);
        },
        &completions);
    if (!added.ok()) return added.status();
    id = *added;
    if (waiters_.Contains(id)) {
      // Parked: the poller watches the file for it and ends it at its deadline.
      if (!poller_.joinable()) {
        try {
          poller_ = std::thread([this] { PollLoop(); });
        } catch (const std::system_error& error) {
          // Past a pids limit: this wait fails, the daemon keeps serving.
          waiters_.Cancel(id, &completions);
          completions.clear();  // its callback must not run: the caller gets the error
          return absl::ResourceExhaustedError(absl::StrCat(
              "file store \"", absl::CEscape(path_), "\" cannot start its poller: ", error.what()));
        }
      }
      poller_cv_.Signal();
    }
  }
  WaiterTable::Run(std::move(completions));
  return id;
}

void FileStore::CancelWait(WaitId id) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    waiters_.Cancel(id, &completions);
  }
  WaiterTable::Run(std::move(completions));
}

FileStoreStats FileStore::Stats() {
  absl::MutexLock lock(&mu_);
  return {static_cast<int64_t>(data_.size()), bytes_, waiters_.size(), replayed_};
}

void FileStore::ApplyLocked(Record record, std::vector<Completion>* out) {
  for (auto& [key, value] : record.entries) {
    if (record.op == kOpDelete) {
      EraseLocked(key);
    } else {
      StoreLocked(std::move(key), std::move(value), record.op == kOpAppend, out);
    }
  }
}

void FileStore::StoreLocked(std::string key, std::string value, bool append,
                            std::vector<Completion>* out) {
  auto [it, inserted] = data_.try_emplace(std::move(key));
  if (inserted) bytes_ += it->first.size();
  bytes_ += value.size();
  if (append) {
    it->second.append(value);
  } else {
    bytes_ -= it->second.size();
    it->second = std::move(value);
  }
  waiters_.OnKeySet(
      it->first,
      [this](const std::string& k) {
        mu_.AssertHeld();  // the table calls its lookup only under mu_
        return FindLocked(k);
      },
      out);
}

void FileStore::EraseLocked(const std::string& key) {
  auto it = data_.find(key);
  if (it == data_.end()) return;
  bytes_ -= it->first.size() + it->second.size();
  data_.erase(it);
}

const std::string* FileStore::FindLocked(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

void FileStore::PollLoop() {
  absl::Time next_poll = absl::InfinitePast();
  absl::MutexLock lock(&mu_);
  while (!stop_poller_) {
    if (waiters_.size() == 0) {
      // Idle stores cost no reads: the next parked wait signals us.
      poller_cv_.Wait(&mu_);
      continue;
    }
    if (absl::Now() >= next_poll) {
      mu_.Unlock();
      // Another process's write shows up only in the file. A failed read (a flaky NFS
      // server) is retried next tick; waits still end at their deadlines.
      Transact(F_RDLCK, [](std::vector<Completion>*) { return absl::OkStatus(); }).IgnoreError();
      mu_.Lock();
      next_poll = absl::Now() + options_.poll_interval;
      continue;
    }
    std::vector<Completion> completions;
    waiters_.ExpireUntil(
        absl::Now(),
        [this](const std::string& key) {
          mu_.AssertHeld();  // the table calls its lookup only under mu_
          return FindLocked(key);
        },
        &completions);
    if (!completions.empty()) {
      mu_.Unlock();
      WaiterTable::Run(std::move(completions));
      mu_.Lock();
      continue;
    }
    poller_cv_.WaitWithDeadline(&mu_, std::min(next_poll, waiters_.NextDeadline()));
  }
}

}  // namespace tpd::store
