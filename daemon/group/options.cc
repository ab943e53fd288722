#include "daemon/group/options.h"

#include <algorithm>
#include <set>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/summarize.h"
#include "daemon/names.h"

namespace tpd::group {
namespace {

// Names in messages are echoed escaped and cut to this length: they may come from any client.
constexpr size_t kMaxEchoedChars = 2 * kMaxWorkerNameLength;

std::string Echo(absl::string_view text) {
  if (text.size() <= kMaxEchoedChars) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, kMaxEchoedChars)), "...");
}

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

// torch's c10::Device parser takes an index as decimal digits without leading zeros.
bool IsIndexText(absl::string_view text) {
  if (text.empty() || !absl::c_all_of(text, absl::ascii_isdigit)) return false;
  return text.size() == 1 || text[0] != '0';
}

absl::StatusOr<int> ParseIndex(absl::string_view index, absl::string_view text) {
  int value = 0;
  if (!absl::SimpleAtoi(index, &value)) {
    return Invalid(absl::StrCat("Could not parse device index '", Echo(index),
                                "' in device string '", Echo(text), "'"));
  }
  return value;
}

// WorkerInfo's check, in its words.
std::string NamesToString(const std::vector<std::string>& names) {
  return absl::StrCat(
      "[",
      JoinSummarized(names, ", ",
                     [](std::string* out, const std::string& name) { out->append(Echo(name)); }),
      "]");
}

bool IsValidCuda(const Device& device, int64_t device_count) {
  return device.index >= 0 && device.index < device_count;
}

// _tensorpipe_validate_devices for one device of a device map: cpu is always valid, a CUDA
// device below the member's device count.
bool IsValidMapDevice(const Device& device, int64_t device_count) {
  return device.is_cpu() || IsValidCuda(device, device_count);
}

// Known names, each at most once. The `field` names the option in messages.
absl::Status ValidateNameList(absl::string_view member, absl::string_view field,
                              absl::string_view unknown_message,
                              const std::vector<std::string>& given,
                              const std::vector<std::string>& known) {
  absl::flat_hash_set<std::string> seen;
  for (const std::string& name : given) {
    if (!absl::c_linear_search(known, name)) {
      return Invalid(absl::StrCat("Node ", member, ": ", unknown_message, Echo(name), "\n", field,
                                  " = ", NamesToString(given), "\nknown ", field, " = ",
                                  NamesToString(known)));
    }
    if (!seen.insert(name).second) {
      return Invalid(absl::StrCat("Node ", member, " lists ", name, " twice in its ", field, "\n",
                                  field, " = ", NamesToString(given)));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateDevices(const MemberOptions& member) {
  if (absl::Status status = ValidateOptionsAsSet(member); !status.ok()) return status;
  const std::vector<Device>& devices = member.options.devices;
  const std::string shown = DevicesToString(devices);
  if (std::set<Device>(devices.begin(), devices.end()).size() != devices.size()) {
    return Invalid(
        absl::StrCat("Node ", member.name, " has duplicated devices\ndevices = ", shown));
  }
  for (const Device& device : devices) {
    if (!IsValidCuda(device, member.device_count)) {
      return Invalid(absl::StrCat("Node ", member.name,
                                  " has devices with invalid indices\ndevices = ", shown,
                                  "\ndevice count = ", member.device_count));
    }
  }
  return absl::OkStatus();
}

// The checks of _validate_device_maps (and options.py) that need only the source member.
absl::Status ValidateOwnDeviceMap(const MemberOptions& member, const std::string& target,
                                  const DeviceMap& map) {
  const std::string where =
      absl::StrCat(" in its device map for ", target, "\ndevice map = ", DeviceMapToString(map));
  for (const auto& [source, dest] : map) {
    // cpu may stand on either side, as in PyTorch. A negative index other than cpu's is only
    // reachable through a hand-built Device; the source side is checked below.
    if (!dest.is_cpu() && dest.index < 0) {
      return Invalid(
          absl::StrCat("Node ", member.name, " has target devices with invalid indices", where));
    }
  }
  std::map<Device, Device> first_source_of;
  for (const auto& [source, dest] : map) {
    auto [it, inserted] = first_source_of.emplace(dest, source);
    if (!inserted) {
      return Invalid(absl::StrCat("Node ", member.name, " has duplicated target devices", where,
                                  "\n`device_map` only supports 1-to-1 mapping, trying to map ",
                                  source.ToString(), " and ", it->second.ToString(), " to ",
                                  dest.ToString()));
    }
  }
  const std::vector<Device>& devices = member.options.devices;
  if (!devices.empty()) {
    for (const auto& [source, dest] : map) {
      if (!absl::c_linear_search(devices, source)) {
        return Invalid(absl::StrCat("Node ", member.name, " has unexpected source devices", where,
                                    "\ndevices = ", DevicesToString(devices)));
      }
    }
  } else {
    for (const auto& [source, dest] : map) {
      if (!IsValidMapDevice(source, member.device_count)) {
        return Invalid(absl::StrCat("Node ", member.name,
                                    " has source devices with invalid indices", where,
                                    "\ndevice count = ", member.device_count));
      }
    }
  }
  return absl::OkStatus();
}

// The checks of _validate_device_maps that need the target member.
absl::Status ValidateMapAgainstTarget(const std::string& source_name, const MemberOptions& target,
                                      const DeviceMap& map) {
  const std::string where = absl::StrCat(" in its device map for ", target.name,
                                         "\ndevice map = ", DeviceMapToString(map));
  const std::vector<Device>& devices = target.options.devices;
  for (const auto& [source, dest] : map) {
    if (!devices.empty()) {
      if (!absl::c_linear_search(devices, dest)) {
        return Invalid(absl::StrCat("Node ", source_name, " has unexpected target devices", where,
                                    "\ndevices = ", DevicesToString(devices)));
      }
    } else if (!IsValidMapDevice(dest, target.device_count)) {
      return Invalid(absl::StrCat("Node ", source_name, " has target devices with invalid indices",
                                  where, "\ndevice count = ", target.device_count));
    }
  }
  return absl::OkStatus();
}

// The member's own list, or `defaults` when it set none, narrowed to the names its node
// registered unless the node's list is empty (unknown), in the member's order.
std::vector<std::string> Effective(const std::vector<std::string>& own,
                                   const std::vector<std::string>& defaults,
                                   const std::vector<std::string>& node) {
  const std::vector<std::string>& asked = own.empty() ? defaults : own;
  if (node.empty()) return asked;
  std::vector<std::string> offered;
  for (const std::string& name : asked) {
    if (absl::c_linear_search(node, name)) offered.push_back(name);
  }
  return offered;
}

// "Node w0 asks for transports [ibv] but its node n1 registered only [shm, uv]: no transport
// in common". `own` empty means the member asked for the defaults.
absl::Status NodeLacks(const MemberOptions& member, absl::string_view field,
                       const std::vector<std::string>& own,
                       const std::vector<std::string>& defaults,
                       const std::vector<std::string>& node, absl::string_view missing) {
  return Invalid(absl::StrCat(
      "Node ", member.name, " asks for ", field, " ", NamesToString(own.empty() ? defaults : own),
      own.empty() ? " (the defaults)" : "", " but its node ", Echo(member.node),
      " registered only ", NamesToString(node), ": no ", missing, " in common"));
}

// Intersects the members' effective lists in rank order, keeping the lowest rank's priority
// order. `acceptable` says whether what is left still works; the first member after which it
// does not is named, with `missing` saying what is gone ("transport", "CPU channel"), and with
// what its node registered when that narrowed its list.
absl::StatusOr<std::vector<std::string>> IntersectInRankOrder(
    const std::vector<const MemberOptions*>& members,
    std::vector<std::string> (*effective)(const MemberOptions&),
    std::vector<std::string> MemberOptions::*node_field, absl::string_view field_name,
    absl::string_view missing, bool (*acceptable)(const std::vector<std::string>&)) {
  std::vector<std::string> common = effective(*members.front());
  for (size_t i = 1; i < members.size(); ++i) {
    const MemberOptions& member = *members[i];
    const std::vector<std::string> theirs = effective(member);
    std::vector<std::string> next;
    for (const std::string& name : common) {
      if (absl::c_linear_search(theirs, name)) next.push_back(name);
    }
    if (!acceptable(next)) {
      const std::vector<std::string>& node = member.*node_field;
      return Invalid(absl::StrCat("Node ", member.name, " has no ", missing,
                                  " in common with the members ranked before it\n", field_name,
                                  " = ", NamesToString(theirs),
                                  node.empty()
                                      ? ""
                                      : absl::StrCat("\nregistered by its node ", Echo(member.node),
                                                     " = ", NamesToString(node)),
                                  "\ncommon to lower ranks = ", NamesToString(common)));
    }
    common = std::move(next);
  }
  return common;
}

bool HasAny(const std::vector<std::string>& names) { return !names.empty(); }

bool HasCpuChannel(const std::vector<std::string>& channels) {
  return absl::c_any_of(channels, [](const std::string& channel) {
    return absl::c_linear_search(CpuChannels(), channel);
  });
}

DeviceMap Invert(const DeviceMap& map) {
  DeviceMap inverted;
  for (const auto& [local, remote] : map) inverted.emplace(remote, local);
  return inverted;
}

}  // namespace

std::string Device::ToString() const { return is_cpu() ? "cpu" : absl::StrCat("cuda:", index); }

std::ostream& operator<<(std::ostream& os, const Device& device) { return os << device.ToString(); }

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  // A bare index is what torch.device(int) takes: a CUDA device.
  if (IsIndexText(text)) {
    absl::StatusOr<int> index = ParseIndex(text, text);
    if (!index.ok()) return index.status();
    return Device::Cuda(*index);
  }
  if (text.size() > 1 && text[0] == '-' && IsIndexText(text.substr(1))) {
    return Invalid(absl::StrCat("Device index must not be negative, got ", Echo(text)));
  }
  const size_t colon = text.find(':');
  const absl::string_view type = text.substr(0, colon);
  const bool has_index = colon != absl::string_view::npos;
  const absl::string_view index_text = has_index ? text.substr(colon + 1) : absl::string_view();
  if (has_index && !IsIndexText(index_text)) {
    return Invalid(absl::StrCat("Invalid device string: '", Echo(text), "'"));
  }
  if (type == "cpu") {
    if (!has_index || index_text == "0") return Device::Cpu();
    return Invalid(absl::StrCat("CPU device index must be -1 or zero, got ", Echo(index_text)));
  }
  if (type == "cuda") {
    if (!has_index) {
      return Invalid(
          "Device string 'cuda' names no device index; tpd needs an explicit CUDA device such "
          "as 'cuda:0' (torch.device(\"cuda\") means the process's current device)");
    }
    absl::StatusOr<int> index = ParseIndex(index_text, text);
    if (!index.ok()) return index.status();
    return Device::Cuda(*index);
  }
  return Invalid(absl::StrCat("Invalid device string: '", Echo(text),
                              "'; tpd accepts cpu, cuda:N, or a CUDA device index N"));
}

absl::StatusOr<DeviceMap> ParseDeviceMap(
    const std::vector<std::pair<std::string, std::string>>& entries) {
  DeviceMap map;
  std::map<Device, absl::string_view> spelling;  // each local device's first spelling
  for (const auto& [from_text, to_text] : entries) {
    absl::StatusOr<Device> from = ParseDevice(from_text);
    if (!from.ok()) return from.status();
    absl::StatusOr<Device> to = ParseDevice(to_text);
    if (!to.ok()) return to.status();
    if (auto [it, inserted] = spelling.emplace(*from, from_text); !inserted) {
      return Invalid(absl::StrCat("`device_map` maps ", from->ToString(), " twice, as '",
                                  Echo(it->second), "' and as '", Echo(from_text), "'"));
    }
    map.emplace(*from, *to);
  }
  return map;
}

absl::StatusOr<std::vector<Device>> ParseDevices(const std::vector<std::string>& texts) {
  std::vector<Device> devices;
  devices.reserve(texts.size());
  for (const std::string& text : texts) {
    absl::StatusOr<Device> device = ParseDevice(text);
    if (!device.ok()) return device.status();
    if (device->is_cpu()) {
      return Invalid("`set_devices` expect a list of CUDA devices, but got device type cpu.");
    }
    devices.push_back(*device);
  }
  return devices;
}

std::string DevicesToString(const std::vector<Device>& devices) {
  return absl::StrCat(
      "[",
      JoinSummarized(devices, ", ",
                     [](std::string* out, const Device& d) { absl::StrAppend(out, d.ToString()); }),
      "]");
}

std::string DeviceMapToString(const DeviceMap& map) {
  return absl::StrCat("{",
                      JoinSummarized(map, ", ",
                                     [](std::string* out, const auto& entry) {
                                       absl::StrAppend(out, entry.first.ToString(), ": ",
                                                       entry.second.ToString());
                                     }),
                      "}");
}

std::string DeviceMapsToString(const std::map<std::string, DeviceMap>& maps) {
  return absl::StrCat("{",
                      JoinSummarized(maps, ", ",
                                     [](std::string* out, const auto& entry) {
                                       absl::StrAppend(out, Echo(entry.first), ": ",
                                                       DeviceMapToString(entry.second));
                                     }),
                      "}");
}

const std::vector<std::string>& DefaultTransports() {
  static const auto* transports = new std::vector<std::string>{"shm", "ibv", "uv"};
  return *transports;
}

const std::vector<std::string>& DefaultChannels() {
  static const auto* channels = new std::vector<std::string>{
      "cma", "mpt_uv", "basic", "cuda_xth", "cuda_ipc", "cuda_gdr", "cuda_basic"};
  return *channels;
}

const std::vector<std::string>& CpuChannels() {
  static const auto* channels = new std::vector<std::string>{"cma", "mpt_uv", "basic"};
  return *channels;
}

std::vector<std::string> EffectiveTransports(const MemberOptions& member) {
  return Effective(member.options.transports, DefaultTransports(), member.node_transports);
}

std::vector<std::string> EffectiveChannels(const MemberOptions& member) {
  return Effective(member.options.channels, DefaultChannels(), member.node_channels);
}

absl::Status ValidateOptionsAsSet(const MemberOptions& member) {
  for (const Device& device : member.options.devices) {
    if (device.is_cpu()) {
      return Invalid(absl::StrCat(
          "Node ", member.name,
          ": `set_devices` expect a list of CUDA devices, but got device type cpu.\ndevices = ",
          DevicesToString(member.options.devices)));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMemberOptions(const MemberOptions& member) {
  if (absl::Status status = tpd::ValidateWorkerName("", member.name); !status.ok()) return status;
  const std::string& name = member.name;
  const BackendOptions& options = member.options;
  if (member.node.empty()) {
    return Invalid(absl::StrCat("Node ", name, ": node (the host it runs on) must not be empty"));
  }
  if (member.rank < 0) {
    return Invalid(absl::StrCat("Node ", name, ": rank must be non-negative, got ", member.rank));
  }
  if (member.device_count < 0) {
    return Invalid(absl::StrCat("Node ", name, ": device count must be non-negative, got ",
                                member.device_count));
  }
  if (options.num_worker_threads <= 0) {
    return Invalid(absl::StrCat("Node ", name, ": num_worker_threads must be positive, got ",
                                options.num_worker_threads));
  }
  if (options.rpc_timeout < absl::ZeroDuration() ||
      options.rpc_timeout == absl::InfiniteDuration()) {
    return Invalid(absl::StrCat("Node ", name,
                                ": rpc_timeout must be finite and non-negative (0 means no "
                                "timeout), got ",
                                absl::FormatDuration(options.rpc_timeout)));
  }
  if (absl::Status status = ValidateNameList(
          name, "transports", "Unknown transport: ", options.transports, DefaultTransports());
      !status.ok()) {
    return status;
  }
  if (absl::Status status = ValidateNameList(
          name, "channels", "Unknown channel: ", options.channels, DefaultChannels());
      !status.ok()) {
    return status;
  }
  // Payloads from local clients are CPU tensors; without a CPU channel none could move.
  if (!options.channels.empty() && !HasCpuChannel(options.channels)) {
    return Invalid(absl::StrCat("Node ", name, " has no CPU channel in its channels; add one of ",
                                NamesToString(CpuChannels()),
                                "\nchannels = ", NamesToString(options.channels)));
  }
  // A node that registered nothing usable for this member: its agent could not connect.
  if (EffectiveTransports(member).empty()) {
    return NodeLacks(member, "transports", options.transports, DefaultTransports(),
                     member.node_transports, "transport");
  }
  if (!HasCpuChannel(EffectiveChannels(member))) {
    return NodeLacks(member, "channels", options.channels, DefaultChannels(), member.node_channels,
                     "CPU channel");
  }
  if (absl::Status status = ValidateDevices(member); !status.ok()) return status;
  for (const auto& [target, map] : options.device_maps) {
    if (absl::Status status = tpd::ValidateWorkerName("", target); !status.ok()) {
      return Invalid(absl::StrCat(
          "Node ", name, " has an invalid target name in its device maps: ", status.message()));
    }
    if (absl::Status status = ValidateOwnDeviceMap(member, target, map); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Negotiated> Negotiate(const std::vector<MemberOptions>& members, bool is_static) {
  if (members.empty()) return Invalid("Cannot negotiate a group without members");
  // Rank order is the order PyTorch's all_gather_object hands the group's options around in.
  std::vector<const MemberOptions*> ranked;
  ranked.reserve(members.size());
  for (const MemberOptions& member : members) ranked.push_back(&member);
  std::stable_sort(
      ranked.begin(), ranked.end(),
      [](const MemberOptions* a, const MemberOptions* b) { return a->rank < b->rank; });

  for (const MemberOptions* member : ranked) {
    if (absl::Status status = ValidateMemberOptions(*member); !status.ok()) return status;
  }
  absl::flat_hash_map<std::string, const MemberOptions*> by_name;
  std::vector<std::string> names;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const MemberOptions& member = *ranked[i];
    if (i > 0 && ranked[i - 1]->rank == member.rank) {
      return Invalid(absl::StrCat("Node ", member.name, " has rank ", member.rank, ", as Node ",
                                  ranked[i - 1]->name, " does; ranks must be unique"));
    }
    if (auto [it, inserted] = by_name.emplace(member.name, &member); !inserted) {
      return Invalid(absl::StrCat("Node ", member.name, " appears twice in the group, with ranks ",
                                  it->second->rank, " and ", member.rank));
    }
    if (is_static && member.rank >= static_cast<int64_t>(ranked.size())) {
      return Invalid(absl::StrCat("Node ", member.name, " has rank ", member.rank,
                                  ", but a static group of ", ranked.size(),
                                  " members has ranks 0 to ", ranked.size() - 1));
    }
    names.push_back(member.name);
  }

  for (const MemberOptions* source : ranked) {
    const std::map<std::string, DeviceMap>& maps = source->options.device_maps;
    if (is_static) {
      std::vector<std::string> unknown;
      for (const auto& [target, map] : maps) {
        if (!by_name.contains(target)) unknown.push_back(target);
      }
      if (!unknown.empty()) {
        return Invalid(absl::StrCat(
            "Node ", source->name, " has invalid target node names in its device maps\n",
            "device maps = ", DeviceMapsToString(maps), "\nnode names = ", NamesToString(names),
            "\nunknown names = ", NamesToString(unknown)));
      }
    }
    for (const auto& [target, map] : maps) {
      // A dynamic group checks maps toward workers that have not joined when they join.
      auto it = by_name.find(target);
      if (it == by_name.end()) continue;
      if (absl::Status status = ValidateMapAgainstTarget(source->name, *it->second, map);
          !status.ok()) {
        return status;
      }
    }
  }

  Negotiated result;
  absl::StatusOr<std::vector<std::string>> transports =
      IntersectInRankOrder(ranked, &EffectiveTransports, &MemberOptions::node_transports,
                           "transports", "transport", HasAny);
  if (!transports.ok()) return transports.status();
  result.transports = *std::move(transports);
  absl::StatusOr<std::vector<std::string>> channels =
      IntersectInRankOrder(ranked, &EffectiveChannels, &MemberOptions::node_channels, "channels",
                           "CPU channel", HasCpuChannel);
  if (!channels.ok()) return channels.status();
  result.channels = *std::move(channels);

  result.num_worker_threads = 0;
  result.rpc_timeout = absl::ZeroDuration();
  for (const MemberOptions* member : ranked) {
    const BackendOptions& options = member->options;
    result.num_worker_threads = std::max(result.num_worker_threads, options.num_worker_threads);
    if (options.rpc_timeout > absl::ZeroDuration() &&
        (result.rpc_timeout == absl::ZeroDuration() || options.rpc_timeout < result.rpc_timeout)) {
      result.rpc_timeout = options.rpc_timeout;
    }

    NegotiatedMember& out = result.members.emplace_back();
    out.name = member->name;
    out.rank = member->rank;
    out.node = member->node;
    out.device_count = member->device_count;
    out.num_worker_threads = options.num_worker_threads;
    out.rpc_timeout = options.rpc_timeout;
    out.device_maps = options.device_maps;
    // _create_reverse_mapping.
    for (const MemberOptions* source : ranked) {
      const auto& source_maps = source->options.device_maps;
      if (auto it = source_maps.find(member->name); it != source_maps.end()) {
        out.reverse_device_maps.emplace(source->name, Invert(it->second));
      }
    }
    // _create_device_list: the given devices, else every local CUDA device a map names (cpu
    // discarded); sorted by index either way.
    if (!options.devices.empty()) {
      out.devices = options.devices;
      std::sort(out.devices.begin(), out.devices.end());
    } else {
      std::set<Device> used;
      for (const auto& [target, map] : options.device_maps) {
        for (const auto& [local, remote] : map) used.insert(local);
      }
      for (const auto& [source, map] : out.reverse_device_maps) {
        for (const auto& [local, remote] : map) used.insert(local);
      }
      used.erase(Device::Cpu());
      out.devices.assign(used.begin(), used.end());
    }
  }
  return result;
}

}  // namespace tpd::group
