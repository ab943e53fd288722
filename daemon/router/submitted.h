// A message a client submitted, read out of its tx heap once, and where its tensors are to land
// by the group's device maps (PyTorch's getDevicesForTensors).
//
// Thread safety: stateless functions.

#ifndef TPD_DAEMON_ROUTER_SUBMITTED_H_
#define TPD_DAEMON_ROUTER_SUBMITTED_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/control.pb.h"
#include "shm/descriptor.h"
#include "shm/message.h"
#include "shm/segment.h"

namespace tpd::router {

// A message's header, names and body range, and its validated tensor table.
struct Submitted {
  shm::ParsedMessage message;
  std::vector<shm::TensorEntry> tensors;
};

// Payload and tensor bytes of `message`, as a session's usage counts them.
uint64_t MessageBytes(const Submitted& message);

// Where one tensor of a message lands: host memory, or a CUDA device (by the sender's map).
struct Place {
  int device = -1;  // -1: cpu
};

// REQUIRES: ValidateDescriptor(d) passed.
// Reads the message of `d` out of the tx heap of `segment`; a CUDA tensor in it is refused
// with `cuda_allowed` when that is not OK (its user may not open the GPUs).
absl::StatusOr<Submitted> ReadSubmitted(const shm::Segment& segment, const shm::Descriptor& d,
                                        const absl::Status& cuda_allowed);

// The device maps that place a message of one worker to another.
struct MapUse {
  const std::string& group;
  const std::string& from;  // the sender
  const std::string& to;    // the receiver, as PyTorch's error names it
};

// Where `tensors` land by `map` (the sender's map toward the receiver; its reverse map for a
// reply): PyTorch's getDevicesForTensors, with its error for a CUDA tensor the map does not
// place ("Request" or, for a `reply`, "Response device mapping is not available ...").
// Empty when every tensor stays in host memory.
absl::StatusOr<std::vector<Place>> PlaceTensors(const MapUse& use, bool reply,
                                                const std::optional<v1::DeviceMap>& map,
                                                const std::vector<shm::TensorEntry>& tensors);

// "call to worker 'w' method 'm'": how errors about a call name it.
std::string CallName(const std::string& worker, const std::string& method);

// `why` a reply of `worker` to `method` did not reach its caller, saying so first (the code is
// why's).
absl::Status ReplyFailed(const std::string& worker, const std::string& method,
                         const absl::Status& why);

// INTERNAL: worker's reply to method could not be read (`why`).
absl::Status MalformedReply(const std::string& worker, const std::string& method,
                            const absl::Status& why);

}  // namespace tpd::router

#endif  // TPD_DAEMON_ROUTER_SUBMITTED_H_
