#include "daemon/router/submitted.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace tpd::router {

absl::StatusOr<Submitted> ReadSubmitted(const shm::Segment& segment, const shm::Descriptor& d,
                                        const absl::Status& cuda_allowed) {
  absl::StatusOr<shm::ParsedMessage> message =
      shm::ParseMessage(segment.base(), d.payload_offset, d.payload_length);
  if (!message.ok()) return message.status();
  absl::StatusOr<std::vector<shm::TensorEntry>> tensors =
      shm::ReadTensorTable(d, segment.base(), segment.layout(), shm::Direction::kSubmission);
  if (!tensors.ok()) return tensors.status();
  if (!cuda_allowed.ok()) {
    for (const shm::TensorEntry& entry : *tensors) {
      if (entry.device_type == static_cast<uint8_t>(shm::DeviceType::kCuda)) return cuda_allowed;
    }
  }
  return Submitted{*std::move(message), *std::move(tensors)};
}

absl::StatusOr<std::vector<Place>> PlaceTensors(const MapUse& use, bool reply,
                                                const std::optional<v1::DeviceMap>& map,
                                                const std::vector<shm::TensorEntry>& tensors) {
  bool on_device = false;
  std::vector<Place> places(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const shm::TensorEntry& entry = tensors[i];
    const bool cuda = entry.device_type == static_cast<uint8_t>(shm::DeviceType::kCuda);
    const std::string device = cuda ? absl::StrCat("cuda:", entry.device_index) : "cpu";
    std::optional<std::string> target;
    if (map) {
      auto it = map->devices().find(device);
      if (it != map->devices().end()) target = it->second;
    }
    if (!target || (!cuda && *target == "cpu")) {
      if (!cuda) continue;  // a cpu tensor with no cpu entry (or cpu -> cpu) stays on the cpu
      // PyTorch's wording (tensorpipe_agent.cpp getDevicesForRemote, tensorpipe_utils.cpp
      // getDevicesForTensors).
      return absl::InvalidArgumentError(absl::StrCat(
          "TensorPipe RPC backend only supports CPU tensors by default, please move your "
          "tensors to CPU before sending them over RPC, or call `set_device_map` on "
          "`TensorPipeRpcBackendOptions` to explicitly configure device mapping. ",
          reply ? "Response" : "Request", " device mapping is not available for destination ",
          use.to, " for device ", device, " but received a tensor on that device."));
    }
    on_device = true;
    if (*target == "cpu") continue;
    int index = -1;
    if (!absl::StartsWith(*target, "cuda:") ||
        !absl::SimpleAtoi(absl::string_view(*target).substr(5), &index) || index < 0) {
      return absl::InternalError(absl::StrCat("group ", use.group, ": negotiated device map of ",
                                              use.from, " names device ", *target));
    }
    places[i].device = index;
  }
  if (!on_device) return std::vector<Place>{};
  return places;
}

std::string CallName(const std::string& worker, const std::string& method) {
  return absl::StrCat("call to worker '", worker, "' method '", method, "'");
}

absl::Status ReplyFailed(const std::string& worker, const std::string& method,
                         const absl::Status& why) {
  return Prefixed(why, "reply of worker '", worker, "' to method '", method, "': ");
}

absl::Status MalformedReply(const std::string& worker, const std::string& method,
                            const absl::Status& why) {
  return absl::InternalError(absl::StrCat(
      "worker '", worker, "' sent a malformed reply to method '", method, "': ", why.message()));
}

uint64_t MessageBytes(const Submitted& message) {
  uint64_t bytes = message.message.body_length;
  for (const shm::TensorEntry& tensor : message.tensors) bytes += tensor.length;
  return bytes;
}

}  // namespace tpd::router
