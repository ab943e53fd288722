#include "shm/peer_notice.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tpd::shm {
namespace {

constexpr char kMagic[8] = {'T', 'P', 'D', 'P', 'E', 'E', 'R', '1'};

// Layout: magic[8], peer u64, segment bytes u64, tx offset u64, tx bytes u64, reserved[24].
constexpr size_t kFieldsEnd = 8 + 4 * 8;

}  // namespace

std::array<uint8_t, kPeerNoticeBytes> EncodePeerNotice(const PeerNotice& notice) {
  std::array<uint8_t, kPeerNoticeBytes> out{};
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  const uint64_t fields[4] = {notice.peer, notice.segment_bytes, notice.tx_offset, notice.tx_bytes};
  std::memcpy(out.data() + 8, fields, sizeof(fields));
  return out;
}

absl::StatusOr<PeerNotice> DecodePeerNotice(absl::string_view bytes) {
  if (bytes.size() != kPeerNoticeBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer notice of ", bytes.size(), " bytes; ", kPeerNoticeBytes, " expected"));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError("peer notice: wrong magic");
  }
  for (size_t i = kFieldsEnd; i < kPeerNoticeBytes; ++i) {
    if (bytes[i] != 0) return absl::InvalidArgumentError("peer notice: reserved bytes not zero");
  }
  uint64_t fields[4];
  std::memcpy(fields, bytes.data() + 8, sizeof(fields));
  const PeerNotice notice{fields[0], fields[1], fields[2], fields[3]};
  if (notice.peer == 0) return absl::InvalidArgumentError("peer notice: peer id 0");
  if (notice.tx_offset > notice.segment_bytes ||
      notice.tx_bytes > notice.segment_bytes - notice.tx_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer notice: tx heap [", notice.tx_offset, ", +", notice.tx_bytes,
                     ") is not inside the segment of ", notice.segment_bytes, " bytes"));
  }
  return notice;
}

}  // namespace tpd::shm
