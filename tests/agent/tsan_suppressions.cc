// ThreadSanitizer suppressions for the agent's tests, built into their binaries (TSan reads
// __tsan_default_suppressions at start; other builds never call it).
//
// Debian's TensorPipe, libuv and Abseil are not instrumented, so TSan misses orders they
// establish internally:
//  - TensorPipe's runInLoop hands results (listener addresses, mpt's lane addresses) back to
//    the calling thread through a std::promise completed inside the library. Agent::Create
//    (Start inlined) copies those strings while only TensorPipe's threads exist: none of tpd's
//    objects is shared yet.
//  - A shm connection's destructor closes an fd that the uv loop had registered with epoll;
//    TensorPipe orders the two through its loops.
//  - Abseil's deadlock detector (GraphCycles) is guarded by Abseil's own spin lock.
// Races between two of tpd's own accesses anywhere else are still reported.

extern "C" const char* __tsan_default_suppressions() {
  return "race:tensorpipe::DeferredExecutor::runInLoop\n"
         "race:tensorpipe::channel::mpt::ContextImpl::ContextImpl\n"
         "race:tensorpipe::transport::shm::ConnectionImpl::~ConnectionImpl\n"
         "race:tpd::agent::Agent::Create\n"
         "race:tpd::agent::Agent::Start\n"
         "race:absl::*::synchronization_internal::GraphCycles::*\n";
}
