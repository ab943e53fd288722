// Calls between workers through the daemon's shared memory (docs/data_plane.md, "Calls on one
// node"): the client side. Used through Client::Handle and Client::Call.
//
// This first version copies: a request's payload and tensors are copied from the user's
// strings into the tx heap (the library's allocator of it), and what arrives in the rx heap is
// copied out into a Message before the rx block is released to the daemon. Zero-copy views
// come later.
//
// Thread safety: thread-safe. One reader thread ("tpd-calls") takes completions off the ring
// and never runs user code; handlers run on a small pool of their own.

#ifndef TPD_CLIENT_CALLS_H_
#define TPD_CLIENT_CALLS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/shm/descriptor.h"
#include "proto/shm/heap.h"
#include "proto/shm/ring.h"
#include "proto/shm/segment.h"

namespace tpd {

// A CPU tensor: dtype, shape and its bytes (product(shape) * item size of them).
struct Tensor {
  shm::DType dtype = shm::DType::kUInt8;
  std::vector<int64_t> shape;
  std::string data;
};

// A request or a reply.
struct Message {
  std::string payload;
  std::vector<Tensor> tensors;
  // A request given to a handler: the calling worker's name (set by the library).
  std::string caller;
};

// Answers one request; an error status goes back to the caller with its code and message.
using Handler = std::function<absl::StatusOr<Message>(const Message& request)>;

class CallEngine {
 public:
  CallEngine(std::shared_ptr<const shm::Segment> segment, int handler_threads);
  ~CallEngine();
  CallEngine(const CallEngine&) = delete;
  CallEngine& operator=(const CallEngine&) = delete;

  void Handle(const std::string& method, Handler handler);
  // `from`: the worker of `group` this client calls as (the daemon checks this session holds it).
  absl::StatusOr<Message> Call(const std::string& group, const std::string& from,
                               const std::string& worker, const std::string& method,
                               const Message& request, absl::Duration timeout);
  // Call without blocking: the future is ready with what Call would return.
  std::future<absl::StatusOr<Message>> CallAsync(const std::string& group,
                                                 const std::string& from,
                                                 const std::string& worker,
                                                 const std::string& method,
                                                 const Message& request, absl::Duration timeout);

 private:
  struct Waiter {
    bool done = false;
    absl::StatusOr<Message> result;
    // CallAsync: the map owns the waiter, the reader answers it by `give_up` at the latest.
    std::unique_ptr<std::promise<absl::StatusOr<Message>>> promise;
    absl::Time give_up = absl::InfiniteFuture();
    std::string what;  // "call to worker 'w' method 'm'"
  };
  // Answers the waiter of `id` (and frees it when async).
  void Finish(uint64_t id, absl::StatusOr<Message> result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives up on async calls past their give_up time.
  void ExpireAsync() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Incoming {
    uint64_t call_id = 0;
    std::string worker;  // this client's, the one called
    std::string method;
    Message request;
  };

  // Copies a message into a tx block and pushes its descriptor.
  absl::Status Submit(shm::Op op, uint64_t call_id, int64_t deadline_ns, uint16_t flags,
                      uint32_t code, const std::string& n0, const std::string& n1,
                      const std::string& n2, const std::string& n3, const Message& message);
  void SendRelease(uint64_t rx_offset);
  void ReadLoop();
  void HandlerLoop();
  void OnCompletion(const shm::Descriptor& d);

  const std::shared_ptr<const shm::Segment> segment_;
  uint8_t* const base_;

  absl::Mutex tx_mu_;
  shm::HeapAllocator tx_ ABSL_GUARDED_BY(tx_mu_);
  shm::RingProducer submissions_ ABSL_GUARDED_BY(tx_mu_);
  shm::RingConsumer completions_;  // the reader thread only

  absl::Mutex mu_;
  absl::CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Waiter*> waiting_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Handler> handlers_ ABSL_GUARDED_BY(mu_);
  std::deque<Incoming> queue_ ABSL_GUARDED_BY(mu_);
  std::thread reader_;
  std::vector<std::thread> pool_;
};

}  // namespace tpd

#endif  // TPD_CLIENT_CALLS_H_
