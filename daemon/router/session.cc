#include "daemon/router/session.h"

#include <errno.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "shm/fd_message.h"
#include "shm/message.h"
#include "shm/peer_notice.h"

namespace tpd::router {

std::shared_ptr<Session> Session::Open(std::string id, std::string handle, SessionLimits limits,
                                       std::shared_ptr<shm::Segment> segment,
                                       const shm::SpinOptions& spin) {
  auto session = std::make_shared<Session>();
  session->id = std::move(id);
  session->handle = std::move(handle);
  session->limits = limits;
  const shm::Layout& layout = segment->layout();
  session->submissions = std::make_unique<shm::RingConsumer>(
      segment->base(), layout.submission,
      absl::StrCat("submission ring of session ", session->handle), spin);
  {
    absl::MutexLock lock(&session->mu);
    session->completions = std::make_unique<shm::RingProducer>(
        segment->base(), layout.completion,
        absl::StrCat("completion ring of session ", session->handle));
    session->rx = std::make_unique<shm::HeapAllocator>(
        absl::StrCat("rx heap of session ", session->handle), layout.rx_heap);
  }
  session->segment = std::move(segment);
  return session;
}

Session::~Session() {
  if (share_fd >= 0) close(share_fd);
  if (notice_fd >= 0) close(notice_fd);
}

absl::Status Session::EndedError() const {
  return absl::UnavailableError(ring_error.empty() ? absl::StrCat("session ", handle, " ended")
                                                   : ring_error);
}

absl::StatusOr<bool> Session::Push(const shm::Descriptor& d) {
  // A release for a session with calls awaiting replies goes without a wake-up: the reply
  // (or the call's failure) rings and the client reads both (its reader also polls every
  // 50 ms). One wake-up less per call on each side.
  const bool quiet = d.op == static_cast<uint8_t>(shm::Op::kRelease) && calls_in_flight.load() > 0;
  // A reply ends its call before the client can see it: a client that asks Admin.Status
  // right after its call returned finds it no longer in flight.
  const bool reply = d.op == static_cast<uint8_t>(shm::Op::kReply);
  if (reply) --calls_in_flight;
  absl::StatusOr<bool> pushed = completions->TryPush(d, /*wake=*/!quiet);
  if (reply && !(pushed.ok() && *pushed)) ++calls_in_flight;
  if (!pushed.ok()) {
    // The client broke its ring: nothing more goes to it, and its own thread ends the session.
    broken = true;
    ring_error = std::string(pushed.status().message());
    return EndedError();
  }
  return *pushed;
}

absl::Status Session::Post(const shm::Descriptor& d) {
  if (broken) return EndedError();
  // What waits goes first: nothing overtakes it.
  FlushUnposted();
  if (unposted.empty()) {
    absl::StatusOr<bool> pushed = Push(d);
    if (!pushed.ok()) return pushed.status();
    if (*pushed) return absl::OkStatus();
  }
  if (d.op == static_cast<uint8_t>(shm::Op::kCall)) {
    // A burst of calls larger than the ring is normal (a program sends a thousand rpc_async
    // while its callee's reader is off the CPU): it waits, up to max_waiting_calls; past that
    // the callee is not reading, and the caller hears so at once instead of the session being
    // ended.
    if (waiting_calls >= limits.max_waiting_calls) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the completion ring of session ", handle, " is full and ", waiting_calls,
                       " calls wait for room on it (its client is not reading its completions)"));
    }
    ++waiting_calls;
  } else if (unposted.size() - waiting_calls >= limits.max_unposted) {
    broken = true;
    ring_error = absl::StrCat(
        "its client left ", unposted.size() - waiting_calls,
        " answers and releases unread for want of room on its completion ring (at most ",
        limits.max_unposted, " may wait)");
    return EndedError();
  }
  unposted.push_back(d);
  unposted_count = static_cast<int64_t>(unposted.size());
  return absl::OkStatus();
}

void Session::FlushUnposted() {
  while (!unposted.empty() && !broken) {
    absl::StatusOr<bool> pushed = Push(unposted.front());
    if (!pushed.ok() || !*pushed) break;  // full: the session's thread retries soon
    if (unposted.front().op == static_cast<uint8_t>(shm::Op::kCall)) --waiting_calls;
    unposted.pop_front();
  }
  unposted_count = static_cast<int64_t>(unposted.size());
}

absl::Status Session::PostLocking(const shm::Descriptor& d) {
  absl::MutexLock lock(&mu);
  return Post(d);
}

void Session::Release(uint64_t tx_offset) {
  if (tx_offset == 0) return;
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(shm::Op::kRelease);
  d.call_id = 1;
  d.payload_offset = tx_offset;
  absl::MutexLock lock(&mu);
  // Fails only for a session that ended: nothing is owed to it.
  Post(d).IgnoreError();
}

absl::Status Session::Answer(uint64_t call_id, const absl::Status& status, absl::string_view body) {
  const shm::MessageNames names = {"", "", std::string(status.message()), ""};
  const uint64_t prefix = shm::MessagePrefixBytes(names);
  const uint64_t bytes = prefix + body.size();
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(shm::Op::kReply);
  d.flags = status.ok() ? 0 : shm::kFlagError;
  d.call_id = call_id;
  absl::MutexLock lock(&mu);
  if (broken) return absl::OkStatus();
  absl::StatusOr<uint64_t> block = rx->Allocate(bytes);
  absl::Status degraded;
  if (block.ok()) {
    shm::WriteMessagePrefix(segment->base() + *block, static_cast<uint32_t>(status.code()), names);
    if (!body.empty()) std::memcpy(segment->base() + *block + prefix, body.data(), body.size());
    d.payload_offset = *block;
    d.payload_length = bytes;
  } else {
    // Still answered: an error reply without a message, which the client reads as its rx heap
    // being full (client/calls.cc).
    d.flags = shm::kFlagError;
    degraded = absl::Status(
        status.code(),
        absl::StrCat(status.message(), "; sent without its message: ", block.status().message()));
  }
  if (!Post(d).ok() && block.ok()) TPD_CHECK_OK(rx->Free(*block));
  return degraded;
}

absl::StatusOr<uint64_t> Session::WriteRx(
    uint64_t bytes, absl::FunctionRef<absl::Status(uint64_t block, uint8_t* at)> fill) {
  absl::MutexLock lock(&mu);
  return WriteRxLocked(bytes, fill);
}

absl::Status Session::WriteRxAndPost(
    uint64_t bytes, absl::FunctionRef<absl::Status(uint64_t block, uint8_t* at)> fill,
    absl::FunctionRef<shm::Descriptor(uint64_t block)> describe, const Lent* lend) {
  absl::MutexLock lock(&mu);
  absl::StatusOr<uint64_t> block = WriteRxLocked(bytes, fill);
  if (!block.ok()) return block.status();
  absl::Status posted = Post(describe(*block));
  // Not posted: the block is still this session's to free, unless it broke (and its heap with
  // it).
  if (!posted.ok() && !broken) TPD_CHECK_OK(rx->Free(*block));
  // Before the lock goes: the client may release the block as soon as it can read it.
  if (posted.ok() && lend != nullptr) lent[*block] = *lend;
  return posted;
}

absl::StatusOr<uint64_t> Session::WriteRxLocked(
    uint64_t bytes, absl::FunctionRef<absl::Status(uint64_t block, uint8_t* at)> fill) {
  if (broken) return EndedError();
  absl::StatusOr<uint64_t> block = rx->Allocate(bytes);
  if (!block.ok()) return block.status();
  absl::Status filled = fill(*block, segment->base() + *block);
  if (!filled.ok()) {
    TPD_CHECK_OK(rx->Free(*block));
    return filled;
  }
  return block;
}

absl::Status Session::FreeRx(uint64_t offset) {
  Lent back;
  absl::Status freed;
  {
    absl::MutexLock lock(&mu);
    if (broken) return absl::OkStatus();
    freed = rx->Free(offset);
    if (freed.ok()) {
      if (auto it = lent.find(offset); it != lent.end()) {
        back = std::move(it->second);
        lent.erase(it);
      }
    }
  }
  // Outside our lock: the release locks the sender.
  if (back.from != nullptr) back.from->Release(back.tx_block);
  return freed;
}

void Session::HoldWhileCopying(absl::Span<const BlockRef> blocks) {
  absl::MutexLock lock(&mu);
  for (const BlockRef& block : blocks) copying[block] = false;
}

bool Session::DeferRelease(const BlockRef& block) {
  absl::MutexLock lock(&mu);
  auto it = copying.find(block);
  if (it == copying.end()) return false;
  it->second = true;
  return true;
}

std::vector<Session::BlockRef> Session::EndCopying(absl::Span<const BlockRef> blocks) {
  std::vector<BlockRef> released;
  absl::MutexLock lock(&mu);
  for (const BlockRef& block : blocks) {
    auto it = copying.find(block);
    if (it == copying.end()) continue;
    if (it->second) released.push_back(block);
    copying.erase(it);
  }
  return released;
}

bool Session::Introduce(const std::shared_ptr<Session>& from, const std::shared_ptr<Session>& to) {
  if (from->share_fd < 0 || to->notice_fd < 0) return false;
  {
    absl::MutexLock lock(&to->mu);
    if (to->peers_told.contains(from->peer_id)) return true;
    if (to->refuses_notices) return false;
  }
  {
    // Registered before the notice goes, so that End, which takes the list under this lock
    // after setting `ended`, either tells `to` or is seen below.
    absl::MutexLock lock(&from->mu);
    if (from->ended.load()) return false;
    from->told.push_back(to);
  }
  absl::MutexLock lock(&to->mu);
  if (to->peers_told.contains(from->peer_id)) return true;
  // An End of `from` that already told `to` set `ended` first: no notice after its kPeerGone.
  if (to->broken || from->ended.load()) return false;
  const shm::Layout& layout = from->segment->layout();
  const std::array<uint8_t, shm::kPeerNoticeBytes> notice = shm::EncodePeerNotice(
      {from->peer_id, layout.total_bytes, layout.tx_heap.offset, layout.tx_heap.bytes});
  // Non-blocking: a client that reads none of its notices fills its socket buffer and gets
  // copies from then on, without holding up the daemon.
  if (!shm::SendWithFd(to->notice_fd, notice.data(), notice.size(), from->share_fd)) {
    // EPIPE: the client shut its reading side (ClientOptions::tensors_in_sender_memory false).
    if (errno == EPIPE) to->refuses_notices = true;
    return false;
  }
  to->peers_told.insert(from->peer_id);
  return true;
}

std::string Session::Flush() {
  absl::MutexLock lock(&mu);
  FlushUnposted();
  return ring_error;
}

void Session::End() {
  absl::flat_hash_map<uint64_t, Lent> back;
  std::vector<std::weak_ptr<Session>> to_tell;
  {
    absl::MutexLock lock(&mu);
    broken = true;
    ended = true;
    back.swap(lent);
    to_tell.swap(told);
  }
  // Outside our lock: each locks another session.
  for (auto& [block, held] : back) held.from->Release(held.tx_block);
  shm::Descriptor gone{};
  gone.op = static_cast<uint8_t>(shm::Op::kPeerGone);
  gone.call_id = peer_id;
  for (const std::weak_ptr<Session>& weak : to_tell) {
    // Fails only for a session that ended too: it needs no telling.
    if (std::shared_ptr<Session> session = weak.lock()) session->PostLocking(gone).IgnoreError();
  }
}

uint64_t Session::RxUsed() {
  if (mu.TryLock()) {
    rx_used_seen = rx->GetStats().used_bytes;
    mu.Unlock();
  }
  return rx_used_seen.load();
}

uint64_t Session::ReaderWakeups() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // `completions` is set in Open and never changes; the count is an atomic of its doorbell.
  return completions->wakeups();
}

}  // namespace tpd::router
