// A client session driven by hand: the test writes descriptors, messages and tensor tables
// into its own writable mapping of the session's segment, as a buggy or hostile client could,
// and reads the daemon's answers off the completion ring. For tests of what the daemon does
// with whatever arrives in shared memory (tests/integration/shm_hostile_test,
// tests/cuda/cuda_calls_test).
//
// Thread safety: one thread at a time.

#ifndef TPD_TESTS_TESTING_RAW_SESSION_H_
#define TPD_TESTS_TESTING_RAW_SESSION_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "proto/control.grpc.pb.h"
#include "shm/attach.h"
#include "shm/descriptor.h"
#include "shm/layout.h"
#include "shm/message.h"
#include "shm/ring.h"
#include "shm/segment.h"

namespace tpd::testing {

struct RawSession {
  std::unique_ptr<Client> client;
  std::shared_ptr<const shm::Segment> segment;
  shm::Layout layout;
  uint8_t* writable = nullptr;  // our own MAP_SHARED, PROT_WRITE mapping of the whole segment
  size_t size = 0;
  std::unique_ptr<shm::RingProducer> submit;
  std::unique_ptr<shm::RingConsumer> complete;

  // Attaches `client` (which joined its groups already) and maps its segment writable.
  static absl::StatusOr<std::unique_ptr<RawSession>> Open(std::unique_ptr<Client> client);
  ~RawSession();

  // Writes a call message (group, worker, method, from this worker) plus `body` at `offset` of
  // the tx heap and submits it; false when the ring is full. With `tensors`, their table
  // follows the message and, for each CUDA entry, its CudaExport record from `records` (in
  // order) follows the table: entries' offsets are the caller's, device_handle is filled in.
  bool SubmitCall(uint64_t offset, const std::string& group, const std::string& worker,
                  const std::string& method, const std::string& from, const std::string& body,
                  uint64_t call_id, absl::Duration timeout = absl::Seconds(5),
                  std::vector<shm::TensorEntry> tensors = {},
                  const std::vector<shm::CudaExport>& records = {});

  // Writes a store call (Op::kStore: names {group, "", method, ""}, `body` the request) at
  // `offset` of the tx heap and submits it; false when the ring is full.
  bool SubmitStore(uint64_t offset, const std::string& group, const std::string& method,
                   const std::string& body, uint64_t call_id);

  // Writes a message (`names`, then `body`) at `offset` of the tx heap; the descriptor of `op`
  // that points at it, not yet submitted.
  shm::Descriptor WriteMessage(shm::Op op, uint64_t offset, const shm::MessageNames& names,
                               const std::string& body, uint64_t call_id);

  // Pops completions until `until`, or until `want` replies came; replies by call id (their
  // status code and, for an error, the message), releases skipped.
  std::map<uint64_t, std::pair<absl::StatusCode, std::string>> Replies(size_t want,
                                                                       absl::Time until);
};

// One request on the data socket of the daemon serving `grpc_socket` (shm/attach.h),
// as this process: the daemon's answer (an fd sent with it is closed).
absl::Status SendDataRequest(const std::string& grpc_socket,
                             const std::array<uint8_t, shm::kAttachRequestBytes>& request);

// The identify exchange for `session_id`, for tests that open sessions with raw gRPC. The
// client library does this itself when it opens a session; a session must be identified
// before it joins a group.
absl::Status IdentifyRawSession(const std::string& grpc_socket, const std::string& session_id);

// Control.OpenSession streams opened by hand, kept open until CloseAll or destruction.
class RawSessionStreams {
 public:
  explicit RawSessionStreams(std::string grpc_socket) : socket_(std::move(grpc_socket)) {}
  ~RawSessionStreams() { CloseAll(); }
  // A new session's id; "" when the daemon refused it, with why in `*refused` (if given).
  std::string Open(absl::Status* refused = nullptr);
  // Ends every stream and the channel (a connection of the test's to the daemon too).
  void CloseAll();

 private:
  const std::string socket_;
  std::unique_ptr<v1::Control::Stub> control_;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::SessionEvent>>> streams_;
};

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_RAW_SESSION_H_
