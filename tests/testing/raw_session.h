// A client session driven by hand: the test writes descriptors, messages and tensor tables
// into its own writable mapping of the session's segment, as a buggy or hostile client could,
// and reads the daemon's answers off the completion ring. For tests of what the daemon does
// with whatever arrives in shared memory (tests/integration/shm_hostile_test,
// tests/cuda/cuda_calls_test).
//
// Thread safety: one thread at a time.

#ifndef TPD_TESTS_TESTING_RAW_SESSION_H_
#define TPD_TESTS_TESTING_RAW_SESSION_H_

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
#include "proto/shm/descriptor.h"
#include "proto/shm/layout.h"
#include "proto/shm/ring.h"
#include "proto/shm/segment.h"

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

  // Pops completions until `until`, or until `want` replies came; replies by call id (their
  // status code and, for an error, the message), releases skipped.
  std::map<uint64_t, std::pair<absl::StatusCode, std::string>> Replies(size_t want,
                                                                       absl::Time until);
};

// The data socket's identify exchange for `session_id` (proto/shm/attach.h), as this process,
// for tests that open sessions with raw gRPC: the daemon's answer. The client library does
// this itself when it opens a session; a session must be identified before it joins a group.
absl::Status IdentifyRawSession(const std::string& grpc_socket, const std::string& session_id);

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_RAW_SESSION_H_
