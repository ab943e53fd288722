#include "tests/store/etcd/etcd_cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace tpd::store::testing {
namespace {

// A port the kernel hands out now; etcd binds it a moment later (a small race that other
// tests on the machine rarely win).
absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    close(fd);
    return absl::InternalError("cannot bind a loopback port for etcd");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

bool AcceptsConnections(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

std::string LoopbackUrl(int port) { return absl::StrCat("http://127.0.0.1:", port); }

}  // namespace

std::string EtcdBinary() {
  const char* configured = std::getenv("TPD_ETCD_BINARY");
  const std::string path = configured != nullptr ? configured : "/usr/bin/etcd";
  return access(path.c_str(), X_OK) == 0 ? path : "";
}

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(int members, absl::Duration timeout,
                                                                EtcdClusterOptions options) {
  if (EtcdBinary().empty()) return absl::FailedPreconditionError(kNoEtcdMessage);
  // Ports are picked free, then bound by etcd a moment later; another process can take one
  // in between. Such a start is retried on fresh ports.
  constexpr int kAttempts = 5;
  absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    cluster = StartOnce(members, timeout, options);
    if (cluster.ok() || !absl::StrContains(cluster.status().message(), "address already in use")) {
      break;
    }
  }
  return cluster;
}

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::StartOnce(
    int members, absl::Duration timeout, const EtcdClusterOptions& options) {
  auto cluster = std::unique_ptr<EtcdCluster>(new EtcdCluster());
  cluster->options_ = options;
  std::vector<std::string> peers;
  for (int i = 0; i < members; ++i) {
    Member member;
    member.name = absl::StrCat("m", i);
    absl::StatusOr<int> client = FreeLoopbackPort();
    absl::StatusOr<int> peer = FreeLoopbackPort();
    if (!client.ok()) return client.status();
    if (!peer.ok()) return peer.status();
    member.client_port = *client;
    member.peer_port = *peer;
    peers.push_back(absl::StrCat(member.name, "=", LoopbackUrl(member.peer_port)));
    cluster->members_.push_back(member);
  }
  cluster->initial_cluster_ = absl::StrJoin(peers, ",");
  for (int i = 0; i < members; ++i) {
    absl::Status status = cluster->Launch(i, /*initial=*/true);
    if (!status.ok()) return status;
  }
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0; i < members; ++i) {
    if (!cluster->AwaitServing(i, deadline)) {
      const int exited = cluster->ReapExited();
      if (exited >= 0) {
        return absl::UnavailableError(absl::StrCat("etcd member ", exited,
                                                   " exited while starting; its log:\n",
                                                   cluster->LogTail(exited)));
      }
      return absl::DeadlineExceededError(absl::StrCat("etcd member ", i, " did not serve within ",
                                                      absl::FormatDuration(timeout), "; its log:\n",
                                                      cluster->LogTail(i)));
    }
  }
  return cluster;
}

EtcdCluster::~EtcdCluster() {
  for (int i = 0; i < size(); ++i) Kill(i);
}

absl::Status EtcdCluster::Launch(int i, bool initial) {
  Member& member = members_[i];
  const bool tls = !options_.cert_file.empty();
  const std::string client =
      absl::StrCat(tls ? "https" : "http", "://127.0.0.1:", member.client_port);
  const std::string peer = LoopbackUrl(member.peer_port);
  std::vector<std::string> argv = {
      EtcdBinary(),
      "--name",
      member.name,
      "--data-dir",
      absl::StrCat(dir_.path(), "/", member.name),
      "--listen-client-urls",
      client,
      "--advertise-client-urls",
      client,
      "--listen-peer-urls",
      peer,
      "--initial-advertise-peer-urls",
      peer,
      "--initial-cluster",
      initial_cluster_,
      "--initial-cluster-state",
      initial ? "new" : "existing",
      "--initial-cluster-token",
      dir_.path(),
      "--logger",
      "zap",
      "--log-level",
      "warn",
      // Fast elections on a busy 2-core machine without flapping.
      "--heartbeat-interval",
      "50",
      "--election-timeout",
      "500",
  };
  if (tls) {
    for (const std::string& arg :
         {std::string("--cert-file"), options_.cert_file, std::string("--key-file"),
          options_.key_file, std::string("--trusted-ca-file"), options_.client_ca_file,
          std::string("--client-cert-auth")}) {
      argv.push_back(arg);
    }
  }
  argv.insert(argv.end(), options_.extra_flags.begin(), options_.extra_flags.end());
  const std::string log_path = absl::StrCat(dir_.path(), "/", member.name, ".log");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed starting etcd");
  if (pid == 0) {
    // Never outlive a crashed test.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  member.pid = pid;
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> EtcdCluster::Channel(int i) const {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options_.cert_file.empty()) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = options_.probe_root_certs;
    tls.pem_cert_chain = options_.probe_cert_chain;
    tls.pem_private_key = options_.probe_private_key;
    credentials = grpc::SslCredentials(tls);
  }
  return grpc::CreateChannel(ClientAddress(i), credentials);
}

absl::StatusOr<int> EtcdCluster::Leader(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    for (int i = 0; i < size(); ++i) {
      if (!Running(i)) continue;
      auto maintenance = etcdserverpb::Maintenance::NewStub(Channel(i));
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      etcdserverpb::StatusRequest request;
      etcdserverpb::StatusResponse response;
      if (maintenance->Status(&context, request, &response).ok() && response.leader() != 0 &&
          response.leader() == response.header().member_id()) {
        return i;
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "no running member of the etcd cluster says it leads after ", absl::FormatDuration(timeout)));
}

bool EtcdCluster::AwaitServing(int i, absl::Time deadline) {
  // First the port (etcd opens it once it has a leader), probed with plain connects: a gRPC
  // channel refused before that backs off for seconds.
  while (!AcceptsConnections(members_[i].client_port)) {
    if (ReapExited() >= 0) return false;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  auto kv = etcdserverpb::KV::NewStub(Channel(i));
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    context.set_wait_for_ready(true);
    etcdserverpb::RangeRequest request;
    request.set_key("tpd-test-probe");
    etcdserverpb::RangeResponse response;
    if (kv->Range(&context, request, &response).ok()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

int EtcdCluster::ReapExited() {
  for (int i = 0; i < size(); ++i) {
    int status = 0;
    if (members_[i].pid > 0 && waitpid(members_[i].pid, &status, WNOHANG) == members_[i].pid) {
      members_[i].pid = -1;
      return i;
    }
  }
  return -1;
}

std::string EtcdCluster::ClientAddress(int i) const {
  return absl::StrCat("127.0.0.1:", members_[i].client_port);
}

std::vector<std::string> EtcdCluster::ClientAddresses() const {
  std::vector<std::string> addresses;
  for (int i = 0; i < size(); ++i) addresses.push_back(ClientAddress(i));
  return addresses;
}

std::string EtcdCluster::UrlHosts() const { return absl::StrJoin(ClientAddresses(), ","); }

void EtcdCluster::Kill(int i) {
  Member& member = members_[i];
  if (member.pid <= 0) return;
  kill(member.pid, SIGKILL);
  int status = 0;
  waitpid(member.pid, &status, 0);
  member.pid = -1;
}

absl::Status EtcdCluster::Restart(int i) {
  if (members_[i].pid > 0) return absl::FailedPreconditionError("etcd member is still running");
  return Launch(i, /*initial=*/false);
}

std::string EtcdCluster::LogTail(int i) const {
  std::ifstream file(absl::StrCat(dir_.path(), "/", members_[i].name, ".log"));
  std::stringstream text;
  text << file.rdbuf();
  const std::string all = text.str();
  return all.size() > 4000 ? all.substr(all.size() - 4000) : all;
}

}  // namespace tpd::store::testing
