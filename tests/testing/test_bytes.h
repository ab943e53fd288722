// Bytes for tests that move data: a reproducible pattern to send, and a checksum to compare
// what arrived, so a test can check gigabytes without keeping a second copy.

#ifndef TPD_TESTS_TESTING_TEST_BYTES_H_
#define TPD_TESTS_TESTING_TEST_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tpd::testing {

// `n` bytes that differ by `seed` and along the buffer (a linear congruential sequence), so a
// shifted, truncated or swapped buffer never matches.
inline std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    s[i] = static_cast<char>(x >> 24);
  }
  return s;
}

// FNV-1a, 64 bits.
inline uint64_t Checksum(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_TEST_BYTES_H_
