// Bytes from the kernel's CSPRNG (getrandom), for credentials and keys: session ids, nonces,
// a daemon's own key. Never from a seeded generator.
//
// Thread safety: thread-safe.

#ifndef TPD_BASE_RANDOM_BYTES_H_
#define TPD_BASE_RANDOM_BYTES_H_

#include <cstddef>
#include <string>

namespace tpd {

// `n` random bytes. Aborts when the kernel has no getrandom (Linux before 3.17) or it fails
// otherwise: without it there is no safe credential to make, so nothing can go on.
std::string RandomBytes(size_t n);

}  // namespace tpd

#endif  // TPD_BASE_RANDOM_BYTES_H_
