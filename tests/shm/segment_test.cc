// Tests of the session segment: the daemon creates and seals it, a client maps it from the
// fd alone, and nobody can change its size afterwards (the C3 fault row: "a client shrinks
// shared memory" must be impossible, not just detected).

#include "shm/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/layout.h"
#include "shm/ring.h"
#include "tests/shm/child_process.h"

namespace tpd::shm {
namespace {

using testing::FinishChild;
using ::testing::HasSubstr;
using testing::StartChild;

SegmentLimits SmallLimits() {
  SegmentLimits limits;
  limits.submission_slots = 16;
  limits.completion_slots = 16;
  limits.tx_heap_bytes = 64 * 1024;
  limits.rx_heap_bytes = 32 * 1024;
  return limits;
}

Segment CreateOrDie(const SegmentLimits& limits = SmallLimits()) {
  absl::StatusOr<Segment> segment = Segment::Create(limits);
  EXPECT_TRUE(segment.ok()) << segment.status();
  return *std::move(segment);
}

TEST(SegmentTest, CreateSealsTheMemfdAndSizesItToTheLayout) {
  Segment segment = CreateOrDie();
  ASSERT_GE(segment.fd(), 0);
  EXPECT_EQ(fcntl(segment.fd(), F_GET_SEALS), kRequiredSeals);
  struct stat st;
  ASSERT_EQ(fstat(segment.fd(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), segment.size());
  EXPECT_EQ(segment.size(), segment.layout().total_bytes);
  EXPECT_TRUE(fcntl(segment.fd(), F_GETFD) & FD_CLOEXEC);
}

TEST(SegmentTest, BadLimitsAreRefused) {
  SegmentLimits limits = SmallLimits();
  limits.submission_slots = 3;
  absl::StatusOr<Segment> segment = Segment::Create(limits);
  EXPECT_EQ(segment.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(segment.status().message(), HasSubstr("submission_slots is 3"));
}

TEST(SegmentTest, ClientMapsTheSameLayoutAndSeesTheDaemonsWrites) {
  Segment daemon = CreateOrDie();
  absl::StatusOr<Segment> client = Segment::Map(dup(daemon.fd()));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->size(), daemon.size());
  EXPECT_EQ(client->layout().tx_heap.offset, daemon.layout().tx_heap.offset);
  EXPECT_EQ(client->layout().rx_heap.bytes, daemon.layout().rx_heap.bytes);
  EXPECT_EQ(client->layout().completion.slots, daemon.layout().completion.slots);
  EXPECT_NE(client->base(), daemon.base());
  // The rx heap is written by the daemon and read by the client; the tx heap the other way.
  std::memcpy(daemon.base() + daemon.layout().rx_heap.offset, "from daemon", 12);
  EXPECT_STREQ(reinterpret_cast<char*>(client->base() + client->layout().rx_heap.offset),
               "from daemon");
  std::memcpy(client->base() + client->layout().tx_heap.offset, "from client", 12);
  EXPECT_STREQ(reinterpret_cast<char*>(daemon.base() + daemon.layout().tx_heap.offset),
               "from client");
}

TEST(SegmentTest, ClientCannotShrinkGrowOrUnsealIt) {
  Segment daemon = CreateOrDie();
  const int fd = daemon.fd();
  const off_t size = static_cast<off_t>(daemon.size());
  errno = 0;
  EXPECT_EQ(ftruncate(fd, size - 4096), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(ftruncate(fd, 0), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(ftruncate(fd, size + 4096), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_NE(fallocate(fd, 0, size, 4096), 0) << "growing through fallocate";
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1) << "F_SEAL_SEAL forbids new seals";
  EXPECT_EQ(errno, EPERM);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, size);
}

TEST(SegmentTest, AClientProcessCannotShrinkItEither) {
  Segment daemon = CreateOrDie();
  const int fd = daemon.fd();
  const off_t size = static_cast<off_t>(daemon.size());
  const pid_t pid = StartChild([&] {
    absl::StatusOr<Segment> client = Segment::Map(dup(fd));
    if (!client.ok()) return 1;
    if (ftruncate(client->fd(), 4096) != -1 || errno != EPERM) return 2;
    // The client scribbles over its whole segment, header included.
    std::memset(client->base(), 0xA5, client->size());
    return 0;
  });
  ASSERT_EQ(FinishChild(pid), 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, size);
  // The daemon's mapping is whole; its layout is its own copy, untouched by the scribbling.
  EXPECT_EQ(daemon.base()[daemon.size() - 1], 0xA5);
  EXPECT_EQ(daemon.layout().total_bytes, static_cast<uint64_t>(size));
  EXPECT_EQ(daemon.layout().rx_heap.bytes, 32u * 1024);
}

TEST(SegmentTest, TheDaemonsTxHeapMappingIsReadOnly) {
  Segment daemon = CreateOrDie();
  uint8_t* tx = daemon.base() + daemon.layout().tx_heap.offset;
  EXPECT_EQ(tx[0], 0);
  EXPECT_DEATH(tx[0] = 1, "") << "writing the tx heap from the daemon's mapping";
  uint8_t* rx = daemon.base() + daemon.layout().rx_heap.offset;
  rx[0] = 1;  // the rx heap is the daemon's to write
  EXPECT_EQ(rx[0], 1);
}

TEST(SegmentTest, MapRefusesAnUnsealedMemfd) {
  absl::StatusOr<Layout> layout = ComputeLayout(SmallLimits());
  ASSERT_TRUE(layout.ok());
  const int fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, layout->total_bytes), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_GROW), 0);  // but not shrink: could SIGBUS a reader
  absl::StatusOr<Segment> mapped = Segment::Map(fd);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mapped.status().message(), HasSubstr("its size could still change"));
  EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "Map closes the fd it was given, on failure too";
}

TEST(SegmentTest, MapRefusesAFileThatIsNotAMemfd) {
  char path[] = "/tmp/tpd-shm-test-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
  absl::StatusOr<Segment> mapped = Segment::Map(fd);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mapped.status().message(), HasSubstr("not a sealable memfd"));
}

TEST(SegmentTest, MapRefusesASealedMemfdWithoutAHeader) {
  const int fd = memfd_create("no-header", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, kRequiredSeals), 0);
  absl::StatusOr<Segment> mapped = Segment::Map(fd);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mapped.status().message(), HasSubstr("magic is 0"));
}

TEST(SegmentTest, MapRefusesSizesNoSegmentHas) {
  const int fd = memfd_create("odd-size", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096 + 7), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, kRequiredSeals), 0);
  absl::StatusOr<Segment> mapped = Segment::Map(fd);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mapped.status().message(), HasSubstr("has 4103 bytes"));
}

TEST(SegmentTest, PreallocateCommitsTheMemory) {
  SegmentOptions options;
  options.preallocate = true;
  absl::StatusOr<Segment> segment = Segment::Create(SmallLimits(), options);
  ASSERT_TRUE(segment.ok()) << segment.status();
  struct stat st;
  ASSERT_EQ(fstat(segment->fd(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, segment->size());
}

TEST(SegmentTest, MovingAndClosingKeepTheMapping) {
  Segment daemon = CreateOrDie();
  uint8_t* base = daemon.base();
  Segment moved = std::move(daemon);
  EXPECT_EQ(moved.base(), base);
  EXPECT_EQ(daemon.base(), nullptr);  // NOLINT(bugprone-use-after-move): checked on purpose
  EXPECT_EQ(daemon.fd(), -1);
  const int fd = moved.fd();
  moved.CloseFd();
  EXPECT_EQ(moved.fd(), -1);
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);
  base[moved.layout().rx_heap.offset] = 7;  // still mapped
  EXPECT_EQ(base[moved.layout().rx_heap.offset], 7);
}

// Lines of /proc/self/maps that map a session memfd.
int SessionMappings() {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:tpd-session") != std::string::npos) ++count;
  }
  return count;
}

TEST(SegmentTest, DestroyingItUnmapsAndClosesSoNoMemfdIsLeftBehind) {
  const int before = SessionMappings();
  int fd;
  {
    Segment segment = CreateOrDie();
    absl::StatusOr<Segment> client = Segment::Map(dup(segment.fd()));
    ASSERT_TRUE(client.ok()) << client.status();
    fd = segment.fd();
    EXPECT_GT(SessionMappings(), before);
  }
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);
  EXPECT_EQ(SessionMappings(), before);
}

}  // namespace
}  // namespace tpd::shm
