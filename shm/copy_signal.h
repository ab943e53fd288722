// How a call posted before its CUDA copies completed says when they did (docs/cuda.md, "Who
// copies, and why").
//
// The daemon posts a call whose CUDA tensors it copies into the callee's receive pools as soon
// as it has issued the copies, so the callee wakes, reads the call and readies its handler while
// the copy runs, instead of after it. Each such tensor's completion entry names, in
// device_handle, the segment offset of one CopySignal in the call's rx block (after the message).
// The callee's client waits there before its handler sees the call: the state leaves kCopying
// once the daemon saw every copy complete (kCopied) or fail (kCopyFailed), and the daemon rings
// the doorbell, so a callee that went to sleep wakes.
//
// Trust: the signal lies in the receiver's own segment. The daemon only writes it, never reads
// it back; a client that writes it can only make its own handler read bytes not copied yet. The
// daemon holds the call's blocks until the copies completed (a release before that is carried
// out after), so nothing is placed where a copy still writes.
//
// Thread safety: one writer (the daemon's copy completion) and one waiter (the client's thread
// that serves the call), in two processes.

#ifndef TPD_SHM_COPY_SIGNAL_H_
#define TPD_SHM_COPY_SIGNAL_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "shm/descriptor.h"
#include "shm/doorbell.h"

namespace tpd::shm {

enum CopyState : uint32_t {
  kCopying = 0,
  kCopied = 1,
  kCopyFailed = 2,
};

// How a client thread whose next event waits for a CUDA copy spins before it sleeps: a callee
// waiting on a CopySignal, a caller and its reader waiting for the reply to a call that sent
// CUDA tensors. (The daemon's session threads wait through every call, CUDA or not, with a
// window of their own: kAfterCallSpin, daemon/router/call_router.cc.) The copy is in
// flight for that very call, so the spin costs no idle CPU; a 256 MiB copy between two GPUs
// takes about 700 µs, and waking a thread asleep costs tens of microseconds on top
// (docs/BENCHMARKS.md, "Issue 18, fourth session"). Waits that keep running longer shut it off.
inline constexpr SpinOptions kCopySpin{absl::Microseconds(2), absl::Milliseconds(1),
                                       absl::Microseconds(1)};

struct alignas(64) CopySignal {
  std::atomic<uint32_t> state;  // CopyState
  uint8_t reserved[60];
  DoorbellWord bell;  // the waiter sleeps on it once its spin is over
};
static_assert(sizeof(CopySignal) == kCopySignalBytes);

}  // namespace tpd::shm

#endif  // TPD_SHM_COPY_SIGNAL_H_
