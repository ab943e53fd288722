#include "base/random_bytes.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tpd {

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t filled = 0;
  while (filled < n) {
    const ssize_t got = getrandom(out.data() + filled, n - filled, 0);
    if (got > 0) {
      filled += static_cast<size_t>(got);
    } else if (got < 0 && errno != EINTR) {
      std::fprintf(stderr, "tpd: getrandom failed: %s\n", std::strerror(errno));
      std::abort();
    }
  }
  return out;
}

}  // namespace tpd
