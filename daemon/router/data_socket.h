// The daemon's data socket: the second unix socket, beside the gRPC one, through which a
// client session receives its shared-memory segment (a sealed memfd, sent with SCM_RIGHTS;
// gRPC cannot pass file descriptors). The exchange is shm/attach.h; the whole story is
// in docs/data_plane.md, "Attaching a session", and docs/security.md, "The data socket".
//
// One connection attaches one session, once: the client sends the session id Control.
// OpenSession gave it; the daemon checks that the session is open and not attached yet and
// that max_sessions are not all taken, records the connection's SO_PEERCRED with it, creates
// the session's Segment and sends it. From then on the connection is the session's second
// half: when it closes (or the client sends anything more) the session is ended through
// `end_session`; when the session ends on the gRPC side, EndSession closes the connection.
// Either way the daemon unmaps the segment and no fd of it stays open here.
//
// A session is also its process's: once identified, the daemon watches the identifying
// process (a pidfd in the loop) and ends the session when that process exits, even while a
// forked child still holds copies of its connections (docs/security.md, "fork()").
//
// Thread safety: thread-safe. One thread of its own ("tpd-data", an epoll loop) accepts,
// reads and closes every connection; EndSession, Sessions and Shutdown may be called from
// any thread. The hooks are called on the loop thread with no lock of this class held.

#ifndef TPD_DAEMON_ROUTER_DATA_SOCKET_H_
#define TPD_DAEMON_ROUTER_DATA_SOCKET_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/log_limiter.h"
#include "daemon/socket_lock.h"
#include "shm/layout.h"
#include "shm/segment.h"

namespace tpd {

// Who attached a session: its data connection's SO_PEERCRED, and the connection (the socket
// owns it; a dup of it reaches the client for the session's life).
struct AttachedClient {
  uid_t uid = 0;
  gid_t gid = 0;
  int connection = -1;
};

struct DataSocketOptions {
  // Where to listen (taken with SocketLock, the gRPC socket's procedure) and the mode and
  // group the socket file gets ([daemon] socket_mode, socket_group).
  std::string path;
  mode_t mode = 0660;
  std::string group;
  // Sizes of each session's segment.
  shm::SegmentLimits limits;
  // Sessions attached at once ([data] max_sessions), their segments' bytes together
  // (max_shared_memory_bytes), and by one uid (max_sessions_per_uid). A uid holding
  // sessions_kept_free attached sessions or more takes another only while that many places stay
  // free after it, for other users (docs/security.md, "Per-user bounds").
  int64_t max_sessions = 256;
  int64_t max_shared_memory_bytes = int64_t{1} << 40;
  int64_t max_sessions_per_uid = 256;
  int64_t sessions_kept_free = 0;
  // Connections that have not sent their request yet, in all, and the share of one uid: with
  // every place taken the listener waits (a burst of one job's processes queues in the
  // backlog), unless a uid over its share holds a connection idle for kPendingGrace, which is
  // closed for the newcomer.
  int64_t max_pending = 128;
  int64_t max_pending_per_uid = 8;
  // How long a connection may take to send its request before it is closed, so idle
  // connections cannot hold the max_pending places.
  absl::Duration request_timeout = absl::Seconds(5);
  // Whether `session_id` names a session whose gRPC stream is open. Required.
  std::function<bool(const std::string& session_id)> session_open;
  // Called when an attached session's data connection closed first, or the process that
  // identified a session exited; `why` says which. Required.
  std::function<void(const std::string& session_id, const std::string& why)> end_session;
  // Binds the session to the uid of the connection that identifies or attaches it (an error,
  // such as PERMISSION_DENIED for a session bound to another uid, refuses the request).
  // Optional: without it nothing is bound.
  std::function<absl::Status(const std::string& session_id, uid_t uid)> bind_uid;
  // Optional: a session attached; an error refuses the attach (the client gets it). The
  // socket lets go of its segment after on_detach(session_id)
  // returns (called on the loop thread, and at Shutdown); the mapping goes with the last
  // reference, so the call router can keep it while TensorPipe still reads from it.
  std::function<absl::Status(const std::string& session_id, const AttachedClient& client,
                             std::shared_ptr<shm::Segment> segment)>
      on_attach;
  std::function<void(const std::string& session_id)> on_detach;
};

class DataSocket {
 public:
  // Takes the socket, binds it (private until its mode and group are set) and starts the
  // loop. Errors name the socket.
  static absl::StatusOr<std::unique_ptr<DataSocket>> Start(DataSocketOptions options);

  // Shuts down if Shutdown() was not called.
  ~DataSocket();
  DataSocket(const DataSocket&) = delete;
  DataSocket& operator=(const DataSocket&) = delete;

  // Stops the loop, closes every connection, frees every segment and removes the socket
  // file. Idempotent. Does not call end_session.
  void Shutdown();

  // The session's gRPC stream ended: its data connection is closed and its segment freed
  // (soon, on the loop thread). No-op for a session that is not attached.
  void EndSession(const std::string& session_id);

  struct SessionInfo {
    std::string session_id;
    pid_t pid = 0;  // SO_PEERCRED of the data connection
    uid_t uid = 0;
    gid_t gid = 0;
    uint64_t segment_bytes = 0;
    absl::Time attached_at;
  };
  // The attached sessions, by session id.
  std::vector<SessionInfo> Sessions() const;

  // What one uid holds: attached sessions and their segments' bytes, and connections that
  // have not attached yet.
  struct UidUse {
    int64_t sessions = 0;
    uint64_t segment_bytes = 0;
    int64_t pending = 0;
  };
  std::map<uid_t, UidUse> UsePerUid() const;

  const std::string& path() const { return path_; }

 private:
  struct Connection {
    int fd = -1;
    pid_t pid = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    std::string request;  // bytes read so far, before the attach
    absl::Time accepted_at;
    std::string session_id;  // set once attached
    std::shared_ptr<shm::Segment> segment;
    absl::Time attached_at;
  };

  DataSocket(DataSocketOptions options, uint64_t segment_bytes, std::unique_ptr<SocketLock> lock,
             int listen_fd, int wake_fd, int epoll_fd);
  void Loop();
  void Accept();
  // Closes connections that sent no whole request within request_timeout; returns how long
  // until the next one is due (absl::InfiniteDuration() when none waits).
  absl::Duration CloseSlowRequests();
  void OnReadable(uint64_t id);
  // Attaches the connection `id` to `session_id` or answers why not.
  void Attach(uint64_t id, const std::string& session_id);
  // Binds `session_id` to the uid of connection `id`, answers and closes it.
  void Identify(uint64_t id, const std::string& session_id);
  // Ends `session_id` when process `pid` exits (a pidfd in the epoll set). Once per session;
  // a pid this daemon cannot see (another pid namespace: 0) is not watched.
  void WatchProcess(const std::string& session_id, pid_t pid);
  // The watched process of tag `tag` exited: ends its session.
  void ProcessExited(uint64_t tag);
  // NOT_FOUND unless `session_id` is open; else what bind_uid says for `uid`.
  absl::Status OpenAndBound(const std::string& session_id, uid_t uid);
  // Closes the connection `id`, frees its segment; ends its session when `end` is set.
  void Close(uint64_t id, bool end);
  // Logs a refused connection of `uid`, at most once a second per uid, counting the ones
  // left out.
  void LogRefusal(uid_t uid, const std::string& what);
  // The uid of connection `id` (-1 once it is gone).
  uid_t UidOf(uint64_t id) const;
  // How many connections of `uid` are pending (attached == false) or attached.
  int64_t CountOf(uid_t uid, bool attached) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the oldest connection idle for kPendingGrace without a request, of a uid holding
  // more than max_pending_per_uid of them; false when there is none.
  bool EvictIdlePending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A client sends its request as it connects: one that sent none this long is idle. And how
  // long the listener waits when every place is taken by connections not idle yet.
  static constexpr absl::Duration kPendingGrace = absl::Milliseconds(100);
  static constexpr absl::Duration kAcceptPause = absl::Milliseconds(2);
  // OK when `uid` may attach one more session now; else RESOURCE_EXHAUSTED naming the bound.
  absl::Status RoomFor(uid_t uid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DataSocketOptions options_;
  const uint64_t segment_bytes_;  // of every session's segment, by options_.limits
  const std::string path_;
  std::unique_ptr<SocketLock> lock_;
  const int listen_fd_;
  const int wake_fd_;
  const int epoll_fd_;
  std::thread loop_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ = false;  // main thread only
  // Every open connection by its id (the epoll tag); only the loop adds and erases.
  std::map<uint64_t, Connection> connections_ ABSL_GUARDED_BY(mu_);
  // Attached sessions: session id -> connection id.
  std::map<std::string, uint64_t> attached_ ABSL_GUARDED_BY(mu_);
  // Processes watched for their sessions: by epoll tag, and the tag of each session. Their
  // pidfds are closed under mu_ (the loop only looks them up by tag).
  struct ProcessWatch {
    int pidfd = -1;
    std::string session_id;
    pid_t pid = 0;
  };
  std::map<uint64_t, ProcessWatch> watches_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> watched_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 2;  // 0: the listener, 1: the wake fd
  // Out of fds (EMFILE, ENFILE): the listener leaves the epoll set until then, so the loop
  // does not spin on a connection it cannot accept (loop only).
  absl::Time accept_paused_until_ = absl::InfinitePast();
  // Refusals of malformed or excess connections: at most one line a second per uid.
  LogLimiter refusals_{absl::Seconds(1)};
};

}  // namespace tpd

#endif  // TPD_DAEMON_ROUTER_DATA_SOCKET_H_
