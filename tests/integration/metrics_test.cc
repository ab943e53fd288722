// Prometheus metrics of real daemons (`[metrics] listen_address`): node0 serves /metrics on a
// loopback port it picks, node1 has metrics off. After calls within node0, across to node1
// and to a worker that does not exist, node0's page counts them (stage histograms, errors by
// code, the agent's peer, sessions per uid, process figures), names no session, and passes
// `promtool check metrics`; a real Prometheus scraping node0 under load returns the series
// through its HTTP API. A second daemon asked for the port node0 holds does not start, and
// says which address it could not bind.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_nodes.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunProcess;
using testing::WaitUntil;

// The body of `GET path` from the HTTP server at host:port (IPv4), or an error line.
std::string HttpGet(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr) != 1) {
    return "error: bad address " + address;
  }
  to.sin_port = htons(static_cast<uint16_t>(port));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return "error: cannot connect to " + address;
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "error: write";
  }
  std::string response;
  char buffer[65536];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || body == std::string::npos) {
    return "error: not HTTP: " + response.substr(0, 200);
  }
  if (response.find(" 200 ") > response.find("\r\n")) {
    return "error: " + response.substr(0, response.find("\r\n"));
  }
  return response.substr(body + 4);
}

// The value of the sample line that starts with `series` (name and labels exactly), or -1.
double Sample(const std::string& page, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double value = -1;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
    }
  }
  return -1;
}

// A loopback TCP port nobody listens on now.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

// Prometheus' `name` binary: where tools/setup.sh unpacks it, or installed; "" when neither.
std::string PrometheusTool(const std::string& name) {
  for (const std::string dir : {"/usr/local/share/tpd/prometheus/usr/bin", "/usr/bin"}) {
    const std::string path = dir + "/" + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(nodes_.StartAll());
    a_ = nodes_.Connect(0);
    b_ = nodes_.Connect(1);
    c_ = nodes_.Connect(0);
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    ASSERT_NE(c_, nullptr);
    for (Client* callee : {b_.get(), c_.get()}) {
      ASSERT_TRUE(
          callee
              ->Handle("echo",
                       [](const Message& request) -> absl::StatusOr<Message> { return request; })
              .ok());
    }
    // a and c on node0, b on node1: a calls c locally and b across the agent.
    auto join = [this](Client* client, const char* name, int rank) {
      JoinOptions options;
      options.group = "g";
      options.name = name;
      options.rank = rank;
      options.world_size = 3;
      options.init_method = nodes_.init_method();
      options.timeout = absl::Seconds(30);
      return client->Join(options).status();
    };
    auto b = std::async(std::launch::async, [&] { return join(b_.get(), "b", 1); });
    auto c = std::async(std::launch::async, [&] { return join(c_.get(), "c", 2); });
    ASSERT_TRUE(join(a_.get(), "a", 0).ok());
    ASSERT_TRUE(b.get().ok());
    ASSERT_TRUE(c.get().ok());
    absl::StatusOr<v1::StatusResponse> status = a_->Status();
    ASSERT_TRUE(status.ok()) << status.status();
    address_ = status->metrics_address();
  }

  testing::DaemonNodes nodes_{{"node0", "node1"}, [](int i) -> std::string {
                                if (i != 0) return "";
                                return "\n[metrics]\nlisten_address = \"127.0.0.1:0\"\n";
                              }};
  std::unique_ptr<Client> a_;
  std::unique_ptr<Client> b_;
  std::unique_ptr<Client> c_;
  std::string address_;  // node0's metrics, as Admin.Status reports it
};

TEST_F(MetricsTest, PageCountsCallsErrorsPeersAndSessionsAndPassesPromtool) {
  ASSERT_TRUE(absl::StartsWith(address_, "127.0.0.1:")) << address_;
  EXPECT_NE(address_, "127.0.0.1:0") << "the port picked is reported";
  absl::StatusOr<v1::StatusResponse> node1 = b_->Status();
  ASSERT_TRUE(node1.ok());
  EXPECT_EQ(node1->metrics_address(), "") << "metrics are off unless configured";

  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(a_->Call("g", "c", "echo", "local").ok());
    ASSERT_TRUE(a_->Call("g", "b", "echo", std::string(4096, 'x')).ok());
  }
  const absl::Status missing = a_->Call("g", "nobody", "echo", "x").status();
  ASSERT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;

  std::string page;
  ASSERT_TRUE(WaitUntil([&] {
    page = HttpGet(address_, "/metrics");
    return Sample(page, "tpd_agent_peer_received_bytes_total{peer=\"node1\"}") >= 5 * 4096;
  })) << page;
  EXPECT_EQ(Sample(page, "tpd_serving"), 1);
  EXPECT_EQ(Sample(page, "tpd_call_stage_seconds_count{stage=\"local.total\"}"), 5) << page;
  EXPECT_EQ(Sample(page, "tpd_call_stage_seconds_count{stage=\"remote.total\"}"), 5);
  EXPECT_EQ(Sample(page, "tpd_call_stage_seconds_bucket{stage=\"local.total\",le=\"+Inf\"}"), 5);
  EXPECT_GT(Sample(page, "tpd_call_stage_seconds_sum{stage=\"local.total\"}"), 0);
  EXPECT_EQ(Sample(page, "tpd_agent_peer_calls_sent_total{peer=\"node1\"}"), 5);
  EXPECT_EQ(Sample(page, "tpd_agent_pipes{state=\"ready\"}"), 1);
  EXPECT_EQ(Sample(page, absl::StrCat("tpd_uid_sessions_attached{uid=\"", getuid(), "\"}")), 2);
  EXPECT_EQ(Sample(page, "tpd_sessions_attached"), 2);
  EXPECT_EQ(Sample(page, "tpd_groups{phase=\"FORMED\"}"), 1) << page;
  EXPECT_GE(Sample(page, "tpd_control_calls_total{method=\"Join\"}"), 2);
  EXPECT_GT(Sample(page, "process_open_fds"), 0);
  EXPECT_GT(Sample(page, "process_resident_memory_bytes"), 0);
  EXPECT_EQ(Sample(page, "tpd_call_errors_total{code=\"NOT_FOUND\"}"), 1)
      << "the daemon answered the call to a worker that is not there";
  absl::StatusOr<v1::StatusResponse> status = a_->Status();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->call_errors().at("NOT_FOUND"), 1);
  const testing::ProcessResult tpctl =
      RunProcess({testing::RunfilePath("client/tpctl"), "--socket", nodes_.socket(0), "status"});
  EXPECT_THAT(tpctl.output, HasSubstr(absl::StrCat("metrics: http://", address_, "/metrics")));
  EXPECT_THAT(tpctl.output, HasSubstr("call errors answered by the daemon: NOT_FOUND=1"));
  // tpctl doctor over the same daemon: its peer, its transports, its metrics, no problem.
  const testing::ProcessResult doctor = RunProcess(
      {testing::RunfilePath("client/tpctl"), "--socket", nodes_.socket(0), "doctor", "--json"});
  EXPECT_EQ(doctor.exit_code, 0) << doctor.output;
  EXPECT_THAT(doctor.output, HasSubstr("\"problems\": 0"));
  EXPECT_THAT(doctor.output, HasSubstr("{\"check\": \"peer node1\", \"level\": \"ok\""));
  EXPECT_THAT(doctor.output, HasSubstr("{\"check\": \"transport uv\", \"level\": \"ok\""));
  EXPECT_THAT(doctor.output, HasSubstr("(loopback)"));
  EXPECT_THAT(doctor.output,
              ::testing::ContainsRegex("\"check\": \"ping node1\", \"level\": \"ok\", "
                                       "\"detail\": \"round trip [0-9]+ us over the agent"))
      << "node0's agent pinged node1's";
  EXPECT_THAT(doctor.output, HasSubstr("{\"check\": \"clock node1\", \"level\": \"ok\""))
      << "one machine, one clock";
  for (const v1::AttachedSession& session : status->attached_sessions()) {
    EXPECT_THAT(page, Not(HasSubstr(session.handle()))) << "no session is named";
  }

  const std::string promtool = PrometheusTool("promtool");
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool (Debian's prometheus package; tools/setup.sh unpacks it) is "
                    "not here: the page's format is not checked";
  }
  testing::TempDir dir;
  const std::string file = dir.WriteFile("metrics.txt", page);
  const testing::ProcessResult check =
      RunProcess({"/bin/sh", "-c", absl::StrCat(promtool, " check metrics < ", file)});
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_EQ(check.output, "") << "promtool finds nothing to lint";
}

// The per-user and per-group view (tpctl status --by_uid, tpctl group usage): calls, bytes and
// errors counted where the daemon reads them, kept after the session that made them ends.
TEST_F(MetricsTest, UsageByUidAndGroupCountsCallsBytesAndErrorsAndOutlivesTheSession) {
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(a_->Call("g", "c", "echo", std::string(1000, 'l')).ok());
    ASSERT_TRUE(a_->Call("g", "b", "echo", std::string(4096, 'x')).ok());
  }
  ASSERT_EQ(a_->Call("g", "nobody", "echo", "x").status().code(), absl::StatusCode::kNotFound);
  auto uid_use = [&](const v1::StatusResponse& status) {
    for (const v1::UidUse& use : status.uid_use()) {
      if (use.uid() == getuid()) return use;
    }
    return v1::UidUse();
  };
  auto group_usage = [&](const v1::StatusResponse& status) {
    for (const v1::GroupUsage& group : status.group_usage()) {
      if (group.group() == "g") return group;
    }
    return v1::GroupUsage();
  };
  absl::StatusOr<v1::StatusResponse> status = b_->Status();  // node1: b's replies only
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(uid_use(*status).calls(), 0u) << "b made no call";
  EXPECT_GE(uid_use(*status).bytes_sent(), 4u * 4096) << "its replies";
  status = c_->Status();
  ASSERT_TRUE(status.ok());
  const v1::UidUse use = uid_use(*status);
  EXPECT_EQ(use.calls(), 9u) << "a's calls, through node0";
  EXPECT_EQ(use.call_errors(), 1u);
  // a's requests and c's replies.
  EXPECT_GE(use.bytes_sent(), 4u * (1000 + 4096) + 4u * 1000);
  EXPECT_EQ(use.attached_sessions(), 2);
  const v1::GroupUsage g = group_usage(*status);
  EXPECT_EQ(g.calls(), 9u);
  EXPECT_EQ(g.call_errors(), 1u) << "the call to a worker that is not there";
  EXPECT_GE(g.bytes_sent(), 4u * (1000 + 4096));
  EXPECT_EQ(g.members_here(), 2);
  EXPECT_EQ(g.phase(), "FORMED");

  const testing::ProcessResult by_uid = RunProcess(
      {testing::RunfilePath("client/tpctl"), "--socket", nodes_.socket(0), "status", "--by_uid"});
  EXPECT_THAT(by_uid.output, HasSubstr(absl::StrCat("uid ", getuid(), ": sessions 2/")));
  EXPECT_THAT(by_uid.output, HasSubstr("since start 9 calls"));
  const testing::ProcessResult groups = RunProcess(
      {testing::RunfilePath("client/tpctl"), "--socket", nodes_.socket(0), "group", "usage"});
  EXPECT_THAT(groups.output, ::testing::ContainsRegex("\ng +FORMED +2 +9 "));

  // tpctl top: two frames while calls run, rates over the interval.
  std::atomic<bool> stop{false};
  std::thread load([&] {
    while (!stop) (void)a_->Call("g", "c", "echo", "load");
  });
  const testing::ProcessResult top =
      RunProcess({testing::RunfilePath("client/tpctl"), "--socket", nodes_.socket(0), "top",
                  "--frames", "2", "--interval_ms", "500"});
  stop = true;
  load.join();
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_THAT(top.output, HasSubstr("every 0.5s"));
  EXPECT_THAT(top.output, ::testing::ContainsRegex("local.total +[1-9][0-9]* +[0-9.]+ +[0-9.]+\n"))
      << "calls/s over the interval";
  EXPECT_THAT(top.output, ::testing::ContainsRegex("node1 +ready"));

  status = c_->Status();
  ASSERT_TRUE(status.ok());
  const uint64_t made = uid_use(*status).calls();
  EXPECT_GT(made, 9u) << "the load's calls";
  EXPECT_EQ(group_usage(*status).calls(), made);

  a_.reset();  // a's session ends: what it sent stays counted
  ASSERT_TRUE(WaitUntil([&] {
    status = c_->Status();
    return status.ok() && uid_use(*status).attached_sessions() == 1;
  }));
  EXPECT_EQ(uid_use(*status).calls(), made);
  EXPECT_EQ(group_usage(*status).calls(), made);
  std::string page;
  ASSERT_TRUE(WaitUntil([&] {
    page = HttpGet(address_, "/metrics");
    return Sample(page, absl::StrCat("tpd_uid_calls_total{uid=\"", getuid(), "\"}")) ==
           static_cast<double>(made);
  })) << page;
  EXPECT_EQ(Sample(page, absl::StrCat("tpd_uid_call_errors_total{uid=\"", getuid(), "\"}")), 1);
}

TEST_F(MetricsTest, APrometheusScrapingUnderLoadReturnsTheSeries) {
  const std::string server = PrometheusTool("prometheus");
  if (server.empty()) {
    GTEST_SKIP() << "prometheus (Debian's prometheus package; tools/setup.sh unpacks it) is "
                    "not here";
  }
  testing::TempDir dir;
  const std::string config = dir.WriteFile(
      "prometheus.yml", absl::StrCat("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                                     "scrape_configs:\n  - job_name: tpd\n    static_configs:\n"
                                     "      - targets: ['",
                                     address_, "']\n"));
  const std::string web = absl::StrCat("127.0.0.1:", FreePort());
  const pid_t prometheus = fork();
  ASSERT_GE(prometheus, 0);
  if (prometheus == 0) {
    const std::string log = dir.path() + "/prometheus.log";
    freopen(log.c_str(), "w", stdout);
    freopen(log.c_str(), "w", stderr);
    execl(server.c_str(), "prometheus", ("--config.file=" + config).c_str(),
          ("--storage.tsdb.path=" + dir.path() + "/data").c_str(),
          ("--web.listen-address=" + web).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  std::thread load([&] {
    while (!stop.load()) {
      if (a_->Call("g", "c", "echo", "load").ok()) calls.fetch_add(1);
    }
  });

  const std::string query =
      "/api/v1/query?query=tpd_call_stage_seconds_count%7Bstage%3D%22local.total%22%7D";
  std::string answer;
  const bool scraped = WaitUntil(
      [&] {
        answer = HttpGet(web, query);
        return absl::StrContains(answer, "\"status\":\"success\"") &&
               absl::StrContains(answer, "\"stage\":\"local.total\"");
      },
      absl::Seconds(60));
  const std::string up = HttpGet(web, "/api/v1/query?query=up%7Bjob%3D%22tpd%22%7D");
  stop = true;
  load.join();
  kill(prometheus, SIGTERM);
  int wait_status = 0;
  waitpid(prometheus, &wait_status, 0);
  ASSERT_TRUE(scraped) << answer << "\n" << up;
  EXPECT_THAT(answer, HasSubstr(absl::StrCat("\"instance\":\"", address_, "\"")));
  EXPECT_THAT(up, HasSubstr("\"1\"]")) << "the target is up: " << up;
  EXPECT_GT(calls.load(), 0);
}

TEST_F(MetricsTest, ADaemonWhosePortIsTakenDoesNotStartAndSaysWhere) {
  testing::TempDir dir;
  const std::string config =
      dir.WriteFile("tpd.toml", absl::StrCat("[metrics]\nlisten_address = \"", address_, "\"\n"));
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> daemon =
      testing::DaemonProcess::Start(dir.path() + "/tpd.sock", {"--config", config});
  ASSERT_FALSE(daemon.ok()) << "two daemons cannot share one metrics port";
  EXPECT_THAT(daemon.status().message(), HasSubstr(address_)) << daemon.status();
}

}  // namespace
}  // namespace tpd
