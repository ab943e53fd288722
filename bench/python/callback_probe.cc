// What it costs a C library to call into Python from a thread Python has not seen (a ctypes
// callback run by a native thread: each call makes and drops a Python thread state) against
// the same callback run on a Python thread (its thread state kept). rpc_bench.py's row P0;
// it is why the C ABI hands events to Python threads blocked in tpd_next_event instead of
// calling back.

#include <chrono>
#include <cstdint>
#include <thread>

namespace {

using Callback = void (*)(int64_t);

int64_t Run(Callback callback, int64_t n) {
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) callback(i);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

}  // namespace

extern "C" {

// Runs `callback` n times on a new native thread; the elapsed nanoseconds of the calls.
int64_t probe_native_thread(Callback callback, int64_t n) {
  int64_t elapsed = 0;
  std::thread thread([&] { elapsed = Run(callback, n); });
  thread.join();
  return elapsed;
}

// Runs `callback` n times on the calling (Python) thread.
int64_t probe_this_thread(Callback callback, int64_t n) { return Run(callback, n); }

}  // extern "C"
