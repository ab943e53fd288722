// The C ABI over the C++ client (tpd_client.h). Each exported function converts its
// arguments, calls client/client.h, and turns the result into a status code plus a
// thread-local message; an exception escaping the C++ side becomes INTERNAL here, never an
// unwind into a C or Python caller.

#include "client/c/tpd_client.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/calls.h"
#include "client/client.h"
#include "google/protobuf/util/json_util.h"

namespace {

// Forks this process has been through, counted in the child (pthread_atfork). A handle keeps
// the count it was made at: in a forked child (a DataLoader worker) the parent's handles are
// copies whose sockets, rings and heaps the parent still uses, so freeing or closing one there
// would release the parent's received blocks, answer or drop its requests and end its
// session. The child leaves them alone instead: it leaks its copies, which die with it.
std::atomic<uint64_t> g_forks{0};
[[maybe_unused]] const int kCountForks =
    pthread_atfork(nullptr, nullptr, [] { g_forks.fetch_add(1); });

uint64_t ForkCount() { return g_forks.load(std::memory_order_relaxed); }
// Whether a handle made at fork count `made_at` belongs to a parent of this process.
bool Inherited(uint64_t made_at) { return made_at != ForkCount(); }

}  // namespace

// The library's view of one client: the C++ client, the two event queues, and what DLPack
// views and arena blocks handed out keep.
struct tpd_client {
  const uint64_t made_at_fork = ForkCount();
  std::unique_ptr<tpd::Client> client;
  std::shared_ptr<struct tpd_events> events;
  absl::Mutex arena_mu;
  // Live arena blocks by their start (tpd_arena_alloc), so a tensor passed by pointer is sent
  // where it lies.
  std::map<const void*, tpd::Tensor> arena ABSL_GUARDED_BY(arena_mu);
};

struct tpd_store {
  tpd::StoreView view;
  const uint64_t made_at_fork = ForkCount();
};

// A request to answer, or a call's result.
struct tpd_event {
  const uint64_t made_at_fork = ForkCount();
  int kind = 0;
  uint64_t tag = 0;
  int code = TPD_OK;
  std::string status_message;
  tpd::Message message;  // payload, tensors, caller
  std::string method;
  tpd::Responder responder;                   // requests only
  std::shared_ptr<struct tpd_events> events;  // the DLPack policy's counters
};

// The queues tpd_next_event waits on; shared with the handlers and callbacks that fill them,
// which may run while the client is being closed.
struct tpd_events {
  absl::Mutex mu;
  // One condition per queue, and one for waiters on both: an event wakes one waiter that can
  // take it, not every thread of the pool (which would all contend for the caller's GIL).
  absl::CondVar requests_cv;
  absl::CondVar replies_cv;
  absl::CondVar any_cv;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  std::deque<std::unique_ptr<tpd_event>> requests ABSL_GUARDED_BY(mu);
  std::deque<std::unique_ptr<tpd_event>> replies ABSL_GUARDED_BY(mu);
  // Bytes of the receive heap held by DLPack views handed out, and the heap's size (known
  // once the client attached).
  std::atomic<uint64_t> rx_view_bytes{0};
  std::atomic<uint64_t> rx_heap_bytes{0};

  // What stops a lent reader (tpd_next_event): the events stopped, or a request another thread
  // queued (it takes that instead). Read without the lock; `requests_queued` mirrors
  // requests.size().
  std::atomic<bool> stopped_flag{false};
  std::atomic<size_t> requests_queued{0};
  // The engine whose ring lent readers are about to read or read now (one reads at a time),
  // for Push to nudge; set while lent_readers > 0 by those threads, which keep it alive.
  int lent_readers ABSL_GUARDED_BY(mu) = 0;
  tpd::CallEngine* lent_engine ABSL_GUARDED_BY(mu) = nullptr;
  // Lent readers asleep waiting for the turn or a request, newest last, each on a condition of
  // its own: the one woken is the one that waited least, whose stack and caches are warmest,
  // so calls keep landing on one or two threads rather than going round the pool in the order
  // a shared condition wakes them (longest waiting first).
  std::vector<absl::CondVar*> lent_sleepers ABSL_GUARDED_BY(mu);

  // A lent reader that served the last request takes the reading turn back from the one that
  // stood in at the ring while it ran (tpd_next_event), so that requests coming one after
  // another all run on one thread: set while it does, which stops the one reading at once.
  std::atomic<bool> reclaiming{false};

  bool RequestOrStop() const {
    return stopped_flag.load(std::memory_order_relaxed) ||
           requests_queued.load(std::memory_order_relaxed) > 0;
  }
  bool LentReaderInterrupted() const {
    return RequestOrStop() || reclaiming.load(std::memory_order_relaxed);
  }

  // Queues `event`; false (the event not taken) once stopped.
  bool Push(std::unique_ptr<tpd_event>& event);

  // Wakes one thread waiting for requests: the newest lent sleeper, else one on requests_cv.
  void WakeRequestWaiter() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (lent_sleepers.empty()) {
      requests_cv.Signal();
      return;
    }
    lent_sleepers.back()->Signal();
    lent_sleepers.pop_back();
  }
};

namespace {

// The events whose requests the calling thread reads as a lent reader (tpd_next_event): a
// request it reads it queues for itself, waking nobody.
thread_local const tpd_events* lent_reader_of = nullptr;
// The events whose last request tpd_next_event gave this thread as a lent reader: back in
// tpd_next_event, it takes the reading turn back (tpd_events::reclaiming).
thread_local const tpd_events* served_request_of = nullptr;

// How long a lent reader taking the turn back spins for it: the one reading gives it up as
// soon as it looks (it spins on the ring, or a nudge wakes it).
constexpr absl::Duration kReclaimSpin = absl::Microseconds(100);

}  // namespace

bool tpd_events::Push(std::unique_ptr<tpd_event>& event) {
  absl::MutexLock lock(&mu);
  if (stopped) return false;
  // TPD_EVENT_RELEASED rides with the replies: the thread completing calls frees memory.
  const bool request = event->kind == TPD_EVENT_REQUEST;
  (request ? requests : replies).push_back(std::move(event));
  if (request && lent_reader_of == this) return true;  // this thread takes it next
  if (request) {
    ++requests_queued;
    // A lent reader at the ring would not see it there: it stops reading to take it.
    if (lent_readers > 0) lent_engine->NudgeReader();
    WakeRequestWaiter();
  } else {
    replies_cv.Signal();
  }
  any_cv.Signal();
  return true;
}

namespace {

thread_local std::string last_error;

int Fail(const absl::Status& status) {
  last_error = std::string(status.message());
  return status.ok() ? TPD_UNKNOWN : static_cast<int>(status.code());
}

int Done(const absl::Status& status) {
  if (status.ok()) {
    last_error.clear();
    return TPD_OK;
  }
  return Fail(status);
}

// Runs `body` (returning absl::Status) with every C++ exception turned into INTERNAL.
template <typename Body>
int Guarded(const char* function, Body&& body) {
  try {
    return Done(body());
  } catch (const std::exception& e) {
    return Fail(absl::InternalError(absl::StrCat(function, ": ", e.what())));
  } catch (...) {
    return Fail(absl::InternalError(absl::StrCat(function, ": unknown exception")));
  }
}

absl::Status Required(const void* p, const char* what) {
  return p == nullptr ? absl::InvalidArgumentError(absl::StrCat(what, " is NULL"))
                      : absl::OkStatus();
}

std::string Str(const char* s) { return s == nullptr ? std::string() : std::string(s); }

char* Copy(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  return out;
}

// `size` bytes at `p`, which may be NULL only for none.
absl::StatusOr<std::string_view> Bytes(const char* p, size_t size, const char* what) {
  if (p == nullptr && size > 0) {
    return absl::InvalidArgumentError(absl::StrCat("NULL ", what, " of ", size, " bytes"));
  }
  return std::string_view(p == nullptr ? "" : p, size);
}

// Hands `bytes` to the caller as a tpd_free-able buffer and its size.
absl::Status TakeBytes(const std::string& bytes, char** out, size_t* size) {
  *out = Copy(bytes);
  *size = bytes.size();
  return absl::OkStatus();
}

absl::Status ToJson(const google::protobuf::Message& message, char** out) {
  if (out == nullptr) return absl::OkStatus();
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) return absl::InternalError(std::string(status.message()));
  *out = Copy(json);
  return absl::OkStatus();
}

// TPD_TIMEOUT_DEFAULT (any negative): absent; 0: no deadline; else microseconds.
std::optional<absl::Duration> CallTimeout(int64_t us) {
  if (us < 0) return std::nullopt;
  return us == 0 ? tpd::kNoTimeout : absl::Microseconds(us);
}

// A store wait: negative and zero both mean the daemon's default.
absl::Duration WaitTimeout(int64_t us) {
  return us <= 0 ? absl::ZeroDuration() : absl::Microseconds(us);
}

absl::StatusOr<int64_t> Integer(const char* key, const std::string& value) {
  int64_t n;
  if (!absl::SimpleAtoi(value, &n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("join option '", key, "': '", value, "' is not an integer"));
  }
  return n;
}

// `client`: where to look for arena blocks (nullptr: none, every CPU tensor is copied in).
// `keep`: held by every CUDA tensor until the daemon no longer reads it (Tensor::Cuda).
absl::StatusOr<std::vector<tpd::Tensor>> ToTensors(tpd_client* client, const tpd_tensor* tensors,
                                                   int n, std::shared_ptr<void> keep = nullptr) {
  if (n < 0 || (n > 0 && tensors == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("tensors: ", n, " given with no array"));
  }
  std::vector<tpd::Tensor> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    const tpd_tensor& t = tensors[i];
    const std::string what = absl::StrCat("tensor ", i);
    if (t.ndim < 0 || t.ndim > 8) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ndim ", t.ndim, " (0 to 8)"));
    }
    std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
    const auto dtype = static_cast<tpd::shm::DType>(t.dtype);
    if (t.device_type == TPD_CUDA) {
      if (t.device_index < 0) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": cuda:", t.device_index));
      }
      out.push_back(tpd::Tensor::Cuda(dtype, std::move(shape), reinterpret_cast<uint64_t>(t.data),
                                      t.device_index, t.stream, keep));
      continue;
    }
    if (t.device_type != TPD_CPU) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": device type ", t.device_type, " is neither CPU nor CUDA"));
    }
    if (t.data == nullptr && t.nbytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": NULL data of ", t.nbytes, " bytes"));
    }
    tpd::Tensor borrowed =
        tpd::Tensor::Borrow(dtype, {static_cast<int64_t>(t.nbytes)}, t.data, t.nbytes);
    if (client != nullptr) {
      absl::MutexLock lock(&client->arena_mu);
      auto it = client->arena.find(t.data);
      if (it != client->arena.end() && it->second.size() == t.nbytes) borrowed = it->second;
    }
    // The tensor as the caller describes it, over the bytes it gave (checked to match).
    absl::StatusOr<tpd::Tensor> shaped = borrowed.Reshaped(dtype, std::move(shape));
    if (!shaped.ok())
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", shaped.status().message()));
    out.push_back(*std::move(shaped));
  }
  return out;
}

// The i-th tensor of `event`, or OUT_OF_RANGE.
absl::StatusOr<const tpd::Tensor*> TensorAt(const tpd_event* event, int i) {
  if (i < 0 || i >= static_cast<int>(event->message.tensors.size())) {
    return absl::OutOfRangeError(absl::StrCat("tensor ", i, " of ", event->message.tensors.size()));
  }
  return &event->message.tensors[i];
}

std::unique_ptr<tpd_event> ReplyEvent(std::shared_ptr<tpd_events> events, uint64_t tag,
                                      absl::StatusOr<tpd::Message> result) {
  auto event = std::make_unique<tpd_event>();
  event->kind = TPD_EVENT_REPLY;
  event->tag = tag;
  event->events = std::move(events);
  if (result.ok()) {
    event->message = *std::move(result);
  } else {
    event->code = static_cast<int>(result.status().code());
    event->status_message = std::string(result.status().message());
  }
  return event;
}

// Queues TPD_EVENT_RELEASED with its tag when the last CUDA tensor holding it goes (the daemon
// released the message that carried them).
struct ReleaseNotice {
  ReleaseNotice(std::shared_ptr<tpd_events> events, uint64_t tag)
      : events(std::move(events)), tag(tag) {}
  ~ReleaseNotice() {
    auto done = std::make_unique<tpd_event>();
    done->kind = TPD_EVENT_RELEASED;
    done->tag = tag;
    done->events = events;
    (void)events->Push(done);  // stopped: nobody waits for it any more
  }
  const std::shared_ptr<tpd_events> events;
  const uint64_t tag;
};

// --- DLPack (the stable "dltensor" capsule ABI, declared here as the DLPack spec lays it out)

struct DLDevice {
  int32_t device_type;  // kDLCPU 1, kDLCUDA 2
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLUInt 1
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // NULL: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// What a DLPack tensor handed out holds: a view of the received tensor (its block), or a copy.
struct DlpackHolder {
  const uint64_t made_at_fork = ForkCount();
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
  tpd::Tensor view;
  std::unique_ptr<char[]> copy;
  std::shared_ptr<tpd_events> events;
  uint64_t counted = 0;  // bytes added to events->rx_view_bytes
};

void DeleteDlpack(DLManagedTensor* self) {
  auto* holder = static_cast<DlpackHolder*>(self->manager_ctx);
  if (Inherited(holder->made_at_fork)) return;  // the parent's block, not this child's
  if (holder->counted != 0) holder->events->rx_view_bytes -= holder->counted;
  delete holder;
}

// A store call's key list from C: INVALID_ARGUMENT for a bad count or a NULL key.
absl::StatusOr<std::vector<std::string>> Keys(const char* const* keys, int n) {
  if (n < 0 || (n > 0 && keys == nullptr)) return absl::InvalidArgumentError("bad key list");
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    if (keys[i] == nullptr) return absl::InvalidArgumentError(absl::StrCat("key ", i, " is NULL"));
    out.emplace_back(keys[i]);
  }
  return out;
}

}  // namespace

extern "C" {

int tpd_abi_version(void) { return TPD_ABI_VERSION; }

size_t tpd_layout(const char* type, const char* field) {
  constexpr size_t kUnknown = static_cast<size_t>(-1);
  if (type == nullptr) return kUnknown;
  struct Entry {
    const char* type;
    const char* field;  // nullptr: the struct's size
    size_t value;
  };
#define TPD_FIELD(type, field) \
  { #type, #field, offsetof(type, field) }
  static constexpr Entry kLayout[] = {
      {"tpd_tensor", nullptr, sizeof(tpd_tensor)},
      TPD_FIELD(tpd_tensor, dtype),
      TPD_FIELD(tpd_tensor, ndim),
      TPD_FIELD(tpd_tensor, shape),
      TPD_FIELD(tpd_tensor, data),
      TPD_FIELD(tpd_tensor, nbytes),
      TPD_FIELD(tpd_tensor, device_type),
      TPD_FIELD(tpd_tensor, device_index),
      TPD_FIELD(tpd_tensor, stream),
      {"tpd_event_info", nullptr, sizeof(tpd_event_info)},
      TPD_FIELD(tpd_event_info, kind),
      TPD_FIELD(tpd_event_info, code),
      TPD_FIELD(tpd_event_info, tag),
      TPD_FIELD(tpd_event_info, message),
      TPD_FIELD(tpd_event_info, payload),
      TPD_FIELD(tpd_event_info, payload_size),
      TPD_FIELD(tpd_event_info, num_tensors),
      TPD_FIELD(tpd_event_info, reserved),
  };
#undef TPD_FIELD
  for (const Entry& entry : kLayout) {
    if (std::strcmp(entry.type, type) != 0) continue;
    if (field == nullptr ? entry.field == nullptr
                         : entry.field != nullptr && std::strcmp(entry.field, field) == 0) {
      return entry.value;
    }
  }
  return kUnknown;
}

const char* tpd_last_error(void) { return last_error.c_str(); }

void tpd_free(void* p) { std::free(p); }

// --- Clients ---

int tpd_client_open(const char* socket_path, int64_t connect_timeout_us, uint64_t cuda_pool_bytes,
                    tpd_client** out) {
  return Guarded("tpd_client_open", [&]() -> absl::Status {
    if (absl::Status s = Required(out, "out"); !s.ok()) return s;
    *out = nullptr;
    tpd::ClientOptions options;
    if (connect_timeout_us >= 0) options.connect_timeout = absl::Microseconds(connect_timeout_us);
    if (cuda_pool_bytes != 0) options.cuda_pool_bytes = cuda_pool_bytes;
    // Received CPU tensors become DLPack tensors that torch may write into: they must arrive
    // in the receive heap (writable), not in their senders' memory (read-only here).
    options.tensors_in_sender_memory = false;
    auto client = tpd::Client::Connect(Str(socket_path), options);
    if (!client.ok()) return client.status();
    auto handle = std::make_unique<tpd_client>();
    handle->client = *std::move(client);
    handle->events = std::make_shared<tpd_events>();
    *out = handle.release();
    return absl::OkStatus();
  });
}

void tpd_client_stop_events(tpd_client* client) {
  if (client == nullptr || Inherited(client->made_at_fork)) return;
  std::deque<std::unique_ptr<tpd_event>> dropped;
  {
    absl::MutexLock lock(&client->events->mu);
    client->events->stopped = true;
    client->events->stopped_flag = true;
    if (client->events->lent_readers > 0) client->events->lent_engine->NudgeReader();
    dropped.swap(client->events->requests);
    client->events->requests_queued = 0;
    for (auto& reply : client->events->replies) dropped.push_back(std::move(reply));
    client->events->replies.clear();
    client->events->requests_cv.SignalAll();
    for (absl::CondVar* sleeper : client->events->lent_sleepers) sleeper->Signal();
    client->events->lent_sleepers.clear();
    client->events->replies_cv.SignalAll();
    client->events->any_cv.SignalAll();
  }
  for (auto& event : dropped) {
    if (event->kind == TPD_EVENT_REQUEST) {
      (void)event->responder.Reply(absl::UnavailableError(
          "the worker's process stopped serving before it handled the call"));
    }
  }
}

void tpd_client_close(tpd_client* client) {
  if (client == nullptr || Inherited(client->made_at_fork)) return;
  tpd_client_stop_events(client);
  try {
    delete client;
  } catch (...) {
    // Nothing to tell: the client is gone either way.
  }
}

// --- Groups ---

struct tpd_join_options {
  tpd::JoinOptions options;
};

tpd_join_options* tpd_join_options_new(void) {
  try {
    return new tpd_join_options();
  } catch (...) {
    return nullptr;
  }
}

void tpd_join_options_free(tpd_join_options* options) { delete options; }

int tpd_join_options_set(tpd_join_options* options, const char* key, const char* value) {
  return Guarded("tpd_join_options_set", [&]() -> absl::Status {
    if (absl::Status s = Required(options, "options"); !s.ok()) return s;
    if (absl::Status s = Required(key, "key"); !s.ok()) return s;
    if (absl::Status s = Required(value, "value"); !s.ok()) return s;
    tpd::JoinOptions& o = options->options;
    const std::string k = key;
    const std::string v = value;
    if (k == "group") {
      o.group = v;
    } else if (k == "name") {
      o.name = v;
    } else if (k == "init_method") {
      o.init_method = v;
    } else if (k == "secret") {
      o.secret = v;
    } else if (k == "abandon") {
      o.abandon = v;
    } else if (k == "rank" || k == "world_size" || k == "timeout_us" || k == "num_worker_threads" ||
               k == "rpc_timeout_us" || k == "include_members") {
      absl::StatusOr<int64_t> n = Integer(key, v);
      if (!n.ok()) return n.status();
      if (k == "rank") o.rank = *n;
      if (k == "world_size") o.world_size = *n;
      if (k == "timeout_us") o.timeout = absl::Microseconds(*n);
      if (k == "num_worker_threads") o.options.set_num_worker_threads(static_cast<int32_t>(*n));
      if (k == "rpc_timeout_us") {
        // The daemon negotiates milliseconds; a positive timeout under one keeps 1 ms there
        // (the caller's own per-call timeouts stay in microseconds).
        o.options.set_rpc_timeout_ms(*n > 0 && *n < 1000 ? 1 : *n / 1000);
      }
      if (k == "include_members") o.include_members = *n != 0;
    } else if (k == "env") {
      std::pair<std::string, std::string> kv = absl::StrSplit(v, absl::MaxSplits('=', 1));
      if (kv.first.empty() || v.find('=') == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("join option 'env': '", v, "' is not NAME=VALUE"));
      }
      o.env[kv.first] = kv.second;
    } else if (k == "device") {
      o.options.add_devices(v);
    } else if (k == "transport") {
      o.options.add_transports(v);
    } else if (k == "channel") {
      o.options.add_channels(v);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown join option '", k, "'"));
    }
    return absl::OkStatus();
  });
}

int tpd_join_options_add_device_map(tpd_join_options* options, const char* worker, const char* from,
                                    const char* to) {
  return Guarded("tpd_join_options_add_device_map", [&]() -> absl::Status {
    if (absl::Status s = Required(options, "options"); !s.ok()) return s;
    if (worker == nullptr || from == nullptr || to == nullptr) {
      return absl::InvalidArgumentError("device map: worker, from and to are required");
    }
    (*(*options->options.options.mutable_device_maps())[worker].mutable_devices())[from] = to;
    return absl::OkStatus();
  });
}

int tpd_join(tpd_client* client, const tpd_join_options* options, char** response_json) {
  return Guarded("tpd_join", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if (absl::Status s = Required(options, "options"); !s.ok()) return s;
    absl::StatusOr<tpd::v1::JoinResponse> joined = client->client->Join(options->options);
    if (!joined.ok()) return joined.status();
    if (auto segment = client->client->AttachSharedMemory(); segment.ok()) {
      client->events->rx_heap_bytes = (*segment)->layout().rx_heap.bytes;
    }
    return ToJson(*joined, response_json);
  });
}

int tpd_leave(tpd_client* client, const char* group, const char* name) {
  return Guarded("tpd_leave", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    return client->client->Leave(Str(group), Str(name));
  });
}

int tpd_barrier(tpd_client* client, const char* group, const char* name, int64_t timeout_us,
                char** response_json) {
  return Guarded("tpd_barrier", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    std::vector<std::string> gone;
    absl::Status status =
        client->client->Barrier(Str(group), Str(name), WaitTimeout(timeout_us), &gone);
    if (!status.ok() || response_json == nullptr) return status;
    tpd::v1::BarrierResponse response;
    for (std::string& member : gone) response.add_gone(std::move(member));
    return ToJson(response, response_json);
  });
}

int tpd_get_group(tpd_client* client, const char* group, const char* init_method,
                  char** view_json) {
  return Guarded("tpd_get_group", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    absl::StatusOr<tpd::v1::GroupView> view =
        client->client->GetGroup(Str(group), Str(init_method));
    if (!view.ok()) return view.status();
    return ToJson(*view, view_json);
  });
}

int tpd_user_secret(tpd_client* client, const char* purpose, char** secret_hex) {
  return Guarded("tpd_user_secret", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if (absl::Status s = Required(secret_hex, "secret_hex"); !s.ok()) return s;
    absl::StatusOr<std::string> secret = client->client->UserSecret(Str(purpose));
    if (!secret.ok()) return secret.status();
    *secret_hex = Copy(absl::BytesToHexString(*secret));
    return absl::OkStatus();
  });
}

int tpd_status(tpd_client* client, char** status_json) {
  return Guarded("tpd_status", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    absl::StatusOr<tpd::v1::StatusResponse> status = client->client->Status();
    if (!status.ok()) return status.status();
    return ToJson(*status, status_json);
  });
}

// --- Tensors ---

int tpd_arena_alloc(tpd_client* client, uint64_t nbytes, void** data) {
  return Guarded("tpd_arena_alloc", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if (absl::Status s = Required(data, "data"); !s.ok()) return s;
    absl::StatusOr<tpd::Tensor> block =
        client->client->AllocateTensor(tpd::shm::DType::kUInt8, {static_cast<int64_t>(nbytes)});
    if (!block.ok()) return block.status();
    *data = block->mutable_data();
    absl::MutexLock lock(&client->arena_mu);
    client->arena[*data] = *std::move(block);
    return absl::OkStatus();
  });
}

int tpd_arena_in_flight(tpd_client* client, const void* data, int* in_flight) {
  return Guarded("tpd_arena_in_flight", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if (absl::Status s = Required(in_flight, "in_flight"); !s.ok()) return s;
    absl::MutexLock lock(&client->arena_mu);
    auto it = client->arena.find(const_cast<void*>(data));
    if (it == client->arena.end()) {
      return absl::NotFoundError("tpd_arena_in_flight: no live arena block starts there");
    }
    *in_flight = it->second.in_flight() ? 1 : 0;
    return absl::OkStatus();
  });
}

void tpd_arena_free(tpd_client* client, void* data) {
  if (client == nullptr || Inherited(client->made_at_fork)) return;
  tpd::Tensor block;  // freed after the lock
  absl::MutexLock lock(&client->arena_mu);
  auto it = client->arena.find(data);
  if (it == client->arena.end()) return;
  block = std::move(it->second);
  client->arena.erase(it);
}

// --- Events ---

int tpd_serve(tpd_client* client, const char* method) {
  return Guarded("tpd_serve", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if (absl::Status s = Required(method, "method"); !s.ok()) return s;
    std::shared_ptr<tpd_events> events = client->events;
    std::string name = method;
    return client->client->HandleDeferred(
        name, [events, name](tpd::Message request, tpd::Responder responder) {
          auto event = std::make_unique<tpd_event>();
          event->kind = TPD_EVENT_REQUEST;
          event->message = std::move(request);
          event->method = name;
          event->responder = responder;
          event->events = events;
          if (!events->Push(event)) {
            (void)responder.Reply(absl::UnavailableError(
                "the worker's process stopped serving before it handled the call"));
          }
        });
  });
}

int tpd_next_event(tpd_client* client, int queues, int64_t timeout_us, tpd_event** out) {
  return Guarded("tpd_next_event", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if (absl::Status s = Required(out, "out"); !s.ok()) return s;
    *out = nullptr;
    if ((queues & (TPD_QUEUE_REQUESTS | TPD_QUEUE_REPLIES)) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("queues ", queues, " names no queue"));
    }
    // A reference of this call's own: tpd_client_close may free the client while this thread,
    // woken by it, has yet to leave the wait.
    const std::shared_ptr<tpd_events> held = client->events;
    tpd_events& events = *held;
    const absl::Time deadline =
        timeout_us < 0 ? absl::InfiniteFuture() : absl::Now() + absl::Microseconds(timeout_us);
    // A thread waiting for requests only reads the calls' ring itself when nobody else does (a
    // lent reader, calls.h): a request it reads goes to its handler (tpd_serve's, which queues
    // it) on this very thread, so it reaches this thread's caller with no hand-off.
    std::shared_ptr<tpd::CallEngine> engine;
    if (queues == TPD_QUEUE_REQUESTS) engine = client->client->AttachedEngine();
    if (engine != nullptr) {
      engine->EnableLentReaders([weak = std::weak_ptr<tpd_events>(held)] {
        if (std::shared_ptr<tpd_events> events = weak.lock()) {
          absl::MutexLock lock(&events->mu);
          events->WakeRequestWaiter();
        }
      });
    }
    absl::MutexLock lock(&events.mu);
    bool timed_out = false;
    bool waiting_for_turn = false;  // counted among the engine's lent readers
    // This thread served the last request; it takes the turn back (reclaiming set by it).
    bool served_last = served_request_of == &events;
    served_request_of = nullptr;
    bool reclaimer = false;
    auto end_reclaim = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(events.mu) {
      if (!reclaimer) return;
      reclaimer = false;
      events.reclaiming = false;
    };
    auto stop_waiting_for_turn = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(events.mu) {
      end_reclaim();
      if (!waiting_for_turn) return;
      waiting_for_turn = false;
      // The turn is free and another lent reader waits for it: wake one.
      if (engine->LentReaderWaits(-1)) events.WakeRequestWaiter();
    };
    while (true) {
      if (events.stopped) {
        stop_waiting_for_turn();
        return absl::CancelledError("the client stopped its events");
      }
      for (auto* queue : {&events.replies, &events.requests}) {
        const int mask = queue == &events.replies ? TPD_QUEUE_REPLIES : TPD_QUEUE_REQUESTS;
        if ((queues & mask) != 0 && !queue->empty()) {
          *out = queue->front().release();
          queue->pop_front();
          if (mask == TPD_QUEUE_REQUESTS) {
            events.requests_queued = events.requests.size();
            if (engine != nullptr) served_request_of = &events;
          }
          stop_waiting_for_turn();
          // A lent reader's own request woke nobody: pass on what it leaves behind.
          if (!queue->empty()) {
            if (mask == TPD_QUEUE_REPLIES) {
              events.replies_cv.Signal();
            } else {
              events.WakeRequestWaiter();
            }
          }
          return absl::OkStatus();
        }
      }
      // Checked after the queues: a wait that timed out as it was signalled has consumed the
      // signal, so it must take the event itself.
      if (timed_out) {
        stop_waiting_for_turn();
        return absl::DeadlineExceededError(
            absl::StrCat("no event within ", timeout_us, " microseconds"));
      }
      if (engine != nullptr) {
        if (waiting_for_turn) {
          end_reclaim();  // before its own reading, which the flag would stop
          ++events.lent_readers;
          events.lent_engine = engine.get();
          events.mu.Unlock();
          lent_reader_of = &events;
          const bool read =
              engine->ReadAsLent(deadline, [&events] { return events.LentReaderInterrupted(); });
          lent_reader_of = nullptr;
          events.mu.Lock();
          if (--events.lent_readers == 0) events.lent_engine = nullptr;
          waiting_for_turn = false;
          timed_out = absl::Now() >= deadline;
          // What it read is queued for it (unless the stop took it), or its turn ended.
          if (read || timed_out) continue;
        }
        // The thread that served the last request reads the next one: it takes the turn back
        // from the lent reader that stood in at the ring while it ran. Requests that come one
        // after another then run on one thread, whose core's caches hold what they touch
        // (Python's objects, their reference counts written by every request); moved to
        // another core each time, a request paid for every object it touched.
        if (served_last && events.lent_readers > 0 && !events.reclaiming) {
          reclaimer = true;
          events.reclaiming = true;
          events.lent_engine->NudgeReader();
        }
        served_last = false;
        waiting_for_turn = true;
        // The turn is free: take it, unless another thread takes it back.
        if (engine->LentReaderWaits(+1) && (reclaimer || !events.reclaiming)) continue;
        if (reclaimer) {  // once: back at the top, the loop ends the reclaim before it reads
          events.mu.Unlock();
          engine->SpinForTurn(std::min(deadline, absl::Now() + kReclaimSpin),
                              [&events] { return events.RequestOrStop(); });
          events.mu.Lock();
          continue;  // takes the turn above when it came free
        }
        absl::CondVar mine;
        events.lent_sleepers.push_back(&mine);
        timed_out = mine.WaitWithDeadline(&events.mu, deadline);
        // Gone from the stack when woken; still there when the wait timed out.
        auto it = std::find(events.lent_sleepers.begin(), events.lent_sleepers.end(), &mine);
        if (it != events.lent_sleepers.end()) events.lent_sleepers.erase(it);
        continue;
      }
      const int both = TPD_QUEUE_REQUESTS | TPD_QUEUE_REPLIES;
      absl::CondVar& cv = (queues & both) == both         ? events.any_cv
                          : (queues & TPD_QUEUE_REQUESTS) ? events.requests_cv
                                                          : events.replies_cv;
      timed_out = cv.WaitWithDeadline(&events.mu, deadline);
    }
  });
}

void tpd_event_free(tpd_event* event) {
  if (event == nullptr || Inherited(event->made_at_fork)) return;
  if (event->kind == TPD_EVENT_REQUEST && event->responder.valid()) {
    (void)event->responder.Reply(absl::InternalError(absl::StrCat(
        "the process serving method '", event->method, "' dropped the call unanswered")));
  }
  try {
    delete event;
  } catch (...) {
  }
}

int tpd_event_kind(const tpd_event* event) { return event == nullptr ? 0 : event->kind; }

uint64_t tpd_event_tag(const tpd_event* event) { return event == nullptr ? 0 : event->tag; }

int tpd_event_status(const tpd_event* event, const char** message) {
  if (event == nullptr) return TPD_INVALID_ARGUMENT;
  if (message != nullptr) *message = event->status_message.c_str();
  return event->code;
}

const char* tpd_event_payload(const tpd_event* event, size_t* size) {
  if (event == nullptr) {
    if (size != nullptr) *size = 0;
    return "";
  }
  if (size != nullptr) *size = event->message.payload.size();
  return event->message.payload.data();
}

const char* tpd_event_method(const tpd_event* event) {
  return event == nullptr ? "" : event->method.c_str();
}

const char* tpd_event_caller(const tpd_event* event) {
  return event == nullptr ? "" : event->message.caller.c_str();
}

int tpd_event_num_tensors(const tpd_event* event) {
  return event == nullptr ? 0 : static_cast<int>(event->message.tensors.size());
}

int tpd_event_read(const tpd_event* event, tpd_event_info* out) {
  return Guarded("tpd_event_read", [&]() -> absl::Status {
    if (absl::Status s = Required(event, "event"); !s.ok()) return s;
    if (absl::Status s = Required(out, "out"); !s.ok()) return s;
    *out = tpd_event_info{};
    out->kind = event->kind;
    out->code = event->code;
    out->tag = event->tag;
    out->message = event->status_message.c_str();
    out->payload = event->message.payload.data();
    out->payload_size = event->message.payload.size();
    out->num_tensors = static_cast<int32_t>(event->message.tensors.size());
    return absl::OkStatus();
  });
}

int tpd_event_tensor(const tpd_event* event, int i, tpd_tensor* out) {
  return Guarded("tpd_event_tensor", [&]() -> absl::Status {
    if (absl::Status s = Required(event, "event"); !s.ok()) return s;
    if (absl::Status s = Required(out, "out"); !s.ok()) return s;
    absl::StatusOr<const tpd::Tensor*> at = TensorAt(event, i);
    if (!at.ok()) return at.status();
    const tpd::Tensor& t = **at;
    *out = tpd_tensor{};
    out->dtype = static_cast<int32_t>(t.dtype());
    out->ndim = static_cast<int32_t>(t.shape().size());
    for (size_t d = 0; d < t.shape().size() && d < 8; ++d) out->shape[d] = t.shape()[d];
    out->nbytes = t.size();
    out->device_type = t.is_cuda() ? TPD_CUDA : TPD_CPU;
    out->device_index = t.device().index;
    out->data = t.is_cuda() ? reinterpret_cast<const void*>(t.device_pointer())
                            : static_cast<const void*>(t.data().data());
    return absl::OkStatus();
  });
}

int tpd_event_tensor_dlpack(const tpd_event* event, int i, int copy, void** managed) {
  return Guarded("tpd_event_tensor_dlpack", [&]() -> absl::Status {
    if (absl::Status s = Required(event, "event"); !s.ok()) return s;
    if (absl::Status s = Required(managed, "managed"); !s.ok()) return s;
    absl::StatusOr<const tpd::Tensor*> at = TensorAt(event, i);
    if (!at.ok()) return at.status();
    const tpd::Tensor& t = **at;
    auto holder = std::make_unique<DlpackHolder>();
    holder->events = event->events;
    holder->shape[0] = static_cast<int64_t>(t.size());
    DLTensor& dl = holder->managed.dl_tensor;
    dl.ndim = 1;
    dl.dtype = DLDataType{1, 8, 1};
    dl.shape = holder->shape;
    if (t.is_cuda()) {
      holder->view = t;
      dl.data = reinterpret_cast<void*>(t.device_pointer());
      dl.device = DLDevice{2, t.device().index};
    } else {
      tpd_events& events = *event->events;
      bool take_copy = copy == 1;
      if (copy < 0) {
        const uint64_t heap = events.rx_heap_bytes.load();
        take_copy = heap == 0 || events.rx_view_bytes.load() + t.size() > heap / 2;
      }
      if (take_copy) {
        holder->copy.reset(new char[t.size() == 0 ? 1 : t.size()]);
        std::memcpy(holder->copy.get(), t.data().data(), t.size());
        dl.data = holder->copy.get();
      } else {
        holder->view = t;
        holder->counted = t.size();
        events.rx_view_bytes += t.size();
        dl.data = const_cast<char*>(t.data().data());
      }
      dl.device = DLDevice{1, 0};
    }
    holder->managed.manager_ctx = holder.get();
    holder->managed.deleter = &DeleteDlpack;
    *managed = &holder.release()->managed;
    return absl::OkStatus();
  });
}

int tpd_reply(tpd_event* event, const char* payload, size_t size, const tpd_tensor* tensors,
              int num_tensors, uint64_t release_tag) {
  return Guarded("tpd_reply", [&]() -> absl::Status {
    if (absl::Status s = Required(event, "event"); !s.ok()) return s;
    if (event->kind != TPD_EVENT_REQUEST) {
      return absl::InvalidArgumentError("tpd_reply: the event is not a request");
    }
    absl::StatusOr<std::string_view> bytes = Bytes(payload, size, "payload");
    if (!bytes.ok()) return bytes.status();
    // Arena blocks are the client's, which an event does not know: tensors are copied in.
    std::shared_ptr<void> released;
    if (release_tag != 0) released = std::make_shared<ReleaseNotice>(event->events, release_tag);
    absl::StatusOr<std::vector<tpd::Tensor>> converted =
        ToTensors(nullptr, tensors, num_tensors, std::move(released));
    if (!converted.ok()) {
      // The caller hears why rather than waiting for its deadline.
      (void)event->responder.Reply(converted.status());
      event->responder = tpd::Responder();
      return converted.status();
    }
    tpd::Message reply;
    reply.payload.assign(*bytes);
    reply.tensors = *std::move(converted);
    absl::Status sent = event->responder.Reply(std::move(reply));
    event->responder = tpd::Responder();
    return sent;
  });
}

int tpd_reply_error(tpd_event* event, int code, const char* message) {
  return Guarded("tpd_reply_error", [&]() -> absl::Status {
    if (absl::Status s = Required(event, "event"); !s.ok()) return s;
    if (event->kind != TPD_EVENT_REQUEST) {
      return absl::InvalidArgumentError("tpd_reply_error: the event is not a request");
    }
    if (code <= TPD_OK || code > TPD_UNAUTHENTICATED) code = TPD_UNKNOWN;
    absl::Status sent =
        event->responder.Reply(absl::Status(static_cast<absl::StatusCode>(code), Str(message)));
    event->responder = tpd::Responder();
    return sent;
  });
}

// --- Calls ---

int tpd_call(tpd_client* client, const char* group, const char* worker, const char* method,
             const char* payload, size_t size, const tpd_tensor* tensors, int num_tensors,
             int64_t timeout_us, tpd_event** reply) {
  return Guarded("tpd_call", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if (absl::Status s = Required(reply, "reply"); !s.ok()) return s;
    *reply = nullptr;
    absl::StatusOr<std::string_view> bytes = Bytes(payload, size, "payload");
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<std::vector<tpd::Tensor>> converted = ToTensors(client, tensors, num_tensors);
    if (!converted.ok()) return converted.status();
    absl::StatusOr<tpd::Message> result = client->client->Call(
        Str(group), Str(worker), Str(method), *bytes, *converted, CallTimeout(timeout_us));
    absl::Status status = result.status();
    *reply = ReplyEvent(client->events, 0, std::move(result)).release();
    return status;
  });
}

int tpd_call_async(tpd_client* client, const char* group, const char* worker, const char* method,
                   const char* payload, size_t size, const tpd_tensor* tensors, int num_tensors,
                   int64_t timeout_us, uint64_t tag) {
  return tpd_call_async_flags(client, group, worker, method, payload, size, tensors, num_tensors,
                              timeout_us, tag, 0);
}

int tpd_call_async_flags(tpd_client* client, const char* group, const char* worker,
                         const char* method, const char* payload, size_t size,
                         const tpd_tensor* tensors, int num_tensors, int64_t timeout_us,
                         uint64_t tag, uint32_t flags) {
  return Guarded("tpd_call_async", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if ((flags & ~static_cast<uint32_t>(TPD_CALL_REVERSE_MAP)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("flags ", flags, " has unknown bits (known: TPD_CALL_REVERSE_MAP)"));
    }
    absl::StatusOr<std::string_view> bytes = Bytes(payload, size, "payload");
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<std::vector<tpd::Tensor>> converted = ToTensors(client, tensors, num_tensors);
    if (!converted.ok()) return converted.status();
    tpd::CallFuture future =
        client->client->CallAsync(Str(group), Str(worker), Str(method), *bytes, *converted,
                                  CallTimeout(timeout_us), (flags & TPD_CALL_REVERSE_MAP) != 0);
    std::shared_ptr<tpd_events> events = client->events;
    future.Then([events, tag](const absl::StatusOr<tpd::Message>& result) {
      std::unique_ptr<tpd_event> event = ReplyEvent(events, tag, result);
      (void)events->Push(event);  // stopped: nobody waits for it any more
    });
    return absl::OkStatus();
  });
}

// --- The store ---

int tpd_store_open(tpd_client* client, const char* group, const char* name_space, tpd_store** out) {
  return Guarded("tpd_store_open", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if (absl::Status s = Required(out, "out"); !s.ok()) return s;
    const std::string in_group = Str(group);
    *out = new tpd_store{in_group.empty() ? client->client->Store(Str(name_space))
                                          : client->client->GroupStore(in_group, Str(name_space))};
    return absl::OkStatus();
  });
}

void tpd_store_close(tpd_store* store) {
  if (store != nullptr && !Inherited(store->made_at_fork)) delete store;
}

int tpd_store_set(tpd_store* store, const char* key, const char* value, size_t size) {
  return Guarded("tpd_store_set", [&]() -> absl::Status {
    if (absl::Status s = Required(store, "store"); !s.ok()) return s;
    absl::StatusOr<std::string_view> bytes = Bytes(value, size, "value");
    if (!bytes.ok()) return bytes.status();
    return store->view.Set(Str(key), absl::string_view(bytes->data(), bytes->size()));
  });
}

int tpd_store_get(tpd_store* store, const char* key, int64_t timeout_us, char** value,
                  size_t* size) {
  return Guarded("tpd_store_get", [&]() -> absl::Status {
    if (absl::Status s = Required(store, "store"); !s.ok()) return s;
    if (value == nullptr || size == nullptr) return absl::InvalidArgumentError("NULL out");
    absl::StatusOr<std::string> got = store->view.Get(Str(key), WaitTimeout(timeout_us));
    if (!got.ok()) return got.status();
    return TakeBytes(*got, value, size);
  });
}

int tpd_store_add(tpd_store* store, const char* key, int64_t delta, int64_t* result) {
  return Guarded("tpd_store_add", [&]() -> absl::Status {
    if (absl::Status s = Required(store, "store"); !s.ok()) return s;
    if (absl::Status s = Required(result, "result"); !s.ok()) return s;
    absl::StatusOr<int64_t> added = store->view.Add(Str(key), delta);
    if (!added.ok()) return added.status();
    *result = *added;
    return absl::OkStatus();
  });
}

int tpd_store_compare_set(tpd_store* store, const char* key, const char* expected,
                          size_t expected_size, const char* desired, size_t desired_size,
                          char** value, size_t* size) {
  return Guarded("tpd_store_compare_set", [&]() -> absl::Status {
    if (absl::Status s = Required(store, "store"); !s.ok()) return s;
    if (value == nullptr || size == nullptr) return absl::InvalidArgumentError("NULL out");
    absl::StatusOr<std::string_view> was = Bytes(expected, expected_size, "expected value");
    if (!was.ok()) return was.status();
    absl::StatusOr<std::string_view> wanted = Bytes(desired, desired_size, "desired value");
    if (!wanted.ok()) return wanted.status();
    absl::StatusOr<std::string> now =
        store->view.CompareSet(Str(key), absl::string_view(was->data(), was->size()),
                               absl::string_view(wanted->data(), wanted->size()));
    if (!now.ok()) return now.status();
    return TakeBytes(*now, value, size);
  });
}

int tpd_store_wait(tpd_store* store, const char* const* keys, int num_keys, int64_t timeout_us) {
  return Guarded("tpd_store_wait", [&]() -> absl::Status {
    if (absl::Status s = Required(store, "store"); !s.ok()) return s;
    absl::StatusOr<std::vector<std::string>> list = Keys(keys, num_keys);
    if (!list.ok()) return list.status();
    return store->view.Wait(*list, WaitTimeout(timeout_us));
  });
}

int tpd_store_check(tpd_store* store, const char* const* keys, int num_keys, int* ready) {
  return Guarded("tpd_store_check", [&]() -> absl::Status {
    if (absl::Status s = Required(store, "store"); !s.ok()) return s;
    if (absl::Status s = Required(ready, "ready"); !s.ok()) return s;
    absl::StatusOr<std::vector<std::string>> list = Keys(keys, num_keys);
    if (!list.ok()) return list.status();
    absl::StatusOr<bool> all = store->view.Check(*list);
    if (!all.ok()) return all.status();
    *ready = *all ? 1 : 0;
    return absl::OkStatus();
  });
}

int tpd_store_delete_key(tpd_store* store, const char* key, int* deleted) {
  return Guarded("tpd_store_delete_key", [&]() -> absl::Status {
    if (absl::Status s = Required(store, "store"); !s.ok()) return s;
    if (absl::Status s = Required(deleted, "deleted"); !s.ok()) return s;
    absl::StatusOr<bool> gone = store->view.DeleteKey(Str(key));
    if (!gone.ok()) return gone.status();
    *deleted = *gone ? 1 : 0;
    return absl::OkStatus();
  });
}

int tpd_store_num_keys(tpd_store* store, int64_t* num_keys) {
  return Guarded("tpd_store_num_keys", [&]() -> absl::Status {
    if (absl::Status s = Required(store, "store"); !s.ok()) return s;
    if (absl::Status s = Required(num_keys, "num_keys"); !s.ok()) return s;
    absl::StatusOr<int64_t> n = store->view.NumKeys();
    if (!n.ok()) return n.status();
    *num_keys = *n;
    return absl::OkStatus();
  });
}

// --- Counters ---

int tpd_call_stats(tpd_client* client, char** stats_json) {
  return Guarded("tpd_call_stats", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if (absl::Status s = Required(stats_json, "stats_json"); !s.ok()) return s;
    absl::StatusOr<tpd::CallEngineStats> stats = client->client->GetCallStats();
    if (!stats.ok()) return stats.status();
    const tpd::CallEngineStats& s = *stats;
    *stats_json = Copy(absl::StrCat(
        "{\"arena_bytes\": ", s.arena_bytes, ", \"arena_used_bytes\": ", s.arena_used_bytes,
        ", \"arena_live_blocks\": ", s.arena_live_blocks, ", \"bytes_copied_in\": ",
        s.bytes_copied_in, ", \"tensors_copied_in\": ", s.tensors_copied_in,
        ", \"tensors_in_place\": ", s.tensors_in_place, ", \"rx_blocks_held\": ", s.rx_blocks_held,
        ", \"handler_threads\": ", s.handler_threads, ", \"handlers_running\": ",
        s.handlers_running, ", \"cuda_tensors_sent\": ", s.cuda_tensors_sent,
        ", \"cuda_tensors_received\": ", s.cuda_tensors_received, ", \"cuda_pool_blocks_held\": ",
        s.cuda_pool_blocks_held, ", \"rx_view_bytes\": ", client->events->rx_view_bytes.load(),
        ", \"rx_heap_bytes\": ", client->events->rx_heap_bytes.load(), "}"));
    return absl::OkStatus();
  });
}

}  // extern "C"
