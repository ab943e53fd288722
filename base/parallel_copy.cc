#include "base/parallel_copy.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace tpd {

// One copy in progress. It lives on its caller's stack: the caller takes it off the queue and
// waits until no helper holds it before it returns.
struct CopyPool::Job {
  char* dst;
  const char* src;
  size_t n;
  size_t chunk;
  size_t chunks;
  int wanted;                   // helpers that may join
  std::atomic<size_t> next{0};  // the next chunk to take
  // Guarded by the pool's mu_ (not expressible on a member of another object).
  int joined = 0;   // helpers that took it
  int holders = 0;  // helpers copying its chunks now

  // Takes chunks until none is left.
  void Run() {
    for (size_t k = next.fetch_add(1, std::memory_order_relaxed); k < chunks;
         k = next.fetch_add(1, std::memory_order_relaxed)) {
      const size_t at = k * chunk;
      std::memcpy(dst + at, src + at, std::min(chunk, n - at));
    }
  }
};

CopyPool::CopyPool(CopyPoolOptions options) : options_(options), owner_(getpid()) {}

CopyPool::~CopyPool() {
  std::vector<std::thread> helpers;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    helpers.swap(helpers_);
  }
  for (std::thread& helper : helpers) helper.join();
}

CopyPool& CopyPool::Default() {
  static CopyPool* const pool = [] {
    CopyPoolOptions options;
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    options.helpers = std::clamp(cores - 1, 0, 7);
    return new CopyPool(options);
  }();
  return *pool;
}

void CopyPool::StartHelpersLocked() {
  if (!helpers_.empty()) return;
  for (int i = 0; i < options_.helpers; ++i) helpers_.emplace_back([this] { HelperLoop(); });
}

void CopyPool::DropJobLocked(Job* job) {
  auto it = std::find(jobs_.begin(), jobs_.end(), job);
  if (it != jobs_.end()) jobs_.erase(it);
}

void CopyPool::HelperLoop() {
  const auto has_work = [](CopyPool* pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool->mu_) {
    return pool->stop_ || !pool->jobs_.empty();
  };
  mu_.Lock();
  while (true) {
    mu_.Await(absl::Condition(+has_work, this));
    if (stop_) break;
    Job* job = jobs_.front();
    ++job->holders;
    if (++job->joined == job->wanted) jobs_.pop_front();
    mu_.Unlock();
    job->Run();
    mu_.Lock();
    DropJobLocked(job);  // every chunk is taken: nobody else need join
    --job->holders;      // last: the caller may return once it is 0
  }
  mu_.Unlock();
}

void CopyPool::Copy(void* dst, const void* src, size_t n) {
  if (n < options_.parallel_from || options_.helpers <= 0 || options_.chunk_bytes == 0 ||
      getpid() != owner_) {
    std::memcpy(dst, src, n);
    return;
  }
  Job job;
  job.dst = static_cast<char*>(dst);
  job.src = static_cast<const char*>(src);
  job.n = n;
  job.chunk = options_.chunk_bytes;
  job.chunks = (n + job.chunk - 1) / job.chunk;
  const size_t threads = std::max<size_t>(n / std::max<size_t>(options_.bytes_per_thread, 1), 1);
  job.wanted =
      static_cast<int>(std::min<size_t>({size_t(options_.helpers), job.chunks - 1, threads - 1}));
  {
    absl::MutexLock lock(&mu_);
    if (!stop_ && job.wanted > 0) {
      StartHelpersLocked();
      jobs_.push_back(&job);
    }
  }
  job.Run();
  const auto released = [](Job* j) { return j->holders == 0; };
  absl::MutexLock lock(&mu_);
  DropJobLocked(&job);
  mu_.Await(absl::Condition(+released, &job));
}

void CopyBytes(void* dst, const void* src, size_t n) { CopyPool::Default().Copy(dst, src, n); }

}  // namespace tpd
