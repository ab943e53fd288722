// Backend options of group members and their negotiation into one group configuration, with
// the semantics of PyTorch's TensorPipe backend: TensorPipeRpcBackendOptions (options.py,
// tensorpipe_agent.h) for one member's options, and backend_registry.py's
// _validate_device_maps, _create_reverse_mapping and _create_device_list for the group.
// Pure computation: no I/O, no locks; every function is safe to call from any thread.
//
// Error messages keep PyTorch's wording where users know it ("num_worker_threads must be
// positive, got 0", "Node w0 has source devices with invalid indices in its device map for
// w1", ...). PyTorch prints Python reprs there; tpd renders the same structures readably:
//   a device         cpu, cuda:1
//   a device list    [cuda:0, cuda:1]         (in list order)
//   a device map     {cuda:0: cuda:1}         (local -> remote, by local device)
//   device maps      {w1: {cuda:0: cuda:1}}   (by remote worker name)
//   names            [w0, w1]
// "Node X" in a message is the member (worker) name, as in PyTorch; the host a member runs on
// is MemberOptions::node.

#ifndef TPD_DAEMON_GROUP_OPTIONS_H_
#define TPD_DAEMON_GROUP_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tpd::group {

// A device of one member: the CPU, or a CUDA device by its index as that member's process
// sees it (after CUDA_VISIBLE_DEVICES). Device maps may name cpu on either side, as PyTorch's
// do ({cpu: cuda:0}: CPU tensors arrive on the callee's cuda:0); device lists hold only CUDA
// devices.
struct Device {
  int index = -1;  // -1 = cpu; 0.. = cuda:index; anything else is invalid

  static Device Cpu() { return Device{-1}; }
  static Device Cuda(int index) { return Device{index}; }
  bool is_cpu() const { return index == -1; }

  // "cpu" or "cuda:N" (torch.device's str()); an invalid index renders as "cuda:-5".
  std::string ToString() const;
};

inline bool operator==(const Device& a, const Device& b) { return a.index == b.index; }
inline bool operator!=(const Device& a, const Device& b) { return a.index != b.index; }
// cpu first, then CUDA devices by index, as PyTorch sorts device lists.
inline bool operator<(const Device& a, const Device& b) { return a.index < b.index; }
std::ostream& operator<<(std::ostream& os, const Device& device);

// Parses what torch.device accepts for cpu and CUDA: "cpu" (and "cpu:0"), "cuda:N", and a bare
// index "N", which torch reads as cuda:N. Unlike torch, "cuda" without an index is rejected:
// PyTorch's own index checks break on it (None < device_count), and which device it means
// depends on the process's current device, which a daemon cannot know. INVALID_ARGUMENT with
// torch's "Invalid device string: '...'" for anything else (leading zeros, spaces, other
// device types).
absl::StatusOr<Device> ParseDevice(absl::string_view text);

// Local device -> remote device, toward one remote worker. Must be 1-to-1.
using DeviceMap = std::map<Device, Device>;

// Parses (local, remote) device strings in the order given. A local device listed twice (say
// "0" and "cuda:0") is an error, where a Python dict would silently keep the last entry. Two
// local devices mapped to one remote device parse: as in PyTorch, where set_device_map lets
// them through, validation (ValidateMemberOptions) refuses them with "Node w has duplicated
// target devices in its device map for v".
absl::StatusOr<DeviceMap> ParseDeviceMap(
    const std::vector<std::pair<std::string, std::string>>& entries);

// options.py's _to_device_list: parses each device; cpu fails with "`set_devices` expect a
// list of CUDA devices, but got device type cpu."
absl::StatusOr<std::vector<Device>> ParseDevices(const std::vector<std::string>& texts);

std::string DevicesToString(const std::vector<Device>& devices);
std::string DeviceMapToString(const DeviceMap& map);
std::string DeviceMapsToString(const std::map<std::string, DeviceMap>& maps);

// TensorPipe's transports and channels in PyTorch's default priority order (highest first):
// shm 200, ibv 100, uv 0; cma 1200, mpt_uv 1100, basic 1000, cuda_xth 400, cuda_ipc 300,
// cuda_gdr 200, cuda_basic 0. These are also the only names tpd accepts.
const std::vector<std::string>& DefaultTransports();
const std::vector<std::string>& DefaultChannels();

// The channels that move CPU tensors; the cuda_* channels move only CUDA tensors.
const std::vector<std::string>& CpuChannels();

// One member's TensorPipeRpcBackendOptions. Defaults are PyTorch's.
struct BackendOptions {
  // Threads that run this member's incoming requests. Must be positive.
  int64_t num_worker_threads = 16;
  // Default deadline of this member's calls; 0 means no deadline, as in PyTorch.
  absl::Duration rpc_timeout = absl::Seconds(60);
  // Transports this member accepts, highest priority first; empty means DefaultTransports().
  std::vector<std::string> transports;
  // Channels this member accepts, highest priority first; empty means DefaultChannels().
  std::vector<std::string> channels;
  // This member's devices -> the remote worker's, by remote worker name; cpu allowed on
  // either side.
  std::map<std::string, DeviceMap> device_maps;
  // The local CUDA devices this member uses; empty means "computed from the device maps"
  // (see NegotiatedMember::devices).
  std::vector<Device> devices;
};

// What one member brings to the group.
struct MemberOptions {
  std::string name;   // worker name, unique in the group
  int64_t rank = -1;  // unique in the group; 0..size-1 for a static group
  std::string node;   // the host (daemon) the member runs on
  // CUDA devices the member's process sees (torch.cuda.device_count() there); may differ
  // between members of one node, e.g. under different CUDA_VISIBLE_DEVICES.
  int64_t device_count = 0;
  BackendOptions options;
  // What the member's node (its daemon's TensorPipe agent) really registered, highest
  // priority first. The member is offered only names found here (EffectiveTransports,
  // EffectiveChannels). Empty means unknown, as in records written by older daemons: no
  // restriction. Names tpd does not know are allowed and simply never offered.
  std::vector<std::string> node_transports;
  std::vector<std::string> node_channels;
};

// What one member really offers the group: its own transports/channels (PyTorch's defaults
// when it set none) that its node registered, in the member's priority order. The whole own
// (or default) list when the node's list is empty (unknown).
std::vector<std::string> EffectiveTransports(const MemberOptions& member);
std::vector<std::string> EffectiveChannels(const MemberOptions& member);

// Checks everything about one member that needs no other member, so a bad member is refused
// when it joins rather than when its group completes: its name (WorkerInfo's rule), rank and
// device count, num_worker_threads > 0, rpc_timeout >= 0, transports and channels known and
// not repeated, channels that still include a CPU channel, effective transports (see
// EffectiveTransports) not empty and effective channels holding a CPU channel ("Node w0 asks
// for transports [ibv] but its node n1 registered only [shm, uv]: no transport in common"),
// and its own devices and device maps: devices CUDA only, no duplicates, within device_count;
// maps 1-to-1, each source cpu or a CUDA device below device_count (PyTorch's
// _tensorpipe_validate_devices), or within `devices` when that is set (which then excludes
// cpu, as in PyTorch), remote worker names valid. INVALID_ARGUMENT naming the member.
absl::Status ValidateMemberOptions(const MemberOptions& member);

// The checks PyTorch's TensorPipeRpcBackendOptions makes as options are set (set_devices takes
// CUDA devices only). With the parsing of device strings and maps (ToMemberOptions in
// membership.cc: PyTorch's torch.device and set_device_map), what a static group refuses at
// a rank's own join; the checks that need the other ranks wait for them, as PyTorch's do.
absl::Status ValidateOptionsAsSet(const MemberOptions& member);

// One member's view of the negotiated group: what its TensorPipeAgent would be built with.
struct NegotiatedMember {
  std::string name;
  int64_t rank = -1;
  std::string node;
  int64_t device_count = 0;
  int64_t num_worker_threads = 0;  // the member's own; PyTorch keeps these per process
  absl::Duration rpc_timeout;      // the member's own; 0 = no deadline
  // The member's device maps as given.
  std::map<std::string, DeviceMap> device_maps;
  // For every member S whose device maps name this member: S's map toward this member,
  // inverted (S's cuda:i -> this member's cuda:j becomes cuda:j -> cuda:i; S's cpu -> cuda:0
  // becomes cuda:0 -> cpu), keyed by S. Replies follow it back. _create_reverse_mapping.
  std::map<std::string, DeviceMap> reverse_device_maps;
  // The local CUDA devices the member uses, sorted by index: `devices` when given, else every
  // source of its own maps and every target that others map onto it, cpu discarded.
  // _create_device_list.
  std::vector<Device> devices;
};

struct Negotiated {
  // One entry per member, by rank.
  std::vector<NegotiatedMember> members;
  // The transports and channels in every member's effective offer (EffectiveTransports,
  // EffectiveChannels: its own list, or PyTorch's defaults, within what its node registered),
  // in the priority order of the member with the lowest rank. Every daemon of the
  // group registers exactly these, priority by position, so TensorPipe's handshake picks the
  // first one that works for each pair of daemons (shm within a host, uv across hosts).
  std::vector<std::string> transports;
  std::vector<std::string> channels;
  // For the daemon-wide worker pool: the largest num_worker_threads any member asked for, so
  // nobody gets fewer threads than in PyTorch. Each member's own value is in `members`.
  int64_t num_worker_threads = 0;
  // For operations that involve every member (join, barrier, shutdown): the shortest nonzero
  // member rpc_timeout, 0 (no deadline) only when every member asked for none. Such an
  // operation fails in PyTorch as soon as the member with the shortest timeout gives up.
  absl::Duration rpc_timeout;
};

// Validates every member (ValidateMemberOptions), then the group as _validate_device_maps
// does, and computes each member's reverse maps and device list. Members need unique names
// and ranks; a static group (`is_static`, PyTorch's world_size given) is complete, so its
// ranks are 0..size-1 and every device map must name a member. A dynamic group is checked as
// PyTorch does on each join: maps toward workers that have not joined yet are not checked
// against them, and are checked when Negotiate runs again after they join. Each target device
// must be within the target's `devices` when set (so not cpu), else cpu or below its
// device_count. Effective
// transports and channels are intersected in rank order; the first member that leaves no
// transport, or no CPU channel, in common is named. INVALID_ARGUMENT naming the member on any
// failure; an empty `members` is INVALID_ARGUMENT too.
//
// Deliberate difference from PyTorch's dynamic join (_set_devices_and_reverse_device_map):
// PyTorch computes the joining worker's reverse maps and hands those same maps to every
// member; here every member gets the reverse maps toward itself, as a static group does.
absl::StatusOr<Negotiated> Negotiate(const std::vector<MemberOptions>& members, bool is_static);

}  // namespace tpd::group

#endif  // TPD_DAEMON_GROUP_OPTIONS_H_
