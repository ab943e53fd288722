// Tensors between the two forms they take in the daemon: a shared-memory TensorEntry (what a
// client wrote in its heap) and the agent's TensorDescriptor (what travels between daemons).
// A descriptor comes from another daemon, so it is checked like anything read from outside:
// a known dtype, at most kMaxTensorDims non-negative dims, a byte size that does not overflow
// and equals the bytes TensorPipe delivers, a cpu device.
//
// Thread safety: stateless functions.

#ifndef TPD_DAEMON_TENSOR_WIRE_H_
#define TPD_DAEMON_TENSOR_WIRE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/agent.pb.h"
#include "proto/shm/descriptor.h"

namespace tpd {

// torch's spelling of a DType code ("float32", "int64", ...); "" for an unknown code.
absl::string_view DTypeName(uint8_t dtype);

// The wire form of a validated entry (its device is "cpu").
v1::TensorDescriptor ToWire(const shm::TensorEntry& entry);

// The entry a descriptor describes, with offset 0 (the caller places it). INVALID_ARGUMENT
// naming tensor `index` and the field when it is not a valid CPU tensor of `nbytes` bytes.
absl::StatusOr<shm::TensorEntry> FromWire(const v1::TensorDescriptor& wire, uint64_t nbytes,
                                          int index);

}  // namespace tpd

#endif  // TPD_DAEMON_TENSOR_WIRE_H_
