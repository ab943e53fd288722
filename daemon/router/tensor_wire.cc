#include "daemon/router/tensor_wire.h"

#include <array>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tpd {

namespace {

// Indexed by DType code; code 0 is no dtype.
constexpr std::array<absl::string_view, 13> kDTypeNames = {
    "",      "float32", "float64", "float16", "bfloat16",  "int8",      "uint8",
    "int16", "int32",   "int64",   "bool",    "complex64", "complex128"};

}  // namespace

absl::string_view DTypeName(uint8_t dtype) {
  return dtype < kDTypeNames.size() ? kDTypeNames[dtype] : absl::string_view();
}

v1::TensorDescriptor ToWire(const shm::TensorEntry& entry, int target_device) {
  v1::TensorDescriptor wire;
  wire.set_dtype(std::string(DTypeName(entry.dtype)));
  for (int dim = 0; dim < entry.ndim; ++dim) wire.add_shape(entry.shape[dim]);
  wire.set_device("cpu");
  wire.set_nbytes(entry.length);
  if (target_device >= 0) wire.set_target_device(absl::StrCat("cuda:", target_device));
  return wire;
}

absl::StatusOr<shm::TensorEntry> FromWire(const v1::TensorDescriptor& wire, uint64_t nbytes,
                                          int index, int* target_device) {
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", index, " from the peer: ", why));
  };
  shm::TensorEntry entry{};
  for (uint8_t code = 1; code < kDTypeNames.size(); ++code) {
    if (kDTypeNames[code] == wire.dtype()) entry.dtype = code;
  }
  if (entry.dtype == 0) {
    return refuse(absl::StrCat("dtype '", wire.dtype().substr(0, 64), "' is not one tpd knows"));
  }
  if (!wire.device().empty() && wire.device() != "cpu") {
    return refuse(absl::StrCat("device '", wire.device().substr(0, 64),
                               "': tensors travel between daemons as host bytes (cpu)"));
  }
  *target_device = -1;
  const std::string& target = wire.target_device();
  if (!target.empty() && target != "cpu") {
    uint32_t cuda = 0;
    if (!absl::StartsWith(target, "cuda:") ||
        !absl::SimpleAtoi(absl::string_view(target).substr(5), &cuda) ||
        cuda >= shm::kMaxCudaDevices) {
      return refuse(absl::StrCat("target device '", target.substr(0, 64),
                                 "' is neither cpu nor cuda:N with N below ",
                                 shm::kMaxCudaDevices));
    }
    *target_device = static_cast<int>(cuda);
  }
  if (wire.shape_size() > shm::kMaxTensorDims) {
    return refuse(absl::StrCat(wire.shape_size(), " dims exceed ", int{shm::kMaxTensorDims}));
  }
  entry.ndim = static_cast<uint8_t>(wire.shape_size());
  uint64_t expected = shm::ItemBytes(entry.dtype);
  for (int dim = 0; dim < wire.shape_size(); ++dim) {
    const int64_t size = wire.shape(dim);
    if (size < 0) return refuse(absl::StrCat("shape[", dim, "] ", size, " is negative"));
    if (__builtin_mul_overflow(expected, static_cast<uint64_t>(size), &expected)) {
      return refuse(absl::StrCat("shape[", dim, "] ", size, " makes its byte size overflow"));
    }
    entry.shape[dim] = size;
  }
  if (expected != nbytes || wire.nbytes() != nbytes) {
    return refuse(absl::StrCat("shape × item size is ", expected, " bytes, its header says ",
                               wire.nbytes(), " and ", nbytes, " arrived"));
  }
  entry.length = nbytes;
  return entry;
}

}  // namespace tpd
