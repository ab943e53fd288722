// A real etcd cluster for tests: 1 or 3 members of Debian's etcd (etcd-server) on loopback
// ports in a temporary directory, started by the test and stopped by it. Members can be
// killed and restarted one by one (for the fault tests of issue 9).
//
// Thread safety: an EtcdCluster belongs to one test thread.

#ifndef TPD_TESTS_STORE_ETCD_ETCD_CLUSTER_H_
#define TPD_TESTS_STORE_ETCD_ETCD_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tests/testing/daemon_process.h"

namespace tpd::store::testing {

// The etcd binary ($TPD_ETCD_BINARY, else /usr/bin/etcd), or "" when there is none; tests
// skip then, naming tools/setup.sh, which installs it.
std::string EtcdBinary();

// The message a test skips with when EtcdBinary() is "".
inline constexpr char kNoEtcdMessage[] =
    "no etcd binary (/usr/bin/etcd or $TPD_ETCD_BINARY): install Debian's etcd-server "
    "(tools/setup.sh does)";

// How the members serve clients.
struct EtcdClusterOptions {
  // TLS on the client port (PEM files): the members' certificate and key, and the CA whose
  // client certificates they require (--client-cert-auth). Empty: plain http.
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  // What Start's readiness probe presents over TLS (PEM text): the CA of the members'
  // certificate and a client certificate with its key.
  std::string probe_root_certs;
  std::string probe_cert_chain;
  std::string probe_private_key;
  // More etcd flags, e.g. {"--auth-token-ttl", "1"}.
  std::vector<std::string> extra_flags;
};

class EtcdCluster {
 public:
  // Starts `members` (1 or 3) members and waits until the cluster answers a linearizable
  // read through every member (a leader is elected), up to `timeout`.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(
      int members, absl::Duration timeout = absl::Seconds(30), EtcdClusterOptions options = {});

  // Kills every member still running (SIGKILL) and removes the data.
  ~EtcdCluster();

  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  // The directory the members' data lies in (removed with the cluster); tests may keep
  // their own files there.
  const std::string& dir() const { return dir_.path(); }
  // "127.0.0.1:port" of member `i`'s client (gRPC) port.
  std::string ClientAddress(int i) const;
  // Every member's client address, in member order.
  std::vector<std::string> ClientAddresses() const;
  // "127.0.0.1:a,127.0.0.1:b,..." for an etcd:// URL.
  std::string UrlHosts() const;

  // The index of the member that leads the cluster now (etcd's Maintenance.Status), waiting
  // up to `timeout` for one.
  absl::StatusOr<int> Leader(absl::Duration timeout = absl::Seconds(10)) const;

  // SIGKILLs member `i` and reaps it.
  void Kill(int i);
  // Starts member `i` again on its data and ports (after Kill); does not wait for it to
  // rejoin.
  absl::Status Restart(int i);
  bool Running(int i) const { return members_[i].pid > 0; }
  // The last lines member `i` logged, for failure messages.
  std::string LogTail(int i) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };

  EtcdCluster() = default;
  // One try of Start on freshly picked ports.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> StartOnce(int members, absl::Duration timeout,
                                                                const EtcdClusterOptions& options);
  absl::Status Launch(int i, bool initial);
  // A channel to member `i`'s client port (TLS with the probe's credentials when set).
  std::shared_ptr<grpc::Channel> Channel(int i) const;
  // Whether a linearizable Range through member `i` succeeds before `deadline`; false at once
  // when a member exits.
  bool AwaitServing(int i, absl::Time deadline);
  // Reaps a member that exited (its pid becomes -1); its index, or -1 when none did.
  int ReapExited();

  ::tpd::testing::TempDir dir_;
  std::vector<Member> members_;
  std::string initial_cluster_;
  EtcdClusterOptions options_;
};

}  // namespace tpd::store::testing

#endif  // TPD_TESTS_STORE_ETCD_ETCD_CLUSTER_H_
