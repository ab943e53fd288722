// The C ABI over the C++ client (tpd_client.h). Each exported function converts its
// arguments, calls client/client.h, and turns the result into a status code plus a
// thread-local message; an exception escaping the C++ side becomes INTERNAL here, never an
// unwind into a C or Python caller.

#include "client/c/tpd_client.h"

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
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
#include "base/parallel_copy.h"
#include "client/calls.h"
#include "client/client.h"
#include "client/events.h"
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

// The library's view of one client: the C++ client, its event queues, and what DLPack views
// and arena blocks handed out keep.
struct tpd_client {
  const uint64_t made_at_fork = ForkCount();
  std::unique_ptr<tpd::Client> client;
  std::shared_ptr<tpd::EventQueues> events;
  absl::Mutex arena_mu;
  // Live arena blocks by their start (tpd_arena_alloc), so a tensor passed by pointer is sent
  // where it lies.
  std::map<const void*, tpd::Tensor> arena ABSL_GUARDED_BY(arena_mu);
};

struct tpd_store {
  tpd::StoreView view;
  const uint64_t made_at_fork = ForkCount();
};

// A request to answer, or a call's result: every event this library queues is one.
struct tpd_event : tpd::ClientEvent {
  const uint64_t made_at_fork = ForkCount();
  std::shared_ptr<tpd::EventQueues> events;  // the DLPack policy's counters
};
static_assert(TPD_EVENT_REQUEST == tpd::ClientEvent::kRequest &&
              TPD_EVENT_REPLY == tpd::ClientEvent::kReply &&
              TPD_EVENT_RELEASED == tpd::ClientEvent::kReleased);
static_assert(TPD_QUEUE_REQUESTS == tpd::EventQueues::kRequests &&
              TPD_QUEUE_REPLIES == tpd::EventQueues::kReplies);

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

// `client`: where to look for arena blocks (nullptr: none). `views`: the receive-heap views
// handed out, which are sent where they lie; any other CPU tensor is copied in.
// `keep`: held by every CUDA tensor until the daemon no longer reads it (Tensor::Cuda).
absl::StatusOr<std::vector<tpd::Tensor>> ToTensors(tpd_client* client,
                                                   const tpd::HandedOutViews& views,
                                                   const tpd_tensor* tensors, int n,
                                                   std::shared_ptr<void> keep = nullptr) {
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
    if (borrowed.storage() == tpd::TensorStorage::kBorrowed && t.nbytes > 0) {
      if (std::optional<tpd::Tensor> view = views.Find(t.data, t.nbytes)) borrowed = *view;
    }
    // The tensor as the caller describes it, over the bytes it gave (checked to match).
    absl::StatusOr<tpd::Tensor> shaped = borrowed.Reshaped(dtype, std::move(shape));
    if (!shaped.ok())
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", shaped.status().message()));
    out.push_back(*std::move(shaped));
  }
  return out;
}

// A new arena block of `nbytes` bytes, as a uint8 tensor.
absl::StatusOr<tpd::Tensor> ArenaBytes(tpd_client* client, uint64_t nbytes) {
  return client->client->AllocateTensor(tpd::shm::DType::kUInt8, {static_cast<int64_t>(nbytes)});
}

// The i-th tensor of `event`, or OUT_OF_RANGE.
absl::StatusOr<const tpd::Tensor*> TensorAt(const tpd_event* event, int i) {
  if (i < 0 || i >= static_cast<int>(event->message.tensors.size())) {
    return absl::OutOfRangeError(absl::StrCat("tensor ", i, " of ", event->message.tensors.size()));
  }
  return &event->message.tensors[i];
}

std::unique_ptr<tpd_event> ReplyEvent(std::shared_ptr<tpd::EventQueues> events, uint64_t tag,
                                      absl::StatusOr<tpd::Message> result) {
  auto event = std::make_unique<tpd_event>();
  event->kind = tpd::ClientEvent::kReply;
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
  ReleaseNotice(std::shared_ptr<tpd::EventQueues> events, uint64_t tag)
      : events(std::move(events)), tag(tag) {}
  ~ReleaseNotice() {
    auto done = std::make_unique<tpd_event>();
    done->kind = tpd::ClientEvent::kReleased;
    done->tag = tag;
    done->events = events;
    std::unique_ptr<tpd::ClientEvent> queued = std::move(done);
    (void)events->Push(queued);  // stopped: nobody waits for it any more
  }
  const std::shared_ptr<tpd::EventQueues> events;
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

// What a DLPack tensor handed out holds: a view of the received tensor (its block), a copy,
// or an arena block (tpd_arena_dlpack).
struct DlpackHolder {
  const uint64_t made_at_fork = ForkCount();
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
  tpd::Tensor view;
  std::unique_ptr<char[]> copy;
  std::shared_ptr<tpd::EventQueues> events;
  uint64_t counted = 0;     // bytes added to events->rx_view_bytes
  bool registered = false;  // in events->views, so it is sent where it lies
};

void DeleteDlpack(DLManagedTensor* self) {
  auto* holder = static_cast<DlpackHolder*>(self->manager_ctx);
  if (Inherited(holder->made_at_fork)) return;  // the parent's block, not this child's
  if (holder->counted != 0) holder->events->rx_view_bytes -= holder->counted;
  if (holder->registered) holder->events->views.Remove(holder->view);
  delete holder;
}

// `holder`'s DLPack tensor: its bytes at `data`, 1-D uint8, on `device`.
void* FinishDlpack(std::unique_ptr<DlpackHolder> holder, void* data, DLDevice device,
                   uint64_t nbytes) {
  holder->shape[0] = static_cast<int64_t>(nbytes);
  DLTensor& dl = holder->managed.dl_tensor;
  dl.data = data;
  dl.device = device;
  dl.ndim = 1;
  dl.dtype = DLDataType{1, 8, 1};
  dl.shape = holder->shape;
  holder->managed.manager_ctx = holder.get();
  holder->managed.deleter = &DeleteDlpack;
  return &holder.release()->managed;
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
    handle->events = std::make_shared<tpd::EventQueues>();
    *out = handle.release();
    return absl::OkStatus();
  });
}

void tpd_client_stop_events(tpd_client* client) {
  if (client == nullptr || Inherited(client->made_at_fork)) return;
  for (std::unique_ptr<tpd::ClientEvent>& event : client->events->Stop()) {
    if (event->kind == tpd::ClientEvent::kRequest) {
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
    absl::StatusOr<tpd::Tensor> block = ArenaBytes(client, nbytes);
    if (!block.ok()) return block.status();
    *data = block->mutable_data();
    absl::MutexLock lock(&client->arena_mu);
    client->arena[*data] = *std::move(block);
    return absl::OkStatus();
  });
}

int tpd_arena_dlpack(tpd_client* client, uint64_t nbytes, void** managed) {
  return Guarded("tpd_arena_dlpack", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if (absl::Status s = Required(managed, "managed"); !s.ok()) return s;
    absl::StatusOr<tpd::Tensor> block = ArenaBytes(client, nbytes);
    if (!block.ok()) return block.status();
    auto holder = std::make_unique<DlpackHolder>();
    holder->events = client->events;
    holder->view = *std::move(block);
    client->events->views.Add(holder->view);
    holder->registered = true;
    void* data = holder->view.mutable_data();
    *managed = FinishDlpack(std::move(holder), data, DLDevice{1, 0}, nbytes);
    return absl::OkStatus();
  });
}

int tpd_arena_in_flight(tpd_client* client, const void* data, int* in_flight) {
  return Guarded("tpd_arena_in_flight", [&]() -> absl::Status {
    if (absl::Status s = Required(client, "client"); !s.ok()) return s;
    if (absl::Status s = Required(in_flight, "in_flight"); !s.ok()) return s;
    {
      absl::MutexLock lock(&client->arena_mu);
      auto it = client->arena.find(const_cast<void*>(data));
      if (it != client->arena.end()) {
        *in_flight = it->second.in_flight() ? 1 : 0;
        return absl::OkStatus();
      }
    }
    std::optional<tpd::Tensor> handed_out = client->events->views.Find(data, 1);
    if (!handed_out || handed_out->storage() != tpd::TensorStorage::kArena) {
      return absl::NotFoundError("tpd_arena_in_flight: no live arena block starts there");
    }
    *in_flight = handed_out->in_flight() ? 1 : 0;
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
    std::shared_ptr<tpd::EventQueues> events = client->events;
    std::string name = method;
    return client->client->HandleDeferred(
        name, [events, name](tpd::Message request, tpd::Responder responder) {
          auto event = std::make_unique<tpd_event>();
          event->kind = tpd::ClientEvent::kRequest;
          event->message = std::move(request);
          event->method = name;
          event->responder = responder;
          event->events = events;
          std::unique_ptr<tpd::ClientEvent> queued = std::move(event);
          if (!events->Push(queued)) {
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
    // A reference of this call's own: tpd_client_close may free the client while this thread,
    // woken by it, has yet to leave the wait.
    const std::shared_ptr<tpd::EventQueues> events = client->events;
    // A thread waiting for requests only reads the calls' ring itself when nobody else does
    // (a lent reader, client/events.h).
    std::shared_ptr<tpd::CallEngine> engine;
    if (queues == TPD_QUEUE_REQUESTS) engine = client->client->AttachedEngine();
    absl::StatusOr<std::unique_ptr<tpd::ClientEvent>> event = events->Next(
        queues, timeout_us < 0 ? absl::InfiniteDuration() : absl::Microseconds(timeout_us),
        std::move(engine));
    if (!event.ok()) return event.status();
    *out = static_cast<tpd_event*>(event->release());  // queued by this library: a tpd_event
    return absl::OkStatus();
  });
}

void tpd_event_free(tpd_event* event) {
  if (event == nullptr || Inherited(event->made_at_fork)) return;
  if (event->kind == tpd::ClientEvent::kRequest && event->responder.valid()) {
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
    if (t.is_cuda()) {
      holder->view = t;
      *managed = FinishDlpack(std::move(holder), reinterpret_cast<void*>(t.device_pointer()),
                              DLDevice{2, t.device().index}, t.size());
    } else {
      tpd::EventQueues& events = *event->events;
      bool take_copy = copy == 1;
      if (copy < 0) {
        const uint64_t heap = events.rx_heap_bytes.load();
        take_copy = heap == 0 || events.rx_view_bytes.load() + t.size() > heap / 2;
      }
      void* data;
      if (take_copy) {
        holder->copy.reset(new char[t.size() == 0 ? 1 : t.size()]);
        tpd::CopyBytes(holder->copy.get(), t.data().data(), t.size());
        data = holder->copy.get();
      } else {
        holder->view = t;
        holder->counted = t.size();
        events.rx_view_bytes += t.size();
        if (!t.in_sender_memory()) {
          events.views.Add(t);
          holder->registered = true;
        }
        data = const_cast<char*>(t.data().data());
      }
      *managed = FinishDlpack(std::move(holder), data, DLDevice{1, 0}, t.size());
    }
    return absl::OkStatus();
  });
}

int tpd_reply(tpd_event* event, const char* payload, size_t size, const tpd_tensor* tensors,
              int num_tensors, uint64_t release_tag) {
  return Guarded("tpd_reply", [&]() -> absl::Status {
    if (absl::Status s = Required(event, "event"); !s.ok()) return s;
    if (event->kind != tpd::ClientEvent::kRequest) {
      return absl::InvalidArgumentError("tpd_reply: the event is not a request");
    }
    absl::StatusOr<std::string_view> bytes = Bytes(payload, size, "payload");
    if (!bytes.ok()) return bytes.status();
    // tpd_arena_alloc's blocks are the client's, which an event does not know: they are copied
    // in. Views of the receive heap (a request's own tensors returned, say) and
    // tpd_arena_dlpack's blocks are known to the events too: they go where they lie.
    std::shared_ptr<void> released;
    if (release_tag != 0) released = std::make_shared<ReleaseNotice>(event->events, release_tag);
    absl::StatusOr<std::vector<tpd::Tensor>> converted =
        ToTensors(nullptr, event->events->views, tensors, num_tensors, std::move(released));
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
    if (event->kind != tpd::ClientEvent::kRequest) {
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
    absl::StatusOr<std::vector<tpd::Tensor>> converted =
        ToTensors(client, client->events->views, tensors, num_tensors);
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
    absl::StatusOr<std::vector<tpd::Tensor>> converted =
        ToTensors(client, client->events->views, tensors, num_tensors);
    if (!converted.ok()) return converted.status();
    tpd::CallFuture future =
        client->client->CallAsync(Str(group), Str(worker), Str(method), *bytes, *converted,
                                  CallTimeout(timeout_us), (flags & TPD_CALL_REVERSE_MAP) != 0);
    std::shared_ptr<tpd::EventQueues> events = client->events;
    future.Then([events, tag](const absl::StatusOr<tpd::Message>& result) {
      std::unique_ptr<tpd::ClientEvent> event = ReplyEvent(events, tag, result);
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
