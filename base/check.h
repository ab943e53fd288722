// Assertions for what "cannot happen", as TensorPipe's TP_DCHECK and Envoy's ASSERT:
//
//   TPD_DCHECK(waiters_.contains(id));         // an invariant, or thread confinement:
//   TPD_DCHECK(loop_.InLoop());                // "this runs on the loop thread only"
//   TPD_CHECK_OK(store.Set("k", "v"));         // a Status that cannot fail here
//
// TPD_DCHECK(cond) is checked in debug and sanitizer builds (a failure prints the file, line
// and condition, then aborts) and compiled out with NDEBUG (`-c opt`): `cond` is then not
// evaluated, so it must have no side effects.
//
// TPD_CHECK_OK(expr) replaces `(void)expr` for an absl::Status (or StatusOr) that cannot
// fail: `expr` is always evaluated; a failure aborts in debug and sanitizer builds and, with
// NDEBUG, is written to stderr (file, line, expression, status) and the program goes on, so a
// wrong "cannot" costs a daemon in production a log line, not its life. A Status that *can*
// fail (a remote store, a file) is handled or logged where it arises, never asserted.
//
// Thread safety: stateless.

#ifndef TPD_BASE_CHECK_H_
#define TPD_BASE_CHECK_H_

#include <cstdio>
#include <cstdlib>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TPD_INTERNAL_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TPD_INTERNAL_SANITIZED 1
#endif

// 1 where TPD_DCHECK checks and a failed TPD_CHECK_OK aborts: debug or sanitizer builds.
#if !defined(NDEBUG) || defined(TPD_INTERNAL_SANITIZED)
#define TPD_DCHECK_IS_ON 1
#else
#define TPD_DCHECK_IS_ON 0
#endif

namespace tpd::internal_check {

[[noreturn]] inline void Fail(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: TPD_DCHECK failed: %s\n", file, line, what);
  std::fflush(stderr);
  std::abort();
}

inline const absl::Status& AsStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

inline void CheckOk(const absl::Status& status, const char* file, int line, const char* expr) {
  if (ABSL_PREDICT_TRUE(status.ok())) return;
  std::fprintf(stderr, "%s:%d: TPD_CHECK_OK failed: %s: %s\n", file, line, expr,
               status.ToString().c_str());
  std::fflush(stderr);
  if (TPD_DCHECK_IS_ON) std::abort();
}

}  // namespace tpd::internal_check

#if TPD_DCHECK_IS_ON
#define TPD_DCHECK(cond)                                      \
  do {                                                        \
    if (ABSL_PREDICT_FALSE(!(cond))) {                        \
      ::tpd::internal_check::Fail(__FILE__, __LINE__, #cond); \
    }                                                         \
  } while (false)
#else
// Compiled out, but still compiled: a condition that stops building is noticed in every build.
#define TPD_DCHECK(cond) \
  do {                   \
    if (false) {         \
      (void)(cond);      \
    }                    \
  } while (false)
#endif

#define TPD_CHECK_OK(expr) \
  ::tpd::internal_check::CheckOk(::tpd::internal_check::AsStatus((expr)), __FILE__, __LINE__, #expr)

#endif  // TPD_BASE_CHECK_H_
