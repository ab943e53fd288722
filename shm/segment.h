// The shared memory of one client session: a sealed memfd, mapped MAP_SHARED by the daemon
// (which creates it) and by the client (which receives the fd over the unix socket).
//
// Create (daemon): memfd_create(MFD_CLOEXEC | MFD_ALLOW_SEALING), ftruncate to the layout's
// size, seal F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL (nobody can change the size again, so
// no access inside the mapping can fault with SIGBUS for being past the end of the file),
// map, write the header and zero the rings. The daemon's mapping of the tx heap is read-only:
// the daemon only ever reads what the client sends.
//
// Map (client): checks that the fd is a memfd carrying those seals, that its size is one a
// segment may have, maps it and reads the header (layout.h: ReadHeader). Both sides use only
// their private Layout afterwards.
//
// The object owns the fd (until CloseFd) and the mapping; both go away with it.
//
// Thread safety: const methods may be called from any thread; the memory it maps is shared
// with another process and is synchronized by the rings (ring.h), not by this class.

#ifndef TPD_SHM_SEGMENT_H_
#define TPD_SHM_SEGMENT_H_

#include <fcntl.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shm/layout.h"

namespace tpd::shm {

// The seals a segment must carry.
inline constexpr int kRequiredSeals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW;

struct SegmentOptions {
  // fallocate the whole segment at creation: memory is committed (and ENOSPC reported) now
  // rather than on first touch, when a full tmpfs or memory cgroup would raise SIGBUS.
  bool preallocate = false;
};

class Segment {
 public:
  // The daemon's side. INVALID_ARGUMENT for bad limits (ComputeLayout); the errno of a
  // failing memfd_create, ftruncate, fallocate, fcntl or mmap otherwise, naming the call.
  static absl::StatusOr<Segment> Create(const SegmentLimits& limits,
                                        const SegmentOptions& options = {});

  // The client's side. Takes ownership of `fd` (closed on failure too). FAILED_PRECONDITION
  // naming what is wrong when `fd` is not a memfd with kRequiredSeals, has a size no segment
  // has, or its header does not describe it.
  static absl::StatusOr<Segment> Map(int fd);

  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  // The memfd, -1 after CloseFd. Pass it to the client with SCM_RIGHTS, then CloseFd.
  int fd() const { return fd_; }
  // Closes the fd; the mapping stays until the object goes.
  void CloseFd();
  // A new fd of the same memfd that is open for reading only (through /proc/self/fd, before
  // CloseFd): a process given it can map the segment but never write into it. The errno of
  // open otherwise, naming it.
  absl::StatusOr<int> OpenReadOnly() const;

  uint8_t* base() const { return base_; }
  uint64_t size() const { return layout_.total_bytes; }
  // Private to this process: the daemon's from its limits, the client's from the header.
  const Layout& layout() const { return layout_; }

 private:
  Segment(int fd, uint8_t* base, const Layout& layout) : fd_(fd), base_(base), layout_(layout) {}
  void Reset();

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  Layout layout_;
};

// Another session's segment as a client maps it to read the tensors the daemon did not copy
// (peer_notice.h): read-only (the fd it comes with is open for reading only, so no mapping of
// it can write), MAP_SHARED. Owns the mapping, not the fd.
//
// Thread safety: const methods from any thread.
class ReadOnlyMapping {
 public:
  // FAILED_PRECONDITION naming what is wrong when `fd` is not a memfd with kRequiredSeals
  // (whose size could change under the mapping) or has another size than `bytes`; the errno
  // of mmap otherwise.
  static absl::StatusOr<ReadOnlyMapping> Map(int fd, uint64_t bytes);

  ReadOnlyMapping(ReadOnlyMapping&& other) noexcept;
  ReadOnlyMapping& operator=(ReadOnlyMapping&& other) noexcept;
  ReadOnlyMapping(const ReadOnlyMapping&) = delete;
  ReadOnlyMapping& operator=(const ReadOnlyMapping&) = delete;
  ~ReadOnlyMapping();

  const uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  ReadOnlyMapping(const uint8_t* base, uint64_t size) : base_(base), size_(size) {}
  void Reset();

  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace tpd::shm

#endif  // TPD_SHM_SEGMENT_H_
