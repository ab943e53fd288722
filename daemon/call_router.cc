#include "daemon/call_router.h"

#include <pthread.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/logging.h"
#include "proto/shm/message.h"

namespace tpd {

namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(50);
constexpr absl::Duration kPostWait = absl::Seconds(1);

}  // namespace

CallRouter::CallRouter(CallRouterOptions options) : options_(std::move(options)) {
  timer_ = std::thread([this] { TimerLoop(); });
}

CallRouter::~CallRouter() { Shutdown(); }

void CallRouter::Shutdown() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    timer_cv_.SignalAll();
    for (const auto& [id, session] : sessions_) ids.push_back(id);
  }
  if (timer_.joinable()) timer_.join();
  for (const std::string& id : ids) Detach(id);
}

void CallRouter::Attach(const std::string& session_id, shm::Segment* segment) {
  auto session = std::make_shared<Session>();
  session->id = session_id;
  session->segment = segment;
  const shm::Layout& layout = segment->layout();
  session->submissions = std::make_unique<shm::RingConsumer>(
      segment->base(), layout.submission, absl::StrCat("submission ring of session ", session_id));
  {
    absl::MutexLock lock(&session->mu);
    session->completions = std::make_unique<shm::RingProducer>(
        segment->base(), layout.completion,
        absl::StrCat("completion ring of session ", session_id));
    session->rx = std::make_unique<shm::HeapAllocator>(
        absl::StrCat("rx heap of session ", session_id), layout.rx_heap);
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  session->thread = std::thread([this, session] { Serve(session); });
  sessions_[session_id] = std::move(session);
}

void CallRouter::Detach(const std::string& session_id) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    session = std::move(it->second);
    sessions_.erase(it);
  }
  session->stop = true;
  if (session->thread.joinable()) session->thread.join();
  {
    absl::MutexLock lock(&session->mu);  // no one writes into its segment after this
    session->broken = true;
  }
  struct Orphan {
    std::string caller;
    uint64_t call_id;
    std::string worker;
    std::string method;
  };
  std::vector<Orphan> orphans;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      const Pending& p = it->second;
      if (p.callee == session_id || p.caller == session_id) {
        if (p.callee == session_id && p.caller != session_id) {
          orphans.push_back({p.caller, p.caller_call_id, p.worker, p.method});
        }
        deadlines_.erase({p.deadline, it->first});
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const Orphan& orphan : orphans) {
    std::shared_ptr<Session> caller = Find(orphan.caller);
    if (caller == nullptr) continue;
    Fail(caller, orphan.call_id,
         absl::UnavailableError(absl::StrCat("worker '", orphan.worker,
                                             "' went away during the call to its method '",
                                             orphan.method, "' (its session ended)")));
  }
}

std::shared_ptr<CallRouter::Session> CallRouter::Find(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second;
}

void CallRouter::Serve(std::shared_ptr<Session> session) {
  pthread_setname_np(pthread_self(), "tpd-session");
  shm::Descriptor batch[64];
  while (!session->stop) {
    absl::StatusOr<bool> ready = session->submissions->WaitForData(absl::Now() + kPollInterval);
    absl::StatusOr<size_t> n = ready.ok() ? session->submissions->TryPopBatch(batch) : ready.status();
    if (!n.ok()) {
      DaemonLog().warn("[session {}] {}; ending the session", session->id, n.status().ToString());
      options_.end_session(session->id, std::string(n.status().message()));
      break;
    }
    for (size_t i = 0; i < *n && !session->stop; ++i) Handle(session, batch[i]);
  }
}

void CallRouter::Handle(const std::shared_ptr<Session>& session, const shm::Descriptor& d) {
  const shm::Layout& layout = session->segment->layout();
  absl::Status valid = shm::ValidateDescriptor(d, layout, shm::Direction::kSubmission);
  if (!valid.ok()) {
    if (d.op == static_cast<uint8_t>(shm::Op::kCall) && d.call_id != 0) {
      Fail(session, d.call_id, valid);
      return;
    }
    DaemonLog().warn("[session {}] {}; ending the session", session->id, valid.ToString());
    session->stop = true;
    options_.end_session(session->id, std::string(valid.message()));
    return;
  }
  switch (static_cast<shm::Op>(d.op)) {
    case shm::Op::kCall:
      HandleCall(session, d);
      break;
    case shm::Op::kReply:
      HandleReply(session, d);
      break;
    case shm::Op::kRelease: {
      absl::MutexLock lock(&session->mu);
      absl::Status freed = session->rx->Free(d.payload_offset);
      if (!freed.ok()) DaemonLog().warn("[session {}] release: {}", session->id, freed.ToString());
      break;
    }
    case shm::Op::kCancel:
      break;  // not yet: the deadline still ends the call
  }
}

void CallRouter::HandleCall(const std::shared_ptr<Session>& session, const shm::Descriptor& d) {
  const shm::Segment& segment = *session->segment;
  absl::StatusOr<shm::ParsedMessage> message =
      shm::ParseMessage(segment.base(), d.payload_offset, d.payload_length);
  absl::StatusOr<std::vector<shm::TensorEntry>> tensors =
      message.ok() ? shm::ReadTensorTable(d, segment.base(), segment.layout(),
                                          shm::Direction::kSubmission)
                   : message.status();
  if (!tensors.ok()) {
    Release(session, d.payload_offset);
    Fail(session, d.call_id, tensors.status());
    return;
  }
  const std::string& group = message->names[0];
  const std::string& worker = message->names[1];
  const std::string& method = message->names[2];
  const std::string& from = message->names[3];
  if (from.empty() || options_.lookup(group, from) != session->id) {
    Release(session, d.payload_offset);
    Fail(session, d.call_id,
         absl::PermissionDeniedError(absl::StrCat(
             "this session holds no worker '", from, "' in group '", group,
             "' on this daemon: a caller must have joined the group it calls into")));
    return;
  }
  std::optional<std::string> target = options_.lookup(group, worker);
  std::shared_ptr<Session> callee = target ? Find(*target) : nullptr;
  if (callee == nullptr) {
    Release(session, d.payload_offset);
    Fail(session, d.call_id,
         target ? absl::UnavailableError(absl::StrCat(
                      "worker '", worker, "' of group '", group,
                      "' is held by a session that is not attached to shared memory (it has not "
                      "called Handle or Call yet, or it ended)"))
                : absl::NotFoundError(absl::StrCat(
                      "worker '", worker, "' is not a member of group '", group,
                      "' on this daemon; calls to workers on other daemons are not available "
                      "in this build")));
    return;
  }
  uint64_t id;
  Pending pending{session->id, d.call_id, callee->id, worker, method, absl::InfiniteFuture()};
  if (d.deadline_unix_ns != 0) pending.deadline = absl::FromUnixNanos(d.deadline_unix_ns);
  {
    absl::MutexLock lock(&mu_);
    id = next_call_id_++;
    if (pending.deadline != absl::InfiniteFuture()) {
      deadlines_.insert({pending.deadline, id});
      timer_cv_.Signal();
    }
    pending_[id] = pending;
  }
  absl::Status delivered =
      Deliver(*session, d, group, worker, method, from, 0, message->body_offset,
              message->body_length,
              *tensors, *callee, shm::Op::kCall, id, 0, d.deadline_unix_ns);
  Release(session, d.payload_offset);
  if (!delivered.ok()) {
    bool ours = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(id);
      if (it != pending_.end()) {
        deadlines_.erase({it->second.deadline, id});
        pending_.erase(it);
        ours = true;
      }
    }
    if (ours) {
      Fail(session, d.call_id,
           absl::Status(delivered.code(), absl::StrCat("call to worker '", worker, "' method '",
                                                       method, "': ", delivered.message())));
    }
  }
}

void CallRouter::HandleReply(const std::shared_ptr<Session>& session, const shm::Descriptor& d) {
  // A late reply (the deadline answered the call) or one to no call of this session is dropped.
  Pending pending;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(d.call_id);
    if (it != pending_.end() && it->second.callee == session->id) {
      pending = it->second;
      deadlines_.erase({it->second.deadline, d.call_id});
      pending_.erase(it);
    }
  }
  if (pending.caller.empty()) {
    Release(session, d.payload_offset);
    return;
  }
  std::shared_ptr<Session> caller = Find(pending.caller);
  const shm::Segment& segment = *session->segment;
  absl::StatusOr<shm::ParsedMessage> message =
      shm::ParseMessage(segment.base(), d.payload_offset, d.payload_length);
  absl::StatusOr<std::vector<shm::TensorEntry>> tensors =
      message.ok() ? shm::ReadTensorTable(d, segment.base(), segment.layout(),
                                          shm::Direction::kSubmission)
                   : message.status();
  absl::Status delivered;
  if (caller == nullptr) {
    // The caller went away; the reply goes nowhere.
  } else if (!tensors.ok()) {
    delivered = absl::InternalError(absl::StrCat("worker '", pending.worker,
                                                 "' sent a malformed reply to method '",
                                                 pending.method, "': ", tensors.status().message()));
  } else {
    delivered = Deliver(*session, d, "", "", message->names[2], "", message->code,
                        message->body_offset, message->body_length, *tensors, *caller,
                        shm::Op::kReply, pending.caller_call_id, d.flags & shm::kFlagError, 0);
  }
  Release(session, d.payload_offset);
  if (!delivered.ok()) {
    Fail(caller, pending.caller_call_id,
         absl::Status(delivered.code(), absl::StrCat("reply of worker '", pending.worker,
                                                     "' to method '", pending.method,
                                                     "': ", delivered.message())));
  }
}

absl::Status CallRouter::Deliver(const Session& from, const shm::Descriptor& d,
                                 const std::string& prefix0, const std::string& prefix1,
                                 const std::string& prefix2, const std::string& prefix3,
                                 uint32_t code, uint64_t body_offset,
                                 uint64_t body_length,
                                 const std::vector<shm::TensorEntry>& tensors, Session& to,
                                 shm::Op op, uint64_t call_id, uint16_t flags,
                                 int64_t deadline_ns) {
  const uint64_t prefix =
      shm::MessagePrefixBytes(prefix0.size(), prefix1.size(), prefix2.size(), prefix3.size());
  const uint64_t payload = prefix + body_length;
  uint64_t total = shm::AlignUp(payload);
  const uint64_t table = total;
  total += shm::AlignUp(tensors.size() * sizeof(shm::TensorEntry));
  std::vector<uint64_t> at(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    at[i] = total;
    total += shm::AlignUp(tensors[i].length);
  }
  absl::MutexLock lock(&to.mu);
  if (to.broken) return absl::UnavailableError(absl::StrCat("session ", to.id, " ended"));
  absl::StatusOr<uint64_t> block = to.rx->Allocate(total);
  if (!block.ok()) return block.status();
  uint8_t* out = to.segment->base() + *block;
  const uint8_t* in = from.segment->base();
  shm::WriteMessagePrefix(out, code, prefix0, prefix1, prefix2, prefix3);
  if (body_length > 0) std::memcpy(out + prefix, in + body_offset, body_length);
  for (size_t i = 0; i < tensors.size(); ++i) {
    shm::TensorEntry entry = tensors[i];
    if (entry.length > 0) {
      std::memcpy(out + at[i], in + entry.offset, entry.length);
      entry.offset = *block + at[i];
    } else {
      entry.offset = 0;
    }
    std::memcpy(out + table + i * sizeof(entry), &entry, sizeof(entry));
  }
  shm::Descriptor posted{};
  posted.op = static_cast<uint8_t>(op);
  posted.flags = flags;
  posted.tensor_count = static_cast<uint32_t>(tensors.size());
  posted.call_id = call_id;
  posted.deadline_unix_ns = deadline_ns;
  posted.payload_offset = *block;
  posted.payload_length = payload;
  posted.tensor_table_offset = tensors.empty() ? 0 : *block + table;
  absl::Status status = Post(to, posted);
  if (!status.ok()) (void)to.rx->Free(*block);
  return status;
}

absl::Status CallRouter::Post(Session& to, const shm::Descriptor& d) {
  if (to.broken) return absl::UnavailableError(absl::StrCat("session ", to.id, " ended"));
  absl::StatusOr<bool> pushed = to.completions->TryPush(d);
  if (pushed.ok() && !*pushed) {
    absl::StatusOr<bool> space = to.completions->WaitForSpace(absl::Now() + kPostWait);
    if (space.ok() && !*space) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the completion ring of session ", to.id, " stayed full for ",
          absl::FormatDuration(kPostWait)));
    }
    pushed = space.ok() ? to.completions->TryPush(d) : space.status();
  }
  if (!pushed.ok()) {
    to.broken = true;
    return absl::UnavailableError(pushed.status().message());
  }
  if (!*pushed) return absl::ResourceExhaustedError("completion ring full");
  return absl::OkStatus();
}

void CallRouter::Release(const std::shared_ptr<Session>& to, uint64_t tx_offset) {
  if (to == nullptr || tx_offset == 0) return;
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(shm::Op::kRelease);
  d.call_id = 1;
  d.payload_offset = tx_offset;
  absl::MutexLock lock(&to->mu);
  (void)Post(*to, d);
}

void CallRouter::Fail(const std::shared_ptr<Session>& to, uint64_t call_id,
                      const absl::Status& status) {
  if (to == nullptr) return;
  const std::string message(status.message());
  const uint64_t bytes = shm::MessagePrefixBytes(0, 0, message.size());
  absl::MutexLock lock(&to->mu);
  if (to->broken) return;
  absl::StatusOr<uint64_t> block = to->rx->Allocate(bytes);
  if (!block.ok()) {
    DaemonLog().warn("[session {}] cannot answer call {} ({}): {}", to->id, call_id,
                     status.ToString(), block.status().ToString());
    return;
  }
  shm::WriteMessagePrefix(to->segment->base() + *block, static_cast<uint32_t>(status.code()), "",
                          "", message);
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(shm::Op::kReply);
  d.flags = shm::kFlagError;
  d.call_id = call_id;
  d.payload_offset = *block;
  d.payload_length = bytes;
  if (!Post(*to, d).ok()) (void)to->rx->Free(*block);
}

void CallRouter::TimerLoop() {
  pthread_setname_np(pthread_self(), "tpd-call-timer");
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (deadlines_.empty()) {
      timer_cv_.Wait(&mu_);
      continue;
    }
    const auto [when, id] = *deadlines_.begin();
    if (when > absl::Now()) {
      timer_cv_.WaitWithDeadline(&mu_, when);
      continue;
    }
    deadlines_.erase(deadlines_.begin());
    auto it = pending_.find(id);
    if (it == pending_.end()) continue;
    Pending p = std::move(it->second);
    pending_.erase(it);
    auto caller = sessions_.find(p.caller);
    std::shared_ptr<Session> session = caller == sessions_.end() ? nullptr : caller->second;
    mu_.Unlock();
    Fail(session, p.caller_call_id,
         absl::DeadlineExceededError(absl::StrCat(
             "call to worker '", p.worker, "' method '", p.method, "' passed its deadline ",
             absl::FormatTime(p.deadline, absl::UTCTimeZone()), " with no reply")));
    mu_.Lock();
  }
}

}  // namespace tpd
