// CUDA tensors crossing to or from another node, staged through the daemon's pinned host
// memory (docs/cuda.md, "Across nodes"), both ways:
//
//   out  StageOut copies a message's CUDA tensors device-to-host into staging, which the
//        agent's pipe then writes; a tensor larger than chunk_bytes goes in chunks, each written
//        as soon as its own copy completed (StagedOut).
//   in   StagedIn holds, per tensor bound for a device, the staging TensorPipe receives it into
//        and the block of the session's receive pool it is copied on to, chunk by chunk as the
//        chunks land, the rest once the message is complete (Land).
//
// Thread safety: thread-safe; callbacks run on the threads CudaCopies::Run names.

#ifndef TPD_DAEMON_ROUTER_CUDA_STAGING_H_
#define TPD_DAEMON_ROUTER_CUDA_STAGING_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent.h"
#include "daemon/router/cuda_copies.h"
#include "daemon/router/session.h"
#include "daemon/router/submitted.h"

namespace tpd::router {

// A message staged for another node: its tx block (released when TensorPipe is done) and the
// pinned staging its CUDA tensors were copied to, with the chunks still to copy.
class StagedOut {
 public:
  StagedOut(CudaCopies* cuda, std::shared_ptr<TxBlock> tx, std::shared_ptr<SessionMemory> source)
      : cuda_(cuda), tx_(std::move(tx)), source_(std::move(source)) {}
  ~StagedOut();

  // Issues every chunk's copy (after the message's other copies: a stream runs in order).
  static void StartChunks(const std::shared_ptr<StagedOut>& self);
  // The agent asks for chunk (tensor, offset): `ready` runs once its copy completed.
  void WhenReady(size_t tensor, uint64_t offset, agent::ChunkReady ready);

 private:
  friend class CudaStaging;
  struct Chunk {
    CudaCopies::Copy copy;
    bool done = false;
    absl::Status status;
    agent::ChunkReady waiting;  // the agent's, if it asked before the copy completed
  };

  CudaCopies* const cuda_;
  const std::shared_ptr<TxBlock> tx_;
  const std::shared_ptr<SessionMemory> source_;  // the sender's memory, mapped while copied
  std::vector<uint64_t> staging_;
  absl::Mutex mu_;
  std::map<std::pair<size_t, uint64_t>, Chunk> chunks_ ABSL_GUARDED_BY(mu_);  // (tensor, offset)
};

// What StageOut leaves to do: `copies` run before the message is sent; `chunked` then starts its
// chunks (StagedOut::StartChunks), whether or not the message is sent.
struct Staged {
  std::vector<CudaCopies::Copy> copies;
  std::shared_ptr<StagedOut> chunked;
};

class CudaStaging {
 public:
  // `cuda` null without a usable driver (`no_cuda` says why); `chunk_bytes` 0: tensors whole.
  CudaStaging(CudaCopies* cuda, std::string no_cuda, uint64_t chunk_bytes)
      : cuda_(cuda), no_cuda_(std::move(no_cuda)), chunk_bytes_(chunk_bytes) {}

  CudaCopies* cuda() const { return cuda_; }
  const std::string& no_cuda() const { return no_cuda_; }

  // Points `out` at `submitted` (tx block `tx_offset` of `session`) for another node: host
  // tensors in place, CUDA tensors through staging; each tensor's target device (`places`)
  // goes with it. The tx block goes back to the client once `out` is done with.
  absl::StatusOr<Staged> StageOut(const std::shared_ptr<Session>& session, uint64_t tx_offset,
                                  const Submitted& submitted, const std::vector<Place>& places,
                                  agent::Message* out) const;

 private:
  CudaCopies* const cuda_;
  const std::string no_cuda_;
  const uint64_t chunk_bytes_;
};

// The tensors of a message from another node bound for CUDA devices of a session: received
// into staging, then copied into the session's receive pools.
class StagedIn {
 public:
  // Takes staging and a pool block of `to` (the session of `worker`) for each tensor `targets`
  // puts on a device (its entry in `tensors` then names the pool block); `chunked[i]`: tensor i
  // comes in chunks.
  static absl::StatusOr<std::unique_ptr<StagedIn>> Reserve(CudaCopies* cuda,
                                                           std::shared_ptr<SessionMemory> to,
                                                           const std::string& worker,
                                                           const std::vector<int>& targets,
                                                           const std::vector<bool>& chunked,
                                                           std::vector<shm::TensorEntry>* tensors);
  // Frees the staging, and the pool blocks unless the message was posted.
  ~StagedIn();

  // Where TensorPipe receives tensor `i`; 0 for a tensor that stays in host memory.
  uint64_t staging(size_t i) const { return staging_[i]; }
  void MarkPosted() { posted_ = true; }
  // A chunk of tensor `tensor` is in staging: copies it on into the pool, `keep` held meanwhile.
  void OnChunk(size_t tensor, uint64_t offset, uint64_t length,
               std::shared_ptr<const void> keep) const;
  // Copies the tensors that came whole, then runs `then` once every copy (chunks included)
  // completed, with the first error.
  void Land(std::shared_ptr<const void> keep, std::function<void(absl::Status)> then) const;

 private:
  class Landing;

  StagedIn(CudaCopies* cuda, std::shared_ptr<SessionMemory> to, size_t n);

  CudaCopies* const cuda_;
  const std::shared_ptr<SessionMemory> to_;
  std::vector<shm::TensorEntry> tensors_;  // device and pool offset of each staged tensor
  std::vector<uint64_t> staging_;
  std::vector<bool> chunked_;
  std::shared_ptr<Landing> landing_;
  std::atomic<bool> posted_{false};
};

}  // namespace tpd::router

#endif  // TPD_DAEMON_ROUTER_CUDA_STAGING_H_
