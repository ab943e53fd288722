// The key-value store behind rendezvous and the tpd.v1.Store service, with the semantics of
// PyTorch's c10d Store. Backends live in store/<backend>/; PrefixStore gives each group its
// own namespace over any backend.
//
// Thread safety: every method of every backend may be called from any thread at once.

#ifndef TPD_STORE_STORE_H_
#define TPD_STORE_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tpd::store {

// Called exactly once when a wait ends: with the keys' values (in request order) once all
// are set, DEADLINE_EXCEEDED naming the missing keys at the deadline, CANCELLED after
// CancelWait, or UNAVAILABLE when the store shuts down. May run on the thread that set the
// last key, the store's timer thread, or the caller's own thread when the keys are already
// there; it must not call back into the store while holding locks the store could need.
using WaitCallback = absl::AnyInvocable<void(absl::StatusOr<std::vector<std::string>>)>;

// Identifies a pending wait for CancelWait. Never reused within one store.
using WaitId = uint64_t;

// What a store adds to a failed call's status when it knows nothing was applied (the server
// refused it, or it was never sent). A failed write without it may have been applied: its
// answer was lost (a timeout, a connection or a leader lost after sending).
inline constexpr absl::string_view kNotAppliedPayload = "tpd.store/not-applied";
inline absl::Status NotApplied(absl::Status status) {
  if (!status.ok()) status.SetPayload(kNotAppliedPayload, absl::Cord("1"));
  return status;
}
inline bool SurelyNotApplied(const absl::Status& status) {
  return status.GetPayload(kNotAppliedPayload).has_value();
}

class Leases;
class Cluster;

// A user of a node: whom a daemon's store calls are made for, when it makes them on a local
// user's behalf.
struct StoreUser {
  int64_t uid = 0;
  std::string node;  // the node's name ([peer] node_name)

  bool operator==(const StoreUser& other) const { return uid == other.uid && node == other.node; }
};

class Store {
 public:
  virtual ~Store() = default;

  // The store's leases, for backends whose server expires keys itself (etcd); nullptr for
  // those without (their users prove liveness by writing changing values instead).
  virtual Leases* leases() { return nullptr; }

  // The cluster of servers behind the store, for backends run as one (etcd): its members and
  // how each is, for operators (tpctl doctor). nullptr for the others.
  virtual Cluster* cluster() { return nullptr; }

  // This store as the calls of `user`, a local user of this node, reach it: a store another
  // daemon serves charges them to that user's share there (remote/remote_store.h). nullptr
  // for backends that tell no writers apart (file, etcd, memory: callers charge locally).
  virtual std::unique_ptr<Store> OnBehalfOf(const StoreUser& user) { return nullptr; }

  // Sets `key` to `value` and wakes every waiter whose keys are now all present.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // Sets every keys[i] to values[i] in one step; readers see all or none.
  // REQUIRES: keys.size() == values.size().
  virtual absl::Status MultiSet(const std::vector<std::string>& keys,
                                const std::vector<std::string>& values) = 0;

  // Adds `delta` to the decimal integer at `key` (missing counts as 0), stores and returns
  // the sum. FAILED_PRECONDITION when the value is not an integer.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;

  // c10d compare_set; returns the value the key holds afterwards, or `expected` when the key
  // is missing and `expected` is non-empty (nothing is created then).
  virtual absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                                 absl::string_view desired) = 0;

  // Appends `value` to the value of `key`, creating it when missing.
  virtual absl::Status Append(absl::string_view key, absl::string_view value) = 0;

  // True when every key is set.
  virtual absl::StatusOr<bool> Check(const std::vector<std::string>& keys) = 0;

  // Removes `key`; returns whether it existed.
  virtual absl::StatusOr<bool> DeleteKey(absl::string_view key) = 0;

  // Number of keys that start with `prefix` ("" counts every key).
  virtual absl::StatusOr<int64_t> NumKeys(absl::string_view prefix) = 0;

  // Starts waiting for every key in `keys` until `deadline`; `done` runs exactly once (see
  // WaitCallback). Waiting costs no thread: a waiter is an entry in the store. Returns an
  // id for CancelWait, or RESOURCE_EXHAUSTED (without calling `done`) when the store's
  // waiter limit is reached.
  virtual absl::StatusOr<WaitId> WaitAsync(std::vector<std::string> keys, absl::Time deadline,
                                           WaitCallback done) = 0;

  // Ends the wait `id` with CANCELLED if it is still pending; a no-op otherwise.
  virtual void CancelWait(WaitId id) = 0;

  // Blocking forms of WaitAsync for callers that own a thread (rendezvous, tests).
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Time deadline);
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline);
  absl::Status Wait(const std::vector<std::string>& keys, absl::Time deadline);
};

// Keys bound to a lease: the store's server deletes them when their writer stops renewing
// the lease for its TTL, so a process's liveness needs no writes and no judging of silence
// by others (the key's absence is the verdict, the same for every reader).
class Leases {
 public:
  struct Grant {
    int64_t id = 0;
    absl::Duration ttl;  // as granted: the server may raise what was asked
  };

  virtual ~Leases() = default;

  // A new lease of about `ttl` (whole seconds, rounded up).
  virtual absl::StatusOr<Grant> GrantLease(absl::Duration ttl) = 0;
  // Sets `key` to `value`, bound to lease `id`. NOT_FOUND when the lease has expired.
  virtual absl::Status SetLeased(absl::string_view key, absl::string_view value, int64_t id) = 0;
  // Renews lease `id` for its TTL. NOT_FOUND when it has expired (its keys are gone).
  virtual absl::Status KeepLeaseAlive(int64_t id) = 0;
  // Ends lease `id` now and deletes its keys; OK when it had already expired.
  virtual absl::Status RevokeLease(int64_t id) = 0;
};

// The members of the cluster that serves a store, as its endpoints answer for them.
class Cluster {
 public:
  struct Member {
    uint64_t id = 0;
    std::string name;
    std::vector<std::string> client_urls;  // as the member advertises them
    bool learner = false;
    // The store's endpoint that is this member (by its answer, or by a client URL naming the
    // endpoint); empty when none is (it was not asked: the store never dials addresses its
    // servers name, only the ones its URL named).
    std::string endpoint;
    // Why the endpoint did not answer; empty when it did, and then its answer follows.
    std::string unanswered;
    std::string version;
    int64_t db_size_bytes = 0;
    uint64_t leader = 0;  // the member it takes for the leader; 0: none
    uint64_t raft_term = 0;
    uint64_t raft_index = 0;
    std::vector<std::string> errors;  // what the member raises (alarms: "NOSPACE")
    absl::Duration round_trip;
  };
  struct Health {
    // In the cluster's order; when they could not be listed, those that answered.
    std::vector<Member> members;
    std::string list_error;  // why the members could not be listed; "" when they were
    // Endpoints of the store that did not answer and are no listed member's, each with why:
    // "host:port: <error>".
    std::vector<std::string> unanswered;
  };

  virtual ~Cluster() = default;

  // Lists the members (through any endpoint) and asks each of the store's endpoints how its
  // member is; the answers by `deadline` (listing may take the store's call timeout).
  virtual Health ProbeMembers(absl::Time deadline) = 0;
};

}  // namespace tpd::store

#endif  // TPD_STORE_STORE_H_
