#include "client/segment/tensor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/segment/link.h"

namespace tpd {

std::string Device::ToString() const {
  switch (type) {
    case shm::DeviceType::kCpu:
      return "cpu";
    case shm::DeviceType::kCuda:
      return absl::StrCat("cuda:", index);
  }
  return absl::StrCat("device-type-", static_cast<int>(type));
}

Tensor::Tensor(shm::DType dtype, std::vector<int64_t> shape, std::string bytes)
    : dtype_(dtype), shape_(std::move(shape)) {
  auto owned = std::make_shared<std::string>(std::move(bytes));
  data_ = owned->data();
  size_ = owned->size();
  keep_ = std::move(owned);
}

Tensor Tensor::Borrow(shm::DType dtype, std::vector<int64_t> shape, const void* data, size_t size) {
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.shape_ = std::move(shape);
  tensor.storage_ = TensorStorage::kBorrowed;
  tensor.data_ = const_cast<char*>(static_cast<const char*>(data));  // never written
  tensor.size_ = size;
  return tensor;
}

Tensor Tensor::Cuda(shm::DType dtype, std::vector<int64_t> shape, uint64_t device_pointer,
                    int device, void* stream, std::shared_ptr<void> keep) {
  Tensor tensor;
  tensor.keep_ = std::move(keep);
  tensor.dtype_ = dtype;
  tensor.shape_ = std::move(shape);
  tensor.storage_ = TensorStorage::kBorrowed;
  tensor.device_ = Device{shm::DeviceType::kCuda, device};
  tensor.data_ = reinterpret_cast<char*>(device_pointer);
  tensor.stream_ = stream;
  const uint64_t item = shm::ItemBytes(static_cast<uint8_t>(dtype));
  uint64_t bytes = item;
  for (int64_t dim : tensor.shape_) bytes *= dim < 0 ? 0 : static_cast<uint64_t>(dim);
  tensor.size_ = bytes;  // the codec checks the shape and dtype again, with overflow
  return tensor;
}

Tensor Tensor::Clone() const {
  if (is_cuda()) return *this;
  Tensor copy(dtype_, shape_, std::string(data()));
  copy.device_ = device_;
  return copy;
}

bool Tensor::in_flight() const { return arena_ != nullptr && arena_->messages.load() > 0; }

absl::StatusOr<Tensor> Tensor::Reshaped(shm::DType dtype, std::vector<int64_t> shape) const {
  absl::StatusOr<uint64_t> bytes = calls_internal::TensorBytes(dtype, shape, "reshaped tensor");
  if (!bytes.ok()) return bytes.status();
  if (*bytes != size_) {
    return absl::InvalidArgumentError(absl::StrCat("reshaped tensor: its dtype and shape make ",
                                                   *bytes, " bytes, the tensor has ", size_));
  }
  Tensor same = *this;
  same.dtype_ = dtype;
  same.shape_ = std::move(shape);
  return same;
}

namespace calls_internal {

absl::StatusOr<uint64_t> TensorBytes(shm::DType dtype, const std::vector<int64_t>& shape,
                                     absl::string_view what) {
  const uint64_t item = shm::ItemBytes(static_cast<uint8_t>(dtype));
  if (item == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dtype ", static_cast<int>(dtype), " is not a dtype"));
  }
  if (shape.size() > shm::kMaxTensorDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", shape.size(), " dims, at most ", int{shm::kMaxTensorDims}));
  }
  uint64_t n = item;
  for (int64_t dim : shape) {
    if (dim < 0 || (dim != 0 && n > UINT64_MAX / static_cast<uint64_t>(dim))) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": bad shape (dim ", dim, ")"));
    }
    n *= static_cast<uint64_t>(dim);
  }
  return n;
}

Tensor TensorParts::Arena(shm::DType dtype, std::vector<int64_t> shape,
                          std::shared_ptr<ArenaBlock> block, char* data, size_t size) {
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.shape_ = std::move(shape);
  tensor.storage_ = TensorStorage::kArena;
  tensor.arena_ = std::move(block);
  tensor.keep_ = tensor.arena_;
  tensor.data_ = data;
  tensor.size_ = size;
  return tensor;
}

Tensor TensorParts::Received(shm::DType dtype, std::vector<int64_t> shape, Device device,
                             std::shared_ptr<void> keep, const char* data, size_t size,
                             bool in_sender_memory) {
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.shape_ = std::move(shape);
  tensor.device_ = device;
  tensor.storage_ = TensorStorage::kReceived;
  tensor.keep_ = std::move(keep);
  tensor.data_ = const_cast<char*>(data);  // read-only: mutable_data() gives none out
  tensor.size_ = size;
  tensor.in_sender_memory_ = in_sender_memory;
  return tensor;
}

}  // namespace calls_internal
}  // namespace tpd
