#include "daemon/router/call_router.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/log_limiter.h"
#include "base/status.h"
#include "daemon/logging.h"
#include "daemon/router/gpu_access.h"
#include "daemon/router/session_handle.h"

namespace tpd {

namespace {

using router::CallName;
using router::MalformedReply;
using router::ReplyFailed;

constexpr absl::Duration kPollInterval = absl::Milliseconds(50);
// How soon a session thread looks again at a completion ring that had no room for what it
// must post: its client is reading (or will be ended past max_unposted), so not long.
constexpr absl::Duration kBacklogInterval = absl::Milliseconds(1);
// How a session thread waits for its client's submissions: the client library's window
// (client/calls.cc). With the doorbell's default 50 µs cap a round trip near it made every hop
// sleep, and sleeping hops kept it there.
constexpr shm::SpinOptions kSessionSpin{absl::Microseconds(2), absl::Microseconds(100),
                                        absl::Microseconds(1)};
// How a session thread waits after its client sent a call, or after a call was posted to it
// (Serve): such a wait lasts as long as a round trip, a handler or a CUDA copy, so the window
// grows up to 1 ms. A client that goes quiet, or handlers that run longer, take it back to
// the minimum within a few calls (SpinWindow).
constexpr shm::SpinOptions kAfterCallSpin{absl::Microseconds(2), absl::Milliseconds(1),
                                          absl::Microseconds(1)};
// The longest the call timer sleeps with deadlines pending later than that
// (PendingCalls::ServeDeadlines).
constexpr absl::Duration kTimerHorizon = absl::Seconds(1);

}  // namespace

CallRouter::CallRouter(CallRouterOptions options)
    : options_(std::move(options)),
      delivery_(options_.cuda, options_.no_cuda),
      staging_(options_.cuda, options_.no_cuda, options_.cuda_chunk_bytes),
      remote_(options_, staging_, pending_, timings_,
              {[this](const std::string& id) { return Find(id); },
               [this](const std::shared_ptr<Session>& to, uint64_t call_id,
                      const absl::Status& status) { Fail(to, call_id, status); },
               [this] { return draining() ? StoppingError() : absl::OkStatus(); },
               [this](const router::MapUse& use, bool reply,
                      const std::vector<shm::TensorEntry>& tensors) {
                 return PlaceTensors(use, reply, tensors);
               }}),
      max_call_spinners_(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 4)) {
  timer_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "tpd-call-timer");
    pending_.ServeDeadlines([this](const Pending& p) { OnDeadline(p); }, kTimerHorizon);
  });
}

CallRouter::~CallRouter() { Shutdown(); }

void CallRouter::Shutdown() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (const auto& [id, session] : sessions_) ids.push_back(id);
  }
  pending_.Stop();
  if (timer_.joinable()) timer_.join();
  for (const std::string& id : ids) Detach(id);
  // Continuations of copies still in flight call into this router: let them run first.
  if (options_.cuda != nullptr) options_.cuda->Flush();
}

absl::Status CallRouter::Attach(const std::string& session_id, uid_t uid, gid_t gid, int connection,
                                std::shared_ptr<shm::Segment> segment) {
  absl::StatusOr<int> share_fd =
      options_.share_memory ? segment->OpenReadOnly() : absl::StatusOr<int>(-1);
  const int notice_fd = options_.share_memory ? dup(connection) : -1;
  std::shared_ptr<Session> session = Session::Open(
      session_id, SessionHandle(session_id), {options_.max_unposted, options_.max_waiting_calls},
      std::move(segment), kSessionSpin);
  session->uid = uid;
  session->gid = gid;
  session->peer_id = ++last_peer_id_;
  if (options_.share_memory && share_fd.ok() && notice_fd >= 0) {
    session->share_fd = *share_fd;
    session->notice_fd = notice_fd;
  } else if (options_.share_memory) {
    // Without either fd the session shares nothing (its messages are copied): it still works.
    DaemonLog().warn(
        "[session {}] shares no memory: {}", session->handle,
        share_fd.ok() ? absl::StrCat("dup: ", std::strerror(errno)) : share_fd.status().ToString());
    if (share_fd.ok()) close(*share_fd);
    if (notice_fd >= 0) close(notice_fd);
  }
  session->cuda_allowed = CheckGpuAccess(uid, options_.device_dir);
  if (options_.cuda != nullptr) session->cuda = options_.cuda->NewSession(session->handle);
  absl::MutexLock lock(&mu_);
  if (stopping_) return StoppingErrorLocked();
  // Past a pids limit (or RLIMIT_NPROC) the start throws; the daemon refuses this session and
  // keeps serving the others.
  try {
    session->thread = std::thread([this, session] { Serve(session); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start a thread for session ", session->handle, ": ", e.what(),
                     " (a tasks or pids limit of the daemon's service reached?)"));
  }
  sessions_[session_id] = std::move(session);
  return absl::OkStatus();
}

void CallRouter::Detach(const std::string& session_id) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    session = std::move(it->second);
    sessions_.erase(it);
    detaching_.insert(session);  // Usage counts it until Retire folds it in
  }
  session->stop = true;
  if (session->thread.joinable()) session->thread.join();
  session->End();  // no one writes into its segment after this
  Retire(session);
  // Its calls' answers have no one to go to; calls it serves are answered here.
  std::vector<Pending> orphans;
  for (Pending& p : pending_.TakeOfSession(session_id)) {
    if (p.callee == session_id && p.caller != session_id) orphans.push_back(std::move(p));
  }
  remote_.calls().DropSession(session_id);
  for (const Pending& p : orphans) {
    AnswerPending(p, absl::UnavailableError(absl::StrCat("worker '", p.worker,
                                                         "' went away during the call to its "
                                                         "method '",
                                                         p.method, "' (its session ended)")));
  }
}

std::shared_ptr<CallRouter::Session> CallRouter::Find(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second;
}

namespace {

router::Usage SessionUsage(router::Session& session) {
  router::Usage usage;
  usage.calls = session.calls_made.load(std::memory_order_relaxed);
  usage.bytes = session.bytes_sent.load(std::memory_order_relaxed);
  usage.errors = session.call_errors.load(std::memory_order_relaxed);
  return usage;
}

}  // namespace

void CallRouter::Retire(const std::shared_ptr<Session>& session) {
  absl::flat_hash_map<std::string, router::Usage> by_group;
  {
    absl::MutexLock lock(&session->usage_mu);
    by_group = std::move(session->usage_by_group);
  }
  absl::MutexLock lock(&mu_);
  detaching_.erase(session);
  retired_.by_uid[session->uid] += SessionUsage(*session);
  for (const auto& [group, usage] : by_group) {
    auto it = retired_.by_group.find(group);
    if (it == retired_.by_group.end() && retired_.by_group.size() >= kMaxGroupsKept) {
      retired_.by_group["(other groups)"] += usage;
    } else {
      retired_.by_group[group] += usage;
    }
  }
}

CallRouter::UsageTotals CallRouter::Usage() {
  std::vector<std::shared_ptr<Session>> sessions;
  UsageTotals totals;
  {
    absl::MutexLock lock(&mu_);
    totals = retired_;
    for (const auto& [id, session] : sessions_) sessions.push_back(session);
    sessions.insert(sessions.end(), detaching_.begin(), detaching_.end());
  }
  for (const std::shared_ptr<Session>& session : sessions) {
    totals.by_uid[session->uid] += SessionUsage(*session);
    absl::MutexLock lock(&session->usage_mu);
    for (const auto& [group, usage] : session->usage_by_group) totals.by_group[group] += usage;
  }
  return totals;
}

std::vector<SessionCallStats> CallRouter::Stats() {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, session] : sessions_) sessions.push_back(session);
  }
  std::vector<SessionCallStats> out;
  for (const std::shared_ptr<Session>& session : sessions) {
    SessionCallStats stats;
    stats.session_id = session->id;
    stats.calls_in_flight = session->calls_in_flight.load();
    stats.unposted = session->unposted_count.load();
    stats.rx_heap_bytes = session->segment->layout().rx_heap.bytes;
    stats.rx_heap_used = session->RxUsed();
    stats.reader_wakeups = session->ReaderWakeups();
    stats.daemon_sleeps = session->DaemonSleeps();
    stats.bytes_shared = session->bytes_shared.load();
    if (session->cuda != nullptr) stats.cuda = options_.cuda->SessionStats(*session->cuda);
    out.push_back(std::move(stats));
  }
  return out;
}

agent::Handler CallRouter::AgentHandler() { return remote_.Handler(); }

size_t CallRouter::Drain(absl::Time deadline, std::string why) {
  {
    absl::MutexLock lock(&mu_);
    if (draining_why_.empty()) draining_why_ = std::move(why);
  }
  // No new call starts now: what is in flight only ends.
  pending_.AwaitNone(deadline);
  const size_t remote = remote_.calls().AwaitNone(deadline);
  return pending_.size() + remote;
}

size_t CallRouter::CallsInFlight() { return pending_.size() + remote_.calls().size(); }

bool CallRouter::draining() {
  absl::MutexLock lock(&mu_);
  return !draining_why_.empty();
}

absl::Status CallRouter::StoppingError() {
  absl::MutexLock lock(&mu_);
  return StoppingErrorLocked();
}

absl::Status CallRouter::StoppingErrorLocked() {
  return absl::UnavailableError(absl::StrCat("the tpd daemon on node ", options_.node, " ",
                                             draining_why_.empty() ? "is stopping" : draining_why_,
                                             " and takes no new calls"));
}

void CallRouter::Serve(std::shared_ptr<Session> session) {
  pthread_setname_np(pthread_self(), "tpd-session");
  shm::Descriptor batch[64];
  // After its client sent a call (its next submission follows the reply), and after a call
  // was posted to it (its reply follows the handler), the next wait spins with this window,
  // learnt apart from kSessionSpin's since such a wait lasts as long as a round trip, a
  // handler or a CUDA copy; a call posted wakes it (Session::CallPosted) from a plain wait.
  // Without this, a client whose calls come slower than kSessionSpin's window (a Python
  // program's, say) finds the thread asleep at every submission and pays a wake-up each way.
  shm::SpinWindow after_call(kAfterCallSpin);
  bool call_sent = false;  // by the last batch
  uint64_t received_seen = session->calls_received.load();
  auto call_received = [&] {
    return session->calls_received.load(std::memory_order_relaxed) != received_seen;
  };
  while (!session->stop) {
    // What waits for room on the completion ring is retried soon: the client that made room
    // does not ring the daemon.
    const absl::Duration wait =
        session->unposted_count.load() > 0 ? kBacklogInterval : kPollInterval;
    bool long_spin = false;
    if (call_sent || call_received()) {
      long_spin = call_spinners_.fetch_add(1) < max_call_spinners_;
      if (!long_spin) --call_spinners_;
    }
    received_seen = session->calls_received.load(std::memory_order_relaxed);
    absl::StatusOr<bool> ready = session->submissions->WaitForData(
        absl::Now() + wait, long_spin ? &after_call : nullptr, call_received);
    if (long_spin) --call_spinners_;
    absl::StatusOr<size_t> n =
        ready.ok() ? session->submissions->TryPopBatch(batch) : ready.status();
    if (!n.ok()) {
      EndSession(*session, n.status().ToString());
      break;
    }
    const int64_t read_ns = router::MonotonicNanos();
    call_sent = false;
    for (size_t i = 0; i < *n && !session->stop; ++i) {
      call_sent |= batch[i].op == static_cast<uint8_t>(shm::Op::kCall);
      Handle(session, batch[i], read_ns);
    }
    const std::string ring_error = session->Flush();
    if (!ring_error.empty()) {
      EndSession(*session, ring_error);
      break;
    }
  }
}

void CallRouter::Handle(const std::shared_ptr<Session>& session, const shm::Descriptor& d,
                        int64_t read_ns) {
  const shm::Layout& layout = session->segment->layout();
  // A device pool is answered like a call.
  const bool call = (d.op == static_cast<uint8_t>(shm::Op::kCall) ||
                     d.op == static_cast<uint8_t>(shm::Op::kDevicePool) ||
                     d.op == static_cast<uint8_t>(shm::Op::kStore)) &&
                    d.call_id != 0;
  // Every call is answered exactly once, and every answer posted counts it down (Post).
  if (call) ++session->calls_in_flight;
  absl::Status valid = shm::ValidateDescriptor(d, layout, shm::Direction::kSubmission);
  if (!valid.ok()) {
    if (call) {
      Fail(session, d.call_id, valid);
      return;
    }
    session->stop = true;
    EndSession(*session, valid.ToString());
    return;
  }
  const shm::Op op = static_cast<shm::Op>(d.op);
  if ((op == shm::Op::kCall || op == shm::Op::kStore) &&
      session->calls_in_flight.load() > options_.max_calls_in_flight) {
    session->Release(d.payload_offset);
    Fail(session, d.call_id,
         absl::ResourceExhaustedError(absl::StrCat(
             "this session has data.max_calls_in_flight (", options_.max_calls_in_flight,
             ") calls waiting for replies; wait for some before making more")));
    return;
  }
  switch (op) {
    case shm::Op::kCall:
      HandleCall(session, d, read_ns);
      break;
    case shm::Op::kStore:
      HandleStore(session, d);
      break;
    case shm::Op::kReply:
      HandleReply(session, d, read_ns);
      break;
    case shm::Op::kRelease:
      HandleRelease(session, d);
      break;
    case shm::Op::kCancel:
      HandleCancel(session, d);
      break;
    case shm::Op::kDevicePool:
      HandleDevicePool(session, d);
      break;
    case shm::Op::kPeerGone:  // a completion only: ValidateDescriptor refused it
      break;
  }
}

void CallRouter::HandleStore(const std::shared_ptr<Session>& session, const shm::Descriptor& d) {
  absl::StatusOr<router::Submitted> call =
      router::ReadSubmitted(*session->segment, d, session->cuda_allowed);
  // The request is copied out of shared memory before anything parses it.
  std::string request;
  if (call.ok()) {
    request.assign(
        reinterpret_cast<const char*>(session->segment->base()) + call->message.body_offset,
        call->message.body_length);
  }
  session->Release(d.payload_offset);
  if (!call.ok() || !options_.store) {
    Fail(session, d.call_id,
         call.ok() ? absl::UnimplementedError("this daemon serves no store to sessions")
                   : call.status());
    return;
  }
  options_.store(session->id, call->message.names[0], call->message.names[2], request,
                 [session, call_id = d.call_id](absl::Status status, std::string response) {
                   // A wait may end after the router is gone (the store's own shutdown): only
                   // the session is touched. An answer that finds its rx heap full still goes,
                   // as RESOURCE_EXHAUSTED (Answer).
                   session->Answer(call_id, status, response).IgnoreError();
                 });
}

void CallRouter::HandleRelease(const std::shared_ptr<Session>& session, const shm::Descriptor& d) {
  // A block a copy still writes is freed once the copy completed.
  if (session->DeferRelease({d.device_pool, d.payload_offset})) return;
  absl::Status freed;
  if (d.device_pool == 0) {
    freed = session->FreeRx(d.payload_offset);
  } else if (session->cuda == nullptr) {
    freed = absl::FailedPreconditionError("no CUDA on this node: nothing was lent");
  } else {
    freed = options_.cuda->FreePool(*session->cuda, static_cast<int>(d.device_pool - 1),
                                    d.payload_offset);
  }
  if (!freed.ok()) Warn(*session, "release", freed);
}

void CallRouter::HandleDevicePool(const std::shared_ptr<Session>& session,
                                  const shm::Descriptor& d) {
  shm::DevicePoolRecord record;
  // ValidateDescriptor checked the payload is one record inside the tx heap.
  std::memcpy(&record, session->segment->base() + d.payload_offset, sizeof(record));
  session->Release(d.payload_offset);
  absl::Status lent =
      !session->cuda_allowed.ok() ? session->cuda_allowed
      : session->cuda == nullptr
          ? absl::FailedPreconditionError(absl::StrCat("receive pool on cuda:", record.device,
                                                       " refused: ", options_.no_cuda))
          : options_.cuda->AddPool(*session->cuda, record);
  if (!lent.ok()) Warn(*session, "receive pool", lent);
  Fail(session, d.call_id, lent);
}

absl::StatusOr<std::vector<router::Place>> CallRouter::PlaceTensors(
    const router::MapUse& use, bool reply, const std::vector<shm::TensorEntry>& tensors) {
  if (tensors.empty()) return std::vector<router::Place>{};
  return router::PlaceTensors(
      use, reply,
      options_.device_map ? options_.device_map(use.group, use.from, use.to, reply) : std::nullopt,
      tensors);
}

void CallRouter::HandleCall(const std::shared_ptr<Session>& session, const shm::Descriptor& d,
                            int64_t read_ns) {
  session->calls_made.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<router::Submitted> call =
      router::ReadSubmitted(*session->segment, d, session->cuda_allowed);
  if (!call.ok()) {
    session->Release(d.payload_offset);
    Fail(session, d.call_id, call.status());
    return;
  }
  const shm::ParsedMessage& message = call->message;
  const auto& [group, worker, method, from] = message.names;
  const uint64_t bytes = router::MessageBytes(*call);
  session->bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
  // Calls are counted by group only in groups the session holds the caller in: a client
  // naming made-up groups must not grow its table (those count for its uid alone).
  const bool member = !from.empty() && options_.lookup(group, from) == session->id;
  if (member) {
    absl::MutexLock lock(&session->usage_mu);
    router::Usage& usage = session->usage_by_group[group];
    ++usage.calls;
    usage.bytes += bytes;
  }
  const std::string& call_group = group;  // a lambda cannot capture a structured binding
  auto refuse = [&](const absl::Status& status) {
    session->Release(d.payload_offset);
    if (member) {
      absl::MutexLock lock(&session->usage_mu);
      ++session->usage_by_group[call_group].errors;
    }
    Fail(session, d.call_id, status);
  };
  if (draining()) {
    refuse(absl::UnavailableError(
        absl::StrCat(CallName(worker, method), ": ", StoppingError().message())));
    return;
  }
  if (!member) {
    refuse(absl::PermissionDeniedError(
        absl::StrCat("this session holds no worker '", from, "' in group '", group,
                     "' on this daemon: a caller must have joined the group it calls into")));
    return;
  }
  // A call flagged so goes by the map the callee's replies to the caller take.
  absl::StatusOr<std::vector<router::Place>> places = PlaceTensors(
      {group, from, worker}, /*reply=*/(d.flags & shm::kFlagReverseMap) != 0, call->tensors);
  if (!places.ok()) {
    refuse(Prefixed(places.status(), CallName(worker, method), ": "));
    return;
  }
  std::optional<std::string> target = options_.lookup(group, worker);
  std::shared_ptr<Session> callee = target ? Find(*target) : nullptr;
  if (callee == nullptr) {
    std::optional<v1::Member> member =
        target ? std::nullopt : options_.member(group, worker, nullptr);
    if (member && member->node() != options_.node) {
      remote_.Call(session, d, *call, *places, *member, read_ns);
      return;
    }
    refuse(target || member
               ? absl::UnavailableError(absl::StrCat(
                     "worker '", worker, "' of group '", group,
                     "' is held by a session that is not attached to shared memory (it has not "
                     "called Handle or Call yet, or it ended)"))
               : absl::NotFoundError(
                     absl::StrCat("worker '", worker, "' is not a member of group '", group, "'")));
    return;
  }
  Pending pending;
  pending.caller = session->id;
  pending.caller_call_id = d.call_id;
  pending.callee = callee->id;
  pending.group = group;
  pending.from = from;
  pending.worker = worker;
  pending.method = method;
  if (d.deadline_unix_ns != 0) pending.deadline = absl::FromUnixNanos(d.deadline_unix_ns);
  pending.read_ns = read_ns;
  const uint64_t id = pending_.Add(pending);
  const uint64_t body_offset = message.body_offset;
  const uint64_t body_length = message.body_length;
  const router::Letter letter{shm::Op::kCall,
                              id,
                              0,
                              d.deadline_unix_ns,
                              0,
                              std::move(call->message.names),
                              d.payload_offset,
                              body_offset,
                              body_length,
                              std::move(call->tensors),
                              *std::move(places)};
  delivery_.Deliver(session, callee, letter,
                    [this, session, callee, id, read_ns](absl::Status delivered) {
                      if (delivered.ok()) {
                        callee->CallPosted();
                        const int64_t posted = router::MonotonicNanos();
                        timings_.Record(router::CallStage::kLocalDeliver, read_ns, posted);
                        pending_.MarkPosted(id, posted);
                        return;
                      }
                      if (std::optional<Pending> failed = pending_.Take(id)) {
                        Fail(session, failed->caller_call_id,
                             Prefixed(delivered, CallName(failed->worker, failed->method), ": "));
                      }
                    });
}

void CallRouter::HandleReply(const std::shared_ptr<Session>& session, const shm::Descriptor& d,
                             int64_t read_ns) {
  // A late reply (the deadline answered the call) or one to no call of this session is dropped.
  std::optional<Pending> pending = pending_.TakeReply(d.call_id, session->id);
  if (!pending) {
    session->Release(d.payload_offset);
    return;
  }
  if (pending->remote) {
    remote_.Respond(session, d, *pending, read_ns);
    return;
  }
  timings_.Record(router::CallStage::kLocalCallee, pending->CalleeSince(), read_ns);
  std::shared_ptr<Session> caller = Find(pending->caller);
  if (caller == nullptr) {  // the caller went away; the reply goes nowhere
    session->Release(d.payload_offset);
    return;
  }
  // After the sender's block went back (Deliver gives it back).
  auto done = [this, caller, call_id = pending->caller_call_id, worker = pending->worker,
               method = pending->method, call_read = pending->read_ns,
               read_ns](absl::Status delivered) {
    if (!delivered.ok()) {
      Fail(caller, call_id, ReplyFailed(worker, method, delivered));
      return;
    }
    const int64_t posted = router::MonotonicNanos();
    timings_.Record(router::CallStage::kLocalReply, read_ns, posted);
    timings_.Record(router::CallStage::kLocalTotal, call_read, posted);
  };
  absl::StatusOr<router::Submitted> reply =
      router::ReadSubmitted(*session->segment, d, session->cuda_allowed);
  if (reply.ok())
    session->bytes_sent.fetch_add(router::MessageBytes(*reply), std::memory_order_relaxed);
  if (!reply.ok()) {
    session->Release(d.payload_offset);
    done(MalformedReply(pending->worker, pending->method, reply.status()));
    return;
  }
  // An error reply's tensors go nowhere: the caller reads only its message.
  if ((d.flags & shm::kFlagError) != 0) reply->tensors.clear();
  absl::StatusOr<std::vector<router::Place>> places = PlaceTensors(
      {pending->group, pending->worker, pending->from}, /*reply=*/true, reply->tensors);
  if (!places.ok()) {
    session->Release(d.payload_offset);
    done(places.status());
    return;
  }
  const shm::ParsedMessage& message = reply->message;
  const router::Letter letter{shm::Op::kReply,
                              pending->caller_call_id,
                              static_cast<uint16_t>(d.flags & shm::kFlagError),
                              0,
                              message.code,
                              {"", "", message.names[2], ""},
                              d.payload_offset,
                              message.body_offset,
                              message.body_length,
                              reply->tensors,
                              *std::move(places)};
  delivery_.Deliver(session, caller, letter, std::move(done));
}

void CallRouter::HandleCancel(const std::shared_ptr<Session>& session, const shm::Descriptor& d) {
  // The callee still runs its handler; its reply is dropped. A remote call's reply is too
  // (the agent's call ends by its reply, its deadline or its pipe).
  if (std::optional<Pending> local = pending_.TakeByCaller(session->id, d.call_id)) {
    Fail(session, d.call_id,
         absl::CancelledError(
             absl::StrCat(CallName(local->worker, local->method), " was cancelled by the caller")));
  } else if (std::optional<router::Outgoing> remote =
                 remote_.calls().Take({session->id, d.call_id})) {
    Fail(session, d.call_id,
         absl::CancelledError(absl::StrCat(CallName(remote->worker, remote->method), " on node ",
                                           remote->node, " was cancelled by the caller")));
  }
}

void CallRouter::FailNode(const std::string& node, const std::string& why) {
  const absl::Status lost =
      absl::UnavailableError(absl::StrCat("node ", node, " was evicted from the group: ", why));
  for (const auto& [key, call] : remote_.calls().TakeNode(node)) {
    Fail(Find(key.first), key.second,
         absl::UnavailableError(
             absl::StrCat(CallName(call.worker, call.method), ": ", lost.message())));
  }
  if (options_.agent != nullptr) options_.agent->FailPeer(agent::PeerId{node, ""}, lost);
}

void CallRouter::Fail(const std::shared_ptr<Session>& to, uint64_t call_id,
                      const absl::Status& status) {
  // An OK status posts an empty reply (a lent device pool's answer).
  if (to == nullptr) return;
  if (!status.ok()) {
    to->call_errors.fetch_add(1, std::memory_order_relaxed);
    const size_t code = static_cast<size_t>(status.code());
    call_errors_[code < call_errors_.size() ? code
                                            : static_cast<size_t>(absl::StatusCode::kUnknown)]
        .fetch_add(1, std::memory_order_relaxed);
  }
  absl::Status degraded = to->Answer(call_id, status);
  if (!degraded.ok()) Warn(*to, absl::StrCat("answer to call ", call_id), degraded);
}

std::map<std::string, uint64_t> CallRouter::CallErrors() const {
  std::map<std::string, uint64_t> errors;
  for (size_t code = 0; code < call_errors_.size(); ++code) {
    const uint64_t count = call_errors_[code].load(std::memory_order_relaxed);
    if (count != 0) errors[absl::StatusCodeToString(static_cast<absl::StatusCode>(code))] = count;
  }
  return errors;
}

void CallRouter::Warn(const Session& session, absl::string_view what, const absl::Status& status) {
  int64_t held = 0;
  if (!warnings_.Admit(session.handle, &held)) return;
  DaemonLog().warn("[session {}] {}: {}{}", session.handle, std::string(what), status.ToString(),
                   HeldBack(held, warnings_.interval()));
}

void CallRouter::EndSession(const Session& session, const std::string& why) {
  DaemonLog().warn("[session {}] {}; ending the session", session.handle, why);
  options_.end_session(session.id, why);
}

void CallRouter::AnswerPending(const Pending& p, const absl::Status& status) {
  if (p.remote) {
    remote_.RespondError(*p.remote, status);
  } else {
    Fail(Find(p.caller), p.caller_call_id, status);
  }
}

void CallRouter::OnDeadline(const Pending& p) {
  // A remote caller's daemon keeps its own deadline and has answered already; its entry only
  // had to go.
  if (p.remote) return;
  Fail(Find(p.caller), p.caller_call_id,
       absl::DeadlineExceededError(
           absl::StrCat(CallName(p.worker, p.method), " passed its deadline ",
                        absl::FormatTime(p.deadline, absl::UTCTimeZone()), " with no reply")));
}

}  // namespace tpd
