#include "shm/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shm/ring.h"

namespace tpd::shm {
namespace {

absl::Status Errno(const char* call, int error) {
  return absl::ErrnoToStatus(error, absl::StrCat("shared-memory segment: ", call));
}

// Closes `fd` when it goes out of scope, unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<Segment> Segment::Create(const SegmentLimits& limits,
                                        const SegmentOptions& options) {
  absl::StatusOr<Layout> layout = ComputeLayout(limits);
  if (!layout.ok()) return layout.status();
  const int fd = memfd_create("tpd-session", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create", errno);
  FdCloser closer(fd);
  const off_t size = static_cast<off_t>(layout->total_bytes);
  if (ftruncate(fd, size) != 0) return Errno("ftruncate", errno);
  if (options.preallocate) {
    // fallocate returns the error instead of setting errno.
    if (int error = posix_fallocate(fd, 0, size); error != 0) {
      return Errno("fallocate", error);
    }
  }
  if (fcntl(fd, F_ADD_SEALS, kRequiredSeals) != 0) return Errno("fcntl(F_ADD_SEALS)", errno);
  void* base = mmap(nullptr, layout->total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return Errno("mmap", errno);
  Segment segment(closer.Release(), static_cast<uint8_t*>(base), *layout);
  WriteHeader(*layout, base);
  InitRing(base, layout->submission);
  InitRing(base, layout->completion);
  // The daemon only reads the tx heap: a bug of ours cannot write into what the client sends.
  if (mprotect(segment.base_ + layout->tx_heap.offset, layout->tx_heap.bytes, PROT_READ) != 0) {
    return Errno("mprotect", errno);
  }
  return segment;
}

namespace {

// The size of `fd` when it is a memfd whose size can no longer change.
absl::StatusOr<uint64_t> SealedSize(int fd) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory segment: fd ", fd,
                     " is not a sealable memfd (F_GET_SEALS: ", std::strerror(errno), ")"));
  }
  if ((seals & kRequiredSeals) != kRequiredSeals) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared-memory segment: fd ", fd, " carries seals 0x", absl::Hex(seals), ", not all of 0x",
        absl::Hex(kRequiredSeals), " (seal, shrink, grow): its size could still change"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno("fstat", errno);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (st.st_size < static_cast<off_t>(kPageBytes) || size > kMaxSegmentBytes ||
      size % kPageBytes != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared-memory segment: fd ", fd, " has ", st.st_size,
        " bytes, not a whole number of pages in [", kPageBytes, ", ", kMaxSegmentBytes, "]"));
  }
  return size;
}

}  // namespace

absl::StatusOr<Segment> Segment::Map(int fd) {
  FdCloser closer(fd);
  absl::StatusOr<uint64_t> size = SealedSize(fd);
  if (!size.ok()) return size.status();
  void* base = mmap(nullptr, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return Errno("mmap", errno);
  absl::StatusOr<Layout> layout = ReadHeader(base, *size);
  if (!layout.ok()) {
    munmap(base, *size);
    return layout.status();
  }
  return Segment(closer.Release(), static_cast<uint8_t*>(base), *layout);
}

absl::StatusOr<int> Segment::OpenReadOnly() const {
  const int fd = open(absl::StrCat("/proc/self/fd/", fd_).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open(/proc/self/fd, O_RDONLY)", errno);
  return fd;
}

Segment::Segment(Segment&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      layout_(other.layout_) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    layout_ = other.layout_;
  }
  return *this;
}

Segment::~Segment() { Reset(); }

void Segment::CloseFd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void Segment::Reset() {
  if (base_ != nullptr) munmap(base_, layout_.total_bytes);
  base_ = nullptr;
  CloseFd();
}

absl::StatusOr<ReadOnlyMapping> ReadOnlyMapping::Map(int fd, uint64_t bytes) {
  absl::StatusOr<uint64_t> size = SealedSize(fd);
  if (!size.ok()) return size.status();
  if (*size != bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared-memory segment: fd ", fd, " has ", *size, " bytes, not the ", bytes, " announced"));
  }
  void* base = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return Errno("mmap", errno);
  return ReadOnlyMapping(static_cast<const uint8_t*>(base), bytes);
}

ReadOnlyMapping::ReadOnlyMapping(ReadOnlyMapping&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), size_(std::exchange(other.size_, 0)) {}

ReadOnlyMapping& ReadOnlyMapping::operator=(ReadOnlyMapping&& other) noexcept {
  if (this != &other) {
    Reset();
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

ReadOnlyMapping::~ReadOnlyMapping() { Reset(); }

void ReadOnlyMapping::Reset() {
  if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), size_);
  base_ = nullptr;
}

}  // namespace tpd::shm
