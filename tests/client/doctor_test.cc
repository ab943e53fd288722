// tpctl doctor's findings from crafted Admin.Status snapshots: a healthy node has no problem;
// each thing that stands in the way (a drained node, an open-file limit below what the
// configuration needs, shared memory past the machine's, a failed pipe, a silent peer, a
// rendezvous store that does not answer, GPUs without peer access, cma under Yama, ibv with a
// small memlock limit) is a problem or a warning that names the numbers and says what to do.

#include "client/doctor.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Level = Finding::Level;

const absl::Time kNow = absl::FromUnixSeconds(1800000000);

v1::StatusResponse Healthy() {
  v1::StatusResponse status;
  status.set_serving_status("SERVING");
  status.mutable_config()->set_socket_mode("0660");
  status.mutable_config()->set_data_max_sessions(100);
  status.mutable_config()->set_data_max_shared_memory_bytes(int64_t{8} << 30);
  status.mutable_config()->set_peer_heartbeat_timeout_ms(5000);
  v1::NodeLimits* limits = status.mutable_limits();
  limits->set_open_file_limit(65536);
  limits->set_open_files_needed(1824);
  limits->set_open_files(40);
  limits->set_memory_bytes(int64_t{64} << 30);
  limits->set_memlock_limit_bytes(8 << 20);
  limits->set_yama_ptrace_scope(0);
  status.set_metrics_address("127.0.0.1:9477");
  v1::AgentStatus* agent = status.mutable_agent();
  for (const char* name : {"uv", "ibv"}) {
    v1::AgentBackend* transport = agent->add_transports();
    transport->set_name(name);
    transport->set_registered(std::string(name) == "uv");
    if (std::string(name) == "ibv") transport->set_reason("no InfiniBand device");
  }
  v1::AgentBackend* cma = agent->add_channels();
  cma->set_name("cma");
  cma->set_registered(true);
  v1::AgentPeer* peer = agent->add_peers();
  peer->set_node("node1");
  peer->set_pipe_state("ready");
  peer->set_transport("uv");
  peer->set_channel("cma");
  v1::PeerInfo* beat = status.add_peers();
  beat->set_node("node1");
  beat->set_last_heartbeat_unix_ms(absl::ToUnixMillis(kNow - absl::Milliseconds(300)));
  v1::RendezvousStoreInfo* store = status.add_rendezvous_stores();
  store->set_name("etcd://10.0.0.1:2379/jobs");
  store->set_liveness("lease");
  return status;
}

// The finding of `check`, or one with an empty check.
Finding Of(const std::vector<Finding>& findings, const std::string& check) {
  for (const Finding& finding : findings) {
    if (finding.check == check) return finding;
  }
  return {};
}

int Count(const std::vector<Finding>& findings, Level level) {
  int n = 0;
  for (const Finding& finding : findings) n += finding.level == level;
  return n;
}

TEST(DoctorTest, AHealthyNodeHasNoProblemAndSaysWhyEachBackendIsOnOrOff) {
  const std::vector<Finding> findings = Diagnose(Healthy(), Probes(), kNow);
  EXPECT_EQ(Count(findings, Level::kProblem), 0);
  EXPECT_EQ(Count(findings, Level::kWarning), 0);
  EXPECT_EQ(Of(findings, "transport uv").level, Level::kOk);
  const Finding ibv = Of(findings, "transport ibv");
  EXPECT_EQ(ibv.level, Level::kNote);
  EXPECT_EQ(ibv.detail, "off: no InfiniBand device");
  EXPECT_EQ(Of(findings, "peer node1").level, Level::kOk);
  EXPECT_THAT(Of(findings, "peer node1").detail, HasSubstr("ready over uv/cma"));
  EXPECT_EQ(Of(findings, "metrics").level, Level::kOk);
}

TEST(DoctorTest, EachObstacleIsAProblemOrWarningWithTheNumbersAndAFix) {
  v1::StatusResponse status = Healthy();
  status.set_serving_status("NOT_SERVING");
  status.mutable_drain()->set_state("drained");
  status.mutable_limits()->set_open_file_limit(1024);
  status.mutable_config()->set_data_max_shared_memory_bytes(int64_t{80} << 30);
  status.mutable_agent()->mutable_peers(0)->set_pipe_state("failed");
  status.mutable_agent()->mutable_peers(0)->set_last_error("connection refused");
  status.mutable_peers(0)->set_last_heartbeat_unix_ms(absl::ToUnixMillis(kNow - absl::Seconds(9)));
  status.mutable_rendezvous_stores(0)->set_failed_beats(3);
  status.mutable_rendezvous_stores(0)->set_last_error("deadline exceeded");
  status.mutable_limits()->set_yama_ptrace_scope(1);
  status.mutable_agent()->mutable_transports(1)->set_registered(true);  // ibv
  status.mutable_config()->set_socket_mode("0666");
  status.set_metrics_address("0.0.0.0:9477");
  v1::GpuStatus* gpus = status.mutable_gpus();
  for (int i = 0; i < 2; ++i) gpus->add_devices()->set_index(i);
  gpus->add_peer_access()->add_can_access(true);
  gpus->mutable_peer_access(0)->add_can_access(false);
  gpus->add_peer_access()->add_can_access(true);
  gpus->mutable_peer_access(1)->add_can_access(true);
  status.add_groups()->set_group("job");
  status.mutable_groups(0)->set_phase("BROKEN");
  status.mutable_groups(0)->set_reason("member w3 left");

  const std::vector<Finding> findings = Diagnose(status, Probes(), kNow);
  struct Want {
    const char* check;
    Level level;
    const char* detail;
  };
  for (const Want& want : {
           Want{"serving", Level::kProblem, "drain drained"},
           Want{"open files", Level::kProblem, "may open 1024 files; 100 sessions"},
           Want{"shared memory", Level::kProblem, "81920 MiB exceeds the machine's 65536 MiB"},
           Want{"peer node1", Level::kProblem, "connection refused"},
           Want{"heartbeat node1", Level::kProblem, "last seen 9s ago"},
           Want{"rendezvous etcd://10.0.0.1:2379/jobs", Level::kWarning, "3 failed beats"},
           Want{"cma", Level::kWarning, "ptrace_scope is 1"},
           Want{"locked memory", Level::kWarning, "ibv"},
           Want{"socket", Level::kWarning, "every user may connect"},
           Want{"metrics", Level::kNote, "reachable from the network"},
           Want{"gpu peer access", Level::kWarning, "cuda:0->cuda:1"},
           Want{"group job", Level::kWarning, "BROKEN: member w3 left"},
       }) {
    const Finding finding = Of(findings, want.check);
    EXPECT_EQ(finding.level, want.level) << want.check << ": " << finding.detail;
    EXPECT_THAT(finding.detail, HasSubstr(want.detail)) << want.check;
    EXPECT_FALSE(finding.fix.empty()) << want.check << " says what to do";
  }
}

TEST(DoctorTest, PingsGiveRoundTripsAndClocksPastTheSkewAreProblems) {
  v1::StatusResponse status = Healthy();
  status.mutable_config()->set_peer_auth_max_skew_ms(30000);
  v1::ProbePeersResponse probes;
  v1::PeerProbe* near = probes.add_peers();
  near->set_node("n1");
  near->set_round_trip_us(84);
  near->set_clock_offset_ms(0.3);
  v1::PeerProbe* drifting = probes.add_peers();
  drifting->set_node("n2");
  drifting->set_round_trip_us(120);
  drifting->set_clock_offset_ms(-2500);
  v1::PeerProbe* far = probes.add_peers();
  far->set_node("n3");
  far->set_round_trip_us(100);
  far->set_clock_offset_ms(45000);
  v1::PeerProbe* gone = probes.add_peers();
  gone->set_node("n4");
  gone->set_error("UNAVAILABLE: connection refused");
  const std::vector<Finding> findings = Diagnose(status, Probes{&probes, nullptr}, kNow);
  EXPECT_EQ(Of(findings, "ping n1").level, Level::kOk);
  EXPECT_THAT(Of(findings, "ping n1").detail, HasSubstr("round trip 84 us"));
  EXPECT_EQ(Of(findings, "clock n1").level, Level::kOk);
  EXPECT_THAT(Of(findings, "clock n1").detail, HasSubstr("+0.3 ms"));
  EXPECT_EQ(Of(findings, "clock n2").level, Level::kWarning);
  EXPECT_EQ(Of(findings, "clock n3").level, Level::kProblem);
  EXPECT_THAT(Of(findings, "clock n3").detail, HasSubstr("auth_max_skew_ms"));
  EXPECT_EQ(Of(findings, "ping n4").level, Level::kProblem);
  EXPECT_THAT(Of(findings, "ping n4").detail, HasSubstr("connection refused"));
}

// The details of the findings of `check` at `level`, in order.
std::vector<std::string> Details(const std::vector<Finding>& findings, const std::string& check,
                                 Level level) {
  std::vector<std::string> details;
  for (const Finding& finding : findings) {
    if (finding.check == check && finding.level == level) details.push_back(finding.detail);
  }
  return details;
}

v1::StoreMember* AskedMember(v1::StoreProbe* store, const std::string& id, const std::string& name,
                             const std::string& endpoint) {
  v1::StoreMember* member = store->add_members();
  member->set_id(id);
  member->set_name(name);
  member->set_endpoint(endpoint);
  member->set_version("3.4.23");
  member->set_leader_id("a1");
  member->set_raft_term(4);
  member->set_db_size_bytes(20 << 20);
  member->set_round_trip_ms(0.4);
  return member;
}

TEST(DoctorTest, EtcdMembersEachWithTheirLeaderAlarmsAndWhetherTheStoreCanReachThem) {
  v1::ProbeStoresResponse probes;
  v1::StoreProbe* healthy = probes.add_stores();
  healthy->set_name("etcd://10.0.0.1:2379,10.0.0.2:2379/jobs");
  AskedMember(healthy, "a1", "infra0", "10.0.0.1:2379");
  AskedMember(healthy, "b2", "infra1", "10.0.0.2:2379");
  v1::StoreProbe* ailing = probes.add_stores();
  ailing->set_name("etcd://10.0.1.1:2379,10.0.1.2:2379/jobs");
  AskedMember(ailing, "a1", "e0", "10.0.1.1:2379")->add_errors("memberID:a1 alarm:NOSPACE");
  v1::StoreMember* unlisted = ailing->add_members();
  unlisted->set_id("c3");
  unlisted->set_name("e2");
  unlisted->add_client_urls("http://10.0.1.3:2379");
  ailing->add_unanswered("10.0.1.2:2379: failed to connect to all addresses");
  AskedMember(ailing, "d4", "e3", "10.0.1.4:2379")->clear_leader_id();
  AskedMember(ailing, "e5", "e4", "10.0.1.5:2379")->set_unanswered("connection refused");
  v1::StoreProbe* gone = probes.add_stores();
  gone->set_name("etcd://10.0.2.1:2379/jobs");
  gone->set_list_error("UNAVAILABLE: no member answered");
  gone->add_unanswered("10.0.2.1:2379: connection refused");

  const std::vector<Finding> findings = Diagnose(Healthy(), Probes{nullptr, &probes}, kNow);
  const std::string first = "etcd etcd://10.0.0.1:2379,10.0.0.2:2379/jobs";
  EXPECT_THAT(Details(findings, first, Level::kOk),
              ElementsAre(HasSubstr("member infra0 at 10.0.0.1:2379: etcd 3.4.23, leader infra0, "
                                    "term 4, db 20 MiB"),
                          HasSubstr("member infra1 at 10.0.0.2:2379"),
                          "2 members, every endpoint answers, leader infra0"));
  EXPECT_THAT(Details(findings, first, Level::kProblem), IsEmpty());

  const std::string second = "etcd etcd://10.0.1.1:2379,10.0.1.2:2379/jobs";
  EXPECT_THAT(Details(findings, second, Level::kProblem),
              ElementsAre(HasSubstr("member e0 at 10.0.1.1:2379 raises: memberID:a1 alarm:NOSPACE"),
                          HasSubstr("member e3 at 10.0.1.4:2379 has no leader")));
  EXPECT_THAT(Details(findings, second, Level::kNote),
              ElementsAre(HasSubstr("member e2 (http://10.0.1.3:2379) is not among the URL's "
                                    "endpoints")));
  // Another member answers: one that does not is a warning (the store fails over).
  EXPECT_THAT(Details(findings, second, Level::kWarning),
              ElementsAre("member e4 at 10.0.1.5:2379 does not answer: connection refused",
                          HasSubstr("endpoint 10.0.1.2:2379: failed to connect")));
  for (const Finding& finding : findings) {
    if (finding.check == second && absl::StrContains(finding.detail, "NOSPACE")) {
      EXPECT_THAT(finding.fix, HasSubstr("etcdctl alarm disarm"));
    }
  }

  const std::string third = "etcd etcd://10.0.2.1:2379/jobs";
  EXPECT_THAT(Details(findings, third, Level::kProblem),
              ElementsAre(HasSubstr("connection refused"),
                          HasSubstr("the members could not be listed: UNAVAILABLE")));
  EXPECT_THAT(Details(findings, third, Level::kOk), IsEmpty());
}

TEST(DoctorTest, NearTheOpenFileLimitIsAWarning) {
  v1::StatusResponse status = Healthy();
  status.mutable_limits()->set_open_file_limit(2000);
  status.mutable_limits()->set_open_files(1700);
  const Finding files = Of(Diagnose(status, Probes(), kNow), "open files");
  EXPECT_EQ(files.level, Level::kWarning);
  EXPECT_THAT(files.detail, HasSubstr("1700 of 2000"));
}

}  // namespace
}  // namespace tpd
