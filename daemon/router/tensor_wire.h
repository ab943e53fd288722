// Tensors between the two forms they take in the daemon: a shared-memory TensorEntry (what a
// client wrote in its heap) and the agent's TensorDescriptor (what travels between daemons).
// A descriptor comes from another daemon, so it is checked like anything read from outside:
// a known dtype, at most kMaxTensorDims non-negative dims, a byte size that does not overflow
// and equals the bytes TensorPipe delivers, a cpu device (bytes travel as host bytes: CUDA
// tensors are staged through pinned memory on both sides), and a target device of "cpu" or
// "cuda:N" (N < shm::kMaxCudaDevices) where the receiver must place it.
//
// Thread safety: stateless functions.

#ifndef TPD_DAEMON_ROUTER_TENSOR_WIRE_H_
#define TPD_DAEMON_ROUTER_TENSOR_WIRE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/agent.pb.h"
#include "shm/descriptor.h"

namespace tpd {

// torch's spelling of a DType code ("float32", "int64", ...); "" for an unknown code.
absl::string_view DTypeName(uint8_t dtype);

// The wire form of a validated entry: its bytes travel from host memory ("cpu"), to be
// placed on `target_device` (-1: cpu, else cuda:N) by the receiver.
v1::TensorDescriptor ToWire(const shm::TensorEntry& entry, int target_device = -1);

// The entry a descriptor describes, with offset 0 (the caller places it), its device cpu;
// `*target_device` is where it must land (-1: cpu). INVALID_ARGUMENT naming tensor `index` and
// the field when it is not a valid tensor of `nbytes` host bytes.
absl::StatusOr<shm::TensorEntry> FromWire(const v1::TensorDescriptor& wire, uint64_t nbytes,
                                          int index, int* target_device);

}  // namespace tpd

#endif  // TPD_DAEMON_ROUTER_TENSOR_WIRE_H_
