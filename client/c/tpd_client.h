/* The tpd client library's C ABI (libtpd_client.so): a local process's handle on its node's
 * daemon, for any language. The Python package (python/tpd) is written on it with ctypes.
 *
 * Example (tests/client/c builds and runs these lines, between the markers, as C):
 *
 *   tpd_client* client;                                                  (example begins)
 *   if (tpd_client_open("", TPD_TIMEOUT_DEFAULT, 0, &client) != TPD_OK) {
 *     fprintf(stderr, "%s\n", tpd_last_error());
 *     return 1;
 *   }
 *   tpd_client_close(client);                                            (example ends)
 *
 * Conventions:
 * - Every function that can fail returns a status code (the gRPC/absl code: TPD_OK is 0) and
 *   leaves a message naming what failed in tpd_last_error() of the calling thread. Nothing
 *   throws or aborts across this boundary.
 * - Timeouts are microseconds: TPD_TIMEOUT_DEFAULT (negative) takes the default of the thing
 *   waited on (the group's rpc_timeout for a call, the daemon's for a store wait), 0 means no
 *   deadline for a call (PyTorch's timeout 0).
 * - Strings are NUL-terminated UTF-8 unless a length goes with them; what the library returns
 *   in an out-parameter of type char** is freed with tpd_free.
 * - Handles are opaque. A tpd_client is thread-safe; a tpd_event belongs to whoever took it.
 * - Across fork(): handles belong to the process that made them. In a forked child, freeing
 *   or closing an inherited client, event, store or DLPack tensor does nothing (the child's
 *   copy is left to die with it), since the parent still uses what they hold. A child forked
 *   after this library was loaded cannot open clients through the same copy (gRPC keeps one
 *   epoll set per process, shared with the parent across fork): load a copy of its own with
 *   dlmopen(LM_ID_NEWLM, ...) and open them through that, as tpd's Python package does.
 *
 * Semantics are those of the C++ client (client/client.h, client/calls.h); this header says
 * what differs.
 */
#ifndef TPD_CLIENT_C_TPD_CLIENT_H_
#define TPD_CLIENT_C_TPD_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: the gRPC codes. */
enum {
  TPD_OK = 0,
  TPD_CANCELLED = 1,
  TPD_UNKNOWN = 2,
  TPD_INVALID_ARGUMENT = 3,
  TPD_DEADLINE_EXCEEDED = 4,
  TPD_NOT_FOUND = 5,
  TPD_ALREADY_EXISTS = 6,
  TPD_PERMISSION_DENIED = 7,
  TPD_RESOURCE_EXHAUSTED = 8,
  TPD_FAILED_PRECONDITION = 9,
  TPD_ABORTED = 10,
  TPD_OUT_OF_RANGE = 11,
  TPD_UNIMPLEMENTED = 12,
  TPD_INTERNAL = 13,
  TPD_UNAVAILABLE = 14,
  TPD_DATA_LOSS = 15,
  TPD_UNAUTHENTICATED = 16,
};

#define TPD_TIMEOUT_DEFAULT (-1)

/* The ABI's version: bumped when a function changes incompatibly. A binding built on this
 * header checks tpd_abi_version() against TPD_ABI_VERSION before it calls anything else.
 * 4: a tensor lying inside a DLPack view of the receive heap is sent where it lies (read after
 * the call returns, no longer copied before), and tpd_arena_dlpack. */
#define TPD_ABI_VERSION 4
int tpd_abi_version(void);

/* The size of the struct named `type` ("tpd_tensor", "tpd_event_info") as this library was
 * built, or with `field` the offset of that field in it; (size_t)-1 for a name it does not
 * know. A binding that mirrors the structs by hand (ctypes) checks its copies with it at load
 * instead of trusting them. */
size_t tpd_layout(const char* type, const char* field);

/* The message of the last failed call on this thread ("" after a success). Valid until the
 * thread's next call into the library. */
const char* tpd_last_error(void);

/* Frees what the library returned through a char** (and nothing else). NULL: no-op. */
void tpd_free(void* p);

/* --- Clients --- */

typedef struct tpd_client tpd_client;

/* Connects to the daemon on `socket_path` ("" or NULL: the default socket, $TPD_SOCKET or the
 * system one). `connect_timeout_us`: how long to wait for the daemon (TPD_TIMEOUT_DEFAULT: 5 s).
 * `cuda_pool_bytes`: the receive pool lent on each CUDA device a join gives this client's
 * workers (0: the library's default, 256 MiB). */
int tpd_client_open(const char* socket_path, int64_t connect_timeout_us, uint64_t cuda_pool_bytes,
                    tpd_client** out);
/* Ends the session (its members leave at once), wakes every tpd_next_event waiting on the
 * client with TPD_CANCELLED, and frees it. Events, calls and tensors taken from it stay
 * valid; answering a request after this fails. NULL: no-op. */
void tpd_client_close(tpd_client* client);
/* Wakes every tpd_next_event on `client` and makes later ones return TPD_CANCELLED at once
 * (events still queued are dropped: requests among them are answered UNAVAILABLE). For a
 * shutdown that stops its event threads before it closes the client. */
void tpd_client_stop_events(tpd_client* client);

/* --- Groups --- */

typedef struct tpd_join_options tpd_join_options;

tpd_join_options* tpd_join_options_new(void);
void tpd_join_options_free(tpd_join_options* options);
/* Sets one option, by name (values are text):
 *   group, name, init_method, secret       strings
 *   rank, world_size                       integers; absent: assigned / a dynamic group
 *   timeout_us                             how long the join waits for the group
 *   env                                    "NAME=VALUE", repeated: env:// variables (when
 *                                          none is given the process environment's are sent)
 *   num_worker_threads, rpc_timeout_us     TensorPipeRpcBackendOptions
 *   device, transport, channel             repeated: devices, _transports, _channels
 *   include_members                        "1": the answer with the group's member list
 *                                          (without, by default: tpd_get_group has it)
 *   abandon                                static groups: this rank cannot take part, and
 *                                          why; the group fails at once naming the rank, and
 *                                          tpd_join returns TPD_ABORTED
 * INVALID_ARGUMENT naming the option for an unknown name or a value that is not its type. */
int tpd_join_options_set(tpd_join_options* options, const char* key, const char* value);
/* Adds device_maps[worker][from] = to ("cuda:0", "cpu", or a bare index). */
int tpd_join_options_add_device_map(tpd_join_options* options, const char* worker, const char* from,
                                    const char* to);

/* Joins; `*response_json` (may be NULL) receives the JoinResponse as JSON (proto3 JSON
 * names). Errors with the daemon's code and message (torch's wording for bad init methods and
 * option validation). */
int tpd_join(tpd_client* client, const tpd_join_options* options, char** response_json);
int tpd_leave(tpd_client* client, const char* group, const char* name);
/* Waits until every member entered the barrier; in a static group members gone since it formed
 * count as arrived. `*response_json` (may be NULL): the BarrierResponse, {"gone": [names]}
 * (proto3 JSON: no "gone" key when nobody was gone). */
int tpd_barrier(tpd_client* client, const char* group, const char* name, int64_t timeout_us,
                char** response_json);
/* The group's view as JSON (GroupView). `init_method` "" or NULL: this daemon's. */
int tpd_get_group(tpd_client* client, const char* group, const char* init_method, char** view_json);
/* A secret of this process's user for `purpose` (Control.UserSecret): 64 hex digits in
 * *secret_hex (free with tpd_free), the same for this uid on every daemon of the cluster. */
int tpd_user_secret(tpd_client* client, const char* purpose, char** secret_hex);
/* Admin.Status of the daemon as JSON. */
int tpd_status(tpd_client* client, char** status_json);

/* --- Tensors --- */

/* dtype codes (shm/descriptor.h DType). */
enum {
  TPD_FLOAT32 = 1,
  TPD_FLOAT64 = 2,
  TPD_FLOAT16 = 3,
  TPD_BFLOAT16 = 4,
  TPD_INT8 = 5,
  TPD_UINT8 = 6,
  TPD_INT16 = 7,
  TPD_INT32 = 8,
  TPD_INT64 = 9,
  TPD_BOOL = 10,
  TPD_COMPLEX64 = 11,
  TPD_COMPLEX128 = 12,
};
enum { TPD_CPU = 0, TPD_CUDA = 1 };

/* A tensor to send, or one received (tpd_event_tensor). Bytes are dense: product(shape) *
 * item size. A CPU tensor is copied into the shared arena before the call returns unless
 * `data` is the start of a live arena block (tpd_arena_alloc: of the same size;
 * tpd_arena_dlpack: of at least that size) or lies inside a live DLPack view of the receive
 * heap (tpd_event_tensor_dlpack, copy 0 or the policy's view), which are sent where they lie:
 * the daemon reads them after the call returns (a reply's, after tpd_reply returns), so change
 * them only once the call completed. A CUDA tensor is sent by pointer: the daemon copies it after
 * the work queued on `stream` (NULL: the legacy default stream) before the call; keep it unchanged
 * until the call completes. */
typedef struct tpd_tensor {
  int32_t dtype;
  int32_t ndim; /* at most 8 */
  int64_t shape[8];
  const void* data; /* host pointer, or device pointer for TPD_CUDA */
  uint64_t nbytes;
  int32_t device_type; /* TPD_CPU or TPD_CUDA */
  int32_t device_index;
  void* stream; /* CUDA only */
} tpd_tensor;

/* A block of the shared arena of `nbytes`, for a CPU tensor to be sent with no copy; `*data`
 * is its start. It stays allocated until tpd_arena_free and every message sending it is
 * released by the daemon. RESOURCE_EXHAUSTED naming the arena's size when it does not fit. */
int tpd_arena_alloc(tpd_client* client, uint64_t nbytes, void** data);
void tpd_arena_free(tpd_client* client, void* data);
/* A block of the shared arena of `nbytes` as a DLPack DLManagedTensor* (as
 * tpd_event_tensor_dlpack's: 1-D uint8 on the CPU), writable, whose deleter frees the block;
 * it may outlive the client. Passed from its start to tpd_call, tpd_call_async or tpd_reply,
 * it is sent where it lies, with no copy, and stays allocated while a sent message holds it.
 * RESOURCE_EXHAUSTED naming the arena's size when it does not fit. */
int tpd_arena_dlpack(tpd_client* client, uint64_t nbytes, void** managed);
/* Whether a sent message still holds the arena block at `data` (1 in *in_flight) or not (0).
 * The block is sent where it lies: the daemon reads it in place, and so may a receiving
 * process of this uid and gid for as long as it keeps the message, after the call returned
 * (docs/data_plane.md, "Tensors shared between sessions"). Change its bytes only once this is
 * 0. NOT_FOUND when `data` is no live block of tpd_arena_alloc or tpd_arena_dlpack. */
int tpd_arena_in_flight(tpd_client* client, const void* data, int* in_flight);

/* --- Events: requests to serve and calls that finished --- */

typedef struct tpd_event tpd_event;

enum {
  TPD_EVENT_REQUEST = 1,  /* a call to one of this client's workers: answer it */
  TPD_EVENT_REPLY = 2,    /* the result of tpd_call, or of tpd_call_async (its tag) */
  TPD_EVENT_RELEASED = 3, /* the CUDA tensors of a reply sent with this tag may change now */
};
/* Queues, by kind: a program may serve requests on some threads and complete calls on
 * another. */
enum { TPD_QUEUE_REQUESTS = 1, TPD_QUEUE_REPLIES = 2 };

/* Incoming calls of `method` to this client's workers become TPD_EVENT_REQUEST events (the
 * first tpd_serve attaches the client to shared memory). */
int tpd_serve(tpd_client* client, const char* method);

/* Blocks for the next event of `queues` (a mask of TPD_QUEUE_*), at most `timeout_us`
 * (TPD_TIMEOUT_DEFAULT: no limit): DEADLINE_EXCEEDED when none came, CANCELLED once events
 * are stopped. Threads blocked here hold no lock of the caller's language (call it with
 * Python's GIL released: ctypes does). */
int tpd_next_event(tpd_client* client, int queues, int64_t timeout_us, tpd_event** out);

/* Frees an event. A request freed unanswered is answered INTERNAL (its caller never waits for
 * its deadline). Received tensors taken out of it (tpd_event_tensor_dlpack) stay valid. */
void tpd_event_free(tpd_event* event);

int tpd_event_kind(const tpd_event* event);
/* A reply's tag (tpd_call_async), 0 for tpd_call's and for requests. */
uint64_t tpd_event_tag(const tpd_event* event);
/* A reply's status code; `*message` (may be NULL) its message, valid while the event lives.
 * TPD_OK for requests. */
int tpd_event_status(const tpd_event* event, const char** message);
/* The payload, valid while the event lives. */
const char* tpd_event_payload(const tpd_event* event, size_t* size);
/* A request's method and calling worker ("" for replies). */
const char* tpd_event_method(const tpd_event* event);
const char* tpd_event_caller(const tpd_event* event);

int tpd_event_num_tensors(const tpd_event* event);

/* What tpd_event_kind, _tag, _status, _payload and _num_tensors return, in one call: for
 * bindings where each call into the library costs (Python's ctypes converts every argument
 * and drops and retakes the GIL), so an event is read with one. Pointers valid while the
 * event lives. */
typedef struct tpd_event_info {
  int32_t kind;
  int32_t code; /* the status code: TPD_OK for requests */
  uint64_t tag;
  const char* message; /* the status message, "" when OK */
  const char* payload;
  uint64_t payload_size;
  int32_t num_tensors;
  int32_t reserved; /* 0 */
} tpd_event_info;
/* INVALID_ARGUMENT for a null event or `out`. */
int tpd_event_read(const tpd_event* event, tpd_event_info* out);

/* The i-th received tensor (its data valid while the event lives). */
int tpd_event_tensor(const tpd_event* event, int i, tpd_tensor* out);

/* The i-th received tensor as a DLPack DLManagedTensor* (legacy "dltensor" capsule ABI),
 * as a 1-D uint8 tensor of its bytes on its device, whose deleter frees what it holds.
 * `copy`: 0, a view into the receive heap (no copy; the heap's block stays held while the
 * tensor lives); 1, a copy in memory of its own (the block goes with the event); -1, the
 * library decides: a view while the views it handed out hold at most half of the receive heap,
 * else a copy, so tensors a program keeps never starve the heap. CUDA tensors are always
 * views of this client's receive pool. (Clients of this library take no tensors in their
 * senders' memory, ClientOptions::tensors_in_sender_memory: every CPU tensor arrives in the
 * receive heap, writable, as DLPack consumers expect.) */
int tpd_event_tensor_dlpack(const tpd_event* event, int i, int copy, void** managed);

/* Answers a TPD_EVENT_REQUEST, once: a reply with a payload and tensors, or an error with a
 * code (not TPD_OK) and message, which the caller receives marked as the remote handler's.
 * Can be called after the thread that took the event moved on, from any thread.
 * A reply's CUDA tensors are read by the daemon after tpd_reply returns: with `release_tag`
 * non-zero, a TPD_EVENT_RELEASED event with that tag arrives on the replies queue once it no
 * longer reads them (keep them unchanged until then). */
int tpd_reply(tpd_event* event, const char* payload, size_t size, const tpd_tensor* tensors,
              int num_tensors, uint64_t release_tag);
int tpd_reply_error(tpd_event* event, int code, const char* message);

/* --- Calls --- */

/* Calls `method` of `worker` in `group` as this client's worker in `group`, and waits;
 * `*reply` a TPD_EVENT_REPLY (also on failure: its status says why, as does the returned
 * code). `timeout_us`: TPD_TIMEOUT_DEFAULT the group's rpc_timeout, 0 none. */
int tpd_call(tpd_client* client, const char* group, const char* worker, const char* method,
             const char* payload, size_t size, const tpd_tensor* tensors, int num_tensors,
             int64_t timeout_us, tpd_event** reply);
/* Starts the call; its result arrives as a TPD_EVENT_REPLY with `tag` on the replies queue.
 * Every started call delivers exactly one event (its reply, its error, its deadline, or
 * CANCELLED when the client closes first). An error here means nothing was started. */
int tpd_call_async(tpd_client* client, const char* group, const char* worker, const char* method,
                   const char* payload, size_t size, const tpd_tensor* tensors, int num_tensors,
                   int64_t timeout_us, uint64_t tag);

/* Flags of tpd_call_async_flags. TPD_CALL_REVERSE_MAP: the call's CUDA tensors go by the
 * reverse of the callee's device map toward the caller (the map the callee's replies take)
 * instead of the caller's own map toward the callee: how torch's distributed autograd sends
 * gradients back by the map their forward pass took. */
enum { TPD_CALL_REVERSE_MAP = 1 };
/* tpd_call_async with `flags` (TPD_CALL_*; INVALID_ARGUMENT for an unknown bit). */
int tpd_call_async_flags(tpd_client* client, const char* group, const char* worker,
                         const char* method, const char* payload, size_t size,
                         const tpd_tensor* tensors, int num_tensors, int64_t timeout_us,
                         uint64_t tag, uint32_t flags);

/* --- The store (c10d semantics: proto/store.proto) --- */

typedef struct tpd_store tpd_store;

/* A store reached through `client`: with `group` NULL or "", the daemon's own store; with a
 * group, the store that group's members share on every node (its rendezvous store), which
 * only a client holding a member of the group may use (calls answer PERMISSION_DENIED
 * otherwise). `name_space` ("" or NULL: none) keeps keys apart within it. `client` must
 * outlive the store. */
int tpd_store_open(tpd_client* client, const char* group, const char* name_space, tpd_store** out);
/* NULL: no-op. */
void tpd_store_close(tpd_store* store);

int tpd_store_set(tpd_store* store, const char* key, const char* value, size_t size);
/* `*value` (tpd_free) and `*size`. */
int tpd_store_get(tpd_store* store, const char* key, int64_t timeout_us, char** value,
                  size_t* size);
int tpd_store_add(tpd_store* store, const char* key, int64_t delta, int64_t* result);
int tpd_store_compare_set(tpd_store* store, const char* key, const char* expected,
                          size_t expected_size, const char* desired, size_t desired_size,
                          char** value, size_t* size);
int tpd_store_wait(tpd_store* store, const char* const* keys, int num_keys, int64_t timeout_us);
/* `*ready` 1 when every key exists. */
int tpd_store_check(tpd_store* store, const char* const* keys, int num_keys, int* ready);
/* `*deleted` 1 when the key existed. */
int tpd_store_delete_key(tpd_store* store, const char* key, int* deleted);
int tpd_store_num_keys(tpd_store* store, int64_t* num_keys);

/* --- Counters --- */

/* The call engine's counters as JSON (CallEngineStats, plus "rx_view_bytes": bytes of the
 * receive heap held by DLPack views handed out, and "rx_heap_bytes"). */
int tpd_call_stats(tpd_client* client, char** stats_json);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TPD_CLIENT_C_TPD_CLIENT_H_ */
