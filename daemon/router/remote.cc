#include "daemon/router/remote.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "daemon/tensor_wire.h"

namespace tpd::router {
namespace {

// Points `out`'s payload and tensors at `submitted`'s bytes in the segment at `base`, with
// their wire descriptors: TensorPipe reads them in place.
void ReferInPlace(uint8_t* base, const Submitted& submitted, agent::Message* out) {
  out->payload = {base + submitted.message.body_offset, submitted.message.body_length};
  for (const shm::TensorEntry& entry : submitted.tensors) {
    *out->header.add_tensors() = ToWire(entry);
    out->tensors.push_back({entry.length == 0 ? nullptr : base + entry.offset, entry.length});
  }
}

absl::Status CheckCounts(const Arrival& arrival) {
  const size_t n = arrival.tensor_sizes.size();
  if (static_cast<size_t>(arrival.header.tensors_size()) != n || n > shm::kMaxTensorsPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat("the message has ", n, " tensors (at most ",
                                                   shm::kMaxTensorsPerMessage, ") and ",
                                                   arrival.header.tensors_size(), " descriptors"));
  }
  for (const std::string& name : arrival.names) {
    if (name.size() > shm::kMaxMessageName) {
      return absl::InvalidArgumentError(
          absl::StrCat("a name of ", name.size(), " bytes exceeds ", shm::kMaxMessageName));
    }
  }
  return absl::OkStatus();
}

// Writes the names and tensor table of `block` into its session's rx heap at `out`, pointing
// `destination` at where the body and each tensor are to be received.
void FillIncoming(RxBlock& block, uint32_t code, const shm::MessageNames& names, uint8_t* out,
                  agent::Destination* destination) {
  shm::WriteMessagePrefix(out, code, names);
  for (size_t i = 0; i < block.tensors.size(); ++i) {
    shm::TensorEntry& entry = block.tensors[i];
    const uint64_t staging = block.staged == nullptr ? 0 : block.staged->staging(i);
    const bool on_device = entry.device_type == static_cast<uint8_t>(shm::DeviceType::kCuda);
    if (!on_device) entry.offset = entry.length == 0 ? 0 : block.offset + block.plan.at[i];
    std::memcpy(out + block.plan.table + i * sizeof(entry), &entry, sizeof(entry));
    void* at = on_device ? reinterpret_cast<void*>(staging) : out + block.plan.at[i];
    destination->tensors.push_back(entry.length == 0 ? nullptr : at);
  }
}

}  // namespace

void Ship(const CudaStaging& staging, const Shipment& what, agent::Message message,
          std::function<void(agent::Message)> send, std::function<void(absl::Status)> failed) {
  if (what.places.empty()) {
    ReferInPlace(what.session->segment->base(), what.submitted, &message);
    message.keepalive = std::make_shared<TxBlock>(what.session, what.tx_offset);
    send(std::move(message));
    return;
  }
  absl::StatusOr<Staged> staged =
      staging.StageOut(what.session, what.tx_offset, what.submitted, what.places, &message);
  if (!staged.ok()) {
    failed(staged.status());
    return;
  }
  // Sent once the unchunked CUDA tensors are in pinned staging; chunks follow as their copies,
  // issued after those, complete.
  if (staged->copies.empty()) {
    send(std::move(message));
  } else {
    auto held = std::make_shared<agent::Message>(std::move(message));
    staging.cuda()->Run(std::move(staged->copies), {what.session->cuda},
                        [send, failed, held](absl::Status copied) {
                          if (copied.ok()) {
                            send(std::move(*held));
                          } else {
                            failed(copied);
                          }
                        });
  }
  StagedOut::StartChunks(staged->chunked);
}

RxBlock::~RxBlock() {
  if (posted || offset == 0) return;
  // A block this router allocated and never posted: freeing it cannot fail.
  TPD_CHECK_OK(session->FreeRx(offset));
}

void RxBlock::Land(const std::shared_ptr<const RxBlock>& self,
                   std::function<void(absl::Status)> then) {
  if (self->staged == nullptr) {
    then(absl::OkStatus());
    return;
  }
  self->staged->Land(self, std::move(then));
}

absl::Status RxBlock::Post(const shm::Descriptor& d) const {
  absl::Status status = session->PostLocking(d);
  if (status.ok()) {
    posted = true;
    if (staged != nullptr) staged->MarkPosted();
  }
  return status;
}

absl::StatusOr<agent::Destination> PlaceIncoming(const CudaStaging& staging,
                                                 const std::shared_ptr<Session>& to,
                                                 const Arrival& arrival) {
  if (absl::Status counted = CheckCounts(arrival); !counted.ok()) return counted;
  const size_t n = arrival.tensor_sizes.size();
  auto block = std::make_shared<RxBlock>();
  block->session = to;
  std::vector<uint64_t> bytes(arrival.tensor_sizes.begin(), arrival.tensor_sizes.end());
  std::vector<int> targets(n, -1);
  std::vector<bool> chunked(n, false);
  bool on_device = false;
  for (size_t i = 0; i < n; ++i) {
    const v1::TensorDescriptor& wire = arrival.header.tensors(static_cast<int>(i));
    absl::StatusOr<shm::TensorEntry> entry =
        FromWire(wire, arrival.tensor_sizes[i], static_cast<int>(i), &targets[i]);
    if (!entry.ok()) return entry.status();
    // An error's tensors are never read: no pool block for them.
    if (arrival.code != 0) targets[i] = -1;
    block->tensors.push_back(*entry);
    chunked[i] = wire.chunk_bytes() > 0;
    if (targets[i] >= 0) {
      bytes[i] = 0;  // in the session's receive pool, not its rx heap
      on_device = true;
    }
  }
  if (on_device) {
    if (staging.cuda() == nullptr || to->cuda == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CUDA tensors for worker '", arrival.header.target_worker(), "': ", staging.no_cuda()));
    }
    // Pool blocks and staging first, outside the session's lock; freed with the block if
    // anything below fails.
    absl::StatusOr<std::unique_ptr<StagedIn>> staged =
        StagedIn::Reserve(staging.cuda(), to->cuda, arrival.header.target_worker(), targets,
                          chunked, &block->tensors);
    if (!staged.ok()) return staged.status();
    block->staged = *std::move(staged);
  }
  block->plan = shm::PlanBlock(shm::MessagePrefixBytes(arrival.names), arrival.payload_size, bytes);
  agent::Destination destination;
  absl::StatusOr<uint64_t> offset = to->WriteRx(block->plan.total, [&](uint64_t at, uint8_t* out) {
    block->offset = at;
    FillIncoming(*block, arrival.code, arrival.names, out, &destination);
    destination.payload = arrival.payload_size == 0 ? nullptr : out + block->plan.prefix;
    return absl::OkStatus();
  });
  if (!offset.ok()) return offset.status();
  if (on_device) {
    // Each chunk bound for a device goes on into the pool as soon as it is in staging.
    std::shared_ptr<const RxBlock> landing = block;
    destination.on_chunk = [landing](size_t tensor, uint64_t at, uint64_t length) {
      landing->staged->OnChunk(tensor, at, length, landing);
    };
  }
  destination.keepalive = std::move(block);
  return destination;
}

void RemoteCalls::Add(const Key& key, Outgoing call) {
  absl::MutexLock lock(&mu_);
  calls_[key] = std::move(call);
}

std::optional<Outgoing> RemoteCalls::Take(const Key& key) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(key);
  if (it == calls_.end()) return std::nullopt;
  Outgoing call = std::move(it->second);
  calls_.erase(it);
  return call;
}

std::vector<std::pair<RemoteCalls::Key, Outgoing>> RemoteCalls::TakeNode(const std::string& node) {
  std::vector<std::pair<Key, Outgoing>> taken;
  absl::MutexLock lock(&mu_);
  for (auto it = calls_.begin(); it != calls_.end();) {
    if (it->second.node == node) {
      taken.emplace_back(it->first, std::move(it->second));
      it = calls_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

void RemoteCalls::DropSession(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  for (auto it = calls_.lower_bound({session_id, 0});
       it != calls_.end() && it->first.first == session_id;) {
    it = calls_.erase(it);
  }
}

size_t RemoteCalls::AwaitNone(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.empty(); };
  mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  return calls_.size();
}

}  // namespace tpd::router
