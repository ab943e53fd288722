#include "daemon/router/cuda_staging.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status.h"
#include "daemon/router/tensor_wire.h"

namespace tpd::router {

StagedOut::~StagedOut() {
  for (uint64_t address : staging_) cuda_->FreeStaging(address);
}

void StagedOut::StartChunks(const std::shared_ptr<StagedOut>& self) {
  std::vector<std::pair<std::pair<size_t, uint64_t>, CudaCopies::Copy>> copies;
  {
    absl::MutexLock lock(&self->mu_);
    for (const auto& [key, chunk] : self->chunks_) copies.emplace_back(key, chunk.copy);
  }
  for (const auto& [key, copy] : copies) {
    self->cuda_->Run({copy}, {self, self->source_}, [self, key = key](absl::Status status) {
      agent::ChunkReady ready;
      {
        absl::MutexLock lock(&self->mu_);
        Chunk& chunk = self->chunks_[key];
        chunk.done = true;
        chunk.status = status;
        ready = std::move(chunk.waiting);
      }
      if (ready) ready(std::move(status));
    });
  }
}

void StagedOut::WhenReady(size_t tensor, uint64_t offset, agent::ChunkReady ready) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto it = chunks_.find({tensor, offset});
    if (it == chunks_.end()) {
      status = absl::InternalError(
          absl::StrCat("no staged chunk of tensor ", tensor, " at offset ", offset));
    } else if (!it->second.done) {
      it->second.waiting = std::move(ready);
      return;
    } else {
      status = it->second.status;
    }
  }
  ready(std::move(status));
}

absl::StatusOr<Staged> CudaStaging::StageOut(const std::shared_ptr<Session>& session,
                                             uint64_t tx_offset, const Submitted& submitted,
                                             const std::vector<Place>& places,
                                             agent::Message* out) const {
  auto staged = std::make_shared<StagedOut>(cuda_, std::make_shared<TxBlock>(session, tx_offset),
                                            session->cuda);
  Staged result;
  uint8_t* const base = session->segment->base();
  out->payload = {base + submitted.message.body_offset, submitted.message.body_length};
  for (size_t i = 0; i < submitted.tensors.size(); ++i) {
    const shm::TensorEntry& entry = submitted.tensors[i];
    *out->header.add_tensors() = ToWire(entry, places.empty() ? -1 : places[i].device);
    if (entry.length == 0) {
      out->tensors.push_back({nullptr, 0});
      continue;
    }
    if (entry.device_type != static_cast<uint8_t>(shm::DeviceType::kCuda)) {
      out->tensors.push_back({base + entry.offset, entry.length});
      continue;
    }
    if (cuda_ == nullptr || session->cuda == nullptr) {
      return absl::FailedPreconditionError(no_cuda_);
    }
    shm::CudaExport record;
    std::memcpy(&record, base + entry.device_handle, sizeof(record));  // validated in the tx heap
    absl::StatusOr<CudaCopies::Source> source =
        cuda_->Resolve(*session->cuda, entry, record, static_cast<uint32_t>(i));
    if (!source.ok()) return source.status();
    absl::StatusOr<uint64_t> staging = cuda_->AllocateStaging(entry.length);
    if (!staging.ok()) return staging.status();
    staged->staging_.push_back(*staging);
    out->tensors.push_back({reinterpret_cast<void*>(*staging), entry.length});
    if (chunk_bytes_ == 0 || entry.length <= chunk_bytes_) {
      result.copies.push_back({CopyEnd{*staging, -1}, source->end, entry.length});
      continue;
    }
    out->header.mutable_tensors(static_cast<int>(i))->set_chunk_bytes(chunk_bytes_);
    absl::MutexLock lock(&staged->mu_);
    for (uint64_t offset = 0; offset < entry.length; offset += chunk_bytes_) {
      const uint64_t length = std::min(chunk_bytes_, entry.length - offset);
      staged->chunks_[{i, offset}].copy = {
          CopyEnd{*staging + offset, -1}, CopyEnd{source->end.address + offset, source->end.device},
          length};
    }
  }
  out->when_chunk_ready = [staged](size_t tensor, uint64_t offset, uint64_t,
                                   agent::ChunkReady ready) {
    staged->WhenReady(tensor, offset, std::move(ready));
  };
  result.chunked = staged;
  out->keepalive = std::move(staged);
  return result;
}

// The copies into the pools of one incoming message: one per chunk as it lands, then the rest
// once the message is complete; `then` runs when all are done, with the first error.
class StagedIn::Landing {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  void Done(const absl::Status& status) {
    std::function<void(absl::Status)> run;
    absl::Status outcome;
    {
      absl::MutexLock lock(&mu_);
      if (first_error_.ok()) first_error_ = status;
      if (--in_flight_ > 0 || !then_) return;
      run = std::move(then_);
      outcome = first_error_;
    }
    run(outcome);
  }
  // REQUIRES: an Add() not Done() yet (the last copies), so `f` runs after them.
  void Then(std::function<void(absl::Status)> f) {
    absl::MutexLock lock(&mu_);
    then_ = std::move(f);
  }

 private:
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  std::function<void(absl::Status)> then_ ABSL_GUARDED_BY(mu_);
};

StagedIn::StagedIn(CudaCopies* cuda, std::shared_ptr<SessionMemory> to, size_t n)
    : cuda_(cuda),
      to_(std::move(to)),
      tensors_(n),
      staging_(n, 0),
      chunked_(n, false),
      landing_(std::make_shared<Landing>()) {}

absl::StatusOr<std::unique_ptr<StagedIn>> StagedIn::Reserve(
    CudaCopies* cuda, std::shared_ptr<SessionMemory> to, const std::string& worker,
    const std::vector<int>& targets, const std::vector<bool>& chunked,
    std::vector<shm::TensorEntry>* tensors) {
  std::unique_ptr<StagedIn> staged(new StagedIn(cuda, std::move(to), targets.size()));
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] < 0) continue;
    shm::TensorEntry& entry = (*tensors)[i];
    entry.device_type = static_cast<uint8_t>(shm::DeviceType::kCuda);
    entry.device_index = static_cast<uint32_t>(targets[i]);
    if (entry.length == 0) continue;
    absl::StatusOr<uint64_t> staging = cuda->AllocateStaging(entry.length);
    if (!staging.ok()) return staging.status();
    absl::StatusOr<uint64_t> pool = cuda->AllocatePool(*staged->to_, targets[i], entry.length);
    if (!pool.ok()) {
      cuda->FreeStaging(*staging);
      return Prefixed(pool.status(), "worker '", worker, "': ");
    }
    entry.offset = *pool;
    staged->staging_[i] = *staging;
    staged->chunked_[i] = chunked[i];
    staged->tensors_[i] = entry;
  }
  return staged;
}

StagedIn::~StagedIn() {
  for (size_t i = 0; i < staging_.size(); ++i) {
    if (staging_[i] == 0) continue;
    cuda_->FreeStaging(staging_[i]);
    // A pool block taken here and never handed to the client: freeing it cannot fail.
    if (!posted_) {
      TPD_CHECK_OK(
          cuda_->FreePool(*to_, static_cast<int>(tensors_[i].device_index), tensors_[i].offset));
    }
  }
}

void StagedIn::OnChunk(size_t tensor, uint64_t offset, uint64_t length,
                       std::shared_ptr<const void> keep) const {
  if (tensor >= staging_.size() || staging_[tensor] == 0) return;  // host memory
  const shm::TensorEntry& entry = tensors_[tensor];
  const int device = static_cast<int>(entry.device_index);
  landing_->Add();
  absl::StatusOr<CopyEnd> dst = cuda_->PoolAddress(*to_, device, entry.offset + offset, device);
  if (!dst.ok()) {
    landing_->Done(dst.status());
    return;
  }
  std::shared_ptr<Landing> landing = landing_;
  cuda_->Run({{*dst, CopyEnd{staging_[tensor] + offset, -1}, length}}, {std::move(keep), to_},
             [landing](absl::Status status) { landing->Done(status); });
}

void StagedIn::Land(std::shared_ptr<const void> keep,
                    std::function<void(absl::Status)> then) const {
  // The chunks' copies were issued as they landed; the rest go now.
  std::vector<CudaCopies::Copy> copies;
  absl::Status placed;
  for (size_t i = 0; i < staging_.size(); ++i) {
    if (staging_[i] == 0 || chunked_[i]) continue;
    const int device = static_cast<int>(tensors_[i].device_index);
    absl::StatusOr<CopyEnd> dst = cuda_->PoolAddress(*to_, device, tensors_[i].offset, device);
    if (!dst.ok()) {
      placed = dst.status();
      break;
    }
    copies.push_back({*dst, CopyEnd{staging_[i], -1}, tensors_[i].length});
  }
  landing_->Add();
  landing_->Then(std::move(then));
  if (!placed.ok()) {
    landing_->Done(placed);
    return;
  }
  std::shared_ptr<Landing> landing = landing_;
  cuda_->Run(std::move(copies), {std::move(keep), to_},
             [landing](absl::Status status) { landing->Done(status); });
}

}  // namespace tpd::router
