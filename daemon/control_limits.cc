#include "daemon/control_limits.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "base/summarize.h"
#include "daemon/names.h"
#include "store/rendezvous/init_method.h"

namespace tpd {
namespace {

absl::Status TooMany(absl::string_view field, int64_t count, absl::string_view setting,
                     int64_t limit) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " has ", count, " entries; the limit group.", setting, " is ", limit));
}

absl::Status CheckString(absl::string_view field, absl::string_view value, int64_t limit) {
  if (static_cast<int64_t>(value.size()) <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " holds \"", Echo(value, 32), "\", ", value.size(),
                   " bytes; the limit group.max_option_bytes is ", limit));
}

template <typename List>
absl::Status CheckList(absl::string_view field, const List& list, absl::string_view setting,
                       int64_t limit, int64_t max_bytes) {
  if (list.size() > limit) return TooMany(field, list.size(), setting, limit);
  for (const std::string& item : list) {
    if (absl::Status status = CheckString(field, item, max_bytes); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status CheckInitMethod(absl::string_view field, const std::string& init_method) {
  if (init_method.size() <= kMaxInitMethodBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " is ", init_method.size(),
                                                 " bytes; init_method URLs are at most ",
                                                 kMaxInitMethodBytes, " bytes"));
}

absl::Status CheckOptions(const v1::BackendOptions& options, const GroupConfig& limits) {
  const int64_t bytes = limits.max_option_bytes;
  for (absl::Status status : {
           CheckList("JoinRequest.options.transports", options.transports(), "max_transports",
                     limits.max_transports, bytes),
           CheckList("JoinRequest.options.channels", options.channels(), "max_channels",
                     limits.max_channels, bytes),
           CheckList("JoinRequest.options.devices", options.devices(), "max_devices",
                     limits.max_devices, bytes),
       }) {
    if (!status.ok()) return status;
  }
  // Every target counts at least once, so a million targets with empty maps count too.
  int64_t entries = 0;
  for (const auto& [target, map] : options.device_maps()) {
    entries += std::max(1, map.devices_size());
    if (entries > limits.max_device_map_entries) break;
  }
  if (entries > limits.max_device_map_entries) {
    return absl::InvalidArgumentError(
        absl::StrCat("JoinRequest.options.device_maps has more than ",
                     limits.max_device_map_entries, " entries (", options.device_maps_size(),
                     " target workers); the limit group.max_device_map_entries is ",
                     limits.max_device_map_entries));
  }
  for (const auto& [target, map] : options.device_maps()) {
    if (absl::Status status = ValidateWorkerName("JoinRequest.options.device_maps key", target);
        !status.ok()) {
      return status;
    }
    for (const auto& [from, to] : map.devices()) {
      for (const std::string* device : {&from, &to}) {
        if (absl::Status status = CheckString("JoinRequest.options.device_maps", *device, bytes);
            !status.ok()) {
          return status;
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJoinRequest(const v1::JoinRequest& request, const GroupConfig& limits) {
  if (absl::Status status = ValidateGroupName("JoinRequest.group", request.group()); !status.ok()) {
    return status;
  }
  if (absl::Status status = ValidateWorkerName("JoinRequest.name", request.name()); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckInitMethod("JoinRequest.init_method", request.init_method());
      !status.ok()) {
    return status;
  }
  if (request.secret().size() > kMaxGroupSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("JoinRequest.secret is ",
                                                   request.secret().size(), " bytes; at most ",
                                                   kMaxGroupSecretBytes, " are accepted"));
  }
  if (request.abandon().size() > kMaxAbandonBytes) {
    return absl::InvalidArgumentError(absl::StrCat("JoinRequest.abandon is ",
                                                   request.abandon().size(), " bytes; at most ",
                                                   kMaxAbandonBytes, " are accepted"));
  }
  if (request.env_size() > limits.max_env_entries) {
    return TooMany("JoinRequest.env", request.env_size(), "max_env_entries",
                   limits.max_env_entries);
  }
  for (const auto& [name, value] : request.env()) {
    for (const std::string* text : {&name, &value}) {
      if (absl::Status status = CheckString("JoinRequest.env", *text, limits.max_option_bytes);
          !status.ok()) {
        return status;
      }
    }
  }
  if (absl::Status status = CheckOptions(request.options(), limits); !status.ok()) return status;

  // world_size and rank may come from the request, the URL's query or env://'s WORLD_SIZE
  // and RANK: check what the init_method resolves to. A URL that does not parse is left to
  // the group manager, which answers in PyTorch's words.
  absl::StatusOr<store::InitMethod> method = store::ParseInitMethod(
      request.init_method(),
      request.has_rank() ? std::optional<int64_t>(request.rank()) : std::nullopt,
      request.has_world_size() ? std::optional<int64_t>(request.world_size()) : std::nullopt,
      {request.env().begin(), request.env().end()});
  if (!method.ok()) return absl::OkStatus();
  if (method->world_size.has_value() && *method->world_size > limits.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat("world_size ", *method->world_size,
                                                   " is above the limit group.max_world_size ",
                                                   limits.max_world_size, " of this daemon"));
  }
  if (method->rank.has_value() && *method->rank >= limits.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", *method->rank,
                                                   " is not below the limit group.max_world_size ",
                                                   limits.max_world_size, " of this daemon"));
  }
  return absl::OkStatus();
}

absl::Status CheckLeaveRequest(const v1::LeaveRequest& request) {
  if (absl::Status status = ValidateGroupName("LeaveRequest.group", request.group());
      !status.ok()) {
    return status;
  }
  return ValidateWorkerName("LeaveRequest.name", request.name());
}

absl::Status CheckBarrierRequest(const v1::BarrierRequest& request) {
  if (absl::Status status = ValidateGroupName("BarrierRequest.group", request.group());
      !status.ok()) {
    return status;
  }
  return ValidateWorkerName("BarrierRequest.name", request.name());
}

absl::Status CheckGroupLookup(const char* method, const std::string& group,
                              const std::string& init_method) {
  if (absl::Status status = ValidateGroupName(absl::StrCat(method, ".group"), group);
      !status.ok()) {
    return status;
  }
  return CheckInitMethod(absl::StrCat(method, ".init_method"), init_method);
}

std::string ClientDescription(const std::string& client) {
  return Echo(client, kMaxClientDescriptionBytes);
}

}  // namespace tpd
