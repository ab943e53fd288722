#include "client/segment/codec.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/parallel_copy.h"
#include "base/status.h"

namespace tpd::calls_internal {
namespace {

absl::Status CheckShape(const shm::MessageNames& names, size_t tensors) {
  for (const std::string& name : names) {
    if (name.size() > shm::kMaxMessageName) {
      return absl::InvalidArgumentError(absl::StrCat("group, worker and method names are at most ",
                                                     shm::kMaxMessageName, " bytes"));
    }
  }
  if (tensors > shm::kMaxTensorsPerMessage) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", shm::kMaxTensorsPerMessage, " tensors per message"));
  }
  return absl::OkStatus();
}

// Where a tensor's bytes go from.
enum class Source {
  kCuda,    // device memory, named by an export record in the block
  kBlock,   // copied into the message's block
  kArena,   // an arena block of this link, in place (pinned)
  kRxHeap,  // this link's rx heap, where a received message left it (its rx block leased)
};

// What each tensor needs in the message's block: a CUDA tensor its export record, an arena or
// rx-heap tensor nothing, any other its bytes. An empty host tensor has no source to name.
struct TensorSlots {
  std::vector<uint64_t> slots;
  std::vector<Source> sources;
  std::vector<std::shared_ptr<ArenaBlock>> pins;
  std::vector<std::shared_ptr<void>> leases;
  uint64_t copied = 0;
};

// Whether `tensor` is a view of `link`'s rx heap that a received message left there: its
// storage keeps that message's rx block (TensorReader), so leasing it holds the bytes.
bool InRxHeapOf(const Link& link, const Tensor& tensor) {
  if (tensor.storage() != TensorStorage::kReceived || tensor.is_cuda() ||
      tensor.in_sender_memory() || TensorParts::KeepOf(tensor) == nullptr) {
    return false;
  }
  const shm::Region& rx = link.layout().rx_heap;
  const auto* data = reinterpret_cast<const uint8_t*>(tensor.data().data());
  const uint8_t* start = link.base() + rx.offset;
  return data >= start && tensor.size() <= rx.bytes &&
         static_cast<uint64_t>(data - start) <= rx.bytes - tensor.size();
}

absl::StatusOr<TensorSlots> PlanTensors(const Link& link, absl::Span<const Tensor> tensors) {
  TensorSlots plan;
  plan.slots.assign(tensors.size(), 0);
  plan.sources.assign(tensors.size(), Source::kBlock);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i];
    const std::string what = absl::StrCat("tensor ", i);
    absl::StatusOr<uint64_t> bytes = TensorBytes(tensor.dtype(), tensor.shape(), what);
    if (!bytes.ok()) return bytes.status();
    if (*bytes != tensor.size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shape and dtype need ", *bytes,
                                                     " bytes, data has ", tensor.size()));
    }
    if (tensor.is_cuda()) {
      const int device = tensor.device().index;
      if (device < 0 || device >= static_cast<int>(shm::kMaxCudaDevices)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": device ", tensor.device().ToString(), " does not exist"));
      }
      plan.sources[i] = Source::kCuda;
      if (*bytes > 0) plan.slots[i] = sizeof(shm::CudaExport);
      continue;
    }
    if (*bytes == 0) continue;
    const std::shared_ptr<ArenaBlock>& arena = TensorParts::ArenaOf(tensor);
    if (tensor.storage() == TensorStorage::kArena && arena != nullptr &&
        arena->link.get() == &link) {
      plan.sources[i] = Source::kArena;
      plan.pins.push_back(Pin(arena));
      continue;
    }
    if (InRxHeapOf(link, tensor)) {
      plan.sources[i] = Source::kRxHeap;
      plan.leases.push_back(TensorParts::KeepOf(tensor));
      continue;
    }
    plan.slots[i] = *bytes;
    plan.copied += *bytes;
  }
  return plan;
}

shm::TensorEntry EntryOf(const Tensor& tensor) {
  shm::TensorEntry entry{};
  entry.dtype = static_cast<uint8_t>(tensor.dtype());
  entry.ndim = static_cast<uint8_t>(tensor.shape().size());
  std::copy(tensor.shape().begin(), tensor.shape().end(), entry.shape);
  entry.length = tensor.size();
  return entry;
}

// A CUDA tensor's entry: its export record at `record_at` of the block (the daemon opens the
// memory through it) and the offset in its allocation.
absl::Status WriteCudaEntry(const Tensor& tensor, uint64_t block, uint64_t record_at, uint8_t* out,
                            shm::TensorEntry* entry, EncodedMessage* encoded) {
  entry->device_type = static_cast<uint8_t>(shm::DeviceType::kCuda);
  entry->device_index = static_cast<uint32_t>(tensor.device().index);
  if (entry->length == 0) return absl::OkStatus();
  absl::StatusOr<CudaExporter*> exporter = CudaExporter::Get();
  shm::CudaExport record;
  absl::StatusOr<uint64_t> offset =
      exporter.ok() ? (*exporter)->Export(tensor.device_pointer(), tensor.size(),
                                          tensor.device().index, tensor.stream(), &record)
                    : exporter.status();
  if (!offset.ok()) return offset.status();
  std::memcpy(out + record_at, &record, sizeof(record));
  // A received tensor passed on: its pool block must not go back to the daemon (and be
  // reused) before the daemon has copied from it.
  if (TensorParts::KeepOf(tensor) != nullptr)
    encoded->leases.push_back(TensorParts::KeepOf(tensor));
  entry->offset = *offset;
  entry->device_handle = block + record_at;
  ++encoded->cuda_tensors;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EncodedMessage> EncodeMessage(Link& link, const OutgoingHeader& header,
                                             std::string_view payload,
                                             absl::Span<const Tensor> tensors) {
  if (absl::Status shape = CheckShape(header.names, tensors.size()); !shape.ok()) return shape;
  absl::StatusOr<TensorSlots> slots = PlanTensors(link, tensors);
  if (!slots.ok()) return slots.status();
  const shm::BlockPlan plan =
      shm::PlanBlock(shm::MessagePrefixBytes(header.names), payload.size(), slots->slots);
  absl::StatusOr<uint64_t> block = link.Allocate(plan.total, "a message");
  if (!block.ok()) return block.status();
  EncodedMessage encoded;
  encoded.block = *block;
  encoded.pins = std::move(slots->pins);
  encoded.leases = std::move(slots->leases);
  encoded.bytes_copied = payload.size() + slots->copied;
  // The block is ours until pushed: filled without the link's lock.
  uint8_t* out = link.base() + *block;
  shm::WriteMessagePrefix(out, header.code, header.names);
  if (!payload.empty()) std::memcpy(out + plan.prefix, payload.data(), payload.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i];
    shm::TensorEntry entry = EntryOf(tensor);
    switch (slots->sources[i]) {
      case Source::kCuda:
        if (absl::Status written =
                WriteCudaEntry(tensor, *block, plan.at[i], out, &entry, &encoded);
            !written.ok()) {
          link.FreeBlock(*block);
          return Prefixed(written, "tensor ", i, " (", tensor.device().ToString(), "): ");
        }
        break;
      case Source::kBlock:  // or an empty host tensor: nothing to copy or point at
        if (entry.length > 0) {
          entry.offset = *block + plan.at[i];
          CopyBytes(out + plan.at[i], TensorParts::Bytes(tensor), tensor.size());
        }
        break;
      case Source::kRxHeap:
        entry.offset = reinterpret_cast<const uint8_t*>(TensorParts::Bytes(tensor)) - link.base();
        entry.device_handle = shm::kInRxHeap;
        ++encoded.tensors_in_place;
        break;
      case Source::kArena:
        entry.offset = TensorParts::ArenaOf(tensor)->offset;
        ++encoded.tensors_in_place;
        break;
    }
    std::memcpy(out + plan.table + i * sizeof(entry), &entry, sizeof(entry));
  }
  encoded.tensors_copied = tensors.size() - encoded.tensors_in_place;
  encoded.descriptor = shm::MessageDescriptor(
      header.op, header.call_id,
      {*block, plan.payload, plan.table, static_cast<uint32_t>(tensors.size())}, header.flags,
      header.deadline_unix_ns);
  return encoded;
}

namespace {

// Reads one decoded message's tensors: views that keep what they lie in.
class TensorReader {
 public:
  TensorReader(const std::shared_ptr<Link>& link, PeerSegments& peers,
               std::shared_ptr<RxBlock> block, std::vector<shm::CopySignal*>* copies)
      : link_(link), peers_(peers), block_(std::move(block)), copies_(copies) {}

  absl::StatusOr<Tensor> Read(const shm::TensorEntry& entry) {
    const auto dtype = static_cast<shm::DType>(entry.dtype);
    std::vector<int64_t> shape(entry.shape, entry.shape + entry.ndim);
    if (entry.device_type == static_cast<uint8_t>(shm::DeviceType::kCuda)) {
      return ReadCuda(entry, dtype, std::move(shape));
    }
    if (entry.length == 0) {
      return TensorParts::Received(dtype, std::move(shape), Device{}, nullptr, nullptr, 0);
    }
    if (entry.device_handle != 0) return ReadInSender(entry, dtype, std::move(shape));
    return TensorParts::Received(dtype, std::move(shape), Device{}, block_,
                                 reinterpret_cast<const char*>(link_->base() + entry.offset),
                                 entry.length);
  }

 private:
  // In this client's receive pool on the device: the daemon copied it there.
  absl::StatusOr<Tensor> ReadCuda(const shm::TensorEntry& entry, shm::DType dtype,
                                  std::vector<int64_t> shape) {
    const int device = static_cast<int>(entry.device_index);
    const Device where{shm::DeviceType::kCuda, device};
    if (entry.length == 0) {
      return TensorParts::Received(dtype, std::move(shape), where, nullptr, nullptr, 0);
    }
    // The daemon's block of our pool: released even when the message is refused.
    auto held = std::make_shared<PoolBlock>(link_, device, entry.offset, entry.length);
    const std::optional<DevicePool> pool = link_->Pool(device);
    if (!pool || entry.offset > pool->bytes || entry.length > pool->bytes - entry.offset) {
      return absl::InternalError(absl::StrCat(
          "the daemon placed a tensor outside this client's receive pool on cuda:", device));
    }
    if (entry.device_handle != 0) {
      auto* signal = reinterpret_cast<shm::CopySignal*>(link_->base() + entry.device_handle);
      if (std::find(copies_->begin(), copies_->end(), signal) == copies_->end()) {
        copies_->push_back(signal);
      }
    }
    ++link_->counters.cuda_tensors_received;
    return TensorParts::Received(dtype, std::move(shape), where, std::move(held),
                                 reinterpret_cast<const char*>(pool->base + entry.offset),
                                 entry.length);
  }

  // In the sender's tx heap, which this client maps as peer `device_handle`.
  absl::StatusOr<Tensor> ReadInSender(const shm::TensorEntry& entry, shm::DType dtype,
                                      std::vector<int64_t> shape) {
    absl::StatusOr<std::shared_ptr<const PeerSegment>> peer = peers_.Get(entry.device_handle);
    if (!peer.ok()) return peer.status();
    const char* at = (*peer)->Find(entry.offset, entry.length);
    if (at == nullptr) {
      return absl::InternalError(absl::StrCat(
          "the daemon placed a tensor outside the memory of peer session ", entry.device_handle));
    }
    block_->bytes += entry.length;
    ++link_->counters.tensors_received_shared;
    return TensorParts::Received(dtype, std::move(shape), Device{},
                                 std::make_shared<PeerView>(PeerView{block_, *std::move(peer)}), at,
                                 entry.length, /*in_sender_memory=*/true);
  }

  const std::shared_ptr<Link>& link_;
  PeerSegments& peers_;
  const std::shared_ptr<RxBlock> block_;
  std::vector<shm::CopySignal*>* const copies_;
};

// An error reply's status (the daemon answers even when this session's rx heap had no room).
absl::Status ErrorReply(const shm::Descriptor& d, const absl::StatusOr<shm::ParsedMessage>& parsed,
                        const absl::Status& entries) {
  if (d.payload_length == 0) {
    return absl::ResourceExhaustedError(
        "the daemon could not place the answer to this call: this session's receive heap "
        "(data.arena_bytes) was full; release received messages and tensors sooner");
  }
  if (!entries.ok()) return entries;
  const auto code = static_cast<absl::StatusCode>(parsed->code);
  return absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
                      parsed->names[2]);
}

}  // namespace

DecodedMessage DecodeMessage(const shm::Descriptor& d, const std::shared_ptr<Link>& link,
                             PeerSegments& peers) {
  DecodedMessage decoded;
  uint8_t* const base = link->base();
  // Released when the last view of it goes: with `decoded` when no tensor holds it.
  std::shared_ptr<RxBlock> block =
      d.payload_offset != 0
          ? std::make_shared<RxBlock>(
                link, d.payload_offset,
                d.payload_length + uint64_t{d.tensor_count} * sizeof(shm::TensorEntry))
          : nullptr;
  decoded.block = block;
  absl::StatusOr<shm::ParsedMessage> parsed =
      shm::ParseMessage(base, d.payload_offset, d.payload_length);
  absl::StatusOr<std::vector<shm::TensorEntry>> entries =
      parsed.ok() ? shm::ReadTensorTable(d, base, link->layout(), shm::Direction::kCompletion)
                  : parsed.status();
  if ((d.flags & shm::kFlagError) != 0) {
    decoded.message = d.op == static_cast<uint8_t>(shm::Op::kReply)
                          ? ErrorReply(d, parsed, entries.status())
                          : absl::InvalidArgumentError("a call marked as an error reply");
    return decoded;
  }
  if (!entries.ok()) {
    decoded.message = entries.status();
    return decoded;
  }
  decoded.names = std::move(parsed->names);
  Message in;
  in.payload.assign(reinterpret_cast<const char*>(base + parsed->body_offset), parsed->body_length);
  link->counters.bytes_copied_out += parsed->body_length;
  TensorReader reader(link, peers, block, &decoded.copies);
  absl::Status misplaced;
  for (const shm::TensorEntry& entry : *entries) {
    // A bad entry fails the message; the later ones are still read, so their blocks are
    // released too.
    absl::StatusOr<Tensor> tensor = reader.Read(entry);
    if (tensor.ok()) {
      in.tensors.push_back(*std::move(tensor));
    } else if (misplaced.ok()) {
      misplaced = tensor.status();
    }
  }
  if (misplaced.ok()) {
    decoded.message = std::move(in);
  } else {
    decoded.message = misplaced;
  }
  return decoded;
}

}  // namespace tpd::calls_internal
