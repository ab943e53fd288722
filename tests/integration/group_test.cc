// Groups across real daemons: three tpd processes on loopback ("nodes" a, b, c), each with its
// own socket and peer port; daemon a serves the groups' store (tcp:// and env:// name its
// peer port). Clients are tpd::Client sessions in this process, or tpctl processes where a
// client must die.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "proto/control.grpc.pb.h"
#include "proto/store.grpc.pb.h"
#include "proto/store_scope.h"
#include "tests/testing/daemon_nodes.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/group_recorder.h"
#include "tests/testing/group_store_checks.h"
#include "tests/testing/raw_session.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using testing::ExpectSameGapFreeVersions;
using testing::GroupRecorder;
using ::testing::HasSubstr;
using testing::RunfilePath;
using testing::TempDir;
using testing::WaitUntil;

constexpr int kNodes = 3;

class GroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(nodes_.StartAll());
    init_method_ = nodes_.init_method();
  }

  std::unique_ptr<Client> Connect(int node) { return nodes_.Connect(node); }

  JoinOptions Options(const std::string& group, int rank, std::optional<int64_t> world_size) {
    JoinOptions options;
    options.group = group;
    options.name = absl::StrCat("w", rank);
    options.rank = rank;
    options.world_size = world_size;
    options.init_method = init_method_;
    options.timeout = absl::Seconds(60);
    // These tests read who joined from the answers (by default they leave the list out).
    options.include_members = true;
    return options;
  }

  // Joins ranks 0..world_size-1 of a static group, rank r through node r % kNodes, each from
  // its own client (session, kept in clients_) and thread. Returns each rank's result.
  std::vector<absl::StatusOr<v1::JoinResponse>> JoinStatic(
      const std::string& group, int world_size,
      std::function<void(int, JoinOptions*)> customize = nullptr) {
    std::vector<Client*> ranks;
    for (int r = 0; r < world_size; ++r) {
      clients_.push_back(Connect(r % kNodes));
      ranks.push_back(clients_.back().get());
    }
    return testing::JoinStatic(ranks, Options(group, 0, world_size), customize);
  }

  // Shared by the nodes: file:// rendezvous files go here (every node allows it).
  TempDir dir_;
  testing::DaemonNodes nodes_{
      {"node-a", "node-b", "node-c"}, [this](int) {
        return absl::StrCat("heartbeat_interval_ms = 100\nheartbeat_timeout_ms = 1000\n",
                            "[group]\ncuda_device_count = 2\n", "file_rendezvous_dirs = [\"",
                            dir_.path(), "\"]\n", "[daemon]\nshutdown_grace_ms = 600000\n");
      }};
  std::string init_method_;
  std::vector<std::unique_ptr<Client>> clients_;
};

void ExpectFormed(const std::vector<absl::StatusOr<v1::JoinResponse>>& results, int world_size) {
  ASSERT_EQ(results.size(), world_size);
  std::set<std::string> nodes;
  for (int r = 0; r < world_size; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    const v1::GroupView& view = results[r]->group();
    EXPECT_EQ(results[r]->rank(), r);
    EXPECT_EQ(view.phase(), "FORMED");
    EXPECT_EQ(view.members_size(), world_size);
    // Every rank sees the very same formed version.
    EXPECT_EQ(view.version(), results[0]->group().version());
    for (const v1::Member& member : view.members()) nodes.insert(member.node());
  }
  EXPECT_EQ(nodes.size(), kNodes) << "members should span every daemon";
}

TEST_F(GroupTest, StaticGroupOfEightFormsOverThreeDaemonsViaTcp) {
  ExpectFormed(JoinStatic("tcp8", 8), 8);
}

// Each of `results` but `except` failed naming `reason`: at once (their joins wait 60 s, and a
// timeout would name the missing ranks instead).
void ExpectAllFailedFor(const std::vector<absl::StatusOr<v1::JoinResponse>>& results, int except,
                        const std::string& reason) {
  for (int r = 0; r < static_cast<int>(results.size()); ++r) {
    if (r == except) continue;
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    // ABORTED while waiting, FAILED_PRECONDITION for a rank that came after the failure.
    EXPECT_TRUE(absl::IsAborted(results[r].status()) ||
                absl::IsFailedPrecondition(results[r].status()))
        << "rank " << r << ": " << results[r].status();
    EXPECT_THAT(results[r].status().message(), HasSubstr(reason)) << "rank " << r;
  }
}

TEST_F(GroupTest, ARankThatCannotTakePartFailsTheOthersAtOnceNamingItAndWhy) {
  // Rank 2 was refused shared memory (say): it abandons, and the group fails on every node.
  std::vector<absl::StatusOr<v1::JoinResponse>> results =
      JoinStatic("abandoned", 4, [](int r, JoinOptions* options) {
        if (r == 2) options->abandon = "data.max_sessions (1) sessions are attached";
      });
  EXPECT_TRUE(absl::IsAborted(results[2].status())) << results[2].status();
  ExpectAllFailedFor(results, 2,
                     "rank 2 (w2) cannot take part: data.max_sessions (1) sessions are "
                     "attached");
  absl::StatusOr<v1::GroupView> view = clients_[0]->GetGroup("abandoned", init_method_);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->phase(), "FAILED");

  // Options PyTorch refuses as they are set (a CPU device among the devices): that rank gets
  // its own error, the others are told it was refused.
  results = JoinStatic("cpu-device", 3, [](int r, JoinOptions* options) {
    if (r == 1) options->options.add_devices("cpu");
  });
  EXPECT_TRUE(absl::IsInvalidArgument(results[1].status())) << results[1].status();
  EXPECT_THAT(results[1].status().message(), HasSubstr("expect a list of CUDA devices"));
  ExpectAllFailedFor(results, 1,
                     "rank 1 (w1) was refused at its join: worker w1 on node node-b: "
                     "`set_devices` expect a list of CUDA devices");
}

TEST_F(GroupTest, AStaticGroupsBarrierCountsMembersGoneAsArrivedAndNamesThem) {
  ExpectFormed(JoinStatic("bar3", 3), 3);
  // Rank 2's process goes away without leaving (its session ends: the daemon knows at once).
  clients_[2].reset();
  std::vector<std::string> gone[2];
  absl::Status entered[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      entered[r] = clients_[r]->Barrier("bar3", absl::StrCat("w", r), absl::Seconds(60), &gone[r]);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(entered[r].ok()) << "rank " << r << ": " << entered[r];
    EXPECT_THAT(gone[r], ::testing::ElementsAre("w2")) << "rank " << r;
  }
  // With everyone there, nobody is named.
  for (const auto& joined : JoinStatic("bar2", 2)) ASSERT_TRUE(joined.ok()) << joined.status();
  std::vector<std::string> none{"x"};
  std::thread other(
      [&] { ASSERT_TRUE(clients_[4]->Barrier("bar2", "w1", absl::Seconds(60)).ok()); });
  EXPECT_TRUE(clients_[3]->Barrier("bar2", "w0", absl::Seconds(60), &none).ok());
  other.join();
  EXPECT_TRUE(none.empty());
}

TEST_F(GroupTest, JoinAnswersLeaveTheMemberListOutUnlessAskedFor) {
  // Ranks 0..3 take the default (what thousands of ranks do); 4..7 ask for the list.
  std::vector<absl::StatusOr<v1::JoinResponse>> results = JoinStatic(
      "lean8", 8, [](int r, JoinOptions* options) { options->include_members = r >= 4; });
  for (int r = 0; r < 8; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    const v1::GroupView& view = results[r]->group();
    EXPECT_EQ(results[r]->rank(), r);
    EXPECT_EQ(view.phase(), "FORMED");
    EXPECT_EQ(view.world_size(), 8);
    EXPECT_EQ(view.version(), results[7]->group().version());
    EXPECT_FALSE(view.transports().empty()) << "the negotiated options are there";
    EXPECT_EQ(results[r]->negotiated().name(), absl::StrCat("w", r)) << "and its own entry";
    EXPECT_EQ(view.members_size(), r < 4 ? 0 : 8) << "rank " << r;
  }
  // The list is one GetGroup away.
  absl::StatusOr<v1::GroupView> full = clients_[0]->GetGroup("lean8", init_method_);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->members_size(), 8);
}

TEST_F(GroupTest, ClientsCannotReachTheDaemonsOwnKeys) {
  ExpectFormed(JoinStatic("own", 3), 3);
  std::unique_ptr<Client> client = Connect(0);
  ASSERT_NE(client, nullptr);
  // Node a's store holds the group's versions and every node's heartbeat, yet a client of
  // node a counts none of them...
  EXPECT_EQ(*client->Store().NumKeys(), 0);
  // ...and cannot write a forged next version through the Store API, nor touch a heartbeat:
  // the daemon and the group go on.
  absl::StatusOr<v1::GroupView> before = client->GetGroup("own", init_method_);
  ASSERT_TRUE(before.ok()) << before.status();
  const std::string next = absl::StrCat("tpd/group/own/v/", before->version() + 1);
  absl::StatusOr<std::string> forged = client->Store().CompareSet(next, "", "garbage");
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kPermissionDenied) << forged.status();
  EXPECT_THAT(forged.status().message(), HasSubstr("reserved"));
  EXPECT_EQ(client->Store().Set("tpd/node/node-b", "1:1").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(client->Store().Check({next}).status().code(), absl::StatusCode::kPermissionDenied);
  // Keys of the client's own are unaffected.
  ASSERT_TRUE(client->Store().Set("tpdish", "v").ok());
  EXPECT_EQ(*client->Store().NumKeys(), 1);
  absl::StatusOr<v1::GroupView> after = client->GetGroup("own", init_method_);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->phase(), "FORMED");
  EXPECT_EQ(after->version(), before->version());
}

TEST_F(GroupTest, MembersOnEveryNodeShareTheGroupsStoreViaTcpAndFile) {
  ExpectFormed(JoinStatic("kv_tcp", 3), 3);
  testing::ExpectOneGroupStore({clients_[0].get(), clients_[1].get(), clients_[2].get()}, "kv_tcp");
  const std::string path = absl::StrCat(dir_.path(), "/kv_rendezvous");
  ExpectFormed(JoinStatic("kv_file", 3,
                          [&path](int, JoinOptions* options) {
                            options->init_method = absl::StrCat("file://", path);
                          }),
               3);
  testing::ExpectOneGroupStore({clients_[3].get(), clients_[4].get(), clients_[5].get()},
                               "kv_file");
  // One group's keys are not another's.
  absl::StatusOr<bool> other = clients_[0]->GroupStore("kv_tcp").Check({"k"});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(*other);
  EXPECT_FALSE(*clients_[0]->GroupStore("kv_tcp").Check({"absent"}));
}

TEST_F(GroupTest, OnlyAMembersSessionReachesAGroupsStore) {
  ExpectFormed(JoinStatic("closed", 3), 3);
  ASSERT_TRUE(clients_[0]->GroupStore("closed").Set("k", "members only").ok());
  // A client of the same node holding no member: one with a session in another group, and
  // one that never joined anything.
  std::unique_ptr<Client> outsider = Connect(0);
  ASSERT_NE(outsider, nullptr);
  ASSERT_TRUE(outsider->Join(Options("elsewhere", 0, std::nullopt)).ok());
  std::unique_ptr<Client> stranger = Connect(1);
  ASSERT_NE(stranger, nullptr);
  for (Client* client : {outsider.get(), stranger.get()}) {
    absl::StatusOr<std::string> got = client->GroupStore("closed").Get("k", absl::Seconds(1));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied) << got.status();
    EXPECT_THAT(got.status().message(), HasSubstr("holds no member of group closed"));
    EXPECT_EQ(client->GroupStore("closed").Set("k", "forged").code(),
              absl::StatusCode::kPermissionDenied);
  }
  // Raw requests: a session id that is no session, no session at all, a bad group name.
  auto stub = v1::Store::NewStub(grpc::CreateChannel(absl::StrCat("unix:", nodes_.socket(0)),
                                                     grpc::InsecureChannelCredentials()));
  auto set = [&stub](const std::vector<std::pair<std::string, std::string>>& metadata) {
    grpc::ClientContext context;
    for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
    v1::SetRequest request;
    request.set_key("k");
    request.set_value("forged");
    v1::SetResponse response;
    return stub->Set(&context, request, &response);
  };
  grpc::Status forged = set({{kStoreGroupMetadata, "closed"}, {kStoreSessionMetadata, "s-0"}});
  EXPECT_EQ(forged.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(forged.error_message(), HasSubstr("unknown or ended session"));
  grpc::Status sessionless = set({{kStoreGroupMetadata, "closed"}});
  EXPECT_EQ(sessionless.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(sessionless.error_message(), HasSubstr("join the group first"));
  grpc::Status bad = set({{kStoreGroupMetadata, "../closed"}, {kStoreSessionMetadata, "s-0"}});
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("metadata tpd-group: group name"));
  // Nothing changed, and a member that leaves loses the store with its membership.
  EXPECT_EQ(*clients_[1]->GroupStore("closed").Get("k"), "members only");
  ASSERT_TRUE(outsider->Leave("elsewhere", "w0").ok());
  ASSERT_TRUE(clients_[1]->Leave("closed", "w1").ok());
  EXPECT_EQ(clients_[1]->GroupStore("closed").Check({"k"}).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(GroupTest, TpctlRefusesADeviceMappedTwiceTowardOneWorker) {
  testing::ProcessResult result = testing::RunProcess(
      {RunfilePath("client/tpctl"), "--socket", nodes_.socket(0), "--init_method", init_method_,
       "--device_maps", "w1:0=1;w1:0=0", "group", "join", "maps", "w0"});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_THAT(result.output, HasSubstr("device 0 is mapped twice toward w1 (to 1 and to 0)"));
}

TEST_F(GroupTest, TpctlTakesTheSameDevicePairGivenTwice) {
  // A dynamic group of one: the join goes through, with the pair once.
  testing::ProcessResult result = testing::RunProcess(
      {RunfilePath("client/tpctl"), "--socket", nodes_.socket(0), "--init_method", init_method_,
       "--device_maps", "w1:0=1;w1:0=1", "group", "join", "maps_twice", "w0"});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("device_maps {w1: {")) << result.output;
}

TEST_F(GroupTest, AStoreThatNeverAnswersStallsNoOtherCall) {
  // A TCP port that accepts connections and never says a word (the kernel completes the
  // handshake for the backlog; nobody reads).
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(silent, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(silent, 128), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(silent, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string silent_url = absl::StrCat("tcp://127.0.0.1:", ntohs(address.sin_port));

  std::vector<std::thread> lookups;
  std::atomic<int> answered{0};
  for (int i = 0; i < 40; ++i) {
    lookups.emplace_back([&, i] {
      std::unique_ptr<Client> client = Connect(0);
      if (client == nullptr) return;
      absl::StatusOr<v1::GroupView> view = client->GetGroup(absl::StrCat("silent", i), silent_url);
      // It ends, with an error naming the store, instead of hanging.
      EXPECT_FALSE(view.ok());
      ++answered;
    });
  }
  // Meanwhile the daemon answers health and local store calls well within a short deadline.
  ClientOptions quick;
  quick.call_timeout = absl::Seconds(2);
  auto client = Client::Connect(nodes_.socket(0), quick);
  ASSERT_TRUE(client.ok()) << client.status();
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE((*client)->Serving().value_or(false));
    EXPECT_TRUE((*client)->Store().Set(absl::StrCat("k", i), "v").ok());
  }
  for (std::thread& thread : lookups) thread.join();
  EXPECT_EQ(answered.load(), 40);
  close(silent);
}

TEST_F(GroupTest, StaticGroupOfEightFormsOverThreeDaemonsViaEnv) {
  auto results = JoinStatic("env8", 8, [this](int r, JoinOptions* options) {
    const size_t colon = nodes_.peer_address(0).rfind(':');
    options->init_method = "env://";
    options->rank.reset();
    options->world_size.reset();
    options->env = {{"MASTER_ADDR", nodes_.peer_address(0).substr(0, colon)},
                    {"MASTER_PORT", nodes_.peer_address(0).substr(colon + 1)},
                    {"RANK", absl::StrCat(r)},
                    {"WORLD_SIZE", "8"}};
  });
  ExpectFormed(results, 8);
}

TEST_F(GroupTest, StaticGroupOfEightFormsOverThreeDaemonsViaFile) {
  const std::string path = absl::StrCat(dir_.path(), "/rendezvous");
  auto results = JoinStatic("file8", 8, [&path](int, JoinOptions* options) {
    options->init_method = absl::StrCat("file://", path);
  });
  ExpectFormed(results, 8);
  EXPECT_EQ(results[0]->group().store(), absl::StrCat("file://", path));
}

TEST_F(GroupTest, NegotiatedDeviceMapsAndReverseMapsReachEveryMember) {
  auto results = JoinStatic("maps", 3, [](int r, JoinOptions* options) {
    (*(*options->options.mutable_device_maps())[absl::StrCat("w", (r + 1) % 3)]
          .mutable_devices())["cuda:0"] = "cuda:1";
  });
  ExpectFormed(results, 3);
  // Each Join answers its own negotiation; GetGroup has everyone's.
  const v1::NegotiatedMember& w1 = results[1]->negotiated();
  EXPECT_EQ(w1.name(), "w1");
  ASSERT_EQ(w1.reverse_device_maps().count("w0"), 1);
  EXPECT_EQ(w1.reverse_device_maps().at("w0").devices().at("cuda:1"), "cuda:0");
  EXPECT_EQ(w1.device_maps().at("w2").devices().at("cuda:0"), "cuda:1");
  EXPECT_TRUE(results[1]->group().negotiated().empty());
  v1::GroupView full = *clients_[0]->GetGroup("maps");
  EXPECT_EQ(full.negotiated_size(), 3);
}

TEST_F(GroupTest, InvalidDeviceMapFailsEveryJoinNamingTheNode) {
  auto results = JoinStatic("badmap", 3, [](int r, JoinOptions* options) {
    if (r == 2) (*(*options->options.mutable_device_maps())["w9"].mutable_devices())["0"] = "1";
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kInvalidArgument) << r;
    EXPECT_THAT(results[r].status().message(), HasSubstr("Node w2 has invalid target node names"));
  }
}

TEST_F(GroupTest, FailedStaticGroupFormsAgainOnceItsMembersLeft) {
  // w0 and w2 wait in the group; then w1 joins with an option no member may use.
  std::vector<absl::StatusOr<v1::JoinResponse>> failed(3, absl::UnknownError("not run"));
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < 3; ++r) clients.push_back(Connect(r));
  std::vector<std::thread> waiting;
  for (int r : {0, 2}) {
    waiting.emplace_back([&, r] { failed[r] = clients[r]->Join(Options("again", r, 3)); });
  }
  ASSERT_TRUE(WaitUntil([&] {
    absl::StatusOr<v1::GroupView> view = clients[1]->GetGroup("again", init_method_);
    return view.ok() && view->members_size() == 2;
  })) << "w0 and w2 never showed as members";
  JoinOptions bad = Options("again", 1, 3);
  bad.options.add_transports("carrier-pigeon");
  failed[1] = clients[1]->Join(bad);
  for (std::thread& thread : waiting) thread.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(failed[r].status().code(), absl::StatusCode::kInvalidArgument)
        << r << ": " << failed[r].status();
    EXPECT_THAT(failed[r].status().message(), HasSubstr("Unknown transport: carrier-pigeon"));
  }
  // The FAILED group's members leave by themselves (their sessions stay open)...
  for (int node = 0; node < kNodes; ++node) {
    auto client = Connect(node);
    ASSERT_TRUE(WaitUntil([&] {
      absl::StatusOr<v1::GroupView> view = client->GetGroup("again");
      return view.ok() && view->members_size() == 0;
    })) << "the FAILED group's members never left, seen from node "
        << node;
  }
  // ...and the same ranks and names form it now.
  ExpectFormed(JoinStatic("again", 3), 3);
}

TEST_F(GroupTest, WhenEveryRankIsInvalidEveryRankGetsRankZerosError) {
  // torch's test_device_maps_invalid_max_local_device and _many_to_one: every rank maps toward
  // the next one; all must raise rank 0's error, however the joins interleave (a group failed
  // early used to tell only the ranks there, and the rest waited for a group never formed).
  auto out_of_range = JoinStatic("all-bad-index", 3, [](int r, JoinOptions* options) {
    (*(*options->options.mutable_device_maps())[absl::StrCat("w", (r + 1) % 3)]
          .mutable_devices())["cuda:2"] = "cuda:0";
  });
  auto many_to_one = JoinStatic("all-many-to-one", 3, [](int r, JoinOptions* options) {
    auto* devices =
        (*options->options.mutable_device_maps())[absl::StrCat("w", (r + 1) % 3)].mutable_devices();
    (*devices)["cuda:1"] = "cuda:0";
    (*devices)["cuda:0"] = "cuda:0";
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out_of_range[r].status().code(), absl::StatusCode::kInvalidArgument) << r;
    EXPECT_THAT(out_of_range[r].status().message(),
                HasSubstr("Node w0 has source devices with invalid indices in its device map "
                          "for w1\ndevice map = {cuda:2: cuda:0}\ndevice count = 2"));
    EXPECT_EQ(many_to_one[r].status().code(), absl::StatusCode::kInvalidArgument) << r;
    EXPECT_THAT(many_to_one[r].status().message(),
                HasSubstr("Node w0 has duplicated target devices in its device map for w1"));
  }
}

TEST_F(GroupTest, TargetIndexBeyondDeviceCountIsRefusedAtJoin) {
  auto client = Connect(1);
  JoinOptions first = Options("dyn-maps", 0, std::nullopt);
  ASSERT_TRUE(client->Join(first).ok());
  JoinOptions bad = Options("dyn-maps", 1, std::nullopt);
  (*(*bad.options.mutable_device_maps())["w0"].mutable_devices())["cuda:0"] = "cuda:7";
  auto other = Connect(2);
  absl::StatusOr<v1::JoinResponse> refused = other->Join(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("w1"));
  EXPECT_THAT(refused.status().message(), HasSubstr("invalid indices"));
  EXPECT_EQ(client->GetGroup("dyn-maps")->members_size(), 1);
}

TEST_F(GroupTest, BadInitMethodsAnswerPyTorchsMessages) {
  auto client = Connect(0);
  struct Case {
    std::string url;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"foo://x:1", "No rendezvous handler for foo://"},
           {"tcp://127.0.0.1", "port number missing"},
           {"env://", "environment variable MASTER_ADDR expected, but not set"},
           {"file://", "path missing"},
       }) {
    JoinOptions options = Options("bad-url", 0, std::nullopt);
    options.init_method = c.url;
    options.env = {{"UNRELATED", "1"}};
    absl::StatusOr<v1::JoinResponse> result = client->Join(options);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << c.url;
    EXPECT_THAT(result.status().message(), HasSubstr(c.message)) << c.url;
  }
  JoinOptions no_rank = Options("bad-url", 0, 4);
  no_rank.rank.reset();
  no_rank.init_method = absl::StrCat(init_method_, "?world_size=4");
  no_rank.world_size.reset();
  EXPECT_THAT(client->Join(no_rank).status().message(), HasSubstr("rank parameter missing"));
}

TEST_F(GroupTest, StaticJoinTimesOutNamingMissingRanksAndFreesItsRank) {
  auto client = Connect(1);
  JoinOptions options = Options("partial", 1, 3);
  options.timeout = absl::Milliseconds(300);
  absl::StatusOr<v1::JoinResponse> result = client->Join(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(result.status().message(), HasSubstr("ranks [0, 2]"));
  // The rank was released: the group is empty again.
  EXPECT_TRUE(WaitUntil([&] {
    absl::StatusOr<v1::GroupView> view = client->GetGroup("partial");
    return view.ok() && view->members_size() == 0;
  })) << "the timed-out join's rank was never given back";
}

TEST_F(GroupTest, DynamicChurnGivesEveryWatcherTheSameVersionSequence) {
  auto watcher_a = Connect(0);
  auto watcher_c = Connect(2);
  GroupRecorder on_a(watcher_a.get(), "churn", init_method_);
  GroupRecorder on_c(watcher_c.get(), "churn", init_method_);
  // Six workers over three daemons join and leave repeatedly; w0 stays throughout.
  auto anchor = Connect(0);
  ASSERT_TRUE(anchor->Join(Options("churn", 0, std::nullopt)).ok());
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int w = 1; w <= 6; ++w) {
    threads.emplace_back([&, w] {
      auto client = Connect(w % kNodes);
      JoinOptions options = Options("churn", w, std::nullopt);
      options.rank.reset();  // ranks assigned by the group
      for (int round = 0; round < 5; ++round) {
        if (!client->Join(options).ok()) ++errors;
        if (!client->Leave("churn", options.name).ok()) ++errors;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(errors.load(), 0);
  // Node a learns the last departures by push: wait for its view to settle.
  const absl::Time settle = absl::Now() + absl::Seconds(20);
  v1::GroupView final_view = *anchor->GetGroup("churn");
  while (final_view.members_size() != 1 && absl::Now() < settle) {
    absl::SleepFor(absl::Milliseconds(5));
    final_view = *anchor->GetGroup("churn");
  }
  ASSERT_EQ(final_view.members_size(), 1);
  EXPECT_EQ(final_view.members(0).name(), "w0");
  const int64_t last = final_view.version();
  ASSERT_TRUE(on_a.WaitForVersion(last, absl::Seconds(20)));
  ASSERT_TRUE(on_c.WaitForVersion(last, absl::Seconds(20)));
  ExpectSameGapFreeVersions({on_a.events(), on_c.events()});
}

TEST_F(GroupTest, KilledClientLeavesAtOnceAndWatchersAreTold) {
  auto watcher = Connect(0);
  GroupRecorder events(watcher.get(), "kill-client", init_method_);
  const std::string tpctl = RunfilePath("client/tpctl");
  int in[2];
  ASSERT_EQ(pipe(in), 0);
  const pid_t child = fork();
  if (child == 0) {
    dup2(in[0], STDIN_FILENO);
    execl(tpctl.c_str(), tpctl.c_str(), "--socket", nodes_.socket(1).c_str(), "--init_method",
          init_method_.c_str(), "--hold", "group", "join", "kill-client", "victim", nullptr);
    _exit(127);
  }
  close(in[0]);
  ASSERT_TRUE(events.WaitFor(
      // JOINED, or a SNAPSHOT already holding the victim when the watch started late.
      [](const v1::GroupEvent& e) { return e.group().members_size() == 1; }, absl::Seconds(20)));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(events.WaitFor(
      [](const v1::GroupEvent& e) {
        return e.kind() == "LEFT" && e.group().members_size() == 0 &&
               e.detail().find("victim") != std::string::npos;
      },
      absl::Seconds(20)));
  // Session end, not heartbeat eviction: the departure is recorded well within a second.
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5));
  close(in[1]);
}

TEST_F(GroupTest, KilledDaemonIsEvictedBreaksStaticGroupAndRejoinsAsNewIncarnation) {
  ExpectFormed(JoinStatic("evict", 3), 3);
  auto watcher = Connect(0);
  GroupRecorder events(watcher.get(), "evict", init_method_);
  const uint64_t old_incarnation = Connect(2)->Status()->node().incarnation();
  nodes_.daemon(2)->Signal(SIGKILL);
  nodes_.daemon(2)->WaitExit(absl::Seconds(10));
  ASSERT_TRUE(events.WaitFor([](const v1::GroupEvent& e) { return e.group().phase() == "BROKEN"; },
                             absl::Seconds(20)));
  v1::GroupView broken = *watcher->GetGroup("evict");
  EXPECT_THAT(broken.reason(), HasSubstr("node-c"));
  for (const v1::Member& member : broken.members()) EXPECT_NE(member.node(), "node-c");

  // Restarted, node c is a new incarnation and joins a fresh dynamic group.
  ASSERT_NO_FATAL_FAILURE(nodes_.Start(2, /*keep_port=*/false));
  auto restarted = Connect(2);
  EXPECT_NE(restarted->Status()->node().incarnation(), old_incarnation);
  absl::StatusOr<v1::JoinResponse> rejoined =
      restarted->Join(Options("after-restart", 0, std::nullopt));
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(rejoined->group().members(0).incarnation(), restarted->Status()->node().incarnation());
}

TEST_F(GroupTest, StoppedDaemonIsEvictedAndOnResumeLearnsItAndCannotActOnOldMembership) {
  auto stopped = Connect(2);
  auto other = Connect(0);
  ASSERT_TRUE(other->Join(Options("stop", 0, std::nullopt)).ok());
  ASSERT_TRUE(stopped->Join(Options("stop", 2, std::nullopt)).ok());
  const uint64_t incarnation = stopped->Status()->node().incarnation();
  nodes_.daemon(2)->Signal(SIGSTOP);
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  v1::GroupView view = *other->GetGroup("stop");
  while (view.members_size() != 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    view = *other->GetGroup("stop");
  }
  ASSERT_EQ(view.members_size(), 1);
  nodes_.daemon(2)->Signal(SIGCONT);
  // On resume node c finds its member gone, takes a new incarnation, and refuses to act for it.
  deadline = absl::Now() + absl::Seconds(20);
  while (stopped->Status()->node().incarnation() == incarnation && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_NE(stopped->Status()->node().incarnation(), incarnation);
  EXPECT_EQ(stopped->Leave("stop", "w2").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(stopped->Barrier("stop", "w2", absl::Seconds(5)).code(),
            absl::StatusCode::kFailedPrecondition);
  // And it can join again, as its new self.
  absl::StatusOr<v1::JoinResponse> again = stopped->Join(Options("stop", 2, std::nullopt));
  ASSERT_TRUE(again.ok()) << again.status();
}

TEST_F(GroupTest, SigtermWithGroupsInUseLeavesExplicitlyAndExitsZero) {
  ExpectFormed(JoinStatic("graceful", 3), 3);
  // On node b also: a static join still waiting for its group, a barrier waiting for the
  // others, and a watch.
  auto waiting = Connect(1);
  absl::StatusOr<v1::JoinResponse> pending;
  std::thread pending_join([&] { pending = waiting->Join(Options("never-full", 0, 5)); });
  absl::Status barrier;
  std::thread barrier_wait(
      [&] { barrier = clients_[1]->Barrier("graceful", "w1", absl::Seconds(60)); });
  auto watcher = Connect(0);
  GroupRecorder on_a(watcher.get(), "graceful", init_method_);
  auto b_watch = Connect(1);
  GroupRecorder on_b(b_watch.get(), "graceful", "");
  // The pending join is recorded once node b knows the group and shows its member.
  auto observer = Connect(1);
  ASSERT_TRUE(WaitUntil([&] {
    absl::StatusOr<v1::GroupView> view = observer->GetGroup("never-full");
    return view.ok() && view->members_size() > 0;
  })) << "node b never showed the pending join's member";
  nodes_.daemon(1)->Signal(SIGTERM);
  // The fixture's grace period is 600 s: exiting here means nothing waited it out.
  EXPECT_EQ(nodes_.daemon(1)->WaitExit(absl::Seconds(60)), 0);
  pending_join.join();
  barrier_wait.join();
  EXPECT_EQ(pending.status().code(), absl::StatusCode::kUnavailable) << pending.status();
  EXPECT_EQ(barrier.code(), absl::StatusCode::kUnavailable) << barrier;
  // The other daemons saw node b's member leave (not a late eviction).
  EXPECT_TRUE(on_a.WaitFor(
      [](const v1::GroupEvent& e) {
        return e.group().phase() == "BROKEN" && e.detail().find("w1") != std::string::npos &&
               e.group().reason().find("left") != std::string::npos;
      },
      absl::Seconds(20)));
}

TEST_F(GroupTest, JoinAbandonedByItsClientIsWithdrawn) {
  // A raw client whose RPC deadline (300 ms) is far shorter than the join's own timeout
  // (the daemon default): when it gives up, its member must not linger in the group.
  auto channel = grpc::CreateChannel(absl::StrCat("unix:", nodes_.socket(1)),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Control::NewStub(channel);
  grpc::ClientContext session_context;
  auto session = stub->OpenSession(&session_context, v1::OpenSessionRequest());
  v1::SessionEvent opened;
  ASSERT_TRUE(session->Read(&opened));
  ASSERT_TRUE(testing::IdentifyRawSession(nodes_.socket(1), opened.session_id()).ok());
  v1::JoinRequest request;
  request.set_session_id(opened.session_id());
  request.set_group("abandoned");
  request.set_name("w0");
  request.set_rank(0);
  request.set_world_size(2);
  request.set_init_method(init_method_);
  grpc::ClientContext join_context;
  join_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
  v1::JoinResponse response;
  grpc::Status status = stub->Join(&join_context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);

  auto observer = Connect(1);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  absl::StatusOr<v1::GroupView> view = observer->GetGroup("abandoned");
  while ((!view.ok() || view->members_size() != 0) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
    view = observer->GetGroup("abandoned");
  }
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->members_size(), 0);
  // The same session may join again under the same name.
  grpc::ClientContext again_context;
  again_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
  request.set_world_size(1);
  EXPECT_TRUE(stub->Join(&again_context, request, &response).ok());
  session_context.TryCancel();
}

TEST_F(GroupTest, DynamicGroupSurvivesRankZeroLeaving) {
  auto zero = Connect(0);
  auto one = Connect(1);
  ASSERT_TRUE(zero->Join(Options("no-special", 0, std::nullopt)).ok());
  ASSERT_TRUE(one->Join(Options("no-special", 1, std::nullopt)).ok());
  ASSERT_TRUE(zero->Leave("no-special", "w0").ok());
  // Node b learns of the departure by push; wait for it rather than for a fixed time.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  v1::GroupView view = *one->GetGroup("no-special");
  while (view.members_size() != 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    view = *one->GetGroup("no-special");
  }
  ASSERT_EQ(view.members_size(), 1);
  EXPECT_EQ(view.members(0).name(), "w1");
  EXPECT_EQ(view.phase(), "DYNAMIC");
}

// Store calls that node a (which serves the groups' store) answered for peers, by method.
int64_t StoreCalls(Client* node_a, const std::string& method) {
  absl::StatusOr<v1::StatusResponse> status = node_a->Status();
  if (!status.ok()) return -1;
  auto it = status->store().calls().find(method);
  return it == status->store().calls().end() ? 0 : it->second;
}

TEST_F(GroupTest, BarrierReleasesOnlyWhenEveryMemberArrived) {
  ExpectFormed(JoinStatic("barrier", 3), 3);
  // w1 (node b) and w2 (node c) arrive first. A barrier arrival is an Add on the group's
  // store, which node a serves: its count of Add calls tells when both have arrived.
  auto node_a = Connect(0);
  const int64_t adds_before = StoreCalls(node_a.get(), "Add");
  std::atomic<int> released{0};
  std::vector<std::thread> threads;
  for (int r = 1; r <= 2; ++r) {
    threads.emplace_back([&, r] {
      if (clients_[r]->Barrier("barrier", absl::StrCat("w", r), absl::Seconds(30)).ok()) ++released;
    });
  }
  EXPECT_TRUE(WaitUntil([&] { return StoreCalls(node_a.get(), "Add") >= adds_before + 2; }))
      << "w1 and w2 never arrived at the barrier";
  // Two of three arrived: nobody may pass.
  EXPECT_EQ(released.load(), 0);
  ASSERT_TRUE(clients_[0]->Barrier("barrier", "w0", absl::Seconds(30)).ok());
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(released.load(), 2);
}

TEST_F(GroupTest, BarrierTimesOutNamingTheRoundWhenAMemberNeverArrives) {
  ExpectFormed(JoinStatic("late", 3), 3);
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      results[r] = clients_[r]->Barrier("late", absl::StrCat("w", r), absl::Milliseconds(500));
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kDeadlineExceeded) << results[r];
    EXPECT_THAT(results[r].message(), HasSubstr("barrier round 1 timed out waiting for all 3"));
  }
}

TEST_F(GroupTest, StatusShowsGroupsMembersAndPeers) {
  ExpectFormed(JoinStatic("status", 3), 3);
  auto client = Connect(1);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::StatusOr<v1::StatusResponse> status = client->Status();
  while (status->peers_size() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    status = client->Status();
  }
  EXPECT_EQ(status->node().name(), "node-b");
  EXPECT_EQ(status->node().device_count(), 2);
  ASSERT_EQ(status->groups_size(), 1);
  EXPECT_EQ(status->groups(0).phase(), "FORMED");
  EXPECT_EQ(status->groups(0).negotiated_size(), 3);
  EXPECT_EQ(status->peers_size(), 2);
  // Its liveness in the group's store: a counter it writes (a tcp:// store has no leases).
  ASSERT_EQ(status->rendezvous_stores_size(), 1);
  const v1::RendezvousStoreInfo& store = status->rendezvous_stores(0);
  EXPECT_EQ(store.name(), status->groups(0).store());
  EXPECT_EQ(store.liveness(), "heartbeat");
  EXPECT_TRUE(store.lease_id().empty());
  EXPECT_GT(store.last_beat_unix_ms(), 0);
  testing::ProcessResult printed =
      testing::RunProcess({RunfilePath("client/tpctl"), "--socket", nodes_.socket(1), "status"});
  EXPECT_THAT(printed.output,
              HasSubstr(absl::StrCat("store ", store.name(), ": liveness by heartbeat, last ")));
  // Control calls are counted apart from store calls.
  EXPECT_GE(status->control_calls().at("Join"), 1);
  EXPECT_EQ(status->store().calls().count("Join"), 0);
}

}  // namespace
}  // namespace tpd
