#include "client/segment/peer_segments.h"

#include <poll.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shm/fd_message.h"
#include "shm/peer_notice.h"

namespace tpd {
namespace {

// More peers than a daemon has sessions (data.max_sessions is at most 65536) is a daemon
// gone wrong: refuse rather than map without end.
constexpr size_t kMaxPeers = 65536;

}  // namespace

const char* PeerSegment::Find(uint64_t offset, uint64_t length) const {
  if (offset < tx_offset || length > tx_bytes || offset - tx_offset > tx_bytes - length) {
    return nullptr;
  }
  return reinterpret_cast<const char*>(mapping.base() + offset);
}

PeerSegments::PeerSegments(int notice_fd) : notice_fd_(notice_fd) {}

PeerSegments::~PeerSegments() {
  if (notice_fd_ >= 0) close(notice_fd_);
}

absl::StatusOr<std::shared_ptr<const PeerSegment>> PeerSegments::Get(uint64_t id) {
  absl::MutexLock lock(&mu_);
  std::string why;
  while (true) {
    if (auto it = peers_.find(id); it != peers_.end()) return it->second;
    if (!ReadOne(&why)) break;
  }
  return absl::InternalError(absl::StrCat("a received tensor lies in the memory of peer session ",
                                          id, ", which this client cannot map: ", why));
}

void PeerSegments::Forget(uint64_t id) {
  std::shared_ptr<const PeerSegment> gone;  // unmapped outside the lock, if nothing holds it
  absl::MutexLock lock(&mu_);
  std::string why;
  pollfd waiting{notice_fd_, POLLIN, 0};
  while (notice_fd_ >= 0 && poll(&waiting, 1, 0) == 1 && (waiting.revents & POLLIN) != 0 &&
         ReadOne(&why)) {
  }
  if (auto it = peers_.find(id); it != peers_.end()) {
    gone = std::move(it->second);
    peers_.erase(it);
  }
}

size_t PeerSegments::size() const {
  absl::MutexLock lock(&mu_);
  return peers_.size();
}

bool PeerSegments::ReadOne(std::string* why) {
  if (notice_fd_ < 0) {
    *why = "this client has no data connection to the daemon";
    return false;
  }
  std::string bytes(shm::kPeerNoticeBytes, '\0');
  absl::StatusOr<int> fd = shm::ReceiveWithFd(notice_fd_, bytes.data(), bytes.size());
  if (!fd.ok()) {
    *why = absl::StrCat("reading its notice: ", fd.status().message());
    return false;
  }
  absl::StatusOr<shm::PeerNotice> notice = shm::DecodePeerNotice(bytes);
  if (!notice.ok() || *fd < 0 || peers_.size() >= kMaxPeers) {
    if (*fd >= 0) close(*fd);
    *why = !notice.ok() ? std::string(notice.status().message())
           : *fd < 0    ? "a peer notice came without its fd"
                        : absl::StrCat("more than ", kMaxPeers, " peers");
    return false;
  }
  absl::StatusOr<shm::ReadOnlyMapping> mapping =
      shm::ReadOnlyMapping::Map(*fd, notice->segment_bytes);
  close(*fd);  // the mapping keeps the memory
  if (!mapping.ok()) {
    *why = std::string(mapping.status().message());
    return false;
  }
  peers_[notice->peer] = std::make_shared<const PeerSegment>(
      PeerSegment{*std::move(mapping), notice->tx_offset, notice->tx_bytes});
  return true;
}

}  // namespace tpd
