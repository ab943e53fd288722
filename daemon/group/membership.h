// The rules of group membership as pure transitions of a GroupRecord: who may join, which
// rank a member gets, when a static group forms, fails or breaks, and the negotiated options
// after every change. Daemons apply these to the newest record and race to store the result
// as the next version (GroupLog), so every daemon enforces the same rules.
//
// Thread safety: pure functions.

#ifndef TPD_DAEMON_GROUP_MEMBERSHIP_H_
#define TPD_DAEMON_GROUP_MEMBERSHIP_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/group_record.pb.h"

namespace tpd::group {

// Phases of GroupView.phase.
inline constexpr char kEmpty[] = "EMPTY";
inline constexpr char kForming[] = "FORMING";
inline constexpr char kFormed[] = "FORMED";
inline constexpr char kDynamic[] = "DYNAMIC";
inline constexpr char kBroken[] = "BROKEN";
inline constexpr char kFailed[] = "FAILED";

struct JoinSpec {
  std::string name;
  std::optional<int64_t> rank;
  std::optional<int64_t> world_size;  // absent: dynamic group
  std::string node;
  uint64_t incarnation = 0;
  int64_t since_unix_ms = 0;
  int64_t device_count = 0;
  // Answer the join without the group's member list (JoinRequest.omit_members).
  bool omit_members = false;
  // Not a join: this rank cannot take part, and why (JoinRequest.abandon).
  std::string abandon;
  // The node's agent address and registered transports/channels (see Node).
  std::string agent_address;
  std::vector<std::string> node_transports;
  std::vector<std::string> node_channels;
  v1::BackendOptions options;
  // Who joins: the uid its session is bound to on `node`, and SecretVerifier of the secret it
  // brought ("" for none).
  int64_t uid = -1;
  std::string secret_verifier;
};

// The record's form of a group's secret: HMAC-SHA256(secret, "tpd-group-secret-v1" || group);
// "" for no secret.
std::string SecretVerifier(absl::string_view group, absl::string_view secret);

// How long a static group's failure to form before all its ranks came is kept after its last
// member left: ranks that start later are refused with its reason instead of starting a group
// that cannot form. Then the name is free again.
inline constexpr int64_t kFailureLingerMs = 60 * 1000;

// Adds a member to `record` (the newest version; the caller stores the result as the next)
// and returns its rank. Static groups fail at once, with the reason naming the rank: a member
// whose own options are invalid (recorded, and the group FAILED with INVALID_ARGUMENT for
// every waiting rank), a rank that abandons (`spec.abandon`: not recorded, the group FAILED
// with ABORTED), or the member completing the world when negotiation fails; otherwise the last
// rank makes it FORMED. The caller reports the failure. Dynamic groups: negotiation runs with
// the newcomer and a failure refuses the join, leaving `record` unchanged. INVALID_ARGUMENT
// for a join that can never fit: static/dynamic or world_size mismatch, rank out of range or
// taken, (dynamic) options invalid, an abandon of a dynamic group. ALREADY_EXISTS for a name
// taken, in PyTorch's words ("RPC worker name w is not unique").
// FAILED_PRECONDITION for a static group already formed, broken or failed while members
// remain, or failed less than kFailureLingerMs before `spec.since_unix_ms`.
// PERMISSION_DENIED for a join the group does not admit (docs/security.md): a group with
// members (or a failure kept) admits only joins that bring its secret, and on each node only
// its owner's uid; the first member of an EMPTY group sets both.
//
// A static join refused in a way the other ranks must learn (an abandon; options PyTorch
// refuses as they are set, ValidateOptionsAsSet) returns its error and, when `failed` is not
// null, sets *failed: `record` then holds the next version, the FAILED group, to be stored like
// any other change. With `failed` null such a join is refused leaving `record` unchanged.
absl::StatusOr<int64_t> AddMember(v1::GroupRecord* record, const JoinSpec& spec,
                                  bool* failed = nullptr);

// Removes every member `remove` selects; returns how many. A FORMED static group becomes
// BROKEN with `why` as its reason; a group left without members becomes EMPTY (and may be
// formed anew), except that a FAILED static group keeps its failure (see AddMember). `change` is
// the GroupEvent kind ("LEFT", "EVICTED").
int RemoveMembers(v1::GroupRecord* record, absl::FunctionRef<bool(const v1::Member&)> remove,
                  absl::string_view change, absl::string_view why);

// Records come from a rendezvous store that others can write (a peer daemon with the token,
// an older tpd, a hand edit): nothing in one is trusted until this accepts it. Checks the
// structure the transitions above rely on (group name, version, phase, unique names and
// ranks within bounds, every member's options present, bounded sizes), not the options'
// meaning, which negotiation judges. DATA_LOSS naming `key` and the first problem found.
absl::Status ValidateGroupRecord(const v1::GroupRecord& record, absl::string_view group,
                                 int64_t version, absl::string_view key);

// Bounds of a record that ValidateGroupRecord enforces: far above any group tpd forms, low
// enough that a forged record cannot make every daemon following it allocate without end.
inline constexpr int64_t kMaxRecordMembers = 1 << 20;
inline constexpr int64_t kMaxRecordStringBytes = 4096;

// The member named `name`, or nullptr.
const v1::Member* FindMember(const v1::GroupRecord& record, absl::string_view name);

}  // namespace tpd::group

#endif  // TPD_DAEMON_GROUP_MEMBERSHIP_H_
