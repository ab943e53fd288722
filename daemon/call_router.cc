#include "daemon/call_router.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/log_limiter.h"
#include "base/status.h"
#include "daemon/gpu_access.h"
#include "daemon/logging.h"
#include "daemon/session_handle.h"
#include "daemon/tensor_wire.h"

namespace tpd {

// A message a client submitted, read out of its tx heap once: header, names and body range,
// and its validated tensor table.
struct Submitted {
  shm::ParsedMessage message;
  std::vector<shm::TensorEntry> tensors;
};

namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(50);
// How soon a session thread looks again at a completion ring that had no room for what it
// must post: its client is reading (or will be ended past max_unposted), so not long.
constexpr absl::Duration kBacklogInterval = absl::Milliseconds(1);
// How a session thread waits for its client's submissions: the client library's window
// (client/calls.cc). With the doorbell's default 50 µs cap a round trip near it made every hop
// sleep, and sleeping hops kept it there.
constexpr shm::SpinOptions kSessionSpin{absl::Microseconds(2), absl::Microseconds(100),
                                        absl::Microseconds(1)};
// How long a request from another daemon may wait for this daemon to read the version of its
// group in which its caller joined, before it is refused.
constexpr absl::Duration kCatchUpWait = absl::Seconds(5);
// The longest the call timer sleeps with deadlines pending later than that
// (PendingCalls::ServeDeadlines).
constexpr absl::Duration kTimerHorizon = absl::Seconds(1);

std::string CallName(const std::string& worker, const std::string& method) {
  return absl::StrCat("call to worker '", worker, "' method '", method, "'");
}

// Where a message's parts go in one heap block: header and names, body, tensor table, tensors.
struct BlockPlan {
  uint64_t prefix = 0;
  uint64_t payload = 0;  // prefix + body
  uint64_t table = 0;    // offset of the table in the block
  std::vector<uint64_t> at;
  uint64_t total = 0;
};

BlockPlan PlanBlock(uint64_t prefix, uint64_t body, const std::vector<uint64_t>& tensor_bytes) {
  BlockPlan plan;
  plan.prefix = prefix;
  plan.payload = prefix + body;
  plan.total = shm::AlignUp(plan.payload);
  plan.table = plan.total;
  plan.total += shm::AlignUp(tensor_bytes.size() * sizeof(shm::TensorEntry));
  plan.at.resize(tensor_bytes.size());
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    plan.at[i] = plan.total;
    plan.total += shm::AlignUp(tensor_bytes[i]);
  }
  return plan;
}

// REQUIRES: ValidateDescriptor(d) passed.
// Reads the message of `d` out of the tx heap of `segment`; a CUDA tensor in it is refused
// with `cuda_allowed` when that is not OK (its user may not open the GPUs).
absl::StatusOr<Submitted> ReadSubmitted(const shm::Segment& segment, const shm::Descriptor& d,
                                        const absl::Status& cuda_allowed) {
  absl::StatusOr<shm::ParsedMessage> message =
      shm::ParseMessage(segment.base(), d.payload_offset, d.payload_length);
  if (!message.ok()) return message.status();
  absl::StatusOr<std::vector<shm::TensorEntry>> tensors = shm::ReadTensorTable(
      d, segment.base(), segment.layout(), shm::Direction::kSubmission);
  if (!tensors.ok()) return tensors.status();
  if (!cuda_allowed.ok()) {
    for (const shm::TensorEntry& entry : *tensors) {
      if (entry.device_type == static_cast<uint8_t>(shm::DeviceType::kCuda)) return cuda_allowed;
    }
  }
  return Submitted{*std::move(message), *std::move(tensors)};
}

absl::Status MalformedReply(const std::string& worker, const std::string& method,
                            const absl::Status& why) {
  return absl::InternalError(absl::StrCat("worker '", worker, "' sent a malformed reply to method '",
                                          method, "': ", why.message()));
}

// Points `out`'s payload and tensors at `submitted`'s bytes in the segment at `base`, with
// their wire descriptors: TensorPipe reads them in place.
void ReferInPlace(uint8_t* base, const Submitted& submitted, agent::Message* out) {
  out->payload = {base + submitted.message.body_offset, submitted.message.body_length};
  for (const shm::TensorEntry& entry : submitted.tensors) {
    *out->header.add_tensors() = ToWire(entry);
    out->tensors.push_back({entry.length == 0 ? nullptr : base + entry.offset, entry.length});
  }
}

}  // namespace

struct CallRouter::RxBlock {
  std::shared_ptr<Session> session;
  uint64_t offset = 0;
  BlockPlan plan;
  std::vector<shm::TensorEntry> tensors;  // offsets filled in, once validated
  mutable std::atomic<bool> posted{false};
  // Tensors bound for a CUDA device of the session (staged from another node): each lands in
  // pinned staging first (its address here, 0 for others) and is copied into the session's
  // receive pool (tensors[i] then names the pool block) before the message is posted.
  CudaCopies* cuda = nullptr;
  std::vector<uint64_t> staging;
  // Per tensor: whether it comes in chunks (each copied on as it lands, Landing counts them).
  std::vector<bool> chunked;
  std::shared_ptr<Landing> landing;

  // Where the message lies, for its descriptor.
  shm::MessageBlock Placed() const {
    return {offset, plan.payload, plan.table, static_cast<uint32_t>(tensors.size())};
  }

  ~RxBlock() {
    for (size_t i = 0; i < staging.size(); ++i) {
      if (staging[i] == 0) continue;
      cuda->FreeStaging(staging[i]);
      if (!posted) {
        (void)cuda->FreePool(*session->cuda, static_cast<int>(tensors[i].device_index),
                             tensors[i].offset);
      }
    }
    if (posted || offset == 0) return;
    absl::MutexLock lock(&session->mu);
    if (!session->broken) (void)session->rx->Free(offset);
  }
};

// The copies into a session's receive pools of a message staged from another node: one per
// chunk as it lands, then the rest once the message is complete; `then` runs when all are done.
struct CallRouter::Landing {
  void Add() {
    absl::MutexLock lock(&mu);
    ++in_flight;
  }
  void Done(const absl::Status& status) {
    std::function<void(absl::Status)> run;
    absl::Status outcome;
    {
      absl::MutexLock lock(&mu);
      if (first_error.ok()) first_error = status;
      if (--in_flight > 0 || !then) return;
      run = std::move(then);
      outcome = first_error;
    }
    run(outcome);
  }
  // REQUIRES: an Add() not Done() yet (the last copies), so `f` runs after them.
  void Then(std::function<void(absl::Status)> f) {
    absl::MutexLock lock(&mu);
    then = std::move(f);
  }

  absl::Mutex mu;
  int in_flight ABSL_GUARDED_BY(mu) = 0;
  absl::Status first_error ABSL_GUARDED_BY(mu);
  std::function<void(absl::Status)> then ABSL_GUARDED_BY(mu);
};

// A message staged for another node: its tx block (released when TensorPipe is done) and the
// pinned staging its CUDA tensors were copied to. Tensors larger than cuda_chunk_bytes go in
// chunks: each chunk's device-to-host copy runs on its own (StartChunks), and the agent
// writes a chunk once its copy completed (WhenReady).
struct CallRouter::StagedOut {
  struct Chunk {
    CudaCopies::Copy copy;
    bool done = false;
    absl::Status status;
    agent::ChunkReady waiting;  // the agent's, if it asked before the copy completed
  };

  ~StagedOut() {
    for (uint64_t address : staging) cuda->FreeStaging(address);
  }

  // Issues every chunk's copy (after the message's other copies: a stream runs in order).
  static void StartChunks(const std::shared_ptr<StagedOut>& self) {
    std::vector<std::pair<std::pair<size_t, uint64_t>, CudaCopies::Copy>> copies;
    {
      absl::MutexLock lock(&self->mu);
      for (const auto& [key, chunk] : self->chunks) copies.emplace_back(key, chunk.copy);
    }
    for (const auto& [key, copy] : copies) {
      self->cuda->Run(
          {copy}, {self, self->source},
          [self, key = key](absl::Status status) {
            agent::ChunkReady ready;
            {
              absl::MutexLock lock(&self->mu);
              Chunk& chunk = self->chunks[key];
              chunk.done = true;
              chunk.status = status;
              ready = std::move(chunk.waiting);
            }
            if (ready) ready(std::move(status));
          });
    }
  }

  void WhenReady(size_t tensor, uint64_t offset, agent::ChunkReady ready) {
    absl::Status status;
    {
      absl::MutexLock lock(&mu);
      auto it = chunks.find({tensor, offset});
      if (it == chunks.end()) {
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

  std::shared_ptr<TxBlock> tx;
  CudaCopies* cuda = nullptr;
  std::shared_ptr<SessionMemory> source;  // the sender's exported memory, mapped while copied
  std::vector<uint64_t> staging;
  absl::Mutex mu;
  std::map<std::pair<size_t, uint64_t>, Chunk> chunks ABSL_GUARDED_BY(mu);  // (tensor, offset)
};

struct CallRouter::TxBlock {
  // Built in place only: a moved-from copy would release the block early.
  TxBlock(CallRouter* router, std::shared_ptr<Session> session, uint64_t offset)
      : router(router), session(std::move(session)), offset(offset) {}
  TxBlock(const TxBlock&) = delete;
  TxBlock& operator=(const TxBlock&) = delete;

  CallRouter* const router;
  const std::shared_ptr<Session> session;
  const uint64_t offset;
  ~TxBlock() { router->Release(session, offset); }
};

CallRouter::CallRouter(CallRouterOptions options) : options_(std::move(options)) {
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

absl::Status CallRouter::Attach(const std::string& session_id, uid_t uid,
                               std::shared_ptr<shm::Segment> segment) {
  auto session = std::make_shared<Session>();
  session->id = session_id;
  session->handle = SessionHandle(session_id);
  session->limits = {options_.max_unposted, options_.max_waiting_calls};
  session->cuda_allowed = CheckGpuAccess(uid, options_.device_dir);
  const shm::Layout& layout = segment->layout();
  session->submissions = std::make_unique<shm::RingConsumer>(
      segment->base(), layout.submission,
      absl::StrCat("submission ring of session ", session->handle), kSessionSpin);
  {
    absl::MutexLock lock(&session->mu);
    session->completions = std::make_unique<shm::RingProducer>(
        segment->base(), layout.completion,
        absl::StrCat("completion ring of session ", session->handle));
    session->rx = std::make_unique<shm::HeapAllocator>(
        absl::StrCat("rx heap of session ", session->handle), layout.rx_heap);
  }
  session->segment = std::move(segment);
  if (options_.cuda != nullptr) session->cuda = options_.cuda->NewSession(session->handle);
  absl::MutexLock lock(&mu_);
  if (stopping_) return StoppingError();
  // Past a pids limit (or RLIMIT_NPROC) the start throws; the daemon refuses this session and
  // keeps serving the others.
  try {
    session->thread = std::thread([this, session] { Serve(session); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot start a thread for session ", session->handle, ": ", e.what(),
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
  }
  session->stop = true;
  if (session->thread.joinable()) session->thread.join();
  {
    absl::MutexLock lock(&session->mu);  // no one writes into its segment after this
    session->broken = true;
  }
  // Its calls' answers have no one to go to; calls it serves are answered here.
  std::vector<Pending> orphans;
  for (Pending& p : pending_.TakeOfSession(session_id)) {
    if (p.callee == session_id && p.caller != session_id) orphans.push_back(std::move(p));
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto it = outgoing_.lower_bound({session_id, 0});
         it != outgoing_.end() && it->first.first == session_id;) {
      it = outgoing_.erase(it);
    }
  }
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
    // Status never waits on a session's lock: it shows the last value read when busy.
    if (session->mu.TryLock()) {
      session->rx_used_seen = session->rx->GetStats().used_bytes;
      session->mu.Unlock();
    }
    stats.rx_heap_used = session->rx_used_seen.load();
    if (session->cuda != nullptr) stats.cuda = options_.cuda->SessionStats(*session->cuda);
    out.push_back(std::move(stats));
  }
  return out;
}

size_t CallRouter::Drain(absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
  }
  // No new call starts now: what is in flight only ends.
  pending_.AwaitNone(deadline);
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outgoing_.empty(); };
  mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  return pending_.size() + outgoing_.size();
}

absl::Status CallRouter::StoppingError() const {
  return absl::UnavailableError(absl::StrCat(
      "the tpd daemon on node ", options_.node, " is stopping and takes no new calls"));
}

void CallRouter::Serve(std::shared_ptr<Session> session) {
  pthread_setname_np(pthread_self(), "tpd-session");
  shm::Descriptor batch[64];
  while (!session->stop) {
    // What waits for room on the completion ring is retried soon: the client that made room
    // does not ring the daemon.
    const absl::Duration wait =
        session->unposted_count.load() > 0 ? kBacklogInterval : kPollInterval;
    absl::StatusOr<bool> ready = session->submissions->WaitForData(absl::Now() + wait);
    absl::StatusOr<size_t> n = ready.ok() ? session->submissions->TryPopBatch(batch) : ready.status();
    if (!n.ok()) {
      EndSession(*session, n.status().ToString());
      break;
    }
    for (size_t i = 0; i < *n && !session->stop; ++i) Handle(session, batch[i]);
    std::string ring_error;
    {
      absl::MutexLock lock(&session->mu);
      session->FlushUnposted();
      ring_error = session->ring_error;
    }
    if (!ring_error.empty()) {
      EndSession(*session, ring_error);
      break;
    }
  }
}

void CallRouter::Handle(const std::shared_ptr<Session>& session, const shm::Descriptor& d) {
  const shm::Layout& layout = session->segment->layout();
  // A device pool is answered like a call.
  const bool call = (d.op == static_cast<uint8_t>(shm::Op::kCall) ||
                     d.op == static_cast<uint8_t>(shm::Op::kDevicePool)) &&
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
  switch (static_cast<shm::Op>(d.op)) {
    case shm::Op::kCall:
      if (session->calls_in_flight.load() > options_.max_calls_in_flight) {
        Release(session, d.payload_offset);
        Fail(session, d.call_id,
             absl::ResourceExhaustedError(absl::StrCat(
                 "this session has data.max_calls_in_flight (", options_.max_calls_in_flight,
                 ") calls waiting for replies; wait for some before making more")));
        return;
      }
      HandleCall(session, d);
      break;
    case shm::Op::kReply:
      HandleReply(session, d);
      break;
    case shm::Op::kRelease: {
      if (d.device_pool != 0) {
        absl::Status freed =
            session->cuda == nullptr
                ? absl::FailedPreconditionError("no CUDA on this node: nothing was lent")
                : options_.cuda->FreePool(*session->cuda, static_cast<int>(d.device_pool - 1),
                                          d.payload_offset);
        if (!freed.ok()) Warn(*session, "release", freed);
        break;
      }
      absl::MutexLock lock(&session->mu);
      absl::Status freed = session->rx->Free(d.payload_offset);
      if (!freed.ok()) Warn(*session, "release", freed);
      break;
    }
    case shm::Op::kCancel:
      HandleCancel(session, d);
      break;
    case shm::Op::kDevicePool:
      HandleDevicePool(session, d);
      break;
  }
}

void CallRouter::HandleDevicePool(const std::shared_ptr<Session>& session,
                                  const shm::Descriptor& d) {
  shm::DevicePoolRecord record;
  // ValidateDescriptor checked the payload is one record inside the tx heap.
  std::memcpy(&record, session->segment->base() + d.payload_offset, sizeof(record));
  Release(session, d.payload_offset);
  absl::Status lent = !session->cuda_allowed.ok() ? session->cuda_allowed
                      : session->cuda == nullptr
                          ? absl::FailedPreconditionError(absl::StrCat(
                                "receive pool on cuda:", record.device, " refused: ",
                                options_.no_cuda))
                          : options_.cuda->AddPool(*session->cuda, record);
  if (!lent.ok()) Warn(*session, "receive pool", lent);
  Fail(session, d.call_id, lent);
}

absl::StatusOr<std::vector<CallRouter::Place>> CallRouter::PlaceTensors(
    const std::string& group, const std::string& from, const std::string& to, bool reply,
    const std::vector<shm::TensorEntry>& tensors) {
  if (tensors.empty()) return std::vector<Place>{};
  std::optional<v1::DeviceMap> map =
      options_.device_map ? options_.device_map(group, from, to, reply) : std::nullopt;
  bool on_device = false;
  std::vector<Place> places(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const shm::TensorEntry& entry = tensors[i];
    const bool cuda = entry.device_type == static_cast<uint8_t>(shm::DeviceType::kCuda);
    const std::string device = cuda ? absl::StrCat("cuda:", entry.device_index) : "cpu";
    std::optional<std::string> target;
    if (map) {
      auto it = map->devices().find(device);
      if (it != map->devices().end()) target = it->second;
    }
    if (!target || (!cuda && *target == "cpu")) {
      if (!cuda) continue;  // a cpu tensor with no cpu entry (or cpu -> cpu) stays on the cpu
      // PyTorch's wording (tensorpipe_utils.cpp, getDevicesForTensors).
      return absl::InvalidArgumentError(absl::StrCat(
          "TensorPipe RPC backend only supports CPU tensors by default, please move your "
          "tensors to CPU before sending them over RPC, or call `set_device_map` on "
          "`TensorPipeRpcBackendOptions` to explicitly configure device mapping. Request "
          "device mapping is not available for destination ",
          to, " for device ", device, " but received a tensor on that device."));
    }
    on_device = true;
    if (*target == "cpu") continue;
    int index = -1;
    if (!absl::StartsWith(*target, "cuda:") ||
        !absl::SimpleAtoi(absl::string_view(*target).substr(5), &index) || index < 0) {
      return absl::InternalError(absl::StrCat("group ", group, ": negotiated device map of ",
                                              from, " names device ", *target));
    }
    places[i].device = index;
  }
  if (!on_device) return std::vector<Place>{};
  return places;
}

void CallRouter::DeliverDevices(const std::shared_ptr<Session>& from, const std::string& prefix0,
                                const std::string& prefix1, const std::string& prefix2,
                                const std::string& prefix3, uint32_t code, uint64_t body_offset,
                                uint64_t body_length,
                                const std::vector<shm::TensorEntry>& tensors,
                                const std::vector<Place>& places,
                                const std::shared_ptr<Session>& to, shm::Op op,
                                uint64_t call_id, uint16_t flags, int64_t deadline_ns,
                                std::function<void(absl::Status)> after) {
  CudaCopies* const cuda = options_.cuda;
  if (cuda == nullptr || from->cuda == nullptr || to->cuda == nullptr) {
    after(absl::FailedPreconditionError(absl::StrCat(
        "a message with CUDA tensors or device maps cannot be delivered: ", options_.no_cuda)));
    return;
  }
  // Sources: the exported allocations opened (once per session), host bytes where they lie.
  const size_t n = tensors.size();
  std::vector<CopyEnd> sources(n);
  uint8_t* const in = from->segment->base();
  for (size_t i = 0; i < n; ++i) {
    const shm::TensorEntry& entry = tensors[i];
    if (entry.length == 0) continue;
    if (entry.device_type != static_cast<uint8_t>(shm::DeviceType::kCuda)) {
      sources[i] = CopyEnd{reinterpret_cast<uint64_t>(in + entry.offset), -1};
      continue;
    }
    shm::CudaExport record;
    std::memcpy(&record, in + entry.device_handle, sizeof(record));  // validated in the tx heap
    absl::StatusOr<CudaCopies::Source> source =
        cuda->Resolve(*from->cuda, entry, record, static_cast<uint32_t>(i));
    if (!source.ok()) {
      after(source.status());
      return;
    }
    sources[i] = source->end;
  }
  std::vector<uint64_t> host_bytes(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (places[i].device < 0) host_bytes[i] = tensors[i].length;
  }
  const BlockPlan plan = PlanBlock(
      shm::MessagePrefixBytes(prefix0.size(), prefix1.size(), prefix2.size(), prefix3.size()),
      body_length, host_bytes);
  std::vector<std::pair<int, uint64_t>> pool_blocks;  // (device, offset)
  std::vector<CudaCopies::Copy> copies;
  uint64_t block = 0;
  absl::Status placed;
  {
    absl::MutexLock lock(&to->mu);
    placed = to->broken ? to->EndedError() : absl::OkStatus();
    if (placed.ok()) {
      absl::StatusOr<uint64_t> allocated = to->rx->Allocate(plan.total);
      if (allocated.ok()) block = *allocated;
      placed = allocated.status();
    }
    uint8_t* const out = to->segment->base() + block;
    for (size_t i = 0; i < n && placed.ok(); ++i) {
      shm::TensorEntry entry = tensors[i];
      entry.device_handle = 0;
      if (places[i].device >= 0) {
        entry.device_type = static_cast<uint8_t>(shm::DeviceType::kCuda);
        entry.device_index = static_cast<uint32_t>(places[i].device);
        entry.offset = 0;
        if (entry.length > 0) {
          absl::StatusOr<uint64_t> pool =
              cuda->AllocatePool(*to->cuda, places[i].device, entry.length);
          // Mapped in the context of the device that runs the copy: the source's, or the
          // pool's own for host sources.
          const int via = sources[i].device >= 0 ? sources[i].device : places[i].device;
          absl::StatusOr<CopyEnd> dst =
              pool.ok() ? cuda->PoolAddress(*to->cuda, places[i].device, *pool, via)
                        : pool.status();
          if (!dst.ok()) {
            if (pool.ok()) (void)cuda->FreePool(*to->cuda, places[i].device, *pool);
            placed = dst.status();
            break;
          }
          pool_blocks.push_back({places[i].device, *pool});
          entry.offset = *pool;
          copies.push_back({*dst, sources[i], entry.length});
        }
      } else {
        entry.device_type = static_cast<uint8_t>(shm::DeviceType::kCpu);
        entry.device_index = 0;
        entry.offset = entry.length == 0 ? 0 : block + plan.at[i];
        if (entry.length > 0) {
          if (sources[i].device < 0) {
            std::memcpy(out + plan.at[i], in + tensors[i].offset, entry.length);
          } else {
            copies.push_back({CopyEnd{reinterpret_cast<uint64_t>(out + plan.at[i]), -1},
                              sources[i], entry.length});
          }
        }
      }
      std::memcpy(out + plan.table + i * sizeof(entry), &entry, sizeof(entry));
    }
    if (!placed.ok()) {
      if (block != 0) (void)to->rx->Free(block);
      for (const auto& [device, offset] : pool_blocks) (void)cuda->FreePool(*to->cuda, device, offset);
    } else {
      shm::WriteMessagePrefix(out, code, prefix0, prefix1, prefix2, prefix3);
      if (body_length > 0) std::memcpy(out + plan.prefix, in + body_offset, body_length);
    }
  }
  if (!placed.ok()) {
    after(placed);  // outside to's lock: it answers the caller, who may be `to`
    return;
  }
  const shm::Descriptor posted = shm::MessageDescriptor(
      op, call_id, {block, plan.payload, plan.table, static_cast<uint32_t>(n)}, flags, deadline_ns);
  std::vector<std::shared_ptr<const void>> keep = {from->cuda, to->cuda, from->segment,
                                                   to->segment};
  cuda->Run(std::move(copies), std::move(keep),
            [this, to, posted, pool_blocks, after = std::move(after)](absl::Status copied) {
              absl::Status status = copied;
              {
                absl::MutexLock lock(&to->mu);
                if (status.ok()) status = to->Post(posted);
                if (!status.ok()) {
                  if (!to->broken) (void)to->rx->Free(posted.payload_offset);
                  for (const auto& [device, offset] : pool_blocks) {
                    (void)options_.cuda->FreePool(*to->cuda, device, offset);
                  }
                }
              }
              after(status);
            });
}

void CallRouter::HandleCall(const std::shared_ptr<Session>& session, const shm::Descriptor& d) {
  absl::StatusOr<Submitted> call = ReadSubmitted(*session->segment, d, session->cuda_allowed);
  if (!call.ok()) {
    Release(session, d.payload_offset);
    Fail(session, d.call_id, call.status());
    return;
  }
  const shm::ParsedMessage& message = call->message;
  const std::string& group = message.names[0];
  const std::string& worker = message.names[1];
  const std::string& method = message.names[2];
  const std::string& from = message.names[3];
  bool draining;
  {
    absl::MutexLock lock(&mu_);
    draining = draining_;
  }
  if (draining) {
    Release(session, d.payload_offset);
    Fail(session, d.call_id,
         absl::Status(absl::StatusCode::kUnavailable,
                      absl::StrCat(CallName(worker, method), ": ", StoppingError().message())));
    return;
  }
  if (from.empty() || options_.lookup(group, from) != session->id) {
    Release(session, d.payload_offset);
    Fail(session, d.call_id,
         absl::PermissionDeniedError(absl::StrCat(
             "this session holds no worker '", from, "' in group '", group,
             "' on this daemon: a caller must have joined the group it calls into")));
    return;
  }
  absl::StatusOr<std::vector<Place>> places =
      PlaceTensors(group, from, worker, /*reply=*/false, call->tensors);
  if (!places.ok()) {
    Release(session, d.payload_offset);
    Fail(session, d.call_id, Prefixed(places.status(), CallName(worker, method), ": "));
    return;
  }
  std::optional<std::string> target = options_.lookup(group, worker);
  std::shared_ptr<Session> callee = target ? Find(*target) : nullptr;
  if (callee == nullptr) {
    std::optional<v1::Member> member =
        target ? std::nullopt : options_.member(group, worker, nullptr);
    if (member && member->node() != options_.node) {
      CallRemote(session, d, *call, *places, *member);
      return;
    }
    Release(session, d.payload_offset);
    Fail(session, d.call_id,
         target || member
             ? absl::UnavailableError(absl::StrCat(
                   "worker '", worker, "' of group '", group,
                   "' is held by a session that is not attached to shared memory (it has not "
                   "called Handle or Call yet, or it ended)"))
             : absl::NotFoundError(absl::StrCat("worker '", worker,
                                                "' is not a member of group '", group, "'")));
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
  const uint64_t id = pending_.Add(pending);
  if (!places->empty()) {
    const uint64_t tx = d.payload_offset;
    const uint64_t caller_call_id = d.call_id;
    DeliverDevices(session, group, worker, method, from, 0, message.body_offset,
                   message.body_length, call->tensors, *places, callee, shm::Op::kCall, id, 0,
                   d.deadline_unix_ns,
                   [this, session, tx, id, caller_call_id, worker, method](absl::Status delivered) {
                     Release(session, tx);
                     if (delivered.ok()) return;
                     if (pending_.Take(id)) {
                       Fail(session, caller_call_id,
                            Prefixed(delivered, CallName(worker, method), ": "));
                     }
                   });
    return;
  }
  absl::Status delivered =
      Deliver(*session, group, worker, method, from, 0, message.body_offset, message.body_length,
              call->tensors, *callee, shm::Op::kCall, id, 0, d.deadline_unix_ns);
  Release(session, d.payload_offset);
  if (!delivered.ok() && pending_.Take(id)) {
    Fail(session, d.call_id, Prefixed(delivered, CallName(worker, method), ": "));
  }
}

void CallRouter::CallRemote(const std::shared_ptr<Session>& session, const shm::Descriptor& d,
                            const Submitted& call, const std::vector<Place>& places,
                            const v1::Member& member) {
  const shm::ParsedMessage& message = call.message;
  const std::string& worker = message.names[1];
  const std::string& method = message.names[2];
  absl::StatusOr<std::string> address =
      options_.agent == nullptr
          ? absl::UnavailableError(absl::StrCat(
                "worker '", worker, "' is on node ", member.node(),
                " and this daemon has no agent for calls to other nodes (set "
                "peer.listen_address and peer.token)"))
          : options_.check_address(member.agent_address());
  if (!address.ok()) {
    Release(session, d.payload_offset);
    Fail(session, d.call_id,
         Prefixed(address.status(), CallName(worker, method), " on node ", member.node(), ": "));
    return;
  }
  agent::Message request;
  v1::AgentMessage& header = request.header;
  header.set_group(message.names[0]);
  header.set_target_worker(worker);
  header.set_method(method);
  header.set_source_worker(message.names[3]);
  // Who calls, as this daemon knows it (HandleCall checked the caller holds this member): the
  // callee's daemon serves the call only if its own view agrees.
  int64_t version = 0;
  if (std::optional<v1::Member> source = options_.member(message.names[0], message.names[3],
                                                         &version)) {
    header.set_source_incarnation(source->incarnation());
  }
  header.set_group_version(version);
  std::vector<CudaCopies::Copy> copies;
  std::shared_ptr<StagedOut> chunked;
  if (places.empty()) {
    ReferInPlace(session->segment->base(), call, &request);
    // TensorPipe reads the tx block in place; back to the client when TensorPipe is done.
    request.keepalive = std::make_shared<TxBlock>(this, session, d.payload_offset);
  } else if (absl::Status staged = StageOut(session, d.payload_offset, call, places, &request,
                                            &copies, &chunked);
             !staged.ok()) {
    Fail(session, d.call_id,
         Prefixed(staged, CallName(worker, method), " on node ", member.node(), ": "));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    outgoing_[{session->id, d.call_id}] = Outgoing{member.node(), worker, method};
  }
  const absl::Time deadline = d.deadline_unix_ns == 0 ? absl::InfiniteFuture()
                                                      : absl::FromUnixNanos(d.deadline_unix_ns);
  const uint64_t call_id = d.call_id;
  std::weak_ptr<Session> weak = session;
  agent::Allocator place_reply = [this, weak](const v1::AgentMessage& reply, size_t payload_size,
                                              absl::Span<const size_t> sizes)
      -> absl::StatusOr<agent::Destination> {
    std::shared_ptr<Session> caller = weak.lock();
    if (caller == nullptr) return absl::UnavailableError("the caller's session ended");
    const bool error = reply.kind() == v1::AgentMessage::ERROR;
    return PlaceIncoming(caller, "", "", error ? reply.status_message() : "", "",
                         error ? static_cast<uint32_t>(reply.status_code()) : 0, payload_size,
                         reply, sizes);
  };
  const agent::PeerId peer{member.node(), *address};
  auto send = [this, weak, call_id, peer, deadline, place_reply](agent::Message request) {
    options_.agent->Send(
        peer, std::move(request), deadline,
        // Weak: a caller that went away must not keep its segment mapped while a reply that
        // has nowhere to go is awaited.
        [this, weak, call_id](absl::StatusOr<agent::Message> reply) {
          if (std::shared_ptr<Session> caller = weak.lock()) {
            OnRemoteReply(caller, call_id, std::move(reply));
          }
        },
        place_reply);
  };
  // Sent once the unchunked CUDA tensors are in pinned staging; chunks follow as their
  // copies, issued after those, complete.
  if (copies.empty()) {
    send(std::move(request));
  } else {
    auto staged = std::make_shared<agent::Message>(std::move(request));
    options_.cuda->Run(std::move(copies), {session->cuda},
                       [this, send, staged, weak, call_id](absl::Status copied) {
                         if (copied.ok()) {
                           send(std::move(*staged));
                           return;
                         }
                         std::shared_ptr<Session> caller = weak.lock();
                         if (caller == nullptr) return;
                         std::optional<Outgoing> call;
                         {
                           absl::MutexLock lock(&mu_);
                           auto it = outgoing_.find({caller->id, call_id});
                           if (it != outgoing_.end()) {
                             call = std::move(it->second);
                             outgoing_.erase(it);
                           }
                         }
                         if (call) {
                           Fail(caller, call_id,
                                Prefixed(copied, CallName(call->worker, call->method), " on node ",
                                         call->node, ": "));
                         }
                       });
  }
  if (chunked != nullptr) StagedOut::StartChunks(chunked);
}

absl::Status CallRouter::StageOut(const std::shared_ptr<Session>& session, uint64_t tx_offset,
                                  const Submitted& submitted, const std::vector<Place>& places,
                                  agent::Message* out, std::vector<CudaCopies::Copy>* copies,
                                  std::shared_ptr<StagedOut>* chunked) {
  auto staged = std::make_shared<StagedOut>();
  staged->tx = std::make_shared<TxBlock>(this, session, tx_offset);
  staged->cuda = options_.cuda;
  staged->source = session->cuda;
  uint8_t* const base = session->segment->base();
  out->payload = {base + submitted.message.body_offset, submitted.message.body_length};
  for (size_t i = 0; i < submitted.tensors.size(); ++i) {
    const shm::TensorEntry& entry = submitted.tensors[i];
    *out->header.add_tensors() = ToWire(entry, places[i].device);
    if (entry.length == 0) {
      out->tensors.push_back({nullptr, 0});
      continue;
    }
    if (entry.device_type != static_cast<uint8_t>(shm::DeviceType::kCuda)) {
      out->tensors.push_back({base + entry.offset, entry.length});
      continue;
    }
    if (options_.cuda == nullptr || session->cuda == nullptr) {
      return absl::FailedPreconditionError(options_.no_cuda);
    }
    shm::CudaExport record;
    std::memcpy(&record, base + entry.device_handle, sizeof(record));  // validated in the tx heap
    absl::StatusOr<CudaCopies::Source> source =
        options_.cuda->Resolve(*session->cuda, entry, record, static_cast<uint32_t>(i));
    if (!source.ok()) return source.status();
    absl::StatusOr<uint64_t> staging = options_.cuda->AllocateStaging(entry.length);
    if (!staging.ok()) return staging.status();
    staged->staging.push_back(*staging);
    out->tensors.push_back({reinterpret_cast<void*>(*staging), entry.length});
    const uint64_t step = options_.cuda_chunk_bytes;
    if (step == 0 || entry.length <= step) {
      copies->push_back({CopyEnd{*staging, -1}, source->end, entry.length});
      continue;
    }
    out->header.mutable_tensors(static_cast<int>(i))->set_chunk_bytes(step);
    absl::MutexLock lock(&staged->mu);
    for (uint64_t offset = 0; offset < entry.length; offset += step) {
      const uint64_t length = std::min(step, entry.length - offset);
      staged->chunks[{i, offset}].copy = {CopyEnd{*staging + offset, -1},
                                          CopyEnd{source->end.address + offset, source->end.device},
                                          length};
    }
  }
  out->when_chunk_ready = [staged](size_t tensor, uint64_t offset, uint64_t,
                                   agent::ChunkReady ready) {
    staged->WhenReady(tensor, offset, std::move(ready));
  };
  *chunked = staged;
  out->keepalive = std::move(staged);
  return absl::OkStatus();
}

void CallRouter::OnRemoteReply(const std::shared_ptr<Session>& caller, uint64_t call_id,
                               absl::StatusOr<agent::Message> reply) {
  Outgoing call;
  {
    absl::MutexLock lock(&mu_);
    auto it = outgoing_.find({caller->id, call_id});
    if (it == outgoing_.end()) return;  // cancelled, or its node was lost: answered already
    call = std::move(it->second);
    outgoing_.erase(it);
  }
  if (!reply.ok()) {
    Fail(
        caller, call_id,
        Prefixed(reply.status(), CallName(call.worker, call.method), " on node ", call.node, ": "));
    return;
  }
  auto block = std::static_pointer_cast<const RxBlock>(reply->keepalive);
  const bool error = reply->header.kind() == v1::AgentMessage::ERROR;
  const shm::Descriptor posted = shm::MessageDescriptor(shm::Op::kReply, call_id, block->Placed(),
                                                        error ? shm::kFlagError : 0);
  LandOnDevices(block, [this, block, caller, posted, call_id, call](absl::Status status) {
    if (status.ok()) {
      absl::MutexLock lock(&caller->mu);
      status = caller->Post(posted);
      if (status.ok()) block->posted = true;
    }
    if (!status.ok()) {
      Fail(caller, call_id,
           Prefixed(status, "reply of worker '", call.worker, "' to method '", call.method, "': "));
    }
  });
}

absl::StatusOr<agent::Destination> CallRouter::PlaceIncoming(
    const std::shared_ptr<Session>& to, const std::string& n0, const std::string& n1,
    const std::string& n2, const std::string& n3, uint32_t code, size_t payload_size,
    const v1::AgentMessage& header, absl::Span<const size_t> tensor_sizes) {
  if (static_cast<size_t>(header.tensors_size()) != tensor_sizes.size() ||
      tensor_sizes.size() > shm::kMaxTensorsPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the message has ", tensor_sizes.size(), " tensors (at most ",
        shm::kMaxTensorsPerMessage, ") and ", header.tensors_size(), " descriptors"));
  }
  for (const std::string* name : {&n0, &n1, &n2, &n3}) {
    if (name->size() > shm::kMaxMessageName) {
      return absl::InvalidArgumentError(
          absl::StrCat("a name of ", name->size(), " bytes exceeds ", shm::kMaxMessageName));
    }
  }
  auto block = std::make_shared<RxBlock>();
  block->session = to;
  std::vector<uint64_t> bytes(tensor_sizes.begin(), tensor_sizes.end());
  std::vector<int> targets(tensor_sizes.size(), -1);
  bool on_device = false;
  for (size_t i = 0; i < tensor_sizes.size(); ++i) {
    absl::StatusOr<shm::TensorEntry> entry = FromWire(
        header.tensors(static_cast<int>(i)), tensor_sizes[i], static_cast<int>(i), &targets[i]);
    if (!entry.ok()) return entry.status();
    if (code != 0) targets[i] = -1;  // an error's tensors are never read: no pool block for them
    block->tensors.push_back(*entry);
    if (targets[i] >= 0) {
      bytes[i] = 0;  // in the session's receive pool, not its rx heap
      on_device = true;
    }
  }
  if (on_device) {
    if (options_.cuda == nullptr || to->cuda == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CUDA tensors for worker '", header.target_worker(), "': ", options_.no_cuda));
    }
    block->cuda = options_.cuda;
    block->staging.assign(tensor_sizes.size(), 0);
    block->chunked.assign(tensor_sizes.size(), false);
    block->landing = std::make_shared<Landing>();
    // Pool blocks and staging first, outside the session's lock; freed by the block if
    // anything below fails.
    for (size_t i = 0; i < tensor_sizes.size(); ++i) {
      shm::TensorEntry& entry = block->tensors[i];
      if (targets[i] < 0) continue;
      entry.device_type = static_cast<uint8_t>(shm::DeviceType::kCuda);
      entry.device_index = static_cast<uint32_t>(targets[i]);
      if (entry.length == 0) continue;
      absl::StatusOr<uint64_t> staging = options_.cuda->AllocateStaging(entry.length);
      if (!staging.ok()) return staging.status();
      absl::StatusOr<uint64_t> pool =
          options_.cuda->AllocatePool(*to->cuda, targets[i], entry.length);
      if (!pool.ok()) {
        options_.cuda->FreeStaging(*staging);
        return Prefixed(pool.status(), "worker '", header.target_worker(), "': ");
      }
      block->staging[i] = *staging;
      block->chunked[i] = header.tensors(static_cast<int>(i)).chunk_bytes() > 0;
      entry.offset = *pool;
    }
  }
  block->plan = PlanBlock(shm::MessagePrefixBytes(n0.size(), n1.size(), n2.size(), n3.size()),
                          payload_size, bytes);
  agent::Destination destination;
  {
    absl::MutexLock lock(&to->mu);
    if (to->broken) return to->EndedError();
    absl::StatusOr<uint64_t> offset = to->rx->Allocate(block->plan.total);
    if (!offset.ok()) return offset.status();
    block->offset = *offset;
    uint8_t* out = to->segment->base() + *offset;
    shm::WriteMessagePrefix(out, code, n0, n1, n2, n3);
    for (size_t i = 0; i < block->tensors.size(); ++i) {
      shm::TensorEntry& entry = block->tensors[i];
      if (targets[i] >= 0) {
        std::memcpy(out + block->plan.table + i * sizeof(entry), &entry, sizeof(entry));
        destination.tensors.push_back(entry.length == 0 ? nullptr
                                                        : reinterpret_cast<void*>(block->staging[i]));
        continue;
      }
      entry.offset = entry.length == 0 ? 0 : *offset + block->plan.at[i];
      std::memcpy(out + block->plan.table + i * sizeof(entry), &entry, sizeof(entry));
      destination.tensors.push_back(entry.length == 0 ? nullptr : out + block->plan.at[i]);
    }
    destination.payload = payload_size == 0 ? nullptr : out + block->plan.prefix;
  }
  if (on_device) {
    // Each chunk bound for a device goes on into the pool as soon as it is in staging.
    std::shared_ptr<const RxBlock> landing_block = block;
    destination.on_chunk = [landing_block](size_t tensor, uint64_t offset, uint64_t length) {
      const RxBlock& b = *landing_block;
      if (tensor >= b.staging.size() || b.staging[tensor] == 0) return;  // host memory
      const shm::TensorEntry& entry = b.tensors[tensor];
      const int device = static_cast<int>(entry.device_index);
      b.landing->Add();
      absl::StatusOr<CopyEnd> dst =
          b.cuda->PoolAddress(*b.session->cuda, device, entry.offset + offset, device);
      if (!dst.ok()) {
        b.landing->Done(dst.status());
        return;
      }
      std::shared_ptr<Landing> landing = b.landing;
      b.cuda->Run({{*dst, CopyEnd{b.staging[tensor] + offset, -1}, length}},
                  {landing_block, b.session->cuda},
                  [landing](absl::Status status) { landing->Done(status); });
    };
  }
  destination.keepalive = std::move(block);
  return destination;
}

agent::Handler CallRouter::AgentHandler() {
  agent::Handler handler;
  handler.allocate = [this](const v1::AgentMessage& header, size_t payload_size,
                            absl::Span<const size_t> sizes) -> absl::StatusOr<agent::Destination> {
    {
      absl::MutexLock lock(&mu_);
      if (draining_) return StoppingError();
    }
    std::optional<std::string> target = options_.lookup(header.group(), header.target_worker());
    std::shared_ptr<Session> callee = target ? Find(*target) : nullptr;
    if (callee == nullptr) {
      return target ? absl::UnavailableError(absl::StrCat(
                          "worker '", header.target_worker(), "' of group '", header.group(),
                          "' is held by a session not attached to shared memory on node ",
                          options_.node))
                    : absl::NotFoundError(absl::StrCat(
                          "worker '", header.target_worker(), "' is not a member of group '",
                          header.group(), "' on node ", options_.node));
    }
    return PlaceIncoming(callee, header.group(), header.target_worker(), header.method(),
                         header.source_worker(), 0, payload_size, header, sizes);
  };
  handler.deliver = [this](agent::InboundRequest request) {
    OnRemoteRequest(std::move(request));
  };
  return handler;
}

absl::Status CallRouter::CheckRemoteCaller(const v1::AgentMessage& header,
                                           const std::string& node, int64_t* version_read) {
  int64_t version = 0;
  std::optional<v1::Member> source =
      options_.member(header.group(), header.source_worker(), &version);
  if (version_read != nullptr) *version_read = version;
  if (source && source->node() == node && source->incarnation() == header.source_incarnation()) {
    return absl::OkStatus();
  }
  std::string known;
  if (!source) {
    known = absl::StrCat("its version ", version, " has no such member");
  } else if (source->node() != node) {
    known = absl::StrCat("it has that worker on node ", source->node());
  } else {
    known = absl::StrCat("it has that worker in incarnation ", source->incarnation(), ", not ",
                         header.source_incarnation());
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "worker '", header.source_worker(), "' of node ", node, " is not a member of group '",
      header.group(), "' as node ", options_.node, " knows the group (", known,
      "): a worker serves only members of its own group"));
}

void CallRouter::OnRemoteRequest(agent::InboundRequest request) {
  // The peer is an authenticated daemon, but what it says of the group comes from the store
  // it reads, which a client may have chosen: only this daemon's own view of the group admits
  // the caller (docs/security.md, "Who may call a worker").
  const v1::AgentMessage& header = request.message.header;
  int64_t have = 0;
  absl::Status admitted = CheckRemoteCaller(header, request.node, &have);
  if (admitted.ok() || header.group_version() <= have || !options_.when_version) {
    ServeRemoteRequest(std::move(request), admitted);
    return;
  }
  // The caller's daemon has read a version this one has not (the caller may have just
  // joined): decide once this daemon has read it too, or when the wait ends.
  auto held = std::make_shared<agent::InboundRequest>(std::move(request));
  const absl::Time until = std::min(held->deadline, absl::Now() + kCatchUpWait);
  const std::string group = held->message.header.group();
  const int64_t version = held->message.header.group_version();
  options_.when_version(group, version, until, [this, held](bool) {
    const absl::Status checked = CheckRemoteCaller(held->message.header, held->node, nullptr);
    ServeRemoteRequest(std::move(*held), checked);
  });
}

void CallRouter::ServeRemoteRequest(agent::InboundRequest request, const absl::Status& admitted) {
  const v1::AgentMessage& header = request.message.header;
  auto block = std::static_pointer_cast<const RxBlock>(request.message.keepalive);
  if (!admitted.ok()) {
    RespondError(request.reply_to, admitted);
    return;
  }
  const std::shared_ptr<Session>& callee = block->session;
  Pending pending;
  pending.remote = request.reply_to;
  pending.callee = callee->id;
  pending.group = header.group();
  pending.from = header.source_worker();
  pending.worker = header.target_worker();
  pending.method = header.method();
  pending.deadline = request.deadline;
  const uint64_t id = pending_.Add(pending);
  const shm::Descriptor posted = shm::MessageDescriptor(
      shm::Op::kCall, id, block->Placed(), 0,
      request.deadline == absl::InfiniteFuture() ? 0 : absl::ToUnixNanos(request.deadline));
  const agent::ReplyTo reply_to = request.reply_to;
  LandOnDevices(block, [this, block, callee, posted, id, reply_to, pending](absl::Status status) {
    if (status.ok()) {
      absl::MutexLock lock(&callee->mu);
      status = callee->Post(posted);
      if (status.ok()) block->posted = true;
    }
    if (status.ok()) return;
    if (pending_.Take(id)) {
      RespondError(reply_to, Prefixed(status, CallName(pending.worker, pending.method), " on node ",
                                      options_.node, ": "));
    }
  });
}

void CallRouter::LandOnDevices(const std::shared_ptr<const RxBlock>& block,
                               std::function<void(absl::Status)> post) {
  if (block->staging.empty()) {
    post(absl::OkStatus());
    return;
  }
  // The chunks' copies were issued as they landed; the rest go now, and `post` runs once all
  // of them completed.
  std::vector<CudaCopies::Copy> copies;
  absl::Status placed;
  for (size_t i = 0; i < block->staging.size(); ++i) {
    if (block->staging[i] == 0 || block->chunked[i]) continue;
    const shm::TensorEntry& entry = block->tensors[i];
    const int device = static_cast<int>(entry.device_index);
    absl::StatusOr<CopyEnd> dst =
        block->cuda->PoolAddress(*block->session->cuda, device, entry.offset, device);
    if (!dst.ok()) {
      placed = dst.status();
      break;
    }
    copies.push_back({*dst, CopyEnd{block->staging[i], -1}, entry.length});
  }
  std::shared_ptr<Landing> landing = block->landing;
  landing->Add();
  landing->Then(std::move(post));
  if (!placed.ok()) {
    landing->Done(placed);
    return;
  }
  block->cuda->Run(std::move(copies), {block, block->session->cuda},
                   [landing](absl::Status status) { landing->Done(status); });
}

void CallRouter::RespondError(const agent::ReplyTo& to, const absl::Status& status) {
  agent::Message response;
  response.header.set_kind(v1::AgentMessage::ERROR);
  response.header.set_status_code(static_cast<int32_t>(status.code()));
  response.header.set_status_message(std::string(status.message()));
  options_.agent->Respond(to, std::move(response));
}

void CallRouter::HandleReply(const std::shared_ptr<Session>& session, const shm::Descriptor& d) {
  // A late reply (the deadline answered the call) or one to no call of this session is dropped.
  std::optional<Pending> pending = pending_.TakeReply(d.call_id, session->id);
  if (!pending) {
    Release(session, d.payload_offset);
    return;
  }
  if (pending->remote) {
    RespondRemote(session, d, *pending);
    return;
  }
  std::shared_ptr<Session> caller = Find(pending->caller);
  absl::StatusOr<Submitted> reply = ReadSubmitted(*session->segment, d, session->cuda_allowed);
  absl::Status delivered;
  if (caller == nullptr) {
    // The caller went away; the reply goes nowhere.
  } else if (!reply.ok()) {
    delivered = MalformedReply(pending->worker, pending->method, reply.status());
  } else {
    // An error reply's tensors go nowhere: the caller reads only its message.
    if ((d.flags & shm::kFlagError) != 0) reply->tensors.clear();
    const shm::ParsedMessage& message = reply->message;
    absl::StatusOr<std::vector<Place>> places =
        PlaceTensors(pending->group, pending->worker, pending->from, /*reply=*/true,
                     reply->tensors);
    if (!places.ok()) {
      delivered = places.status();
    } else if (!places->empty()) {
      const uint64_t tx = d.payload_offset;
      const Pending answered = *pending;
      DeliverDevices(session, "", "", message.names[2], "", message.code, message.body_offset,
                     message.body_length, reply->tensors, *places, caller, shm::Op::kReply,
                     pending->caller_call_id, d.flags & shm::kFlagError, 0,
                     [this, session, caller, tx, answered](absl::Status delivered) {
                       Release(session, tx);
                       if (delivered.ok()) return;
                       Fail(caller, answered.caller_call_id,
                            Prefixed(delivered, "reply of worker '", answered.worker,
                                     "' to method '", answered.method, "': "));
                     });
      return;
    } else {
      delivered = Deliver(*session, "", "", message.names[2], "", message.code,
                          message.body_offset, message.body_length, reply->tensors, *caller,
                          shm::Op::kReply, pending->caller_call_id, d.flags & shm::kFlagError,
                          0);
    }
  }
  Release(session, d.payload_offset);
  if (!delivered.ok()) {
    Fail(caller, pending->caller_call_id,
         Prefixed(delivered, "reply of worker '", pending->worker, "' to method '", pending->method,
                  "': "));
  }
}

void CallRouter::RespondRemote(const std::shared_ptr<Session>& session, const shm::Descriptor& d,
                               const Pending& pending) {
  absl::StatusOr<Submitted> reply = ReadSubmitted(*session->segment, d, session->cuda_allowed);
  if (!reply.ok()) {
    Release(session, d.payload_offset);
    RespondError(*pending.remote, MalformedReply(pending.worker, pending.method, reply.status()));
    return;
  }
  // An error reply's tensors go nowhere: the caller reads only its message.
  if ((d.flags & shm::kFlagError) != 0) reply->tensors.clear();
  absl::StatusOr<std::vector<Place>> places =
      PlaceTensors(pending.group, pending.worker, pending.from, /*reply=*/true, reply->tensors);
  if (!places.ok()) {
    Release(session, d.payload_offset);
    RespondError(*pending.remote, places.status());
    return;
  }
  agent::Message response;
  if ((d.flags & shm::kFlagError) != 0) {
    response.header.set_kind(v1::AgentMessage::ERROR);
    response.header.set_status_code(static_cast<int32_t>(reply->message.code));
    response.header.set_status_message(reply->message.names[2]);
  }
  if (places->empty()) {
    ReferInPlace(session->segment->base(), *reply, &response);
    response.keepalive = std::make_shared<TxBlock>(this, session, d.payload_offset);
    options_.agent->Respond(*pending.remote, std::move(response));
    return;
  }
  std::vector<CudaCopies::Copy> copies;
  std::shared_ptr<StagedOut> chunked;
  if (absl::Status staged =
          StageOut(session, d.payload_offset, *reply, *places, &response, &copies, &chunked);
      !staged.ok()) {
    RespondError(*pending.remote, Prefixed(staged, "reply of worker '", pending.worker,
                                           "' to method '", pending.method, "': "));
    return;
  }
  // Answered once the unchunked CUDA tensors are in pinned staging; chunks follow.
  auto staged = std::make_shared<agent::Message>(std::move(response));
  const agent::ReplyTo to = *pending.remote;
  options_.cuda->Run(std::move(copies), {session->cuda},
                     [this, staged, to](absl::Status copied) {
                       if (copied.ok()) {
                         options_.agent->Respond(to, std::move(*staged));
                       } else {
                         RespondError(to, copied);
                       }
                     });
  StagedOut::StartChunks(chunked);
}

void CallRouter::HandleCancel(const std::shared_ptr<Session>& session, const shm::Descriptor& d) {
  std::optional<Pending> local = pending_.TakeByCaller(session->id, d.call_id);
  std::optional<Outgoing> remote;
  if (!local) {
    absl::MutexLock lock(&mu_);
    if (auto out = outgoing_.find({session->id, d.call_id}); out != outgoing_.end()) {
      remote = std::move(out->second);
      outgoing_.erase(out);
    }
  }
  // The callee still runs its handler; its reply is dropped. A remote call's reply is too
  // (the agent's call ends by its reply, its deadline or its pipe).
  if (local) {
    Fail(session, d.call_id,
         absl::CancelledError(absl::StrCat(CallName(local->worker, local->method),
                                           " was cancelled by the caller")));
  } else if (remote) {
    Fail(session, d.call_id,
         absl::CancelledError(absl::StrCat(CallName(remote->worker, remote->method),
                                           " on node ", remote->node,
                                           " was cancelled by the caller")));
  }
}

void CallRouter::FailNode(const std::string& node, const std::string& why) {
  const absl::Status lost = absl::UnavailableError(
      absl::StrCat("node ", node, " was evicted from the group: ", why));
  std::vector<std::pair<std::string, uint64_t>> callers;
  std::vector<Outgoing> calls;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = outgoing_.begin(); it != outgoing_.end();) {
      if (it->second.node == node) {
        callers.push_back(it->first);
        calls.push_back(std::move(it->second));
        it = outgoing_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (size_t i = 0; i < callers.size(); ++i) {
    Fail(Find(callers[i].first), callers[i].second,
         absl::UnavailableError(absl::StrCat(CallName(calls[i].worker, calls[i].method), ": ",
                                             lost.message())));
  }
  if (options_.agent != nullptr) options_.agent->FailPeer(agent::PeerId{node, ""}, lost);
}

absl::Status CallRouter::Deliver(const Session& from, const std::string& prefix0,
                                 const std::string& prefix1, const std::string& prefix2,
                                 const std::string& prefix3, uint32_t code, uint64_t body_offset,
                                 uint64_t body_length,
                                 const std::vector<shm::TensorEntry>& tensors, Session& to,
                                 shm::Op op, uint64_t call_id, uint16_t flags,
                                 int64_t deadline_ns) {
  std::vector<uint64_t> bytes;
  bytes.reserve(tensors.size());
  for (const shm::TensorEntry& entry : tensors) bytes.push_back(entry.length);
  const BlockPlan plan = PlanBlock(
      shm::MessagePrefixBytes(prefix0.size(), prefix1.size(), prefix2.size(), prefix3.size()),
      body_length, bytes);
  absl::MutexLock lock(&to.mu);
  if (to.broken) return to.EndedError();
  absl::StatusOr<uint64_t> block = to.rx->Allocate(plan.total);
  if (!block.ok()) return block.status();
  uint8_t* out = to.segment->base() + *block;
  const uint8_t* in = from.segment->base();
  shm::WriteMessagePrefix(out, code, prefix0, prefix1, prefix2, prefix3);
  if (body_length > 0) std::memcpy(out + plan.prefix, in + body_offset, body_length);
  for (size_t i = 0; i < tensors.size(); ++i) {
    shm::TensorEntry entry = tensors[i];
    if (entry.length > 0) {
      std::memcpy(out + plan.at[i], in + entry.offset, entry.length);
      entry.offset = *block + plan.at[i];
    } else {
      entry.offset = 0;
    }
    std::memcpy(out + plan.table + i * sizeof(entry), &entry, sizeof(entry));
  }
  const shm::Descriptor posted = shm::MessageDescriptor(
      op, call_id, {*block, plan.payload, plan.table, static_cast<uint32_t>(tensors.size())}, flags,
      deadline_ns);
  absl::Status status = to.Post(posted);
  if (!status.ok()) (void)to.rx->Free(*block);
  return status;
}

void CallRouter::Release(const std::shared_ptr<Session>& to, uint64_t tx_offset) {
  if (to == nullptr || tx_offset == 0) return;
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(shm::Op::kRelease);
  d.call_id = 1;
  d.payload_offset = tx_offset;
  absl::MutexLock lock(&to->mu);
  (void)to->Post(d);  // fails only for a session that ended: nothing is owed to it
}

void CallRouter::Fail(const std::shared_ptr<Session>& to, uint64_t call_id,
                      const absl::Status& status) {
  // An OK status posts an empty reply (a lent device pool's answer).
  if (to == nullptr) return;
  const std::string message(status.message());
  const uint64_t bytes = shm::MessagePrefixBytes(0, 0, message.size());
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(shm::Op::kReply);
  d.flags = status.ok() ? 0 : shm::kFlagError;
  d.call_id = call_id;
  absl::MutexLock lock(&to->mu);
  if (to->broken) return;
  absl::StatusOr<uint64_t> block = to->rx->Allocate(bytes);
  if (block.ok()) {
    shm::WriteMessagePrefix(to->segment->base() + *block, static_cast<uint32_t>(status.code()),
                            "", "", message);
    d.payload_offset = *block;
    d.payload_length = bytes;
  } else {
    // Still answered: an error reply without a message, which the client reads as its rx
    // heap being full (client/calls.cc).
    d.flags = shm::kFlagError;
    Warn(*to, absl::StrCat("answer to call ", call_id),
         absl::Status(status.code(), absl::StrCat(status.message(), "; sent without its message: ",
                                                  block.status().message())));
  }
  if (!to->Post(d).ok() && block.ok()) (void)to->rx->Free(*block);
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
    RespondError(*p.remote, status);
  } else {
    Fail(Find(p.caller), p.caller_call_id, status);
  }
}

void CallRouter::OnDeadline(const Pending& p) {
  // A remote caller's daemon keeps its own deadline and has answered already; its entry only
  // had to go.
  if (p.remote) return;
  Fail(Find(p.caller), p.caller_call_id,
       absl::DeadlineExceededError(absl::StrCat(
           CallName(p.worker, p.method), " passed its deadline ",
           absl::FormatTime(p.deadline, absl::UTCTimeZone()), " with no reply")));
}

}  // namespace tpd
