#include "daemon/group/group_manager.h"

#include <random>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "daemon/group/heartbeat.h"
#include "daemon/logging.h"

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
  node_.incarnation = NewIncarnation();
}

GroupManager::~GroupManager() { Shutdown(); }

void GroupManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    sessions_.clear();
  }
  std::vector<GroupTracker*> live;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, tracker] : trackers_) live.push_back(tracker.get());
  }
  // Trackers stay allocated until the destructor: streams still closing may refer to them.
  // They leave in parallel: each may wait on its own store.
  std::vector<std::thread> leaving;
  for (GroupTracker* tracker : live) leaving.emplace_back([tracker] { tracker->Shutdown(); });
  for (std::thread& thread : leaving) thread.join();
  stop_heartbeat_.Notify();
  std::vector<std::thread> heartbeats;
  {
    absl::MutexLock lock(&mu_);
    heartbeats = std::move(heartbeats_);
  }
  for (std::thread& thread : heartbeats) thread.join();
}

void GroupManager::Reincarnate() {
  const uint64_t incarnation = NewIncarnation();
  node_.incarnation = incarnation;
  DaemonLog().warn("[node {}] evicted from a group: taking new incarnation {}", node_.name,
                   incarnation);
}

void GroupManager::HeartbeatTo(store::Store* store) {
  const std::string key = HeartbeatKey(node_.name);
  int64_t counter = 0;
  while (!stop_heartbeat_.WaitForNotificationWithTimeout(options_.tracker.heartbeat_interval)) {
    (void)store->Set(key, HeartbeatValue(node_.incarnation.load(), ++counter));
  }
}

std::string GroupManager::OpenSession(const std::string& client) {
  absl::BitGen gen;
  const std::string id = absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(gen)),
                                      absl::Hex(absl::Uniform<uint64_t>(gen)));
  absl::MutexLock lock(&mu_);
  sessions_[id] = client;
  return id;
}

void GroupManager::EndSession(const std::string& session_id) {
  std::vector<GroupTracker*> trackers;
  {
    absl::MutexLock lock(&mu_);
    if (sessions_.erase(session_id) == 0) return;
    for (auto& [key, tracker] : trackers_) trackers.push_back(tracker.get());
  }
  for (GroupTracker* tracker : trackers) tracker->EndSession(session_id);
}

absl::Status GroupManager::CheckSession(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("the tpd daemon is shutting down");
  if (sessions_.count(session_id) == 0) {
    return absl::FailedPreconditionError(
        "unknown or ended session: open one with Control.OpenSession and keep its stream open");
  }
  return absl::OkStatus();
}

absl::StatusOr<GroupManager::Rendezvous> GroupManager::StoreFor(
    const store::InitMethod& method, store::FileCreation creation) {
  const std::string name = store::RendezvousStoreName(method);
  {
    absl::MutexLock lock(&mu_);
    auto it = stores_.find(name);
    if (it != stores_.end()) return Rendezvous{name, it->second.get()};
  }
  // Opened outside the lock: a file store replays its whole log (maybe over NFS), a host name
  // is resolved, and the heartbeat threads must not wait for that.
  absl::StatusOr<std::unique_ptr<store::Store>> store =
      store::OpenRendezvousStore(method, options_.rendezvous, creation);
  if (!store.ok()) return store.status();
  absl::MutexLock lock(&mu_);
  // Another join may have opened the same store meanwhile: keep the first.
  auto [it, inserted] = stores_.try_emplace(name, *std::move(store));
  if (inserted && !shut_down_) {
    store::Store* raw = it->second.get();
    heartbeats_.emplace_back([this, raw] { HeartbeatTo(raw); });
  }
  return Rendezvous{name, it->second.get()};
}

absl::StatusOr<GroupTracker*> GroupManager::TrackerFor(const std::string& group,
                                                       const Rendezvous& rdzv) {
  if (shut_down_) return absl::UnavailableError("the tpd daemon is shutting down");
  auto known = tracker_store_.find(group);
  if (known != tracker_store_.end() && known->second != rdzv.store_name) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", group, " is already in use on this daemon through ", known->second,
                     "; name groups in ", rdzv.store_name, " differently"));
  }
  std::unique_ptr<GroupTracker>& tracker = trackers_[group];
  if (tracker == nullptr) {
    tracker = std::make_unique<GroupTracker>(group, rdzv.store_name, rdzv.store, &node_,
                                             options_.tracker, [this] { Reincarnate(); });
    tracker_store_[group] = rdzv.store_name;
  }
  return tracker.get();
}

absl::StatusOr<GroupTracker*> GroupManager::Tracker(const std::string& group,
                                                    const std::string& init_method) {
  const std::string name = GroupName(group);
  {
    absl::MutexLock lock(&mu_);
    auto it = trackers_.find(name);
    if (it != trackers_.end()) return it->second.get();
  }
  if (init_method.empty()) {
    return absl::NotFoundError(absl::StrCat("this daemon does not know group ", name,
                                            "; give its init_method to look it up"));
  }
  absl::StatusOr<store::InitMethod> method =
      store::ParseInitMethod(init_method, std::nullopt, std::nullopt, {});
  if (!method.ok()) return method.status();
  absl::StatusOr<Rendezvous> rdzv = StoreFor(*method, store::FileCreation::kMustExist);
  if (!rdzv.ok()) return rdzv.status();
  absl::MutexLock lock(&mu_);
  return TrackerFor(name, *rdzv);
}

void GroupManager::Join(const v1::JoinRequest& request, GroupTracker::JoinDone done) {
  if (absl::Status status = CheckSession(request.session_id()); !status.ok()) {
    done(status);
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
  if (request.name().empty()) {
    done(absl::InvalidArgumentError("Join needs a worker name"));
    return;
  }
  absl::StatusOr<Rendezvous> rdzv = StoreFor(*method, store::FileCreation::kCreate);
  if (!rdzv.ok()) {
    done(rdzv.status());
    return;
  }
  absl::StatusOr<GroupTracker*> tracker;
  {
    // The session is checked again under the same lock that creates the tracker: EndSession
    // erases the session and lists the trackers under it, so either this join sees the
    // session gone, or the tracker is on EndSession's list and undoes the join.
    absl::MutexLock lock(&mu_);
    if (sessions_.count(request.session_id()) == 0) {
      tracker = absl::CancelledError("the client's session ended during the join");
    } else {
      tracker = TrackerFor(GroupName(request.group()), *rdzv);
    }
  }
  if (!tracker.ok()) {
    done(tracker.status());
    return;
  }
  JoinSpec spec;
  spec.name = request.name();
  spec.rank = method->rank;
  spec.world_size = method->world_size;
  spec.options = request.options();
  const absl::Duration timeout = request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms())
                                                          : options_.default_join_timeout;
  (*tracker)->Join(std::move(spec), request.session_id(), absl::Now() + timeout, std::move(done));
}

void GroupManager::CancelJoin(const v1::JoinRequest& request) {
  GroupTracker* tracker = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = trackers_.find(GroupName(request.group()));
    if (it != trackers_.end()) tracker = it->second.get();
  }
  if (tracker != nullptr) tracker->CancelJoin(request.session_id(), request.name());
}

void GroupManager::Leave(const v1::LeaveRequest& request,
                         absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) {
  if (absl::Status status = CheckSession(request.session_id()); !status.ok()) {
    done(status);
    return;
  }
  absl::StatusOr<GroupTracker*> tracker = Tracker(request.group(), "");
  if (!tracker.ok()) {
    done(tracker.status());
    return;
  }
  (*tracker)->Leave(request.session_id(), request.name(), std::move(done));
}

void GroupManager::Barrier(const v1::BarrierRequest& request, GroupTracker::Done done) {
  if (absl::Status status = CheckSession(request.session_id()); !status.ok()) {
    done(status);
    return;
  }
  absl::StatusOr<GroupTracker*> tracker = Tracker(request.group(), "");
  if (!tracker.ok()) {
    done(tracker.status());
    return;
  }
  const absl::Duration timeout = request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms())
                                                          : options_.default_join_timeout;
  (*tracker)->Barrier(request.session_id(), request.name(), absl::Now() + timeout, std::move(done));
}

absl::StatusOr<v1::GroupView> GroupManager::GetGroup(const std::string& group,
                                                     const std::string& init_method) {
  absl::StatusOr<GroupTracker*> tracker = Tracker(group, init_method);
  if (!tracker.ok()) return tracker.status();
  return (*tracker)->View();
}

std::vector<v1::GroupView> GroupManager::ListGroups() {
  std::vector<GroupTracker*> trackers;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, tracker] : trackers_) trackers.push_back(tracker.get());
  }
  std::vector<v1::GroupView> views;
  for (GroupTracker* tracker : trackers) views.push_back(tracker->View());
  return views;
}

}  // namespace tpd::group

namespace tpd::group {

std::map<std::string, absl::Time> GroupManager::PeerHeartbeats() {
  std::vector<GroupTracker*> trackers;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, tracker] : trackers_) trackers.push_back(tracker.get());
  }
  std::map<std::string, absl::Time> peers;
  for (GroupTracker* tracker : trackers) {
    for (const auto& [node, seen] : tracker->PeerHeartbeats()) {
      peers[node] = std::max(peers[node], seen);
    }
  }
  return peers;
}

}  // namespace tpd::group
