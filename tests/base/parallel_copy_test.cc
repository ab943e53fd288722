// Unit tests of CopyPool: every byte lands where memcpy would put it, whatever the size, the
// chunking, the number of helpers and of concurrent copiers; a forked child copies alone.

#include "base/parallel_copy.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tpd {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> bytes(n);
  std::mt19937 random(seed);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(random());
  return bytes;
}

// Copies into a buffer with guard bytes on both sides and checks the copy and the guards.
void ExpectCopies(CopyPool& pool, size_t n, uint32_t seed) {
  const std::vector<uint8_t> src = Pattern(n, seed);
  std::vector<uint8_t> dst(n + 128, 0xA5);
  pool.Copy(dst.data() + 64, src.data(), n);
  for (size_t i = 0; i < 64; ++i) {
    ASSERT_EQ(dst[i], 0xA5) << "byte " << i << " before the copy of " << n;
    ASSERT_EQ(dst[64 + n + i], 0xA5) << "byte " << i << " after the copy of " << n;
  }
  ASSERT_EQ(0, std::memcmp(dst.data() + 64, src.data(), n)) << "a copy of " << n << " bytes";
}

TEST(CopyPoolTest, EverySizeAroundTheThresholdAndTheChunksCopiesExactly) {
  CopyPool pool({/*helpers=*/3, /*parallel_from=*/4096, /*chunk_bytes=*/1000,
                 /*bytes_per_thread=*/1000});
  for (size_t n : {size_t{0}, size_t{1}, size_t{999}, size_t{4095}, size_t{4096}, size_t{4097},
                   size_t{5000}, size_t{123457}, size_t{3 << 20}}) {
    ExpectCopies(pool, n, static_cast<uint32_t>(n));
  }
}

TEST(CopyPoolTest, NoHelpersCopiesOnTheCallersThread) {
  CopyPool pool({/*helpers=*/0, /*parallel_from=*/1, /*chunk_bytes=*/64, /*bytes_per_thread=*/64});
  ExpectCopies(pool, 100000, 7);
}

TEST(CopyPoolTest, ConcurrentCopiersShareTheHelpersAndEachGetsItsBytes) {
  CopyPool pool({/*helpers=*/2, /*parallel_from=*/1 << 12, /*chunk_bytes=*/1 << 12,
                 /*bytes_per_thread=*/1 << 12});
  std::vector<std::thread> copiers;
  std::vector<int> failures(8, 0);
  for (int t = 0; t < 8; ++t) {
    copiers.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        const size_t n = (1 << 16) + 977 * t + round;
        const std::vector<uint8_t> src = Pattern(n, t * 100 + round);
        std::vector<uint8_t> dst(n);
        pool.Copy(dst.data(), src.data(), n);
        if (dst != src) ++failures[t];
      }
    });
  }
  for (std::thread& copier : copiers) copier.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(failures[t], 0) << "copier " << t;
}

TEST(CopyPoolTest, AChildForkedAfterTheHelpersStartedCopiesAlone) {
  CopyPool pool({/*helpers=*/2, /*parallel_from=*/1 << 12, /*chunk_bytes=*/1 << 12,
                 /*bytes_per_thread=*/1 << 12});
  ExpectCopies(pool, 1 << 20, 1);  // the helpers run now
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The helpers are the parent's: waiting for one would hang, so a hang fails the test.
    const std::vector<uint8_t> src = Pattern(1 << 20, 2);
    std::vector<uint8_t> dst(src.size());
    pool.Copy(dst.data(), src.data(), src.size());
    _exit(dst == src ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(CopyPoolTest, TheProcessPoolCopies) {
  const std::vector<uint8_t> src = Pattern(5 << 20, 3);
  std::vector<uint8_t> dst(src.size());
  CopyBytes(dst.data(), src.data(), src.size());
  EXPECT_EQ(dst, src);
  EXPECT_LE(CopyPool::Default().options().helpers, 7);
}

}  // namespace
}  // namespace tpd
