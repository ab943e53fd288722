// Makes Debian's Abseil synchronization visible to ThreadSanitizer (`--config=tsan`).
//
// Debian's libabsl is not instrumented, so TSan never sees absl::Mutex, CondVar or
// Notification order anything, and reports every access to ABSL_GUARDED_BY data from two
// threads as a race. The tsan config links this file into every binary and test (as the
// "malloc" library; it defines no allocator) and wraps the calls our code makes into those
// classes (`ld --wrap`, flags in this target's linkopts): each wrapper calls the real
// function and tells TSan about it, a release on the object before anything that may let
// another thread in (unlock, wait, notify) and an acquire after anything that got in (lock,
// wait returned, notification seen). Lock order and deadlocks are not modelled; races are.
//
// Calls Abseil makes to itself, and gRPC's own locking, stay invisible: a report whose stacks
// lead into gRPC (a handler, a reactor callback, a call's teardown) is, as far as seen, about
// gRPC handing a call between its threads, not about our locks. So --config=tsan checks code
// that synchronizes through Abseil and std::thread (the store, the group worker and tracker);
// under gRPC it reports noise.
//
// The mangled names carry Debian's inline namespace (absl::debian3): the static_assert below
// stops the build when another Abseil is used.

#include <sanitizer/tsan_interface.h>

#include <type_traits>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

static_assert(std::is_same_v<absl::Mutex, absl::debian3::Mutex>,
              "tsan_absl_sync.cc wraps Debian's Abseil (inline namespace debian3)");

namespace {

using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

void Acquire(const void* object) { __tsan_acquire(const_cast<void*>(object)); }
void Release(const void* object) { __tsan_release(const_cast<void*>(object)); }

// Abseil evaluates the condition of LockWhen and Await inside the real call, on whichever
// thread holds the lock at that moment (the waiter, or the thread unlocking): before the
// wrapper's Acquire after the call. So the wrappers pass a condition that acquires the
// waiter's condition (released by the waiter once built) and the mutex first, and releases
// the mutex after.
struct Guarded {
  Mutex* mu;
  const Condition* condition;
};
bool EvalHoldingLock(Guarded* guarded) {
  Acquire(guarded);
  Acquire(guarded->mu);
  const bool holds = guarded->condition->Eval();
  // What the condition read happens before the next holder of the lock, whoever that is.
  Release(guarded->mu);
  return holds;
}

}  // namespace

// `ld --wrap=X` sends our calls of X to __wrap_X and lets __real_X name the real X. Member
// functions take `this` first, as these free functions do.
#define TPD_REAL(name) __real_##name
#define TPD_WRAP(name) __wrap_##name

extern "C" {

// --- absl::Mutex -------------------------------------------------------------------------
void TPD_REAL(_ZN4absl7debian35Mutex4LockEv)(Mutex*);
void TPD_WRAP(_ZN4absl7debian35Mutex4LockEv)(Mutex* mu) {
  TPD_REAL(_ZN4absl7debian35Mutex4LockEv)(mu);
  Acquire(mu);
}
void TPD_REAL(_ZN4absl7debian35Mutex10ReaderLockEv)(Mutex*);
void TPD_WRAP(_ZN4absl7debian35Mutex10ReaderLockEv)(Mutex* mu) {
  TPD_REAL(_ZN4absl7debian35Mutex10ReaderLockEv)(mu);
  Acquire(mu);
}
bool TPD_REAL(_ZN4absl7debian35Mutex7TryLockEv)(Mutex*);
bool TPD_WRAP(_ZN4absl7debian35Mutex7TryLockEv)(Mutex* mu) {
  const bool locked = TPD_REAL(_ZN4absl7debian35Mutex7TryLockEv)(mu);
  if (locked) Acquire(mu);
  return locked;
}
bool TPD_REAL(_ZN4absl7debian35Mutex13ReaderTryLockEv)(Mutex*);
bool TPD_WRAP(_ZN4absl7debian35Mutex13ReaderTryLockEv)(Mutex* mu) {
  const bool locked = TPD_REAL(_ZN4absl7debian35Mutex13ReaderTryLockEv)(mu);
  if (locked) Acquire(mu);
  return locked;
}
void TPD_REAL(_ZN4absl7debian35Mutex6UnlockEv)(Mutex*);
void TPD_WRAP(_ZN4absl7debian35Mutex6UnlockEv)(Mutex* mu) {
  Release(mu);
  TPD_REAL(_ZN4absl7debian35Mutex6UnlockEv)(mu);
}
void TPD_REAL(_ZN4absl7debian35Mutex12ReaderUnlockEv)(Mutex*);
void TPD_WRAP(_ZN4absl7debian35Mutex12ReaderUnlockEv)(Mutex* mu) {
  Release(mu);
  TPD_REAL(_ZN4absl7debian35Mutex12ReaderUnlockEv)(mu);
}
void TPD_REAL(_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE)(Mutex*, const Condition&);
void TPD_WRAP(_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE)(Mutex* mu, const Condition& c) {
  Guarded guarded{mu, &c};
  const Condition acquiring(&EvalHoldingLock, &guarded);
  Release(&guarded);
  TPD_REAL(_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE)(mu, acquiring);
  Acquire(mu);
}
bool TPD_REAL(_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE)(
    Mutex*, const Condition&, Duration);
bool TPD_WRAP(_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE)(
    Mutex* mu, const Condition& c, Duration d) {
  Guarded guarded{mu, &c};
  const Condition acquiring(&EvalHoldingLock, &guarded);
  Release(&guarded);
  const bool met =
      TPD_REAL(_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE)(
          mu, acquiring, d);
  Acquire(mu);
  return met;
}
bool TPD_REAL(_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE)(
    Mutex*, const Condition&, Time);
bool TPD_WRAP(_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE)(
    Mutex* mu, const Condition& c, Time t) {
  Guarded guarded{mu, &c};
  const Condition acquiring(&EvalHoldingLock, &guarded);
  Release(&guarded);
  const bool met = TPD_REAL(
      _ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE)(mu, acquiring, t);
  Acquire(mu);
  return met;
}
// Await* releases the lock while it waits and holds it again when it returns.
void TPD_REAL(_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE)(Mutex*, const Condition&);
void TPD_WRAP(_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE)(Mutex* mu, const Condition& c) {
  Guarded guarded{mu, &c};
  const Condition acquiring(&EvalHoldingLock, &guarded);
  Release(&guarded);
  Release(mu);
  TPD_REAL(_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE)(mu, acquiring);
  Acquire(mu);
}
bool TPD_REAL(_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE)(
    Mutex*, const Condition&, Duration);
bool TPD_WRAP(_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE)(
    Mutex* mu, const Condition& c, Duration d) {
  Guarded guarded{mu, &c};
  const Condition acquiring(&EvalHoldingLock, &guarded);
  Release(&guarded);
  Release(mu);
  const bool met = TPD_REAL(
      _ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE)(mu, acquiring, d);
  Acquire(mu);
  return met;
}
bool TPD_REAL(_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE)(
    Mutex*, const Condition&, Time);
bool TPD_WRAP(_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE)(
    Mutex* mu, const Condition& c, Time t) {
  Guarded guarded{mu, &c};
  const Condition acquiring(&EvalHoldingLock, &guarded);
  Release(&guarded);
  Release(mu);
  const bool met = TPD_REAL(_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE)(
      mu, acquiring, t);
  Acquire(mu);
  return met;
}

// --- absl::CondVar: waiting releases the mutex and takes it again ------------------------
void TPD_REAL(_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE)(CondVar*, Mutex*);
void TPD_WRAP(_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE)(CondVar* cv, Mutex* mu) {
  Release(mu);
  TPD_REAL(_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE)(cv, mu);
  Acquire(mu);
}
bool TPD_REAL(_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE)(CondVar*,
                                                                                    Mutex*,
                                                                                    Duration);
bool TPD_WRAP(_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE)(CondVar* cv,
                                                                                    Mutex* mu,
                                                                                    Duration d) {
  Release(mu);
  const bool timed_out =
      TPD_REAL(_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE)(cv, mu, d);
  Acquire(mu);
  return timed_out;
}
bool TPD_REAL(_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE)(CondVar*, Mutex*,
                                                                                 Time);
bool TPD_WRAP(_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE)(CondVar* cv,
                                                                                 Mutex* mu,
                                                                                 Time t) {
  Release(mu);
  const bool timed_out =
      TPD_REAL(_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE)(cv, mu, t);
  Acquire(mu);
  return timed_out;
}

// --- absl::Notification: Notify releases, a wait that saw it acquires ---------------------
void TPD_REAL(_ZN4absl7debian312Notification6NotifyEv)(Notification*);
void TPD_WRAP(_ZN4absl7debian312Notification6NotifyEv)(Notification* n) {
  Release(n);
  TPD_REAL(_ZN4absl7debian312Notification6NotifyEv)(n);
}
void TPD_REAL(_ZNK4absl7debian312Notification19WaitForNotificationEv)(const Notification*);
void TPD_WRAP(_ZNK4absl7debian312Notification19WaitForNotificationEv)(const Notification* n) {
  TPD_REAL(_ZNK4absl7debian312Notification19WaitForNotificationEv)(n);
  Acquire(n);
}
bool TPD_REAL(_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE)(
    const Notification*, Duration);
bool TPD_WRAP(_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE)(
    const Notification* n, Duration d) {
  const bool notified = TPD_REAL(
      _ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE)(n, d);
  if (notified) Acquire(n);
  return notified;
}
bool TPD_REAL(_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE)(
    const Notification*, Time);
bool TPD_WRAP(_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE)(
    const Notification* n, Time t) {
  const bool notified =
      TPD_REAL(_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE)(n, t);
  if (notified) Acquire(n);
  return notified;
}

}  // extern "C"
