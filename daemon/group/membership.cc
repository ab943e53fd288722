#include "daemon/group/membership.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/hmac.h"
#include "base/summarize.h"
#include "daemon/group/options.h"

namespace tpd::group {
namespace {

absl::StatusOr<MemberOptions> ToMemberOptions(const v1::Member& member,
                                              const v1::MemberOptionsRecord& record) {
  const v1::BackendOptions& in = record.options();
  MemberOptions out;
  out.name = member.name();
  out.rank = member.rank();
  out.node = member.node();
  out.device_count = record.device_count();
  if (in.num_worker_threads() != 0) out.options.num_worker_threads = in.num_worker_threads();
  if (in.rpc_timeout_ms() != 0) out.options.rpc_timeout = absl::Milliseconds(in.rpc_timeout_ms());
  out.options.transports.assign(in.transports().begin(), in.transports().end());
  out.options.channels.assign(in.channels().begin(), in.channels().end());
  out.node_transports.assign(record.node_transports().begin(), record.node_transports().end());
  out.node_channels.assign(record.node_channels().begin(), record.node_channels().end());
  // Proto maps have no order; sort so error messages and results never depend on it.
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> maps;
  for (const auto& [to, map] : in.device_maps()) {
    auto& entries = maps[to];
    entries.assign(map.devices().begin(), map.devices().end());
    std::sort(entries.begin(), entries.end());
  }
  for (const auto& [to, entries] : maps) {
    absl::StatusOr<DeviceMap> map = ParseDeviceMap(entries);
    if (!map.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("worker ", member.name(), " on node ",
                                                     member.node(), ": device map toward ", to,
                                                     ": ", map.status().message()));
    }
    out.options.device_maps[to] = *std::move(map);
  }
  absl::StatusOr<std::vector<Device>> devices =
      ParseDevices({in.devices().begin(), in.devices().end()});
  if (!devices.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", member.name(), " on node ", member.node(), ": ", devices.status().message()));
  }
  out.options.devices = *std::move(devices);
  return out;
}

// A member's own options' error (they do not parse, or do not validate); OK when valid.
absl::Status OwnOptionsError(const v1::Member& member, const v1::MemberOptionsRecord& options) {
  absl::StatusOr<MemberOptions> own = ToMemberOptions(member, options);
  if (!own.ok()) return own.status();
  return ValidateMemberOptions(*own);
}

// In a complete static group whose ranks' own options are not all valid, the error of the
// first invalid rank in rank order (PyTorch validates the gathered options in that order, so
// every rank raises that one).
absl::Status FirstInvalidInRankOrder(const v1::GroupRecord& record) {
  for (const v1::Member& member : record.view().members()) {  // sorted by rank
    auto options = record.options().find(member.name());
    if (options == record.options().end()) continue;  // Renegotiate reports it
    if (absl::Status error = OwnOptionsError(member, options->second); !error.ok()) return error;
  }
  return absl::OkStatus();
}

void ToProtoMaps(const std::map<std::string, DeviceMap>& maps,
                 google::protobuf::Map<std::string, v1::DeviceMap>* out) {
  for (const auto& [to, map] : maps) {
    v1::DeviceMap& proto = (*out)[to];
    for (const auto& [from, onto] : map)
      (*proto.mutable_devices())[from.ToString()] = onto.ToString();
  }
}

// Reruns negotiation over every member and records the result in the view.
absl::Status Renegotiate(v1::GroupRecord* record) {
  v1::GroupView* view = record->mutable_view();
  view->clear_negotiated();
  view->clear_transports();
  view->clear_channels();
  if (view->members().empty()) return absl::OkStatus();
  std::vector<MemberOptions> members;
  for (const v1::Member& member : view->members()) {
    auto found = record->options().find(member.name());
    if (found == record->options().end()) {
      return absl::DataLossError(absl::StrCat("group ", view->group(), ": member ", member.name(),
                                              " has no options in the record"));
    }
    absl::StatusOr<MemberOptions> options = ToMemberOptions(member, found->second);
    if (!options.ok()) return options.status();
    members.push_back(*std::move(options));
  }
  absl::StatusOr<Negotiated> negotiated = Negotiate(members, view->is_static());
  if (!negotiated.ok()) return negotiated.status();
  for (const NegotiatedMember& member : negotiated->members) {
    v1::NegotiatedMember* out = view->add_negotiated();
    out->set_name(member.name);
    ToProtoMaps(member.device_maps, out->mutable_device_maps());
    ToProtoMaps(member.reverse_device_maps, out->mutable_reverse_device_maps());
    for (const Device& device : member.devices) out->add_devices(device.ToString());
  }
  view->mutable_transports()->Add(negotiated->transports.begin(), negotiated->transports.end());
  view->mutable_channels()->Add(negotiated->channels.begin(), negotiated->channels.end());
  view->set_num_worker_threads(negotiated->num_worker_threads);
  view->set_rpc_timeout_ms(absl::ToInt64Milliseconds(negotiated->rpc_timeout));
  return absl::OkStatus();
}

bool KnownPhase(absl::string_view phase) {
  for (absl::string_view known : {kEmpty, kForming, kFormed, kDynamic, kBroken, kFailed}) {
    if (phase == known) return true;
  }
  return false;
}

}  // namespace

absl::Status ValidateGroupRecord(const v1::GroupRecord& record, absl::string_view group,
                                 int64_t version, absl::string_view key) {
  auto bad = [&](absl::string_view problem) {
    return absl::DataLossError(absl::StrCat("group ", group, ": record ", key,
                                            " in the rendezvous store is not a valid tpd group "
                                            "record (",
                                            problem,
                                            "); the group cannot be followed until it "
                                            "is removed from that store"));
  };
  const v1::GroupView& view = record.view();
  if (view.group() != group) return bad("it names another group");
  if (view.version() != version) {
    return bad(absl::StrCat("it says version ", view.version()));
  }
  if (!KnownPhase(view.phase())) return bad("unknown phase");
  if (view.members_size() > kMaxRecordMembers || record.options_size() > kMaxRecordMembers ||
      record.node_owner_uids_size() > kMaxRecordMembers) {
    return bad(absl::StrCat("more than ", kMaxRecordMembers, " members"));
  }
  if (!record.secret_verifier().empty() && record.secret_verifier().size() != 32) {
    return bad(
        absl::StrCat("a secret verifier of ", record.secret_verifier().size(), " bytes, not 32"));
  }
  if (view.is_static()) {
    if (view.world_size() <= 0 || view.world_size() > kMaxRecordMembers) {
      return bad(absl::StrCat("world_size ", view.world_size()));
    }
    if (view.members_size() > view.world_size()) return bad("more members than world_size");
  } else if (view.world_size() != 0) {
    return bad("a dynamic group with a world_size");
  }
  const bool kept_failure = view.phase() == kFailed && view.is_static();
  if ((view.phase() == kEmpty) != view.members().empty() && !kept_failure) {
    return bad(view.members().empty() ? "no members outside phase EMPTY"
                                      : "members in an EMPTY group");
  }
  if (view.phase() == kFormed && view.members_size() != view.world_size()) {
    return bad("FORMED without all ranks");
  }
  if (record.failure_code() < 0 || record.failure_code() > 16) {
    return bad(absl::StrCat("failure code ", record.failure_code()));
  }
  if (view.reason().size() > kMaxRecordStringBytes ||
      record.change_detail().size() > 16 * kMaxRecordStringBytes) {
    return bad("oversized text");
  }
  std::set<absl::string_view> names;
  std::set<int64_t> ranks;
  for (const v1::Member& member : view.members()) {
    if (member.name().empty() || member.name().size() > kMaxRecordStringBytes ||
        member.node().empty() || member.node().size() > kMaxRecordStringBytes ||
        member.agent_address().size() > kMaxRecordStringBytes) {
      return bad(
          "a member with an empty or oversized name or node, or an oversized agent "
          "address");
    }
    if (member.rank() < 0 || (view.is_static() && member.rank() >= view.world_size())) {
      return bad(absl::StrCat("rank ", member.rank(), " out of range"));
    }
    if (!names.insert(member.name()).second) return bad("a worker name held twice");
    if (!ranks.insert(member.rank()).second) return bad("a rank held twice");
    if (record.options().count(member.name()) == 0) {
      return bad(absl::StrCat("no options for member ", member.name().substr(0, 128)));
    }
  }
  if (static_cast<size_t>(record.options_size()) != names.size()) {
    return bad("options for workers that are not members");
  }
  return absl::OkStatus();
}

const v1::Member* FindMember(const v1::GroupRecord& record, absl::string_view name) {
  for (const v1::Member& member : record.view().members()) {
    if (member.name() == name) return &member;
  }
  return nullptr;
}

std::string SecretVerifier(absl::string_view group, absl::string_view secret) {
  if (secret.empty()) return "";
  return HmacSha256(secret, absl::StrCat("tpd-group-secret-v1", group));
}

namespace {

// A static group that failed to form, whose members all left, within kFailureLingerMs of its
// failure by `now_ms` (either way: daemons' clocks differ, and a record dated far ahead must not
// keep a name for ever).
bool KeepsFailure(const v1::GroupRecord& record, int64_t now_ms) {
  const v1::GroupView& view = record.view();
  return view.phase() == kFailed && view.members().empty() && record.failed_unix_ms() != 0 &&
         std::abs(now_ms - record.failed_unix_ms()) < kFailureLingerMs;
}

// Makes the group FAILED for `reason`; its waiting ranks get `code`. `now_ms` 0: every rank
// was there to learn it (a failed negotiation), so nothing is kept for late ones.
void MarkFailed(v1::GroupRecord* record, absl::StatusCode code, const std::string& reason,
                int64_t now_ms) {
  v1::GroupView* view = record->mutable_view();
  view->set_phase(kFailed);
  view->set_reason(reason);
  record->set_change("FAILED");
  record->set_change_detail(reason);
  record->set_failed_unix_ms(now_ms);
  record->set_failure_code(code == absl::StatusCode::kInvalidArgument ? 0 : static_cast<int>(code));
}

// The first joiner of an EMPTY group (or of one whose kept failure expired) starts it: it
// decides whether the group is static, and who may join it.
void StartIfEmpty(v1::GroupRecord* record, const JoinSpec& spec) {
  v1::GroupView* view = record->mutable_view();
  if (!view->members().empty()) return;
  const bool is_static = spec.world_size.has_value();
  view->set_is_static(is_static);
  view->set_world_size(is_static ? *spec.world_size : 0);
  view->set_phase(is_static ? kForming : kDynamic);
  view->clear_reason();
  record->set_secret_verifier(spec.secret_verifier);
  record->clear_node_owner_uids();
  record->clear_failed_unix_ms();
  record->clear_failure_code();
}

// A rank of a forming (or EMPTY) static group that cannot join: the group fails at once, as
// the next version, and its waiting ranks get ABORTED with `reason`.
void FailForming(v1::GroupRecord* record, const JoinSpec& spec, const std::string& reason) {
  StartIfEmpty(record, spec);
  const int64_t version = record->view().version();
  MarkFailed(record, absl::StatusCode::kAborted, reason, spec.since_unix_ms);
  record->mutable_view()->set_version(version + 1);
}

// "rank R (name)", or "worker name" for a join that named no rank.
std::string RankOf(const JoinSpec& spec, std::optional<int64_t> rank) {
  return rank ? absl::StrCat("rank ", *rank, " (", spec.name, ")")
              : absl::StrCat("worker ", spec.name);
}

// The error a static group's rank gets for the options PyTorch refuses as they are set: parsing
// (ToMemberOptions) and ValidateOptionsAsSet.
absl::Status OptionsAsSetError(const v1::Member& member, const v1::MemberOptionsRecord& options) {
  absl::StatusOr<MemberOptions> own = ToMemberOptions(member, options);
  if (!own.ok()) return own.status();
  return ValidateOptionsAsSet(*own);
}

// PERMISSION_DENIED unless the group whose newest record is `record` admits `spec`'s join.
absl::Status Admit(const v1::GroupRecord& record, const JoinSpec& spec) {
  const v1::GroupView& view = record.view();
  // Anyone may start an EMPTY group; only joiners with its secret learn why it failed.
  if (view.members().empty() && !KeepsFailure(record, spec.since_unix_ms)) {
    return absl::OkStatus();
  }
  if (!ConstantTimeEquals(record.secret_verifier(), spec.secret_verifier)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "group ", view.group(), " admits only joins that bring its secret, and worker ", spec.name,
        record.secret_verifier().empty()
            ? " brought one to a group started without a secret (join without one)"
        : spec.secret_verifier.empty() ? " brought none (JoinRequest.secret)"
                                       : " brought another one (JoinRequest.secret)"));
  }
  auto owner = record.node_owner_uids().find(spec.node);
  if (owner != record.node_owner_uids().end() && owner->second != spec.uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "group ", view.group(), " belongs to uid ", owner->second, " on node ", spec.node, ": uid ",
        spec.uid, " may not join it there (worker ", spec.name, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// AddMember, once the join is admitted.
absl::StatusOr<int64_t> AddAdmitted(v1::GroupRecord* record, const JoinSpec& spec, bool* failed) {
  // Every check runs against `current` before anything changes, so a refused join leaves
  // the record as it was without copying it: a static group of N ranks would otherwise copy
  // its whole record (O(N)) for every join, O(N^2) over its formation.
  const v1::GroupView& current = record->view();
  const std::string& group = current.group();
  const bool empty = current.members().empty();
  const bool is_static = spec.world_size.has_value();

  if (empty && KeepsFailure(*record, spec.since_unix_ms)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group ", group, " failed to form ", (spec.since_unix_ms - record->failed_unix_ms()) / 1000,
        " s ago: ", current.reason(), " (its name is free again ", kFailureLingerMs / 1000,
        " s after the failure)"));
  } else if (empty) {
    // The first joiner decides whether the group is static (below, once the join is valid).
  } else if (current.is_static() != is_static) {
    // torch's words first (its agent says them for the same mix, and tests match them).
    return absl::FailedPreconditionError(absl::StrCat(
        "RPC group mixes statically and dynamically initialized members which is "
        "not supported: group ",
        group, " is ", current.is_static() ? "static" : "dynamic", " but worker ", spec.name,
        " joins it as ", is_static ? "static (world_size given)" : "dynamic (no world_size)"));
  } else if (is_static && current.world_size() != *spec.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group, " has world_size ",
                                                   current.world_size(), " but worker ", spec.name,
                                                   " joins with world_size ", *spec.world_size));
  } else if (current.phase() == kFormed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "static group ", group, " is already formed with all ", current.world_size(), " ranks"));
  } else if (current.phase() == kBroken || current.phase() == kFailed) {
    return absl::FailedPreconditionError(
        absl::StrCat("group ", group, " is ", current.phase(), ": ", current.reason(),
                     " (it can be formed again once its remaining members have left)"));
  }
  if (is_static && (*spec.world_size <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be positive, got ", *spec.world_size));
  }

  for (const v1::Member& member : current.members()) {
    if (member.name() == spec.name) {
      // PyTorch's words (and its RuntimeError: not an invalid option, a clash).
      return absl::AlreadyExistsError(
          absl::StrCat("RPC worker name ", spec.name, " is not unique. Workers ", member.rank(),
                       " and ", spec.rank ? absl::StrCat(*spec.rank) : std::string("a new one"),
                       " share the same name (group ", group, ", rank ", member.rank(), " on node ",
                       member.node(), ")"));
    }
  }
  int64_t rank;
  if (spec.rank.has_value()) {
    rank = *spec.rank;
    if (rank < 0 || (is_static && rank >= *spec.world_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " of worker ", spec.name, " is out of range",
                       is_static ? absl::StrCat(" [0, ", *spec.world_size, ")")
                                 : std::string(" (must be >= 0)")));
    }
    const auto it = std::find_if(current.members().begin(), current.members().end(),
                                 [rank](const v1::Member& m) { return m.rank() == rank; });
    if (it != current.members().end()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of group ", group,
                                                     " is already taken by ", it->name(),
                                                     " on node ", it->node()));
    }
  } else if (is_static) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", spec.name, " joins static group ", group, " without a rank"));
  } else {
    std::set<int64_t> taken;
    for (const v1::Member& member : current.members()) taken.insert(member.rank());
    rank = 0;
    while (taken.count(rank) > 0) ++rank;  // the lowest free rank
  }

  if (!spec.abandon.empty()) {
    if (!is_static) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", spec.name, " abandons dynamic group ", group,
          ": only a static group's ranks wait for each other (leave or do not join instead)"));
    }
    if (failed == nullptr) return absl::AbortedError(spec.abandon);
    // Nothing is joined: the group fails, naming the rank, so the others stop waiting.
    const std::string reason =
        absl::StrCat(RankOf(spec, rank), " cannot take part: ", spec.abandon);
    FailForming(record, spec, reason);
    *failed = true;
    return absl::AbortedError(reason);
  }

  v1::Member member;
  member.set_name(spec.name);
  member.set_rank(rank);
  member.set_node(spec.node);
  member.set_incarnation(spec.incarnation);
  member.set_since_unix_ms(spec.since_unix_ms);
  member.set_agent_address(spec.agent_address);
  v1::MemberOptionsRecord options;
  *options.mutable_options() = spec.options;
  options.set_device_count(spec.device_count);
  for (const std::string& name : spec.node_transports) options.add_node_transports(name);
  for (const std::string& name : spec.node_channels) options.add_node_channels(name);

  // A member's own options are checked before anything else, so it alone is blamed. A
  // dynamic group refuses the newcomer. A static group checks them as PyTorch does, once
  // every rank is there (its ranks gather their options first): it FAILS with the error
  // PyTorch raises on every rank, the first invalid rank's in rank order
  // (FirstInvalidInRankOrder). Failing earlier would tell only the ranks there by then: the
  // others would find the failed members gone and wait for a group that never forms.
  if (!is_static) {
    if (absl::Status own_error = OwnOptionsError(member, options); !own_error.ok()) {
      return own_error;
    }
  } else if (absl::Status as_set = OptionsAsSetError(member, options); !as_set.ok()) {
    // Options PyTorch refuses as they are set never reach its gathering: the rank is refused
    // at once, and the group fails naming it, so the other ranks do not wait for it.
    if (failed == nullptr) return as_set;
    FailForming(record, spec,
                absl::StrCat(RankOf(spec, rank), " was refused at its join: ", as_set.message()));
    *failed = true;
    return as_set;
  }

  // Only a dynamic join can still be refused (by negotiation with the present members): it
  // works on a copy. A static join cannot fail from here on and changes the record in place.
  v1::GroupRecord copy;
  if (!is_static) copy = *record;
  v1::GroupRecord& next = is_static ? *record : copy;
  v1::GroupView* view = next.mutable_view();
  if (empty) StartIfEmpty(&next, spec);
  next.mutable_node_owner_uids()->insert({spec.node, spec.uid});
  // Members stay sorted by rank: move the newcomer down to its place.
  auto* members = view->mutable_members();
  *members->Add() = std::move(member);
  for (int i = members->size() - 1; i > 0 && members->Get(i - 1).rank() > members->Get(i).rank();
       --i) {
    members->SwapElements(i - 1, i);
  }
  (*next.mutable_options())[spec.name] = std::move(options);

  next.set_change("JOINED");
  next.set_change_detail(
      absl::StrCat(spec.name, " (rank ", rank, ") joined from node ", spec.node));
  if (!is_static) {
    if (absl::Status status = Renegotiate(&next); !status.ok()) return status;
  } else if (view->members_size() == view->world_size()) {
    absl::Status status = FirstInvalidInRankOrder(next);
    if (status.ok()) status = Renegotiate(&next);
    if (status.ok()) {
      view->set_phase(kFormed);
      view->set_formed_version(view->version() + 1);
      next.set_change("FORMED");
      next.set_change_detail(
          absl::StrCat("all ", view->world_size(), " ranks joined; ", spec.name, " was the last"));
    } else {
      MarkFailed(&next, absl::StatusCode::kInvalidArgument, std::string(status.message()),
                 /*now_ms=*/0);
    }
  }
  view->set_version(view->version() + 1);
  if (!is_static) *record = std::move(copy);
  return rank;
}

}  // namespace

absl::StatusOr<int64_t> AddMember(v1::GroupRecord* record, const JoinSpec& spec, bool* failed) {
  if (failed != nullptr) *failed = false;
  if (absl::Status admitted = Admit(*record, spec); !admitted.ok()) return admitted;
  absl::StatusOr<int64_t> rank = AddAdmitted(record, spec, failed);
  // Any other rank of a forming static group that cannot join (a name or rank taken, another
  // world_size) fails the group too: the ranks waiting would otherwise wait for the timeout.
  const v1::GroupView& view = record->view();
  if (!rank.ok() && failed != nullptr && !*failed && spec.world_size.has_value() &&
      (absl::IsInvalidArgument(rank.status()) || absl::IsAlreadyExists(rank.status())) &&
      view.is_static() && view.phase() == kForming) {
    FailForming(record, spec,
                absl::StrCat(RankOf(spec, spec.rank),
                             " was refused at its join: ", rank.status().message()));
    *failed = true;
  }
  return rank;
}

int RemoveMembers(v1::GroupRecord* record, absl::FunctionRef<bool(const v1::Member&)> remove,
                  absl::string_view change, absl::string_view why) {
  v1::GroupView* view = record->mutable_view();
  std::vector<std::string> removed;
  auto* members = view->mutable_members();
  for (int i = members->size() - 1; i >= 0; --i) {
    if (!remove(members->Get(i))) continue;
    removed.push_back(members->Get(i).name());
    record->mutable_options()->erase(members->Get(i).name());
    members->DeleteSubrange(i, 1);
  }
  if (removed.empty()) return 0;
  std::reverse(removed.begin(), removed.end());
  record->set_change(std::string(change));
  record->set_change_detail(absl::StrCat(JoinSummarized(removed, ", "), ": ", why));
  if (members->empty() && view->phase() == kFailed && record->failed_unix_ms() != 0) {
    // Ranks that start late must learn why the group failed, not start it anew and wait for
    // ranks that are gone: the failure, and the secret that guards its reason, stay until
    // kFailureLingerMs after it (AddMember).
    record->clear_node_owner_uids();
  } else if (members->empty()) {
    // Nobody holds the group any more: whoever starts it next decides who may join.
    record->clear_secret_verifier();
    record->clear_node_owner_uids();
    view->set_phase(kEmpty);
    view->clear_formed_version();
    view->clear_reason();
    view->set_is_static(false);
    view->set_world_size(0);
    view->clear_negotiated();
    view->clear_transports();
    view->clear_channels();
    view->clear_num_worker_threads();
    view->clear_rpc_timeout_ms();
  } else if (view->phase() == kFormed) {
    view->set_phase(kBroken);
    view->set_reason(absl::StrCat(JoinSummarized(removed, ", "), " ",
                                  change == "EVICTED" ? "evicted" : "left", ": ", why));
    record->set_change("BROKEN");
  } else if (view->phase() == kDynamic) {
    // Removing members cannot invalidate the others' maps in a dynamic group (maps toward
    // absent workers are not checked) when the record is one this daemon wrote; a forged one
    // (validated for structure, not meaning) may fail here, and then keeps no negotiation.
    (void)Renegotiate(record);
  }
  view->set_version(view->version() + 1);
  return static_cast<int>(removed.size());
}

}  // namespace tpd::group
