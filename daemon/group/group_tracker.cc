#include "daemon/group/group_tracker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "base/status.h"
#include "base/summarize.h"
#include "daemon/group/heartbeat.h"
#include "daemon/logging.h"

namespace tpd::group {
namespace {

// A group's version wait is re-armed this often even without news, which bounds how late a
// resynchronization after a gap (versions deleted while this daemon was stopped) can come.
constexpr absl::Duration kVersionWaitSlice = absl::Seconds(2);

// The same store error is logged at most once per this interval per group.
constexpr absl::Duration kErrorLogInterval = absl::Seconds(30);

}  // namespace

GroupTracker::GroupTracker(std::string group, std::string store_name, store::Store* root,
                           NodeLiveness* liveness, GroupWorker* worker, Node* node,
                           TrackerOptions options,
                           std::function<void(uint64_t incarnation)> on_evicted)
    : group_(group),
      store_name_(std::move(store_name)),
      liveness_(liveness),
      root_(root),
      group_store_(absl::StrCat("tpd/group/", group), root),
      log_(&group_store_, group),
      node_(node),
      options_(options),
      on_evicted_(std::move(on_evicted)),
      worker_(worker) {
  latest_.mutable_view()->set_group(group_);
  latest_.mutable_view()->set_phase(kEmpty);
  worker_->Add(this);
}

GroupTracker::~GroupTracker() { Stop(); }

void GroupTracker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stop_ = true;
  }
  worker_->Remove(this);
  bool armed;
  store::WaitId version_wait;
  std::vector<store::WaitId> barrier_waits;
  {
    absl::MutexLock lock(&mu_);
    armed = wait_armed_;
    version_wait = wait_id_;
    barrier_waits.assign(barrier_waits_.begin(), barrier_waits_.end());
  }
  // Cancelling may run the callbacks on this thread, and they take mu_: not under it.
  if (armed) log_.CancelWait(version_wait);
  for (store::WaitId id : barrier_waits) group_store_.CancelWait(id);
  {
    // A remote store answers a cancel asynchronously; its callbacks still touch this object.
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](std::set<store::WaitId>* waits) { return waits->empty(); }, &barrier_waits_),
        absl::Seconds(10));
  }
  std::vector<PendingJoin> joins;
  std::deque<Op> ops;
  std::deque<BarrierOp> barriers;
  std::vector<ViewDone> view_waiters;
  {
    // The version wait's callback touches this object: wait for it to have run.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* armed) { return !*armed; }, &wait_armed_));
    joins = std::move(pending_joins_);
    ops = std::move(ops_);
    barriers = std::move(barriers_);
    view_waiters = std::move(view_waiters_);
    view_waiters_.clear();
    stopped_ = true;
  }
  SettleVersionWaiters();  // stop_ is set: every waiter is answered
  const absl::Status stopping = absl::UnavailableError("the tpd daemon is stopping");
  for (PendingJoin& join : joins) join.done(stopping);
  for (BarrierOp& barrier : barriers) barrier.done(stopping);
  for (ViewDone& done : view_waiters) done(stopping);
  for (Op& op : ops) {
    if (op.join_done) op.join_done(stopping);
    if (op.remove_done) op.remove_done(stopping);
  }
}

void GroupTracker::Enqueue(Op op) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      if (op.join) ++joins_in_flight_[op.session_id];
      ops_.push_back(std::move(op));
      worker_->Wake(this);
      return;
    }
  }
  // No worker will take it any more: answer at once.
  const absl::Status stopping = absl::UnavailableError("the tpd daemon is stopping");
  if (op.join_done) op.join_done(stopping);
  if (op.remove_done) op.remove_done(stopping);
}

void GroupTracker::Join(JoinSpec spec, std::string session_id, absl::Time deadline, JoinDone done) {
  spec.node = node_->name;
  spec.incarnation = node_->incarnation.load();
  spec.device_count = node_->device_count;
  spec.agent_address = node_->agent_address;
  spec.node_transports = node_->transports;
  spec.node_channels = node_->channels;
  spec.since_unix_ms = absl::ToUnixMillis(absl::Now());
  Op op;
  op.join = std::move(spec);
  op.session_id = std::move(session_id);
  op.deadline = deadline;
  op.join_done = std::move(done);
  Enqueue(std::move(op));
}

void GroupTracker::CancelJoin(const std::string& session_id, const std::string& name) {
  JoinDone done;
  bool withdraw = false;
  {
    absl::MutexLock lock(&mu_);
    auto queued = std::find_if(ops_.begin(), ops_.end(), [&](const Op& op) {
      return op.join && op.join->name == name && op.session_id == session_id;
    });
    auto pending =
        std::find_if(pending_joins_.begin(), pending_joins_.end(), [&](const PendingJoin& join) {
          return join.name == name && join.session_id == session_id;
        });
    if (queued != ops_.end()) {
      // Not recorded yet: it simply never happens.
      done = std::move(queued->join_done);
      ops_.erase(queued);
      if (auto it = joins_in_flight_.find(session_id);
          it != joins_in_flight_.end() && --it->second == 0) {
        joins_in_flight_.erase(it);
        ended_sessions_.erase(session_id);
      }
    } else if (pending != pending_joins_.end()) {
      // Recorded, waiting for its group: the member leaves again.
      done = std::move(pending->done);
      pending_joins_.erase(pending);
      local_.erase(name);
      withdraw = true;
    } else if (joins_in_flight_.count(session_id) > 0 && local_.count(name) == 0) {
      // Being recorded right now: undone when it lands (see ApplyOps).
      cancelled_joins_.insert({session_id, name});
    }
  }
  if (withdraw) {
    Op op;
    op.remove = [name, node = node_->name](const v1::Member& m) {
      return m.name() == name && m.node() == node;
    };
    op.change = "LEFT";
    op.why = "its client cancelled the join";
    op.remove_done = [](absl::StatusOr<int64_t>) {};
    Enqueue(std::move(op));
  }
  if (done) done(absl::CancelledError("the join was cancelled by its client"));
}

void GroupTracker::Leave(const std::string& session_id, const std::string& name,
                         absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    auto it = local_.find(name);
    if (it == local_.end() || it->second.session_id != session_id) {
      refused = FindMember(latest_, name) == nullptr
                    ? absl::NotFoundError(absl::StrCat("no worker ", name, " in group ", group_))
                    : absl::FailedPreconditionError(absl::StrCat(
                          "worker ", name, " of group ", group_,
                          " was not joined through this session; only its own client may make "
                          "it leave"));
    }
  }
  if (!refused.ok()) {
    done(refused);
    return;
  }
  Op op;
  op.remove = [name, node = node_->name](const v1::Member& member) {
    return member.name() == name && member.node() == node;
  };
  op.change = "LEFT";
  op.why = "left the group";
  op.remove_done = std::move(done);
  Enqueue(std::move(op));
}

void GroupTracker::EndSession(const std::string& session_id) {
  std::set<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    // Only a join still on its way can land after this; remember the session for it alone.
    if (joins_in_flight_.count(session_id) > 0) ended_sessions_.insert(session_id);
    for (const auto& [name, member] : local_) {
      if (member.session_id == session_id) names.insert(name);
    }
  }
  if (names.empty()) return;
  Op op;
  op.remove = [names, node = node_->name](const v1::Member& member) {
    return member.node() == node && names.count(member.name()) > 0;
  };
  op.change = "LEFT";
  op.why = "its client's session ended (process exited or disconnected)";
  op.remove_done = [](absl::StatusOr<int64_t>) {};
  Enqueue(std::move(op));
}

void GroupTracker::Shutdown() {
  std::set<std::string> names;
  std::vector<PendingJoin> joins;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, member] : local_) names.insert(name);
    // Joins still waiting for their group are answered now, before their members leave.
    joins = std::move(pending_joins_);
    pending_joins_.clear();
  }
  for (PendingJoin& join : joins) join.done(absl::UnavailableError("the tpd daemon is stopping"));
  if (!names.empty()) {
    // Shared: if the store does not answer in time, the op may still finish after we stop
    // waiting, or be failed by the destructor.
    auto left = std::make_shared<absl::Notification>();
    Op op;
    op.remove = [names, node = node_->name](const v1::Member& member) {
      return member.node() == node && names.count(member.name()) > 0;
    };
    op.change = "LEFT";
    op.why = "its daemon is shutting down";
    op.remove_done = [left](absl::StatusOr<int64_t>) { left->Notify(); };
    Enqueue(std::move(op));
    left->WaitForNotificationWithTimeout(absl::Seconds(5));
  }
  Stop();
}

void GroupTracker::Barrier(const std::string& session_id, const std::string& name,
                           absl::Time deadline, BarrierDone done) {
  int64_t generation = 0;
  int64_t round = 0;
  int64_t expected = 0;
  bool counts_gone = false;
  bool member = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = local_.find(name);
    if (it != local_.end() && it->second.session_id == session_id) {
      member = true;
      const v1::GroupView& view = latest_.view();
      // Keys of a barrier carry a generation so that a group formed anew (or a dynamic
      // group after a change) never meets the rounds of an earlier one: a static group's
      // is the version that formed it; a dynamic group's is the current version, so
      // members meet when they see the same membership.
      generation = view.is_static() ? view.formed_version() : view.version();
      if (it->second.barrier_generation != generation) {
        it->second.barrier_generation = generation;
        it->second.barrier_round = 0;
      }
      round = ++it->second.barrier_round;
      expected = view.is_static() ? view.world_size() : view.members_size();
      counts_gone = view.is_static();
    }
  }
  if (!member) {
    done(absl::FailedPreconditionError(
        absl::StrCat("worker ", name, " is not a member of group ", group_,
                     " held by this session (never joined, left, or evicted)")));
    return;
  }
  // The store calls run on the worker: a slow store must not hold a gRPC thread.
  BarrierOp op{absl::StrCat("barrier/", generation, "/", round),
               name,
               generation,
               round,
               expected,
               counts_gone,
               deadline,
               std::move(done)};
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      barriers_.push_back(std::move(op));
      worker_->Wake(this);
      return;
    }
  }
  op.done(absl::UnavailableError("the tpd daemon is stopping"));
}

void GroupTracker::EnterBarrier(BarrierOp op) {
  const std::string& key = op.key;
  const int64_t round = op.round;
  const int64_t expected = op.expected;
  BarrierDone done = std::move(op.done);
  // Who arrived, by name, for CompleteWithoutTheGone: set before counting, so whoever sees the
  // count also finds the names of those it counts.
  if (op.counts_gone) {
    if (absl::Status status = group_store_.Set(absl::StrCat(key, "/in/", op.name), "");
        !status.ok()) {
      done(status);
      return;
    }
    // Each member clears its own mark of the round before (best effort, as below).
    if (round > 1) {
      (void)group_store_.DeleteKey(
          absl::StrCat("barrier/", op.generation, "/", round - 1, "/in/", op.name));
    }
  }
  absl::StatusOr<int64_t> arrived = group_store_.Add(key, 1);
  if (!arrived.ok()) {
    done(arrived.status());
    return;
  }
  if (*arrived >= expected) {
    if (absl::Status status = group_store_.Set(absl::StrCat(key, "/done"), ""); !status.ok()) {
      done(status);
      return;
    }
    // The previous round is over for everyone: its keys can go (best effort: leftovers
    // only cost store space until the group's keys are next reused).
    if (round > 1) {
      (void)group_store_.DeleteKey(absl::StrCat("barrier/", op.generation, "/", round - 1));
      (void)group_store_.DeleteKey(
          absl::StrCat("barrier/", op.generation, "/", round - 1, "/done"));
    }
  }
  // The wait may end before WaitAsync returns; both sides meet under mu_ through `cell`.
  struct Cell {
    std::optional<store::WaitId> id;
    bool finished = false;
    BarrierDone done;
  };
  auto cell = std::make_shared<Cell>();
  cell->done = std::move(done);
  if (op.counts_gone) {
    absl::MutexLock lock(&mu_);
    OpenBarrier& open = open_barriers_[key];
    open.generation = op.generation;
    ++open.waits;
  }
  absl::StatusOr<store::WaitId> id =
      group_store_.WaitAsync({absl::StrCat(key, "/done")}, op.deadline,
                             [this, key, round, expected, counts_gone = op.counts_gone,
                              cell](absl::StatusOr<std::vector<std::string>> result) {
                               bool stopping;
                               {
                                 absl::MutexLock lock(&mu_);
                                 cell->finished = true;
                                 if (cell->id.has_value()) barrier_waits_.erase(*cell->id);
                                 if (counts_gone) CloseOpenBarrier(key);
                                 stopping = stop_;
                               }
                               if (stopping && !result.ok()) {
                                 cell->done(absl::UnavailableError("the tpd daemon is stopping"));
                                 return;
                               }
                               if (result.status().code() == absl::StatusCode::kDeadlineExceeded) {
                                 cell->done(absl::DeadlineExceededError(absl::StrCat(
                                     "group ", group_, ": barrier round ", round,
                                     " timed out waiting for all ", expected, " members")));
                                 return;
                               }
                               if (!result.ok()) {
                                 cell->done(result.status());
                                 return;
                               }
                               // The done key holds the names of the members that were gone, one
                               // per line.
                               std::vector<std::string> gone;
                               if (!result->empty() && !result->front().empty()) {
                                 gone = absl::StrSplit(result->front(), '\n');
                               }
                               cell->done(std::move(gone));
                             });
  if (!id.ok()) {
    {
      absl::MutexLock lock(&mu_);
      if (op.counts_gone) CloseOpenBarrier(key);
    }
    cell->done(id.status());  // the store refused the wait and will not call back
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!cell->finished) {
      cell->id = *id;
      barrier_waits_.insert(*id);
    }
  }
  if (op.counts_gone && *arrived < expected) CompleteWithoutTheGone(key, op.generation);
}

void GroupTracker::CloseOpenBarrier(const std::string& key) {
  auto it = open_barriers_.find(key);
  if (it != open_barriers_.end() && --it->second.waits <= 0) open_barriers_.erase(it);
}

void GroupTracker::CompleteWithoutTheGone(const std::string& key, int64_t generation) {
  std::vector<std::string> keys;
  std::vector<std::string> gone;
  {
    absl::MutexLock lock(&mu_);
    const v1::GroupView& view = latest_.view();
    // Only the group formed at `generation`, and only once it lost someone: until then the
    // count decides.
    if (!view.is_static() || view.formed_version() != generation ||
        formed_generation_ != generation || view.members_size() >= view.world_size()) {
      return;
    }
    std::set<std::string> live;
    for (const v1::Member& member : view.members()) {
      live.insert(member.name());
      keys.push_back(absl::StrCat(key, "/in/", member.name()));
    }
    for (const std::string& name : formed_names_) {
      if (live.count(name) == 0) gone.push_back(name);
    }
  }
  absl::StatusOr<bool> all_in = group_store_.Check(keys);
  if (!all_in.ok() || !*all_in) return;  // the last live member to arrive completes it
  DaemonLog().info("[group {}] {}: every live member arrived; {} gone, counted as arrived: {}",
                   group_, key, gone.size(), JoinSummarized(gone, ", "));
  (void)group_store_.Set(absl::StrCat(key, "/done"), absl::StrJoin(gone, "\n"));
}

v1::GroupView GroupTracker::View() {
  absl::MutexLock lock(&mu_);
  return ViewLocked();
}

v1::GroupView GroupTracker::ViewLocked() {
  v1::GroupView view = latest_.view();
  view.set_store(store_name_);
  if (!damaged_.ok()) {
    view.set_phase(kFailed);
    view.set_reason(std::string(damaged_.message()));
  }
  return view;
}

std::shared_ptr<const v1::GroupView> GroupTracker::SharedViewLocked() {
  // A damaged group's view is rebuilt each time (it is rare, and says why it is damaged).
  if (!damaged_.ok()) return std::make_shared<const v1::GroupView>(ViewLocked());
  // Versions are never reused, so the version names the view.
  if (view_cache_ == nullptr || view_cache_->version() != latest_.view().version()) {
    view_cache_ = std::make_shared<const v1::GroupView>(ViewLocked());
  }
  return view_cache_;
}

void GroupTracker::GetView(ViewDone done) {
  std::shared_ptr<const v1::GroupView> shared;
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    if (!loaded_) {
      // Answered by the worker once its first read of the store ends (bounded by the
      // store's call deadline): no gRPC thread waits on a slow store.
      view_waiters_.push_back(std::move(done));
      return;
    }
    if (load_error_.ok()) {
      shared = SharedViewLocked();
    } else {
      error = load_error_;
    }
  }
  if (shared == nullptr) {
    done(error);
    return;
  }
  done(v1::GroupView(*shared));
}

bool GroupTracker::Idle() {
  absl::MutexLock lock(&mu_);
  return local_.empty() && watchers_.empty() && pending_joins_.empty() && ops_.empty() &&
         barriers_.empty() && barrier_waits_.empty() && joins_in_flight_.empty() &&
         view_waiters_.empty();
}

std::optional<std::string> GroupTracker::SessionOf(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = local_.find(name);
  if (it == local_.end()) return std::nullopt;
  return it->second.session_id;
}

std::optional<v1::Member> GroupTracker::MemberNamed(const std::string& name, int64_t* version) {
  absl::MutexLock lock(&mu_);
  if (version != nullptr) *version = latest_.view().version();
  auto it = member_index_.find(name);
  if (it == member_index_.end()) return std::nullopt;
  return latest_.view().members(it->second);
}

void GroupTracker::WhenVersion(int64_t version, absl::Time deadline, VersionDone done) {
  bool reached;
  {
    absl::MutexLock lock(&mu_);
    reached = latest_.view().version() >= version;
    if (!reached && !stop_ && version_waiters_.size() < kMaxVersionWaiters) {
      version_waiters_.emplace(version, VersionWaiter{deadline, std::move(done)});
      return;
    }
  }
  done(reached);
}

void GroupTracker::SettleVersionWaiters() {
  std::vector<std::pair<VersionDone, bool>> settled;
  {
    absl::MutexLock lock(&mu_);
    const int64_t have = latest_.view().version();
    const absl::Time now = options_.clock->Now();
    for (auto it = version_waiters_.begin(); it != version_waiters_.end();) {
      const bool reached = it->first <= have;
      if (reached || it->second.deadline <= now || stop_) {
        settled.emplace_back(std::move(it->second.done), reached);
        it = version_waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [done, reached] : settled) done(reached);
}

std::optional<v1::DeviceMap> GroupTracker::DeviceMapOf(const std::string& from,
                                                       const std::string& to, bool reverse) {
  absl::MutexLock lock(&mu_);
  auto it = negotiated_index_.find(from);
  if (it == negotiated_index_.end()) return std::nullopt;
  const v1::NegotiatedMember& member = latest_.view().negotiated(it->second);
  const auto& maps = reverse ? member.reverse_device_maps() : member.device_maps();
  auto map = maps.find(to);
  if (map == maps.end()) return std::nullopt;
  return map->second;
}

std::unique_ptr<store::Store> GroupTracker::KeysFor(const store::StoreUser& user) {
  // The prefix over the user's view of the store, which it keeps.
  struct Keys : store::PrefixStore {
    Keys(std::string prefix, std::unique_ptr<store::Store> of)
        : PrefixStore(std::move(prefix), of.get()), base(std::move(of)) {}
    const std::unique_ptr<store::Store> base;
  };
  std::unique_ptr<store::Store> theirs = root_->OnBehalfOf(user);
  if (theirs == nullptr) return std::make_unique<store::PrefixStore>("", &group_store_);
  return std::make_unique<Keys>(absl::StrCat("tpd/group/", group_), std::move(theirs));
}

bool GroupTracker::Holds(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  if (joins_in_flight_.count(session_id) > 0) return true;
  for (const auto& [name, member] : local_) {
    if (member.session_id == session_id) return true;
  }
  return false;
}

std::map<std::string, absl::Time> GroupTracker::PeerHeartbeats() {
  absl::MutexLock lock(&mu_);
  std::map<std::string, absl::Time> out;
  for (const auto& [node, seen] : heartbeats_) {
    if (!seen.first.empty()) out[node] = seen.second;  // empty: its key was never seen
  }
  return out;
}

void GroupTracker::AddWatcher(std::shared_ptr<GroupWatcher> watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.insert(watcher);
  // A snapshot taken before the first read would show an empty group and then jump: until
  // then the worker's first read sends it (see WorkerLoop), not this caller.
  if (!loaded_) return;
  v1::GroupEvent event;
  event.set_kind("SNAPSHOT");
  *event.mutable_group() = ViewLocked();
  // Under the lock, like every event, so the snapshot precedes any later version.
  watcher->OnEvent(event);
}

void GroupTracker::RemoveWatcher(const std::shared_ptr<GroupWatcher>& watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

void GroupTracker::ArmVersionWait() {
  if (wait_armed_ || stop_ || options_.clock->Now() < rearm_after_) return;
  const int64_t next = latest_.view().version() + 1;
  wait_armed_ = true;
  mu_.Unlock();
  absl::StatusOr<store::WaitId> id = log_.WaitForVersion(
      next, absl::Now() + kVersionWaitSlice, [this](absl::StatusOr<v1::GroupRecord> record) {
        absl::MutexLock lock(&mu_);
        if (!record.ok() && record.status().code() != absl::StatusCode::kDeadlineExceeded) {
          // The store refused (down, shutting down, full): retry at the next tick, not at once.
          rearm_after_ = options_.clock->Now() + options_.heartbeat_interval;
        }
        if (record.ok() || record.status().code() != absl::StatusCode::kDeadlineExceeded) {
          arrived_.push_back(std::move(record));
        }
        wait_armed_ = false;
        // Under mu_: Stop() waits for wait_armed_ to clear before the tracker may go.
        worker_->Wake(this);
      });
  mu_.Lock();
  if (!id.ok()) {
    wait_armed_ = false;
    rearm_after_ = options_.clock->Now() + options_.heartbeat_interval;
  } else if (wait_armed_) {
    wait_id_ = *id;
    if (stop_) {
      // Stop() looked while the id was not known yet, so it cancelled an older one: cancel
      // this one, or Stop() would wait out the slice for its callback.
      mu_.Unlock();
      log_.CancelWait(*id);
      mu_.Lock();
    }
  }
}

void GroupTracker::Load() {
  // Learn the group's current state first, so joins apply to the newest version.
  absl::Status load = absl::OkStatus();
  if (absl::StatusOr<v1::GroupRecord> latest = log_.Latest(); latest.ok()) {
    Observe(*std::move(latest), /*snapshot=*/true);
  } else {
    NoteStoreError(latest.status());
    load = latest.status();
  }
  std::vector<ViewDone> view_waiters;
  absl::StatusOr<v1::GroupView> view;
  {
    absl::MutexLock lock(&mu_);
    loaded_ = true;
    if (!load.ok() && load.code() != absl::StatusCode::kDataLoss) {
      load_error_ = absl::UnavailableError(absl::StrCat("group ", group_,
                                                        ": cannot read its rendezvous store ",
                                                        store_name_, ": ", load.message()));
    }
    view = load_error_.ok() ? absl::StatusOr<v1::GroupView>(ViewLocked()) : load_error_;
    view_waiters = std::move(view_waiters_);
    view_waiters_.clear();
    if (!snapshot_sent_) {
      // Watchers added before the first read get their snapshot now (the first read sent
      // none: it failed).
      v1::GroupEvent event;
      event.set_kind("SNAPSHOT");
      *event.mutable_group() = ViewLocked();
      for (const std::shared_ptr<GroupWatcher>& watcher : watchers_) watcher->OnEvent(event);
    }
  }
  for (ViewDone& done : view_waiters) done(view);
}

absl::Time GroupTracker::Step() {
  ++steps_;
  bool loaded;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::InfiniteFuture();
    loaded = loaded_;
  }
  if (!loaded) Load();
  std::vector<Op> ops;
  std::vector<absl::StatusOr<v1::GroupRecord>> arrived;
  std::vector<BarrierOp> barriers;
  std::map<std::string, OpenBarrier> recheck;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::InfiniteFuture();
    ArmVersionWait();
    if (recheck_barriers_) {
      recheck = open_barriers_;
      recheck_barriers_ = false;
    }
    ops.assign(std::make_move_iterator(ops_.begin()), std::make_move_iterator(ops_.end()));
    ops_.clear();
    arrived.assign(std::make_move_iterator(arrived_.begin()),
                   std::make_move_iterator(arrived_.end()));
    arrived_.clear();
    barriers.assign(std::make_move_iterator(barriers_.begin()),
                    std::make_move_iterator(barriers_.end()));
    barriers_.clear();
  }
  for (BarrierOp& barrier : barriers) EnterBarrier(std::move(barrier));
  for (const auto& [key, open] : recheck) CompleteWithoutTheGone(key, open.generation);
  for (absl::StatusOr<v1::GroupRecord>& record : arrived) {
    if (record.ok()) {
      Observe(*std::move(record), /*snapshot=*/false);
    } else if (record.status().code() != absl::StatusCode::kCancelled) {
      NoteStoreError(record.status());
    }
  }
  if (!ops.empty()) ApplyOps(std::move(ops));
  if (options_.clock->Now() >= next_tick_) {
    bool waiting;
    {
      absl::MutexLock lock(&mu_);
      waiting = wait_armed_ && load_error_.ok() && damaged_.ok();
    }
    // The version wait brings every new version; reading the newest as well (four reads) is
    // a safety net, needed each tick only while no wait is armed (the store refused one) or
    // the group's read failed (a successful CatchUp is what clears that).
    if (!waiting || options_.clock->Now() >= next_catch_up_) {
      CatchUp();
      next_catch_up_ = options_.clock->Now() + kVersionWaitSlice;
    }
    CheckDeadlines();
    CheckHeartbeats();
    next_tick_ = options_.clock->Now() + options_.heartbeat_interval;
  }
  SettleVersionWaiters();
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::InfiniteFuture();
  // Work queued by this step itself (removals after a failed formation, undone joins) or
  // arrived meanwhile: at once. Else the next tick, or the time to re-arm a refused wait.
  if (!ops_.empty() || !arrived_.empty() || !barriers_.empty() || recheck_barriers_) {
    return absl::InfinitePast();
  }
  return wait_armed_ ? next_tick_ : std::min(next_tick_, rearm_after_);
}

void GroupTracker::CatchUp() {
  int64_t have;
  {
    absl::MutexLock lock(&mu_);
    have = latest_.view().version();
  }
  absl::StatusOr<v1::GroupRecord> latest = log_.Latest();
  if (!latest.ok()) {
    NoteStoreError(latest.status());
    return;
  }
  {
    // The store answers, and its newest record is valid (again: a bad one was removed).
    absl::MutexLock lock(&mu_);
    damaged_ = absl::OkStatus();
    load_error_ = absl::OkStatus();
  }
  if (latest->view().version() <= have) return;
  // Read the versions in between one by one, so watchers miss none that still exist.
  for (int64_t version = have + 1; version < latest->view().version(); ++version) {
    absl::StatusOr<std::optional<v1::GroupRecord>> record = log_.Read(version);
    if (!record.ok() || !record->has_value()) {
      // Deleted, or not a valid record: skip the gap and resynchronize from the newest.
      Observe(*std::move(latest), /*snapshot=*/true);
      return;
    }
    Observe(**std::move(record), /*snapshot=*/false);
  }
  Observe(*std::move(latest), /*snapshot=*/false);
}

void GroupTracker::NoteStoreError(const absl::Status& status) {
  const absl::Time now = options_.clock->Now();
  absl::MutexLock lock(&mu_);
  if (status.code() == absl::StatusCode::kDataLoss) damaged_ = status;
  // A store that stays down would otherwise log twice a second for as long as it is down.
  if (status.message() == last_error_ && now - last_error_logged_ < kErrorLogInterval) {
    ++errors_suppressed_;
    return;
  }
  DaemonLog().warn("[group {}] [store {}] following versions: {}: {}{}", group_, store_name_,
                   absl::StatusCodeToString(status.code()), std::string(status.message()),
                   errors_suppressed_ > 0
                       ? absl::StrCat(" (", errors_suppressed_, " repeats not logged)")
                       : std::string());
  last_error_ = std::string(status.message());
  last_error_logged_ = now;
  errors_suppressed_ = 0;
}

void GroupTracker::ApplyOps(std::vector<Op> ops) {
  absl::Status damaged;
  {
    absl::MutexLock lock(&mu_);
    damaged = damaged_;
  }
  if (!damaged.ok()) {
    // No version can be written on top of a record no daemon can read.
    SettledJoins(ops);
    for (Op& op : ops) {
      if (op.join_done) op.join_done(damaged);
      if (op.remove_done) op.remove_done(damaged);
    }
    return;
  }
  for (int attempt = 0;; ++attempt) {
    v1::GroupRecord base;
    {
      absl::MutexLock lock(&mu_);
      base = latest_;
    }
    v1::GroupRecord next = base;
    std::vector<absl::Status> results(ops.size());
    std::vector<int64_t> ranks(ops.size(), -1);
    std::vector<std::pair<std::string, std::string>> changes;
    // Members an earlier life of this node left behind go first, so their names and ranks
    // are free for the joins of this batch (a job whose members all ran on one node).
    std::set<std::string> stale;
    std::optional<int64_t> own_owner;
    {
      absl::MutexLock lock(&mu_);
      stale = StaleOwnMembers(base);
      own_owner = LocalOwnerUid();
    }
    // Who owns this group on this node is what this daemon's own sessions say, never what
    // the record says (docs/security.md, "Who may join a group"): a record written elsewhere
    // (a forged one, or one from a store another user serves) can neither hand this node to
    // another uid nor keep the owner's uid out. AddMember then admits by this entry.
    if (own_owner) {
      (*next.mutable_node_owner_uids())[node_->name] = *own_owner;
    } else {
      next.mutable_node_owner_uids()->erase(node_->name);
    }
    // One incarnation for the whole attempt: its members must all match the key announced.
    const uint64_t incarnation = node_->incarnation.load();
    bool joining = false;  // some join of this batch adds a member
    if (!stale.empty()) {
      RemoveMembers(
          &next,
          [&](const v1::Member& m) {
            return m.node() == node_->name && m.incarnation() != incarnation &&
                   stale.count(m.name()) > 0;
          },
          "EVICTED", absl::StrCat("node ", node_->name, " restarted"));
      changes.emplace_back(next.change(), next.change_detail());
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      Op& op = ops[i];
      if (op.join) {
        // The incarnation in force when the member is recorded, not when it was asked for.
        op.join->incarnation = incarnation;
        bool failed = false;
        absl::StatusOr<int64_t> rank = AddMember(&next, *op.join, &failed);
        results[i] = rank.status();
        if (rank.ok()) {
          joining = true;
          ranks[i] = *rank;
          changes.emplace_back(next.change(), next.change_detail());
        } else if (failed) {
          // Refused, and the group failed for it: that is recorded, so every rank learns.
          changes.emplace_back(next.change(), next.change_detail());
        }
      } else if (RemoveMembers(&next, op.remove, op.change, op.why) > 0) {
        changes.emplace_back(next.change(), next.change_detail());
      }
    }
    if (changes.empty()) {
      // Nothing to record (every op failed, or removals found nobody): answer now.
      SettledJoins(ops);
      for (size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].join) ops[i].join_done(results[i]);
        if (ops[i].remove_done) ops[i].remove_done(base.view().version());
      }
      return;
    }
    // One version for the whole batch, so the log has no gaps.
    next.mutable_view()->set_version(base.view().version() + 1);
    if (next.view().phase() == kFormed && base.view().phase() != kFormed) {
      next.mutable_view()->set_formed_version(next.view().version());
    }
    std::vector<std::string> details;
    std::string change = changes.back().first;
    for (const auto& [kind, detail] : changes) {
      details.push_back(detail);
      if (kind == "FAILED" || kind == "BROKEN" || kind == "FORMED") change = kind;
    }
    next.set_change(change);
    next.set_change_detail(JoinSummarized(details, "; "));
    // Peers judge this node's members by the incarnation its liveness key names.
    const absl::Status announced = joining ? liveness_->Announce(incarnation) : absl::OkStatus();
    if (absl::IsAborted(announced) && attempt < 100) continue;  // a new incarnation: redo
    absl::StatusOr<bool> appended =
        announced.ok() ? log_.TryAppend(next) : absl::StatusOr<bool>(announced);
    if (!appended.ok() || (!*appended && attempt >= 100)) {
      const absl::Status error =
          !appended.ok()
              ? Prefixed(appended.status(), "group ", group_,
                         ": cannot update the rendezvous store ", store_name_, ": ")
              : absl::AbortedError(absl::StrCat("group ", group_, ": lost the race for a new ",
                                                "version 100 times; retry"));
      SettledJoins(ops);
      for (Op& op : ops) {
        if (op.join_done) op.join_done(error);
        if (op.remove_done) op.remove_done(error);
      }
      return;
    }
    if (!*appended) {
      CatchUp();  // another daemon took this version: observe it, then retry on top of it
      continue;
    }
    {
      // Register the new members before observing, so the observation settles their joins.
      absl::MutexLock lock(&mu_);
      for (auto it = local_.begin(); it != local_.end();) {
        it = FindMember(next, it->first) == nullptr ? local_.erase(it) : std::next(it);
      }
      for (size_t i = 0; i < ops.size(); ++i) {
        if (!ops[i].join) continue;
        if (!results[i].ok()) continue;
        const std::string& name = ops[i].join->name;
        if (ended_sessions_.count(ops[i].session_id) > 0 ||
            cancelled_joins_.erase({ops[i].session_id, name}) > 0) {
          // Its client went away while the join was being recorded: undo it.
          results[i] = absl::CancelledError("the client left during the join");
          Op undo;
          undo.remove = [name, node = node_->name](const v1::Member& m) {
            return m.name() == name && m.node() == node;
          };
          undo.change = "LEFT";
          undo.why = "its client's session ended (process exited or disconnected)";
          undo.remove_done = [](absl::StatusOr<int64_t>) {};
          ops_.push_back(std::move(undo));
          continue;
        }
        local_[name] =
            LocalMember{ops[i].session_id, ops[i].join->incarnation, ops[i].join->uid, absl::Now()};
        pending_joins_.push_back({name, ops[i].session_id, ops[i].deadline,
                                  std::move(ops[i].join_done), ops[i].join->omit_members});
      }
    }
    SettledJoins(ops);
    Observe(std::move(next), /*snapshot=*/false);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].join && !results[i].ok()) ops[i].join_done(results[i]);
      if (ops[i].remove_done) ops[i].remove_done(base.view().version() + 1);
    }
    return;
  }
}

std::optional<int64_t> GroupTracker::LocalOwnerUid() {
  // Joins are admitted one uid per node, so every local member has the same uid.
  for (const auto& [name, member] : local_) {
    if (member.uid >= 0) return member.uid;
  }
  return std::nullopt;
}

std::set<std::string> GroupTracker::StaleOwnMembers(const v1::GroupRecord& record) {
  const uint64_t incarnation = node_->incarnation.load();
  std::set<std::string> stale;
  for (const v1::Member& member : record.view().members()) {
    // Held by an earlier life of this daemon (killed and restarted under the same node name):
    // no session here holds it, and no heartbeat of ours will ever vouch for it again.
    if (member.node() == node_->name && member.incarnation() != incarnation &&
        local_.count(member.name()) == 0) {
      stale.insert(member.name());
    }
  }
  return stale;
}

void GroupTracker::SettledJoins(const std::vector<Op>& ops) {
  absl::MutexLock lock(&mu_);
  for (const Op& op : ops) {
    if (!op.join) continue;
    cancelled_joins_.erase({op.session_id, op.join->name});
    auto it = joins_in_flight_.find(op.session_id);
    if (it == joins_in_flight_.end() || --it->second > 0) continue;
    joins_in_flight_.erase(it);
    ended_sessions_.erase(op.session_id);
  }
}

void GroupTracker::Observe(v1::GroupRecord record, bool snapshot) {
  // A settled join: its error, or else the rank it is answered with from `answer_view`.
  struct Settled {
    JoinDone done;
    absl::Status error;
    int64_t rank = -1;
    std::string name;
    bool omit_members = false;
  };
  std::vector<Settled> settled;
  // One copy of the view for every join this version answers; each answer is built from it
  // after the lock is released (see below).
  v1::GroupView answer_view;
  bool answers = false;
  v1::GroupEvent event;
  std::vector<Op> removals;
  std::optional<uint64_t> evicted;  // the incarnation whose members were evicted
  {
    absl::MutexLock lock(&mu_);
    // An empty record only re-settles pending joins against the current version.
    const bool fresh = record.view().version() > latest_.view().version() &&
                       (snapshot || record.view().version() == latest_.view().version() + 1);
    if (fresh) {
      const int64_t members_before = latest_.view().members_size();
      latest_ = std::move(record);
      const v1::GroupView& now = latest_.view();
      if (now.is_static() && now.phase() == kFormed && now.formed_version() != formed_generation_) {
        formed_generation_ = now.formed_version();
        formed_names_.clear();
        for (const v1::Member& member : now.members()) formed_names_.push_back(member.name());
      }
      // A member gone from a formed group: barriers waiting for it may be complete now.
      if (now.members_size() < members_before && !open_barriers_.empty()) {
        recheck_barriers_ = true;
      }
      member_index_.clear();
      for (int i = 0; i < latest_.view().members_size(); ++i) {
        member_index_[latest_.view().members(i).name()] = i;
      }
      negotiated_index_.clear();
      for (int i = 0; i < latest_.view().negotiated_size(); ++i) {
        negotiated_index_[latest_.view().negotiated(i).name()] = i;
      }
      event.set_kind(snapshot ? "SNAPSHOT" : latest_.change());
      event.set_detail(latest_.change_detail());
      *event.mutable_group() = latest_.view();
      event.mutable_group()->set_store(store_name_);
      DaemonLog().info("[group {}] version {} {}: {}", group_, event.group().version(),
                       event.kind(), event.detail());
      for (const std::shared_ptr<GroupWatcher>& watcher : watchers_) watcher->OnEvent(event);
      snapshot_sent_ = true;
      // This daemon forgets its own members before recording their removal, so a local
      // member absent from a new version was removed by another daemon: evicted.
      for (auto it = local_.begin(); it != local_.end();) {
        if (FindMember(latest_, it->first) == nullptr) {
          DaemonLog().warn("[group {}] [worker {}] evicted at version {}: {}", group_, it->first,
                           latest_.view().version(), latest_.change_detail());
          // Only losing members of the current incarnation calls for a new one; members of an
          // older incarnation are gone because this node already took a new one. And only when
          // peers may have found this node silent here: a record that evicts a member this
          // node kept alive disagrees with what the node knows of itself (a forged record, a
          // store another user serves), so it costs this group its member and nothing more.
          // A new incarnation would make every peer evict this node's members of every group.
          if (it->second.incarnation == node_->incarnation.load()) {
            if (liveness_->MayHaveLookedSilentSince(it->second.recorded)) {
              evicted = it->second.incarnation;
            } else {
              DaemonLog().warn(
                  "[group {}] [worker {}] version {} removes a member this node "
                  "kept alive (its heartbeat in store {} was never late): the "
                  "record is not acted on beyond this group; node {} keeps "
                  "incarnation {}",
                  group_, it->first, latest_.view().version(), store_name_, node_->name,
                  it->second.incarnation);
            }
          }
          it = local_.erase(it);
        } else {
          ++it;
        }
      }
    }
    const v1::GroupView& view = latest_.view();
    for (auto it = pending_joins_.begin(); it != pending_joins_.end();) {
      const v1::Member* member = FindMember(latest_, it->name);
      if (member == nullptr) {
        settled.push_back(
            {std::move(it->done), absl::AbortedError(absl::StrCat(
                                      "worker ", it->name, " was removed from group ", group_,
                                      " before it formed: ", latest_.change_detail()))});
      } else if (!view.is_static() || view.phase() == kFormed) {
        settled.push_back(
            {std::move(it->done), absl::OkStatus(), member->rank(), it->name, it->omit_members});
        answers = true;
      } else if (view.phase() == kFailed || view.phase() == kBroken) {
        // Options no member may use are torch's ValueError (INVALID_ARGUMENT); a rank that
        // could not take part, or a member lost, aborts the others' joins.
        const absl::StatusCode code = view.phase() == kBroken ? absl::StatusCode::kAborted
                                      : latest_.failure_code() == 0
                                          ? absl::StatusCode::kInvalidArgument
                                          : static_cast<absl::StatusCode>(latest_.failure_code());
        settled.push_back({std::move(it->done), absl::Status(code, view.reason())});
        // A failed formation frees its ranks: our member leaves so the group can form anew.
        Op op;
        op.remove = [name = it->name, node = node_->name](const v1::Member& m) {
          return m.name() == name && m.node() == node;
        };
        op.change = "LEFT";
        op.why = "the group failed to form";
        op.remove_done = [](absl::StatusOr<int64_t>) {};
        removals.push_back(std::move(op));
      } else {
        ++it;
        continue;
      }
      it = pending_joins_.erase(it);
    }
    for (Op& op : removals) ops_.push_back(std::move(op));
    if (answers) {
      answer_view = view;
      answer_view.set_store(store_name_);
    }
  }
  // Each member is answered with its own negotiated entry only (see JoinResponse).
  std::map<std::string, v1::NegotiatedMember> own;
  if (answers) {
    for (v1::NegotiatedMember& member : *answer_view.mutable_negotiated()) {
      own[member.name()] = std::move(member);
    }
    answer_view.clear_negotiated();
  }
  // Each answer carries the member list (N members), and every call owns its response. They
  // are built one at a time and handed to gRPC at once, outside the lock: building all of a
  // formed group's local answers under mu_ first held O(N^2 / daemons) memory and blocked the
  // tracker for seconds at N = 4000 (bench/group_bench.cc).
  // Answers that asked for no member list share one copy without it (built once per version).
  v1::GroupView memberless_view;
  bool memberless_built = false;
  for (Settled& join : settled) {
    if (!join.error.ok()) {
      join.done(join.error);
      continue;
    }
    v1::JoinResponse response;
    if (join.omit_members) {
      if (!memberless_built) {
        memberless_view = answer_view;
        memberless_view.clear_members();
        memberless_built = true;
      }
      *response.mutable_group() = memberless_view;
    } else {
      *response.mutable_group() = answer_view;
    }
    response.set_rank(join.rank);
    if (auto it = own.find(join.name); it != own.end()) *response.mutable_negotiated() = it->second;
    join.done(std::move(response));
  }
  if (evicted && on_evicted_) on_evicted_(*evicted);
}

void GroupTracker::CheckDeadlines() {
  std::vector<std::pair<JoinDone, absl::Status>> expired;
  const absl::Time now = options_.clock->Now();
  absl::MutexLock lock(&mu_);
  for (auto it = pending_joins_.begin(); it != pending_joins_.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    const v1::GroupView& view = latest_.view();
    std::set<int64_t> present;
    for (const v1::Member& member : view.members()) present.insert(member.rank());
    // Lists the first few missing ranks only: world_size may be large, and the message must
    // stay far below gRPC's metadata limit.
    std::vector<int64_t> missing;
    int64_t present_in_range = 0;
    for (int64_t rank : present) present_in_range += rank >= 0 && rank < view.world_size();
    for (int64_t rank = 0; rank < view.world_size() && missing.size() < kMaxListedItems; ++rank) {
      if (present.count(rank) == 0) missing.push_back(rank);
    }
    const int64_t unlisted =
        view.world_size() - present_in_range - static_cast<int64_t>(missing.size());
    expired.emplace_back(
        std::move(it->done),
        absl::DeadlineExceededError(absl::StrCat(
            "group ", group_, ": timed out waiting for ranks [", absl::StrJoin(missing, ", "),
            unlisted > 0 ? absl::StrCat(", ... and ", unlisted, " more") : "", "] (",
            view.members_size(), " of ", view.world_size(), " joined)")));
    Op op;
    op.remove = [name = it->name, node = node_->name](const v1::Member& m) {
      return m.name() == name && m.node() == node;
    };
    op.change = "LEFT";
    op.why = "its join timed out";
    op.remove_done = [](absl::StatusOr<int64_t>) {};
    ops_.push_back(std::move(op));
    it = pending_joins_.erase(it);
  }
  mu_.Unlock();
  for (auto& [done, status] : expired) done(status);
  mu_.Lock();
}

void GroupTracker::CheckHeartbeats() {
  std::map<std::string, std::set<uint64_t>> nodes;  // other nodes -> incarnations in the group
  bool own_stale;
  {
    absl::MutexLock lock(&mu_);
    if (local_.empty() && watchers_.empty()) return;
    for (const v1::Member& member : latest_.view().members()) {
      if (member.node() != node_->name) nodes[member.node()].insert(member.incarnation());
    }
    own_stale = !StaleOwnMembers(latest_).empty();
  }
  if (own_stale) {
    // ApplyOps removes them before anything else; an op that removes nobody gets it there.
    Op op;
    op.remove = [](const v1::Member&) { return false; };
    op.remove_done = [](absl::StatusOr<int64_t>) {};
    Enqueue(std::move(op));
  }
  const absl::Time now = options_.clock->Now();
  if (liveness_->leased()) {
    CheckLeases(nodes);
    return;
  }
  // A daemon that was itself stalled (overloaded, paused, starved of CPU) cannot tell a
  // silent peer from its own deafness: heartbeats may have gone unrecorded or unread. After
  // a stall it restarts every peer's window instead of judging it.
  const bool stalled = last_heartbeat_check_ != absl::InfinitePast() &&
                       now - last_heartbeat_check_ > options_.heartbeat_timeout / 2;
  last_heartbeat_check_ = now;
  if (stalled) {
    DaemonLog().warn("[group {}] heartbeat checks were stalled; restarting every peer's window",
                     group_);
    absl::MutexLock lock(&mu_);
    for (auto& [node, seen] : heartbeats_) seen.second = now;
    return;
  }
  for (const auto& [node, incarnations] : nodes) {
    absl::StatusOr<std::optional<std::string>> read = liveness_->ReadPeer(node);
    if (!read.ok()) return;  // the store is unreachable: no judgement possible
    const std::string value = read->value_or("");
    absl::Time changed;
    {
      absl::MutexLock lock(&mu_);
      auto [it, inserted] = heartbeats_.try_emplace(node, value, now);
      if (!inserted && it->second.first != value) it->second = {value, now};
      changed = it->second.second;
    }
    const uint64_t alive = IncarnationOf(value);
    std::string why;
    std::function<bool(const v1::Member&)> remove;
    if (alive != 0 && incarnations.count(alive) != incarnations.size()) {
      if (!FreshReadAgrees(node, *read)) continue;
      why = absl::StrCat("node ", node, " restarted (incarnation ", alive, ")");
      remove = [node = node, alive](const v1::Member& m) {
        return m.node() == node && m.incarnation() != alive;
      };
    } else if (now - changed > options_.heartbeat_timeout) {
      if (!FreshReadAgrees(node, *read)) continue;
      why = absl::StrCat("node ", node, " sent no heartbeat for ",
                         absl::FormatDuration(absl::Trunc(now - changed, absl::Milliseconds(1))));
      remove = [node = node](const v1::Member& m) { return m.node() == node; };
      {
        absl::MutexLock lock(&mu_);
        heartbeats_[node].second = now;  // one eviction attempt per window
      }
      // Only a silent node is lost; a restarted one serves its new incarnation's calls.
      if (options_.on_node_lost) options_.on_node_lost(node, why);
    } else {
      continue;
    }
    Evict(node, why, std::move(remove));
  }
}

void GroupTracker::CheckLeases(const std::map<std::string, std::set<uint64_t>>& nodes) {
  // The key's presence is the store's verdict, not this daemon's judgement of time, so a
  // daemon that was itself stalled reads the same as any other.
  const absl::Time now = options_.clock->Now();
  for (const auto& [node, incarnations] : nodes) {
    absl::StatusOr<std::optional<std::string>> read = liveness_->ReadPeer(node);
    if (!read.ok()) return;  // the store is unreachable: no judgement possible
    const std::string value = read->value_or("");
    // Not a heartbeat (ReadPeer empties one too long), so no verdict either way.
    if (read->has_value() && value.empty()) continue;
    if (read->has_value()) {
      absl::MutexLock lock(&mu_);
      heartbeats_[node] = {value, now};  // Admin.Status: last seen alive
    }
    const uint64_t alive = IncarnationOf(value);
    if (!read->has_value()) {
      if (!FreshReadAgrees(node, *read)) continue;
      {
        // One eviction attempt per heartbeat window while the key stays gone.
        absl::MutexLock lock(&mu_);
        auto [it, inserted] = heartbeats_.try_emplace(node, "", now);
        if (!inserted && it->second.first.empty() &&
            now - it->second.second < options_.heartbeat_timeout) {
          continue;
        }
        it->second = {"", now};
      }
      const std::string why =
          absl::StrCat("node ", node, "'s liveness lease expired (its daemon stopped renewing it)");
      if (options_.on_node_lost) options_.on_node_lost(node, why);
      Evict(node, why, [node = node](const v1::Member& m) { return m.node() == node; });
    } else if (alive != 0 && incarnations.count(alive) != incarnations.size()) {
      if (!FreshReadAgrees(node, *read)) continue;
      Evict(node, absl::StrCat("node ", node, " restarted (incarnation ", alive, ")"),
            [node = node, alive](const v1::Member& m) {
              return m.node() == node && m.incarnation() != alive;
            });
    }
  }
}

bool GroupTracker::FreshReadAgrees(const std::string& node,
                                   const std::optional<std::string>& judged) {
  // The shared read may predate a version this daemon just observed (a node restarted and
  // announced its new incarnation before recording the member seen here): an eviction
  // stands only on a read made now.
  absl::StatusOr<std::optional<std::string>> now = liveness_->ReadPeer(node, /*fresh=*/true);
  return now.ok() && *now == judged;
}

void GroupTracker::Evict(const std::string& node, const std::string& why,
                         std::function<bool(const v1::Member&)> remove) {
  DaemonLog().warn("[group {}] evicting members of node {}: {}", group_, node, why);
  Op op;
  op.remove = std::move(remove);
  op.change = "EVICTED";
  op.why = why;
  op.remove_done = [](absl::StatusOr<int64_t>) {};
  Enqueue(std::move(op));
}

}  // namespace tpd::group
