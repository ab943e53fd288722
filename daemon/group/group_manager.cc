#include "daemon/group/group_manager.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <system_error>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/hmac.h"
#include "base/random_bytes.h"
#include "daemon/logging.h"
#include "daemon/router/session_handle.h"
#include "store/prefix_store.h"

namespace tpd::group {
namespace {

// The group a request names; "" is the default group.
std::string GroupName(const std::string& group) { return group.empty() ? "default" : group; }

uint64_t NewIncarnation() {
  absl::BitGen gen;
  return absl::Uniform<uint64_t>(gen, 1, UINT64_MAX);
}

}  // namespace

GroupManager::GroupManager(GroupManagerOptions options) : options_(std::move(options)) {
  node_.name = options_.node_name;
  node_.device_count = options_.device_count;
  node_.agent_address = options_.agent_address;
  node_.transports = options_.transports;
  node_.channels = options_.channels;
  node_.incarnation = NewIncarnation();
  reaper_ = std::thread([this] { ReapLoop(); });
}

GroupManager::StoreEntry::~StoreEntry() {
  // Shutdown may have stopped the heartbeat already (it holds a reference while it does).
  if (!stop.HasBeenNotified()) stop.Notify();
  if (heartbeat.joinable()) heartbeat.join();
}

GroupManager::~GroupManager() { Shutdown(); }

void GroupManager::StopJoins(std::string why) {
  absl::MutexLock lock(&mu_);
  if (joins_refused_why_.empty()) joins_refused_why_ = std::move(why);
}

void GroupManager::Shutdown(std::string why) {
  std::vector<std::shared_ptr<GroupTracker>> live;
  std::vector<std::shared_ptr<StoreEntry>> stores;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    shut_down_why_ = std::move(why);
    sessions_.clear();
    for (auto& [name, entry] : trackers_) live.push_back(entry.tracker);
    for (auto& [name, weak] : stores_) {
      if (std::shared_ptr<StoreEntry> entry = weak.lock()) stores.push_back(std::move(entry));
    }
  }
  stop_reaper_.Notify();
  if (reaper_.joinable()) reaper_.join();
  // Trackers leave in parallel (each may wait on its own store), on a bounded number of
  // threads: a daemon following a thousand groups must not need a thousand more to stop.
  std::atomic<size_t> next{0};
  auto leave = [&live, &next] {
    for (size_t i = next++; i < live.size(); i = next++) live[i]->Shutdown();
  };
  std::vector<std::thread> leaving;
  for (size_t i = 0; i < std::min<size_t>(live.size(), 8); ++i) {
    try {
      leaving.emplace_back(leave);
    } catch (const std::system_error&) {
      break;  // out of threads: the ones started, and this one, do the rest
    }
  }
  leave();
  for (std::thread& thread : leaving) thread.join();
  // Trackers stay allocated while streams still closing refer to them; heartbeats stop now.
  for (const std::shared_ptr<StoreEntry>& entry : stores) entry->stop.Notify();
}

void GroupManager::ReapLoop() {
  const absl::Duration period =
      std::clamp(std::min(options_.idle_release / 4, options_.identify_timeout / 2),
                 absl::Milliseconds(10), absl::Seconds(5));
  while (!stop_reaper_.WaitForNotificationWithTimeout(period)) {
    std::vector<std::shared_ptr<GroupTracker>> released;
    std::vector<std::string> unidentified;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      for (const auto& [id, session] : sessions_) {
        if (!session.uid && now - session.opened >= options_.identify_timeout) {
          unidentified.push_back(id);
        }
      }
      for (auto it = trackers_.begin(); it != trackers_.end();) {
        if (now - it->second.last_used >= options_.idle_release && it->second.tracker->Idle()) {
          DaemonLog().info(
              "[group {}] [store {}] released: no local member, watcher or call "
              "for {}",
              it->first, it->second.store_name, absl::FormatDuration(options_.idle_release));
          released.push_back(std::move(it->second.tracker));
          it = trackers_.erase(it);
        } else {
          ++it;
        }
      }
    }
    // Stopped outside the lock (a worker may be finishing a store call); freed, with the
    // store once its last group goes, when the last reference is dropped.
    for (const std::shared_ptr<GroupTracker>& tracker : released) tracker->Stop();
    for (const std::string& id : unidentified) {
      if (!session_ender_) break;
      session_ender_(id, absl::StrCat("the session did not identify its user on the data "
                                      "socket within ",
                                      absl::FormatDuration(options_.identify_timeout),
                                      " (data.session_identify_timeout_ms)"));
    }
  }
}

void GroupManager::Reincarnate(uint64_t lost, absl::string_view why) {
  const uint64_t incarnation = NewIncarnation();
  if (!node_.incarnation.compare_exchange_strong(lost, incarnation)) return;
  DaemonLog().warn("[node {}] {}: taking new incarnation {}", node_.name, std::string(why),
                   incarnation);
}

void GroupManager::HeartbeatTo(StoreEntry* entry) {
  while (!entry->stop.WaitForNotificationWithTimeout(options_.tracker.heartbeat_interval)) {
    entry->liveness->Beat();
  }
  entry->liveness->Stop();
}

std::string GroupManager::OpenSession(const std::string& client) {
  // The id is the session's only credential on the data socket (docs/security.md): 128 bits
  // from the kernel's CSPRNG, not from a seeded generator.
  const std::string id = absl::BytesToHexString(RandomBytes(16));
  std::optional<std::string> evicted;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    int64_t unidentified = 0;
    const std::pair<const std::string, SessionEntry>* oldest = nullptr;
    for (const auto& entry : sessions_) {
      if (entry.second.uid) continue;
      ++unidentified;
      if (oldest == nullptr || entry.second.opened < oldest->second.opened) oldest = &entry;
    }
    if (oldest != nullptr && unidentified >= options_.max_unidentified_sessions) {
      evicted = oldest->first;
    }
    sessions_[id] = SessionEntry{client, std::nullopt, now};
  }
  if (evicted && session_ender_) {
    session_ender_(*evicted, absl::StrCat("data.max_unidentified_sessions (",
                                          options_.max_unidentified_sessions,
                                          ") sessions had not identified their user; this one, "
                                          "the oldest, was ended for a new one"));
  }
  return id;
}

absl::Status GroupManager::BindSessionUid(const std::string& session_id, int64_t uid) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session ", SessionHandle(session_id), " is not open"));
  }
  std::optional<int64_t>& bound = it->second.uid;
  if (bound && *bound != uid) {
    return absl::PermissionDeniedError(absl::StrCat("session ", SessionHandle(session_id),
                                                    " belongs to another user; uid ", uid,
                                                    " may not use it"));
  }
  if (!bound) {
    int64_t of_uid = 0;
    for (const auto& [id, session] : sessions_) of_uid += session.uid == uid;
    if (of_uid >= options_.max_sessions_per_uid) {
      return absl::ResourceExhaustedError(
          absl::StrCat("data.max_open_sessions_per_uid (", options_.max_sessions_per_uid,
                       ") sessions of uid ", uid, " are open; end some of them"));
    }
  }
  bound = uid;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> GroupManager::SessionUid(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || !it->second.uid) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", SessionHandle(session_id),
        it == sessions_.end() ? " is not open"
                              : " has not identified its user on the data socket yet"));
  }
  return *it->second.uid;
}

absl::StatusOr<std::string> GroupManager::UserSecret(const std::string& session_id,
                                                     absl::string_view purpose) {
  absl::StatusOr<int64_t> uid = SessionUid(session_id);
  if (!uid.ok()) return uid.status();
  // Length-prefixed, so no (uid, purpose) pair encodes like another.
  return HmacSha256(
      options_.user_secret_key,
      absl::StrCat("tpd-user-secret-v1 uid=", *uid, " purpose=", purpose.size(), ":", purpose));
}

void GroupManager::EndSession(const std::string& session_id) {
  std::vector<std::shared_ptr<GroupTracker>> trackers;
  {
    absl::MutexLock lock(&mu_);
    if (sessions_.erase(session_id) == 0) return;
    for (auto& [name, entry] : trackers_) trackers.push_back(entry.tracker);
  }
  for (const std::shared_ptr<GroupTracker>& tracker : trackers) tracker->EndSession(session_id);
}

std::vector<std::shared_ptr<GroupTracker>> GroupManager::AllTrackers() {
  std::vector<std::shared_ptr<GroupTracker>> trackers;
  absl::MutexLock lock(&mu_);
  for (auto& [name, entry] : trackers_) trackers.push_back(entry.tracker);
  return trackers;
}

absl::StatusOr<std::shared_ptr<store::Store>> GroupManager::GroupStore(
    const std::string& session_id, const std::string& group) {
  if (absl::Status status = CheckSession(session_id); !status.ok()) return status;
  std::shared_ptr<GroupTracker> tracker = Known(group);
  if (tracker == nullptr || !tracker->Holds(session_id)) {
    return absl::PermissionDeniedError(
        absl::StrCat("this client's session holds no member of group ", GroupName(group),
                     " on this daemon: only members may use a group's store (join it first)"));
  }
  // Members' sessions are bound to their uid (a join needs it).
  absl::StatusOr<int64_t> uid = SessionUid(session_id);
  if (!uid.ok()) return uid.status();
  // The user keys, apart from the group's own records, as this member's user reaches them;
  // the tracker (and through it the rendezvous store) lives while the returned pointer does.
  struct UserKeys : store::PrefixStore {
    UserKeys(std::shared_ptr<GroupTracker> of, std::unique_ptr<store::Store> keys)
        : PrefixStore("store", keys.get()), tracker(std::move(of)), group_keys(std::move(keys)) {}
    const std::shared_ptr<GroupTracker> tracker;
    const std::unique_ptr<store::Store> group_keys;
  };
  std::unique_ptr<store::Store> keys = tracker->KeysFor({*uid, node_.name});
  return std::make_shared<UserKeys>(std::move(tracker), std::move(keys));
}

std::optional<std::string> GroupManager::SessionOf(const std::string& group,
                                                   const std::string& name) {
  std::shared_ptr<GroupTracker> tracker = Known(group);
  if (tracker == nullptr) return std::nullopt;
  return tracker->SessionOf(name);
}

std::optional<v1::Member> GroupManager::MemberNamed(const std::string& group,
                                                    const std::string& name, int64_t* version) {
  if (version != nullptr) *version = 0;
  std::shared_ptr<GroupTracker> tracker = Known(group);
  if (tracker == nullptr) return std::nullopt;
  return tracker->MemberNamed(name, version);
}

void GroupManager::WhenVersion(const std::string& group, int64_t version, absl::Time deadline,
                               GroupTracker::VersionDone done) {
  std::shared_ptr<GroupTracker> tracker = Known(group);
  if (tracker == nullptr) {
    done(false);
    return;
  }
  tracker->WhenVersion(version, deadline, std::move(done));
}

std::optional<v1::DeviceMap> GroupManager::DeviceMapOf(const std::string& group,
                                                       const std::string& from,
                                                       const std::string& to, bool reverse) {
  std::shared_ptr<GroupTracker> tracker = Known(group);
  if (tracker == nullptr) return std::nullopt;
  return tracker->DeviceMapOf(from, to, reverse);
}

int64_t GroupManager::SessionCount() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(sessions_.size());
}

std::shared_ptr<GroupTracker> GroupManager::Known(const std::string& group) {
  absl::MutexLock lock(&mu_);
  auto it = trackers_.find(GroupName(group));
  if (it == trackers_.end()) return nullptr;
  it->second.last_used = absl::Now();
  return it->second.tracker;
}

absl::Status GroupManager::CheckSessionGroups(const std::string& session_id,
                                              const std::string& group) {
  std::vector<std::pair<std::string, std::shared_ptr<GroupTracker>>> trackers;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, entry] : trackers_) trackers.emplace_back(name, entry.tracker);
  }
  int64_t held = 0;
  for (const auto& [name, tracker] : trackers) {
    if (name == group) return absl::OkStatus();  // already in it (or joining): no new group
    if (tracker->Holds(session_id)) ++held;
  }
  if (held < options_.max_groups_per_session) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("this client's session already holds members in ", held,
                   " groups; the limit group.max_groups_per_session is ",
                   options_.max_groups_per_session, " (leave a group first)"));
}

absl::Status GroupManager::CheckSession(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError(shut_down_why_);
  if (sessions_.count(session_id) == 0) {
    return absl::FailedPreconditionError(
        "unknown or ended session: open one with Control.OpenSession and keep its stream open");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<GroupManager::StoreEntry>> GroupManager::StoreFor(
    const store::InitMethod& method, store::FileCreation creation) {
  const std::string name = store::RendezvousStoreName(method);
  {
    absl::MutexLock lock(&mu_);
    auto it = stores_.find(name);
    if (it != stores_.end()) {
      if (std::shared_ptr<StoreEntry> entry = it->second.lock()) return entry;
    }
  }
  // Opened outside the lock: a file store replays its whole log (maybe over NFS), a host name
  // is resolved, and the heartbeat threads must not wait for that.
  absl::StatusOr<std::unique_ptr<store::Store>> store =
      store::OpenRendezvousStore(method, options_.rendezvous, creation);
  if (!store.ok()) return store.status();
  auto entry = std::make_shared<StoreEntry>();
  entry->name = name;
  entry->store = *std::move(store);
  entry->liveness = std::make_unique<NodeLiveness>(
      entry->store.get(), name, node_.name, &node_.incarnation, options_.tracker.heartbeat_timeout,
      options_.tracker.heartbeat_interval / 2,
      [this](uint64_t lost) { Reincarnate(lost, "its liveness lease expired"); });
  absl::StatusOr<std::unique_ptr<GroupWorker>> worker = GroupWorker::Start(name);
  if (!worker.ok()) return worker.status();
  entry->worker = *std::move(worker);
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError(shut_down_why_);
  // Another join may have opened the same store meanwhile: keep the first.
  std::weak_ptr<StoreEntry>& slot = stores_[name];
  if (std::shared_ptr<StoreEntry> first = slot.lock()) return first;
  try {
    entry->heartbeat = std::thread([this, raw = entry.get()] { HeartbeatTo(raw); });
  } catch (const std::system_error& error) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot start a heartbeat thread for rendezvous store ", name, ": ", error.what()));
  }
  slot = entry;
  // Forget stores that closed since (the map holds only weak references).
  for (auto it = stores_.begin(); it != stores_.end();) {
    it = it->second.expired() ? stores_.erase(it) : std::next(it);
  }
  return entry;
}

absl::StatusOr<std::shared_ptr<GroupTracker>> GroupManager::TrackerFor(
    const std::string& group, std::shared_ptr<StoreEntry> entry, std::optional<int64_t> uid) {
  if (shut_down_) return absl::UnavailableError(shut_down_why_);
  auto it = trackers_.find(group);
  if (it != trackers_.end()) {
    if (it->second.store_name != entry->name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group ", group, " is already in use on this daemon through ", it->second.store_name,
          "; name groups in ", entry->name, " differently (an unused group is released after ",
          absl::FormatDuration(options_.idle_release), ")"));
    }
    it->second.last_used = absl::Now();
    if (!it->second.uid) it->second.uid = uid;
    return it->second.tracker;
  }
  const std::string released =
      absl::StrCat(" (groups without local members or watchers are released after ",
                   absl::FormatDuration(options_.idle_release), ")");
  if (static_cast<int64_t>(trackers_.size()) >= options_.max_groups) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this daemon already follows ", trackers_.size(),
                     " groups; the limit group.max_groups is ", options_.max_groups, released));
  }
  // Shares, so that no one user, nor lookups that nobody answers for, fill the table.
  int64_t same_share = 0;
  for (const auto& [name, followed] : trackers_) same_share += followed.uid == uid;
  if (!uid && same_share >= options_.max_unattributed_groups) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this daemon already follows ", same_share,
                     " groups for lookups and watches; the limit "
                     "group.max_unattributed_groups is ",
                     options_.max_unattributed_groups,
                     " (a member's group counts against its user instead)", released));
  }
  if (uid && same_share >= options_.max_groups_per_uid) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this daemon already follows ", same_share, " groups joined by uid ", *uid,
        "; the limit group.max_groups_per_uid is ", options_.max_groups_per_uid, released));
  }
  // The tracker keeps its store open: the deleter holds the entry until the tracker is gone.
  std::shared_ptr<GroupTracker> tracker(
      new GroupTracker(group, entry->name, entry->store.get(), entry->liveness.get(),
                       entry->worker.get(), &node_, options_.tracker,
                       [this](uint64_t lost) { Reincarnate(lost, "evicted from a group"); }),
      [entry](GroupTracker* doomed) { delete doomed; });
  trackers_[group] = TrackerEntry{tracker, entry->name, absl::Now(), uid};
  return tracker;
}

absl::StatusOr<std::shared_ptr<GroupTracker>> GroupManager::Tracker(
    const std::string& group, const std::string& init_method) {
  const std::string name = GroupName(group);
  if (init_method.empty()) {
    if (std::shared_ptr<GroupTracker> known = Known(name)) return known;
    return absl::NotFoundError(absl::StrCat("this daemon does not know group ", name,
                                            "; give its init_method to look it up"));
  }
  absl::StatusOr<store::InitMethod> method =
      store::ParseInitMethod(init_method, std::nullopt, std::nullopt, {});
  if (!method.ok()) return method.status();
  {
    // A group already followed is answered without opening its store again; a lookup through
    // another store is refused by TrackerFor, and does not count as using the group.
    absl::MutexLock lock(&mu_);
    auto it = trackers_.find(name);
    if (it != trackers_.end() && it->second.store_name == store::RendezvousStoreName(*method)) {
      it->second.last_used = absl::Now();
      return it->second.tracker;
    }
  }
  absl::StatusOr<std::shared_ptr<StoreEntry>> entry =
      StoreFor(*method, store::FileCreation::kMustExist);
  if (!entry.ok()) return entry.status();
  absl::MutexLock lock(&mu_);
  return TrackerFor(name, *std::move(entry), std::nullopt);
}

void GroupManager::Join(const v1::JoinRequest& request, GroupTracker::JoinDone done) {
  if (absl::Status status = CheckSession(request.session_id()); !status.ok()) {
    done(status);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!joins_refused_why_.empty()) {
      done(absl::UnavailableError(joins_refused_why_));
      return;
    }
  }
  JoinSpec spec;
  {
    absl::MutexLock lock(&mu_);
    auto session = sessions_.find(request.session_id());
    if (session != sessions_.end() && session->second.uid) spec.uid = *session->second.uid;
  }
  if (spec.uid < 0) {
    done(absl::FailedPreconditionError(absl::StrCat(
        "session ", SessionHandle(request.session_id()),
        " has not identified its user on the data socket, so it may join no group (the tpd "
        "client library does this when it opens a session)")));
    return;
  }

  absl::StatusOr<store::InitMethod> method = store::ParseInitMethod(
      request.init_method(),
      request.has_rank() ? std::optional<int64_t>(request.rank()) : std::nullopt,
      request.has_world_size() ? std::optional<int64_t>(request.world_size()) : std::nullopt,
      {request.env().begin(), request.env().end()});
  if (!method.ok()) {
    done(method.status());
    return;
  }
  if (absl::Status status = CheckSessionGroups(request.session_id(), GroupName(request.group()));
      !status.ok()) {
    done(status);
    return;
  }
  absl::StatusOr<std::shared_ptr<StoreEntry>> entry =
      StoreFor(*method, store::FileCreation::kCreate);
  if (!entry.ok()) {
    done(entry.status());
    return;
  }
  absl::StatusOr<std::shared_ptr<GroupTracker>> tracker;
  {
    // The session is checked again under the same lock that creates the tracker: EndSession
    // erases the session and lists the trackers under it, so either this join sees the
    // session gone, or the tracker is on EndSession's list and undoes the join.
    absl::MutexLock lock(&mu_);
    if (sessions_.count(request.session_id()) == 0) {
      tracker = absl::CancelledError("the client's session ended during the join");
    } else {
      tracker = TrackerFor(GroupName(request.group()), *std::move(entry), spec.uid);
    }
  }
  if (!tracker.ok()) {
    done(tracker.status());
    return;
  }
  spec.secret_verifier = SecretVerifier(GroupName(request.group()), request.secret());
  spec.name = request.name();
  spec.rank = method->rank;
  spec.world_size = method->world_size;
  spec.options = request.options();
  spec.omit_members = !request.include_members();
  spec.abandon = request.abandon();
  const absl::Duration timeout = request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms())
                                                          : options_.default_join_timeout;
  (*tracker)->Join(std::move(spec), request.session_id(), absl::Now() + timeout, std::move(done));
}

void GroupManager::CancelJoin(const v1::JoinRequest& request) {
  if (std::shared_ptr<GroupTracker> tracker = Known(request.group())) {
    tracker->CancelJoin(request.session_id(), request.name());
  }
}

void GroupManager::Leave(const v1::LeaveRequest& request,
                         absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) {
  if (absl::Status status = CheckSession(request.session_id()); !status.ok()) {
    done(status);
    return;
  }
  absl::StatusOr<std::shared_ptr<GroupTracker>> tracker = Tracker(request.group(), "");
  if (!tracker.ok()) {
    done(tracker.status());
    return;
  }
  (*tracker)->Leave(request.session_id(), request.name(), std::move(done));
}

void GroupManager::Barrier(const v1::BarrierRequest& request, GroupTracker::BarrierDone done) {
  if (absl::Status status = CheckSession(request.session_id()); !status.ok()) {
    done(status);
    return;
  }
  absl::StatusOr<std::shared_ptr<GroupTracker>> tracker = Tracker(request.group(), "");
  if (!tracker.ok()) {
    done(tracker.status());
    return;
  }
  const absl::Duration timeout = request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms())
                                                          : options_.default_join_timeout;
  (*tracker)->Barrier(request.session_id(), request.name(), absl::Now() + timeout, std::move(done));
}

void GroupManager::GetGroup(const std::string& group, const std::string& init_method,
                            GroupTracker::ViewDone done) {
  absl::StatusOr<std::shared_ptr<GroupTracker>> tracker = Tracker(group, init_method);
  if (!tracker.ok()) {
    done(tracker.status());
    return;
  }
  (*tracker)->GetView(std::move(done));
}

std::vector<v1::GroupView> GroupManager::ListGroups() {
  std::vector<v1::GroupView> views;
  for (const std::shared_ptr<GroupTracker>& tracker : AllTrackers()) {
    views.push_back(tracker->View());
  }
  return views;
}

std::vector<std::shared_ptr<GroupManager::StoreEntry>> GroupManager::OpenStores() {
  std::vector<std::shared_ptr<StoreEntry>> entries;
  absl::MutexLock lock(&mu_);
  for (auto& [name, weak] : stores_) {
    if (std::shared_ptr<StoreEntry> entry = weak.lock()) entries.push_back(std::move(entry));
  }
  return entries;
}

std::map<std::string, LivenessStats> GroupManager::RendezvousStores() {
  const std::vector<std::shared_ptr<StoreEntry>> entries = OpenStores();
  // Outside mu_: a liveness's mutex is held across its store calls.
  std::map<std::string, LivenessStats> stores;
  for (const std::shared_ptr<StoreEntry>& entry : entries) {
    stores[entry->name] = entry->liveness->Stats();
  }
  return stores;
}

std::map<std::string, store::Cluster::Health> GroupManager::ProbeStoreClusters(
    absl::Time deadline) {
  const std::vector<std::shared_ptr<StoreEntry>> entries = OpenStores();
  // Outside mu_: probing takes round trips to the store's servers.
  std::map<std::string, store::Cluster::Health> clusters;
  for (const std::shared_ptr<StoreEntry>& entry : entries) {
    if (store::Cluster* cluster = entry->store->cluster()) {
      clusters[entry->name] = cluster->ProbeMembers(deadline);
    }
  }
  return clusters;
}

std::map<std::string, absl::Time> GroupManager::PeerHeartbeats() {
  std::map<std::string, absl::Time> peers;
  for (const std::shared_ptr<GroupTracker>& tracker : AllTrackers()) {
    for (const auto& [node, seen] : tracker->PeerHeartbeats()) {
      peers[node] = std::max(peers[node], seen);
    }
  }
  return peers;
}

}  // namespace tpd::group
