#include "daemon/router/delivery.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/parallel_copy.h"
#include "shm/copy_signal.h"
#include "shm/doorbell.h"

namespace tpd::router {

struct Delivery::Placement {
  const Letter& letter;
  const uint8_t* in;         // the sender's segment
  uint64_t peer = 0;         // the sender's peer id when some tensors are shared, else 0
  std::vector<bool> shared;  // per tensor, when `peer` is set
  uint64_t shared_bytes = 0;
  shm::BlockPlan plan;
  std::vector<CopyEnd> sources;                       // per tensor; empty in the host case
  std::vector<std::pair<int, uint64_t>> pool_blocks;  // (device, offset) taken in `to`
  std::vector<CudaCopies::Copy> copies;
  // Where the block's CopySignal lies from its start, for a call posted before its copies ran
  // (0: posted after them).
  uint64_t signal_at = 0;
};

void Delivery::Deliver(const std::shared_ptr<Session>& from, const std::shared_ptr<Session>& to,
                       const Letter& letter, std::function<void(absl::Status)> after) {
  Placement p{letter, from->segment->base()};
  // The sender's block, once nothing more is read from it (unless `to` holds it now).
  auto give_back = [&from, tx = letter.tx_block] { from->Release(tx); };
  if (!letter.places.empty()) {
    if (cuda_ == nullptr || from->cuda == nullptr || to->cuda == nullptr) {
      give_back();
      after(absl::FailedPreconditionError(absl::StrCat(
          "a message with CUDA tensors or device maps cannot be delivered: ", no_cuda_)));
      return;
    }
    if (absl::Status resolved = ResolveSources(*from, &p); !resolved.ok()) {
      give_back();
      after(resolved);
      return;
    }
  } else {
    Share(from, to, &p);
  }
  std::vector<uint64_t> host_bytes(letter.tensors.size(), 0);
  for (size_t i = 0; i < letter.tensors.size(); ++i) {
    if ((letter.places.empty() || letter.places[i].device < 0) && (p.peer == 0 || !p.shared[i])) {
      host_bytes[i] = letter.tensors[i].length;
    }
  }
  p.plan = shm::PlanBlock(shm::MessagePrefixBytes(letter.names), letter.body_length, host_bytes);
  uint64_t block_bytes = p.plan.total;
  if (PostsBeforeCopies(p)) {
    p.signal_at = shm::AlignUp(p.plan.total);
    block_bytes = p.signal_at + sizeof(shm::CopySignal);
  }
  auto fill = [&](uint64_t block, uint8_t* out) { return Fill(*to, block, out, &p); };
  auto describe = [&](uint64_t block) {
    return shm::MessageDescriptor(
        letter.op, letter.call_id,
        {block, p.plan.payload, p.plan.table, static_cast<uint32_t>(letter.tensors.size())},
        letter.flags, letter.deadline_ns);
  };
  if (letter.places.empty()) {
    // Host memory only: copied and posted under one hold of `to`'s lock, nothing to wait for.
    const Session::Lent lend{from, letter.tx_block};
    absl::Status posted =
        to->WriteRxAndPost(p.plan.total, fill, describe, p.peer != 0 ? &lend : nullptr);
    if (p.peer == 0 || !posted.ok()) give_back();
    if (p.peer != 0 && posted.ok()) to->bytes_shared += p.shared_bytes;
    after(posted);
    return;
  }
  absl::StatusOr<uint64_t> block = to->WriteRx(block_bytes, fill);
  if (!block.ok()) {
    give_back();
    after(block.status());
    return;
  }
  const shm::Descriptor posted = describe(*block);
  if (p.copies.empty()) {
    give_back();
    after(Post(*to, posted, p.pool_blocks));
    return;
  }
  std::vector<std::shared_ptr<const void>> keep = {from->cuda, to->cuda, from->segment,
                                                   to->segment};
  if (p.signal_at != 0) {
    // The callee wakes and readies its handler while the copies run; its client waits on the
    // signal before the handler sees the call. From here the blocks are the callee's: its
    // client releases them, also when the copies fail.
    std::vector<Session::BlockRef> held = {{0, *block}};
    for (const auto& [device, offset] : p.pool_blocks) {
      held.push_back({static_cast<uint32_t>(device) + 1, offset});
    }
    to->HoldWhileCopying(held);
    if (absl::Status s = Post(*to, posted, p.pool_blocks); !s.ok()) {
      to->EndCopying(held);  // Post freed them
      give_back();
      after(s);
      return;
    }
    auto* signal = reinterpret_cast<shm::CopySignal*>(to->segment->base() + *block + p.signal_at);
    cuda_->Run(std::move(p.copies), std::move(keep),
               [this, from, to, tx = letter.tx_block, signal, held = std::move(held),
                after = std::move(after)](absl::Status copied) {
                 from->Release(tx);
                 const bool ok = copied.ok();
                 after(std::move(copied));  // before the callee can answer
                 signal->state.store(ok ? shm::kCopied : shm::kCopyFailed,
                                     std::memory_order_release);
                 shm::Doorbell(&signal->bell).Ring();
                 for (const auto& [pool, offset] : to->EndCopying(held)) {
                   if (pool == 0) {
                     TPD_CHECK_OK(to->FreeRx(offset));
                   } else {
                     TPD_CHECK_OK(cuda_->FreePool(*to->cuda, static_cast<int>(pool - 1), offset));
                   }
                 }
               });
    // The callee's session thread, likely asleep, wakes while the copy runs and is awake for
    // the reply (CallRouter::Serve).
    to->CallPosted();
    return;
  }
  cuda_->Run(std::move(p.copies), std::move(keep),
             [this, from, to, tx = letter.tx_block, posted, pools = std::move(p.pool_blocks),
              after = std::move(after)](absl::Status copied) {
               from->Release(tx);
               if (copied.ok()) {
                 after(Post(*to, posted, pools));
                 return;
               }
               TPD_CHECK_OK(to->FreeRx(posted.payload_offset));
               FreePools(*to, pools);
               after(copied);
             });
}

bool Delivery::PostsBeforeCopies(const Placement& p) {
  // Only calls: a reply's waiter is the caller's thread, which the reply's completion wakes
  // directly. And only when every copy lands in a receive pool: a host tensor copied from a
  // device lies in the rx block, whose entries' device_handle means a peer's segment.
  if (p.letter.op != shm::Op::kCall || p.letter.places.empty()) return false;
  bool copies = false;
  for (size_t i = 0; i < p.letter.tensors.size(); ++i) {
    if (p.letter.tensors[i].length == 0) continue;
    if (p.letter.places[i].device < 0 && p.sources[i].device >= 0) return false;
    if (p.letter.places[i].device >= 0) copies = true;
  }
  return copies;
}

void Delivery::Share(const std::shared_ptr<Session>& from, const std::shared_ptr<Session>& to,
                     Placement* p) {
  // The trust decision (docs/security.md): only between processes of one uid and gid.
  if (from->uid != to->uid || from->gid != to->gid) return;
  const std::vector<shm::TensorEntry>& tensors = p->letter.tensors;
  // A tensor the sender sends from its rx heap (shm::kInRxHeap) is copied: a peer maps only
  // its sender's tx heap.
  auto large = [](const shm::TensorEntry& entry) {
    return entry.device_type == static_cast<uint8_t>(shm::DeviceType::kCpu) &&
           entry.device_handle == 0 && entry.length >= kShareMinBytes;
  };
  // Most messages carry no large tensor: they cost this scan and nothing more.
  if (std::none_of(tensors.begin(), tensors.end(), large) || !Session::Introduce(from, to)) {
    return;
  }
  p->peer = from->peer_id;
  p->shared.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    p->shared[i] = large(tensors[i]);
    if (p->shared[i]) p->shared_bytes += tensors[i].length;
  }
}

absl::Status Delivery::ResolveSources(Session& from, Placement* p) {
  const std::vector<shm::TensorEntry>& tensors = p->letter.tensors;
  const uint8_t* const in = p->in;
  p->sources.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const shm::TensorEntry& entry = tensors[i];
    if (entry.length == 0) continue;
    if (entry.device_type != static_cast<uint8_t>(shm::DeviceType::kCuda)) {
      p->sources[i] = CopyEnd{reinterpret_cast<uint64_t>(in + entry.offset), -1};
      continue;
    }
    shm::CudaExport record;
    std::memcpy(&record, in + entry.device_handle, sizeof(record));  // validated in the tx heap
    absl::StatusOr<CudaCopies::Source> source =
        cuda_->Resolve(*from.cuda, entry, record, static_cast<uint32_t>(i));
    if (!source.ok()) return source.status();
    p->sources[i] = source->end;
  }
  return absl::OkStatus();
}

absl::Status Delivery::Fill(Session& to, uint64_t block, uint8_t* out, Placement* p) {
  const Letter& letter = p->letter;
  for (size_t i = 0; i < letter.tensors.size(); ++i) {
    if (absl::Status filled = FillTensor(to, i, block, out, p); !filled.ok()) {
      FreePools(to, p->pool_blocks);
      return filled;
    }
  }
  if (p->signal_at != 0) {
    // Zeroed: kCopying, and a doorbell nobody sleeps on yet.
    std::memset(out + p->signal_at, 0, sizeof(shm::CopySignal));
  }
  shm::WriteMessagePrefix(out, letter.code, letter.names);
  if (letter.body_length > 0) {
    std::memcpy(out + p->plan.prefix, p->in + letter.body_offset, letter.body_length);
  }
  return absl::OkStatus();
}

absl::Status Delivery::FillTensor(Session& to, size_t i, uint64_t block, uint8_t* out,
                                  Placement* p) {
  const shm::TensorEntry& sent = p->letter.tensors[i];
  const int device = p->letter.places.empty() ? -1 : p->letter.places[i].device;
  // In the host case every source is in the sender's segment (device -1).
  const CopyEnd source = p->sources.empty() ? CopyEnd{} : p->sources[i];
  shm::TensorEntry entry = sent;
  entry.device_handle = 0;
  if (device >= 0) {
    entry.device_type = static_cast<uint8_t>(shm::DeviceType::kCuda);
    entry.device_index = static_cast<uint32_t>(device);
    entry.offset = 0;
    if (entry.length > 0) {
      if (p->signal_at != 0) entry.device_handle = block + p->signal_at;
      absl::StatusOr<uint64_t> pool = cuda_->AllocatePool(*to.cuda, device, entry.length);
      if (!pool.ok()) return pool.status();
      p->pool_blocks.push_back({device, *pool});
      // Mapped in the context of the device that runs the copy: the source's, or the pool's
      // own for host sources.
      absl::StatusOr<CopyEnd> dst =
          cuda_->PoolAddress(*to.cuda, device, *pool, source.device >= 0 ? source.device : device);
      if (!dst.ok()) return dst.status();
      entry.offset = *pool;
      p->copies.push_back({*dst, source, entry.length});
    }
  } else if (p->peer != 0 && p->shared[i]) {
    // Where it lies in the sender's segment, which the receiver maps as peer `p->peer`.
    entry.device_handle = p->peer;
  } else {
    entry.device_type = static_cast<uint8_t>(shm::DeviceType::kCpu);
    entry.device_index = 0;
    entry.offset = entry.length == 0 ? 0 : block + p->plan.at[i];
    if (entry.length > 0 && source.device < 0) {
      CopyBytes(out + p->plan.at[i], p->in + sent.offset, entry.length);
    } else if (entry.length > 0) {
      p->copies.push_back(
          {CopyEnd{reinterpret_cast<uint64_t>(out + p->plan.at[i]), -1}, source, entry.length});
    }
  }
  std::memcpy(out + p->plan.table + i * sizeof(entry), &entry, sizeof(entry));
  return absl::OkStatus();
}

absl::Status Delivery::Post(Session& to, const shm::Descriptor& posted,
                            const std::vector<std::pair<int, uint64_t>>& pool_blocks) {
  absl::Status status = to.PostLocking(posted);
  if (!status.ok()) {
    TPD_CHECK_OK(to.FreeRx(posted.payload_offset));
    FreePools(to, pool_blocks);
  }
  return status;
}

void Delivery::FreePools(Session& to, const std::vector<std::pair<int, uint64_t>>& pool_blocks) {
  // Pool blocks this delivery took and nobody else saw: freeing them cannot fail.
  for (const auto& [device, offset] : pool_blocks)
    TPD_CHECK_OK(cuda_->FreePool(*to.cuda, device, offset));
}

}  // namespace tpd::router
