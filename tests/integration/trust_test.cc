// Trust on one node (docs/security.md; FAULTS.md B5): what another user of the node, or a
// process that knows a group's name but not its secret, can make a real daemon do, and what a
// hostile session can do to other sessions' answers and to the daemon's memory and journal.
//
//   - another uid can neither join a group (nor take a departed member's name), nor call its
//     workers; a process of the owner's uid without the group's secret cannot join either;
//   - session ids are never printed: the handles that are printed grant nothing, and a
//     session identified by one uid cannot be attached by another;
//   - a reply that finds its caller's completion ring full still reaches it, and a session
//     that never reads its completions is ended past a bound;
//   - attached sessions and open sessions are bounded per uid and in all, with errors naming
//     the settings, and tpctl status shows the use per uid;
//   - warnings a client can cause are rate-limited;
//   - a thread that cannot start (a pids limit) refuses one attach, and the daemon serves on.
//
// The second user is uid 65534 (tests/testing/second_user.h); its cases skip when the test
// does not run as root.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "daemon/router/session_handle.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/control.grpc.pb.h"
#include "shm/descriptor.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_session.h"
#include "tests/testing/second_user.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;
using testing::WaitUntil;

// The line "<step>: ..." of the second user's output, or "" when there is none.
std::string Step(const std::string& output, const std::string& step) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (absl::StartsWith(line, absl::StrCat(step, ": "))) return std::string(line);
  }
  return "";
}

int CountOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

class TrustTest : public ::testing::Test {
 protected:
  // A daemon open to every user of the machine (socket mode 0666 in a 0711 directory), with
  // `data` added to its [data] table.
  void Start(const std::string& data = "") {
    testing::OpenDirToSecondUser(dir_.path());
    socket_ = absl::StrCat(dir_.path(), "/tpd.sock");
    const std::string config = dir_.WriteFile(
        "tpd.toml",
        absl::StrCat("[daemon]\nsocket_mode = \"0666\"\n",
                     "[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"secret\"\n",
                     "node_name = \"trust\"\n[data]\narena_bytes = ", 4 << 20, "\n", data));
    auto daemon = DaemonProcess::Start(socket_, {"--config", config});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    std::unique_ptr<Client> probe = Connect();
    ASSERT_NE(probe, nullptr);
    init_method_ = absl::StrCat("tcp://", probe->Status()->peer_address());
  }

  std::unique_ptr<Client> Connect() {
    auto client = Client::Connect(socket_);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  absl::Status Join(Client* client, const std::string& group, const std::string& name,
                    const std::string& secret = "") {
    JoinOptions options;
    options.group = group;
    options.name = name;
    options.init_method = init_method_;
    options.secret = secret;
    options.timeout = absl::Seconds(20);
    return client->Join(options).status();
  }

  // A client joined to `group` as `name` that echoes method "echo".
  std::unique_ptr<Client> Echoer(const std::string& group, const std::string& name,
                                 const std::string& secret = "") {
    std::unique_ptr<Client> client = Connect();
    if (client == nullptr) return nullptr;
    EXPECT_TRUE(Join(client.get(), group, name, secret).ok());
    EXPECT_TRUE(
        client
            ->Handle("echo",
                     [](const Message& request) -> absl::StatusOr<Message> { return request; })
            .ok());
    return client;
  }

  // A member `name` of `group` whose session the test drives by hand (RawSession): it reads its
  // completions only when the test says.
  std::unique_ptr<testing::RawSession> RawMember(const std::string& group,
                                                 const std::string& name) {
    std::unique_ptr<Client> client = Connect();
    if (client == nullptr || !Join(client.get(), group, name).ok()) return nullptr;
    auto raw = testing::RawSession::Open(std::move(client));
    EXPECT_TRUE(raw.ok()) << raw.status();
    return raw.ok() ? *std::move(raw) : nullptr;
  }

  testing::ProcessResult AsSecondUser(std::vector<std::string> args) {
    args.insert(args.begin(), absl::StrCat("--socket=", socket_));
    testing::ProcessResult result = testing::RunAsSecondUser(dir_.path(), args);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result;
  }

  std::string OpenRawSession(absl::Status* refused = nullptr) {
    if (raw_sessions_ == nullptr) {
      raw_sessions_ = std::make_unique<testing::RawSessionStreams>(socket_);
    }
    return raw_sessions_->Open(refused);
  }

  // Answers, releases and calls waiting for room on the completion rings of all attached
  // sessions.
  int64_t Unposted(Client* observer) {
    absl::StatusOr<v1::StatusResponse> status = observer->Status();
    int64_t unposted = 0;
    if (status.ok()) {
      for (const v1::AttachedSession& session : status->attached_sessions()) {
        unposted += session.unposted_completions();
      }
    }
    return unposted;
  }

  void TearDown() override {
    raw_sessions_.reset();
    if (daemon_ == nullptr) return;
    // Whatever happened, the daemon still serves a fresh client.
    std::unique_ptr<Client> c = Connect();
    ASSERT_NE(c, nullptr);
    absl::StatusOr<bool> serving = c->Serving();
    ASSERT_TRUE(serving.ok()) << serving.status();
    EXPECT_TRUE(*serving);
  }

  TempDir dir_;
  std::string socket_;
  std::string init_method_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<testing::RawSessionStreams> raw_sessions_;
};

TEST_F(TrustTest, AnotherUserCanNeitherJoinNorCallNorTakeADepartedMembersName) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  Start();
  std::unique_ptr<Client> a = Echoer("g", "a");
  std::unique_ptr<Client> b = Echoer("g", "b");
  ASSERT_TRUE(a && b);

  testing::ProcessResult tried = AsSecondUser(
      {"--group=g", "--name=x", absl::StrCat("--init_method=", init_method_), "--call=a"});
  EXPECT_THAT(Step(tried.output, "join"), HasSubstr("PERMISSION_DENIED")) << tried.output;
  EXPECT_THAT(Step(tried.output, "join"), HasSubstr("uid 65534 may not join"));
  EXPECT_THAT(Step(tried.output, "call"), Not(HasSubstr("call: OK"))) << tried.output;
  EXPECT_NE(Step(tried.output, "call"), "") << tried.output;

  // A departed member's name is no one else's to take while the group lives.
  ASSERT_TRUE(b->Leave("g", "b").ok());
  tried = AsSecondUser(
      {"--group=g", "--name=b", absl::StrCat("--init_method=", init_method_), "--call=a"});
  EXPECT_THAT(Step(tried.output, "join"), HasSubstr("PERMISSION_DENIED")) << tried.output;
  EXPECT_THAT(Step(tried.output, "call"), Not(HasSubstr("OK")));

  absl::StatusOr<v1::GroupView> view = a->GetGroup("g");
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->members_size(), 1);
  EXPECT_EQ(view->members(0).name(), "a");
  // The owner's own processes still join.
  std::unique_ptr<Client> c = Echoer("g", "c");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->Call("g", "a", "echo", "hi", {}, absl::Seconds(10)).ok());
}

TEST_F(TrustTest, AnotherUserReachesNoGroupsStoreButItsOwnGroups) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  Start();
  std::unique_ptr<Client> a = Echoer("g", "a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->GroupStore("g").Set("k", "root's").ok());

  // The second user is a member of a group of its own on this node, and asks for g's store.
  testing::ProcessResult tried =
      AsSecondUser({"--group=mine", "--name=x", absl::StrCat("--init_method=", init_method_),
                    "--group_store=g"});
  for (const char* step : {"group_store_get", "group_store_set"}) {
    EXPECT_THAT(Step(tried.output, step), HasSubstr("PERMISSION_DENIED")) << tried.output;
    EXPECT_THAT(Step(tried.output, step), HasSubstr("holds no member of group g"));
  }
  // Its own group's store is its own.
  tried = AsSecondUser({"--group=mine2", "--name=x", absl::StrCat("--init_method=", init_method_),
                        "--group_store=mine2"});
  EXPECT_EQ(Step(tried.output, "join"), "join: OK") << tried.output;
  EXPECT_EQ(Step(tried.output, "group_store_set"), "group_store_set: OK") << tried.output;
  // g's key is untouched.
  absl::StatusOr<std::string> value = a->GroupStore("g").Get("k");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "root's");
}

TEST_F(TrustTest, AGroupWithASecretAdmitsOnlyJoinsThatBringIt) {
  Start();
  std::unique_ptr<Client> first = Echoer("s", "first", "k1");
  ASSERT_NE(first, nullptr);
  std::unique_ptr<Client> other = Connect();
  ASSERT_NE(other, nullptr);

  absl::Status none = Join(other.get(), "s", "none");
  EXPECT_EQ(none.code(), absl::StatusCode::kPermissionDenied) << none;
  EXPECT_THAT(none.message(), HasSubstr("brought none"));
  absl::Status wrong = Join(other.get(), "s", "wrong", "k2");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kPermissionDenied) << wrong;
  EXPECT_THAT(wrong.message(), HasSubstr("brought another one"));
  // A process that did not get in cannot call in either.
  absl::StatusOr<Message> call = other->Call("s", "first", "echo", "x", {}, absl::Seconds(5));
  EXPECT_FALSE(call.ok());
  // The secret never appears in what the daemon shows or logs.
  EXPECT_THAT(daemon_->Output(), Not(HasSubstr("k1")));

  ASSERT_TRUE(Join(other.get(), "s", "second", "k1").ok());
  absl::StatusOr<Message> reply = other->Call("s", "first", "echo", "in", {}, absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, "in");

  // A group without a secret takes no join that brings one.
  std::unique_ptr<Client> open = Echoer("open", "o");
  ASSERT_NE(open, nullptr);
  absl::Status brought = Join(other.get(), "open", "p", "k1");
  EXPECT_EQ(brought.code(), absl::StatusCode::kPermissionDenied) << brought;

  // Once everyone left, whoever starts the group again decides who may join.
  ASSERT_TRUE(first->Leave("s", "first").ok());
  ASSERT_TRUE(other->Leave("s", "second").ok());
  EXPECT_TRUE(Join(other.get(), "s", "again").ok());
}

TEST_F(TrustTest, AnotherUserWithTheSecretStillCannotJoinOnTheOwnersNode) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  Start();
  std::unique_ptr<Client> first = Echoer("s", "first", "k1");
  ASSERT_NE(first, nullptr);
  testing::ProcessResult tried =
      AsSecondUser({"--group=s", "--name=x", absl::StrCat("--init_method=", init_method_),
                    "--secret=k1", "--call=first"});
  EXPECT_THAT(Step(tried.output, "join"), HasSubstr("PERMISSION_DENIED")) << tried.output;
  EXPECT_THAT(Step(tried.output, "join"), HasSubstr("belongs to uid 0"));
}

// tpd.rpc derives a job's group name and secret from Control.UserSecret (docs/security.md,
// "Python jobs"): it must be the same for one uid on every daemon of the cluster, another for
// every other uid and purpose, and only for sessions that identified their user.
TEST_F(TrustTest, AUsersSecretIsItsOwnAndTheSameOnEveryDaemonOfTheCluster) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  Start();
  std::unique_ptr<Client> root = Connect();
  ASSERT_NE(root, nullptr);
  absl::StatusOr<std::string> mine = root->UserSecret("job");
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->size(), 32u);
  EXPECT_EQ(*root->UserSecret("job"), *mine);
  EXPECT_NE(*root->UserSecret("another purpose"), *mine);

  // Another daemon of the cluster (the same token) gives root the same secret.
  TempDir other_dir;
  const std::string other_socket = absl::StrCat(other_dir.path(), "/tpd.sock");
  const std::string other_config =
      other_dir.WriteFile("tpd.toml",
                          "[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"secret\"\n"
                          "node_name = \"other\"\n");
  auto other = DaemonProcess::Start(other_socket, {"--config", other_config});
  ASSERT_TRUE(other.ok()) << other.status();
  auto there = Client::Connect(other_socket);
  ASSERT_TRUE(there.ok()) << there.status();
  EXPECT_EQ(*(*there)->UserSecret("job"), *mine);

  // The second user gets a secret of its own, never root's.
  testing::ProcessResult asked = AsSecondUser({"--user_secret=job"});
  EXPECT_EQ(Step(asked.output, "user_secret"), "user_secret: OK") << asked.output;
  const std::string theirs = Step(asked.output, "user_secret_hex");
  ASSERT_NE(theirs, "") << asked.output;
  EXPECT_NE(theirs, absl::StrCat("user_secret_hex: ", absl::BytesToHexString(*mine)));
  EXPECT_THAT(daemon_->Output(), Not(HasSubstr(absl::BytesToHexString(*mine))));

  // A session that did not identify its user gets none.
  auto stub = v1::Control::NewStub(
      grpc::CreateChannel(absl::StrCat("unix:", socket_), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::UserSecretRequest request;
  request.set_session_id(OpenRawSession());
  request.set_purpose("job");
  v1::UserSecretResponse response;
  const grpc::Status refused = stub->UserSecret(&context, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("has not identified its user"));
}

TEST_F(TrustTest, OnlyProcessesOfOneUidAndOneGidAreHandedEachOthersMemory) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  Start();
  std::unique_ptr<Client> a = Echoer("g", "a", "k1");
  ASSERT_NE(a, nullptr);
  auto call_a_as = [&](const std::string& name, uid_t uid, gid_t gid) {
    testing::ProcessResult result = testing::RunToolAs(
        dir_.path(),
        {absl::StrCat("--socket=", socket_), "--group=g", absl::StrCat("--name=", name),
         absl::StrCat("--init_method=", init_method_), "--secret=k1", "--call=a",
         absl::StrCat("--tensor_bytes=", 1 << 20)},
        uid, gid);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_EQ(Step(result.output, "call"), "call: OK") << result.output;
    return result.output;
  };
  // Control: a process of a's own uid and gid gets a's reply in a's memory, and a gets the
  // request in the caller's.
  EXPECT_THAT(call_a_as("same", getuid(), getgid()),
              HasSubstr("shared: 1 tensors in sender memory, 1 peer segments mapped"));
  EXPECT_EQ(a->GetCallStats()->tensors_received_shared, 1u);
  // The same user in another group: copies both ways, and no fd of a's memory reaches it.
  EXPECT_THAT(call_a_as("other_gid", getuid(), testing::kSecondGid),
              HasSubstr("shared: 0 tensors in sender memory, 0 peer segments mapped"));
  EXPECT_EQ(a->GetCallStats()->tensors_received_shared, 1u) << "nothing more shared";
  // Another uid cannot call a's worker at all (the group's owner rule, above); the daemon's
  // uid and gid check behind it is delivery_test's SharingTest.
}

TEST_F(TrustTest, GroupRecordsCannotBeReadThroughTheStore) {
  Start();
  std::unique_ptr<Client> a = Echoer("g", "a", "k1");
  ASSERT_NE(a, nullptr);
  absl::StatusOr<std::string> record = a->Store().Get("tpd/group/g/v/1", absl::Seconds(1));
  EXPECT_EQ(record.status().code(), absl::StatusCode::kPermissionDenied) << record.status();
}

TEST_F(TrustTest, PrintedHandlesGrantNothingAndIdsAreNeverPrinted) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  Start();
  std::unique_ptr<Client> a = Echoer("g", "a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->Call("g", "a", "echo", "self", {}, absl::Seconds(10)).ok());
  absl::StatusOr<v1::StatusResponse> status = a->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->attached_sessions_size(), 1);
  const std::string handle = status->attached_sessions(0).handle();
  EXPECT_THAT(handle, ::testing::MatchesRegex("s-[0-9a-f]{12}"));

  // A raw session's id never reaches the log; its handle does.
  const std::string id = OpenRawSession();
  ASSERT_EQ(id.size(), 32u);
  ASSERT_TRUE(WaitUntil([&] { return absl::StrContains(daemon_->Output(), SessionHandle(id)); }));
  EXPECT_THAT(daemon_->Output(), Not(HasSubstr(id)));

  // What is printed gets another user nowhere: the handle is no session id, and the id of a
  // session identified by root cannot be attached by it.
  testing::ProcessResult tried =
      AsSecondUser({absl::StrCat("--raw_session=", handle), "--raw_leave=g:a", "--raw_barrier=g:a",
                    "--raw_attach"});
  EXPECT_THAT(Step(tried.output, "raw_leave"), HasSubstr("FAILED_PRECONDITION")) << tried.output;
  EXPECT_THAT(Step(tried.output, "raw_barrier"), HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(Step(tried.output, "raw_attach"), Not(HasSubstr("OK")));

  // A session root identified (the client library does it when it opens one) is root's: its
  // id, were it stolen, attaches for no other user.
  ASSERT_TRUE(testing::IdentifyRawSession(socket_, id).ok());
  tried = AsSecondUser({absl::StrCat("--raw_session=", id), "--raw_attach"});
  EXPECT_THAT(Step(tried.output, "raw_attach"), HasSubstr("PERMISSION_DENIED")) << tried.output;
  EXPECT_THAT(Step(tried.output, "raw_attach"), HasSubstr("belongs to another user"));

  // Nothing of a's changed.
  absl::StatusOr<v1::GroupView> view = a->GetGroup("g");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->members_size(), 1);
  EXPECT_TRUE(a->Call("g", "a", "echo", "still", {}, absl::Seconds(10)).ok());
}

TEST_F(TrustTest, AReplyReachesItsCallerWhoseCompletionRingIsFull) {
  // Flooders can fill a session's completion ring by calling it: a burst past the ring waits
  // (max_calls_in_flight of it), the rest is refused at once; the reply to that session's own
  // call must still reach it, and its counts come back down.
  Start("max_calls_in_flight = 100\n");
  std::unique_ptr<Client> e = Echoer("g", "e");
  ASSERT_NE(e, nullptr);
  std::unique_ptr<testing::RawSession> victim = RawMember("g", "v");
  ASSERT_NE(victim, nullptr);
  testing::RawSession& v = *victim;
  const int slots = static_cast<int>(v.layout.completion.slots);
  // Twelve flooders, 100 calls each, call v (which does not read): 1024 fill its ring, 100
  // wait for room, 76 are refused.
  std::vector<std::unique_ptr<Client>> flooders;
  std::vector<CallFuture> flood;
  for (int i = 0; i < 12; ++i) {
    flooders.push_back(Connect());
    ASSERT_NE(flooders.back(), nullptr);
    ASSERT_TRUE(Join(flooders.back().get(), "g", absl::StrCat("f", i)).ok());
    for (int j = 0; j < 100; ++j) {
      flood.push_back(flooders.back()->CallAsync("g", "v", "m", "", {}, absl::Seconds(60)));
    }
  }
  const int refused_expected = 12 * 100 - slots - 100;
  ASSERT_GT(refused_expected, 0);
  int refused = 0;
  ASSERT_TRUE(WaitUntil([&] {
    refused = 0;
    for (CallFuture& call : flood) {
      if (!call.ready()) continue;
      const absl::StatusOr<Message>& done = call.Wait();
      EXPECT_EQ(done.status().code(), absl::StatusCode::kResourceExhausted) << done.status();
      EXPECT_THAT(std::string(done.status().message()),
                  HasSubstr("is full and 100 calls wait for room on it"));
      ++refused;
    }
    return refused >= refused_expected;
  })) << refused
      << " calls refused";
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(refused, refused_expected) << "the calls past the ring did not wait";
  EXPECT_EQ(Unposted(e.get()), 100);

  // v calls e; e answers at once, into v's full ring.
  ASSERT_TRUE(
      v.SubmitCall(v.layout.tx_heap.offset, "g", "e", "echo", "v", "mine", 7, absl::Seconds(30)));
  ASSERT_TRUE(WaitUntil([&] { return Unposted(e.get()) > 100; }, absl::Seconds(10)))
      << "the reply was not kept for the victim";

  // v reads its completions again: its reply is there.
  std::map<uint64_t, std::pair<absl::StatusCode, std::string>> replies =
      v.Replies(1, absl::Now() + absl::Seconds(20));
  ASSERT_EQ(replies.count(7), 1u) << "the reply to v's call never came";
  EXPECT_EQ(replies[7].first, absl::StatusCode::kOk) << replies[7].second;
  // Its call is no longer counted in flight once answered.
  EXPECT_TRUE(WaitUntil([&] { return Unposted(e.get()) == 0; }, absl::Seconds(10)));
}

TEST_F(TrustTest, ASessionThatNeverReadsItsCompletionsIsEndedPastItsBound) {
  // max_calls_in_flight 16: at most 4 * 16 + 1024 answers and releases may wait.
  Start("max_calls_in_flight = 16\n");
  std::unique_ptr<Client> e = Echoer("g", "e");
  ASSERT_NE(e, nullptr);
  std::unique_ptr<testing::RawSession> hoarder = RawMember("g", "h");
  ASSERT_NE(hoarder, nullptr);
  testing::RawSession& h = *hoarder;

  // Calls as fast as its submission ring takes them, never reading a completion.
  const absl::Time until = absl::Now() + absl::Seconds(20);
  uint64_t id = 0;
  bool ended = false;
  while (absl::Now() < until && !ended) {
    if (!h.SubmitCall(h.layout.tx_heap.offset, "g", "e", "echo", "h", "x", ++id)) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    if (id % 256 == 0) {
      ended = absl::StrContains(daemon_->Output(), "answers and releases unread");
    }
  }
  ASSERT_TRUE(WaitUntil([&] {
    return absl::StrContains(daemon_->Output(), "answers and releases unread");
  })) << "the hoarder was never ended";
  EXPECT_THAT(daemon_->Output(), HasSubstr("ending the session"));
  // Its session is gone; the others are served.
  EXPECT_TRUE(WaitUntil([&] { return e->Status()->attached_session_count() == 1; }));
  EXPECT_TRUE(e->Call("g", "e", "echo", "fine", {}, absl::Seconds(10)).ok());
}

TEST_F(TrustTest, WarningsAClientCausesAreRateLimited) {
  Start();
  std::unique_ptr<testing::RawSession> raw = RawMember("g", "c");
  ASSERT_NE(raw, nullptr);
  testing::RawSession& r = *raw;
  // 20000 releases of blocks the daemon never gave it.
  int sent = 0;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (sent < 20000 && absl::Now() < until) {
    shm::Descriptor release{};
    release.op = static_cast<uint8_t>(shm::Op::kRelease);
    release.call_id = 1;
    release.payload_offset = r.layout.rx_heap.offset + 64 * (1 + sent % 100);
    if (r.submit->TryPush(release).value_or(false)) {
      ++sent;
    } else {
      absl::SleepFor(absl::Microseconds(100));
    }
  }
  ASSERT_EQ(sent, 20000);
  absl::SleepFor(absl::Milliseconds(300));
  const std::string log = daemon_->Output();
  // One line in the first 10 s interval, where 20000 would have gone.
  EXPECT_GE(CountOf(log, "] release: "), 1);
  EXPECT_LE(CountOf(log, "] release: "), 2);
}

TEST_F(TrustTest, AttachedAndOpenSessionsAreBoundedPerUserAndInAll) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  Start("max_sessions_per_uid = 3\nmax_open_sessions = 20\n");
  std::unique_ptr<Client> observer = Connect();
  ASSERT_NE(observer, nullptr);
  auto held = std::async(std::launch::async, [&] {
    return AsSecondUser({"--attach_sessions=5", "--hold_ms=4000"});
  });
  // While the second user holds its sessions: 3 attached, shown per uid.
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<v1::StatusResponse> s = observer->Status();
        if (!s.ok()) return false;
        for (const v1::UidUse& use : s->uid_use()) {
          if (use.uid() == testing::kSecondUid && use.attached_sessions() == 3) return true;
        }
        return false;
      },
      absl::Seconds(20)));
  testing::ProcessResult tpctl = testing::RunProcess(
      {testing::RunfilePath("client/tpctl"), absl::StrCat("--socket=", socket_), "status"});
  EXPECT_EQ(tpctl.exit_code, 0) << tpctl.output;
  EXPECT_THAT(tpctl.output, HasSubstr("uid 65534: 3 sessions attached (max 3)"));
  // This user's sessions are its own to bound: it attaches meanwhile.
  std::unique_ptr<Client> mine = Connect();
  ASSERT_NE(mine, nullptr);
  EXPECT_TRUE(mine->AttachSharedMemory().ok());
  testing::ProcessResult result = held.get();
  EXPECT_THAT(result.output, HasSubstr("attached: 3"));
  EXPECT_THAT(Step(result.output, "attach_error"), HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(Step(result.output, "attach_error"), HasSubstr("data.max_sessions_per_uid (3)"));

  // Open sessions, all users together: 20 at most.
  absl::Status refused;
  for (int i = 0; i < 25 && refused.ok(); ++i) OpenRawSession(&refused);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("data.max_open_sessions (20)"));
}

TEST_F(TrustTest, AUserTakesAllButTheKeptPlacesAndASecondUserGetsThose) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  Start("max_sessions = 8\nsessions_kept_free = 3\n");
  // This user's job takes what it can: five of eight places, no fixed per-user cap.
  std::vector<std::unique_ptr<Client>> mine;
  for (int i = 0; i < 5; ++i) {
    mine.push_back(Connect());
    ASSERT_NE(mine.back(), nullptr);
    ASSERT_TRUE(mine.back()->AttachSharedMemory().ok()) << i;
  }
  std::unique_ptr<Client> sixth = Connect();
  ASSERT_NE(sixth, nullptr);
  absl::Status kept = sixth->AttachSharedMemory().status();
  EXPECT_EQ(kept.code(), absl::StatusCode::kResourceExhausted) << kept;
  EXPECT_THAT(kept.message(), HasSubstr("data.sessions_kept_free (3)"));
  // The places kept are the second user's; past them the node is full.
  testing::ProcessResult result = AsSecondUser({"--attach_sessions=4", "--hold_ms=0"});
  EXPECT_THAT(result.output, HasSubstr("attached: 3")) << result.output;
  EXPECT_THAT(Step(result.output, "attach_error"), HasSubstr("data.max_sessions (8)"));
}

// The daemon's store: each uid fills its own share, callers without a session share one, and
// what they hold leaves everyone else room (docs/security.md, "Per-user bounds").
TEST_F(TrustTest, AUserFillsOnlyItsShareOfTheStoreAndOthersKeepTheirs) {
  Start(absl::StrCat("[store]\nmax_total_bytes = ", 48 << 20, "\nmax_bytes_per_uid = ", 16 << 20,
                     "\nmax_bytes_without_session = ", 8 << 20, "\n"));
  if (HasFatalFailure()) return;
  // Through the client library: its session's uid is charged.
  testing::ProcessResult filled = AsSecondUser({"--store_fill_mib=40"});
  EXPECT_THAT(filled.output, HasSubstr("store_filled: 15\n")) << filled.output;
  EXPECT_THAT(Step(filled.output, "store_fill"),
              AllOf(HasSubstr("RESOURCE_EXHAUSTED"), HasSubstr("uid 65534 holds 15728"),
                    HasSubstr("its share, store.max_bytes_per_uid, is 16777216")));
  // By raw calls that name no session: the share of all such callers; a session named that
  // is nobody's is refused, not charged to anyone.
  filled =
      AsSecondUser({"--store_fill_mib=40", "--store_without_session", "--raw_session=made-up"});
  EXPECT_THAT(Step(filled.output, "store_named_session"),
              AllOf(HasSubstr("FAILED_PRECONDITION"), HasSubstr("is not open")));
  EXPECT_THAT(filled.output, HasSubstr("store_filled: 7\n")) << filled.output;
  EXPECT_THAT(Step(filled.output, "store_fill"),
              AllOf(HasSubstr("callers without a session holds"),
                    HasSubstr("its share, store.max_bytes_without_session, is 8388608")));
  // This user (root) still has its whole share, though the other user's keys stay.
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  const std::string value(1 << 20, 'r');
  for (int i = 0; i < 15; ++i) {
    ASSERT_TRUE(client->Store().Set(absl::StrCat("mine", i), value).ok()) << i;
  }
  // The other user's values were overwritten by this one: they are charged here now.
  absl::Status over = client->Store().Set("fill0", value);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_THAT(over.message(), HasSubstr("uid 0 holds"));
  ASSERT_TRUE(*client->Store().DeleteKey("mine0"));
  EXPECT_TRUE(client->Store().Set("fill0", value).ok());
  testing::ProcessResult again = AsSecondUser({"--store_fill_mib=1"});
  EXPECT_THAT(Step(again.output, "store_fill"), HasSubstr("store_fill: OK")) << again.output;
  // Operators see who holds what.
  absl::StatusOr<v1::StatusResponse> status = client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  std::map<std::string, int64_t> keys;
  for (const v1::StoreWriter& writer : status->store().writers())
    keys[writer.writer()] = writer.keys();
  EXPECT_EQ(keys["uid 0"], 14);     // mine1..mine14: fill0 went back to the other user
  EXPECT_EQ(keys["uid 65534"], 9);  // fill0 again, and fill7..fill14
  EXPECT_EQ(keys["callers without a session"], 6);  // fill1..fill6
}

TEST_F(TrustTest, AGroupsStoreChargesEachMembersUserNotThePeerDaemons) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  // A tcp:// group's store is reached through the home daemon's peer port, this daemon's own
  // here as on any node: the home charges each write to the member's user on its node.
  Start(absl::StrCat("[store]\nmax_total_bytes = ", 64 << 20, "\nmax_bytes_per_uid = ", 16 << 20,
                     "\n"));
  if (HasFatalFailure()) return;
  testing::ProcessResult filled =
      AsSecondUser({"--group=mine", "--name=x", absl::StrCat("--init_method=", init_method_),
                    "--group_store_fill_mib=40"});
  EXPECT_THAT(Step(filled.output, "join"), HasSubstr("OK")) << filled.output;
  EXPECT_THAT(filled.output, HasSubstr("group_store_filled: 15\n")) << filled.output;
  EXPECT_THAT(Step(filled.output, "group_store_fill"),
              AllOf(HasSubstr("RESOURCE_EXHAUSTED"), HasSubstr("uid 65534 of node trust holds"),
                    HasSubstr("its share, store.max_bytes_per_uid, is 16777216")));
  // Root's members still have root's whole share, and it ends at the same bound.
  std::unique_ptr<Client> a = Echoer("g", "a");
  ASSERT_NE(a, nullptr);
  const StoreView store = a->GroupStore("g");
  const std::string value(1 << 20, 'r');
  for (int i = 0; i < 15; ++i) ASSERT_TRUE(store.Set(absl::StrCat("mine", i), value).ok()) << i;
  absl::Status over = store.Set("mine15", value);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_THAT(over.message(), HasSubstr("uid 0 of node trust holds"));
  absl::StatusOr<v1::StatusResponse> status = a->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  std::map<std::string, int64_t> keys;
  for (const v1::StoreWriter& writer : status->store().writers())
    keys[writer.writer()] = writer.keys();
  EXPECT_EQ(keys["uid 0 of node trust"], 15);
}

TEST_F(TrustTest, CudaTensorsOfAUserWhoCannotOpenTheGpusAreRefusedUnopened) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  // Device nodes as a node restricting its GPUs to a group has them: root:root 0660.
  const std::string devices = absl::StrCat(dir_.path(), "/dev");
  std::filesystem::create_directory(devices);
  for (const char* node : {"nvidiactl", "nvidia0"}) {
    const std::string path = absl::StrCat(devices, "/", node);
    std::ofstream(path) << "";
    chmod(path.c_str(), 0660);
  }
  Start(absl::StrCat("device_dir = \"", devices, "\"\n"));
  // The second user's own group (it may start groups of its own), and a forged CUDA IPC
  // handle in a call: refused before the daemon opens anything.
  testing::ProcessResult tried =
      AsSecondUser({"--group=own", "--name=u", absl::StrCat("--init_method=", init_method_),
                    "--call=u", "--forged_cuda_call"});
  EXPECT_THAT(Step(tried.output, "join"), HasSubstr("OK")) << tried.output;
  EXPECT_THAT(Step(tried.output, "forged_cuda_call"), HasSubstr("PERMISSION_DENIED"))
      << tried.output;
  EXPECT_THAT(Step(tried.output, "forged_cuda_call"),
              HasSubstr("uid 65534 may not open the node's GPUs itself"));
  EXPECT_THAT(Step(tried.output, "forged_cuda_call"), HasSubstr("nvidia"));
}

TEST_F(TrustTest, OpenSessionsAreBoundedPerUserAndUnidentifiedOnesEnd) {
  if (const std::string why = testing::CannotSwitchUser(); !why.empty()) GTEST_SKIP() << why;
  Start("max_open_sessions_per_uid = 2\nsession_identify_timeout_ms = 500\n");
  testing::ProcessResult result = AsSecondUser({"--attach_sessions=4"});
  EXPECT_THAT(result.output, HasSubstr("attached: 2"));
  EXPECT_THAT(Step(result.output, "attach_error"), HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(Step(result.output, "attach_error"),
              HasSubstr("data.max_open_sessions_per_uid (2) sessions of uid 65534"));
  // Another user's sessions are its own to count: root opens and joins.
  std::unique_ptr<Client> mine = Echoer("g", "mine");
  ASSERT_NE(mine, nullptr);
  // A session that never identifies its user holds its place for the timeout only.
  const int64_t before = mine->Status()->open_session_count();
  ASSERT_FALSE(OpenRawSession().empty());
  EXPECT_EQ(mine->Status()->open_session_count(), before + 1);
  EXPECT_TRUE(
      WaitUntil([&] { return mine->Status()->open_session_count() == before; }, absl::Seconds(10)))
      << "the unidentified session was never ended";
}

// Sessions that never identify their user cannot hold max_open_sessions: past
// max_unidentified_sessions the oldest of them is ended for each new one, and a client that
// identifies (as the library does at once) opens and joins while they keep coming.
TEST_F(TrustTest, SessionsThatNeverIdentifyCannotHoldTheOpenSessionPlaces) {
  Start("max_open_sessions = 20\nmax_unidentified_sessions = 5\n");
  std::vector<std::string> opened;
  for (int i = 0; i < 30; ++i) {
    absl::Status refused;
    opened.push_back(OpenRawSession(&refused));
    ASSERT_FALSE(opened.back().empty()) << "open " << i << ": " << refused;
  }
  std::unique_ptr<Client> mine = Echoer("g", "mine");
  ASSERT_NE(mine, nullptr);
  // At most 5 unidentified, plus this client's and the fixture's probe's identified ones.
  EXPECT_LE(mine->Status()->open_session_count(), 5 + 2);
  // The oldest were ended; the newest is still open (it may identify now).
  EXPECT_EQ(testing::IdentifyRawSession(socket_, opened.front()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(testing::IdentifyRawSession(socket_, opened.back()).ok());
}

// The pids controller of cgroup v1 or v2, where this machine has one we may write.
std::string PidsCgroupRoot() {
  for (const char* root : {"/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
    std::error_code ignored;
    if (std::filesystem::exists(absl::StrCat(root, "/cgroup.procs"), ignored) &&
        (std::filesystem::exists(absl::StrCat(root, "/pids.current"), ignored) ||
         std::string(root) == "/sys/fs/cgroup/pids")) {
      return root;
    }
  }
  return "";
}

bool WriteTo(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

TEST_F(TrustTest, AThreadThatCannotStartRefusesOneAttachAndTheDaemonServesOn) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to put the daemon in a pids cgroup";
  const std::string root = PidsCgroupRoot();
  if (root.empty()) GTEST_SKIP() << "no writable pids cgroup controller on this machine";
  Start();
  std::unique_ptr<Client> a = Echoer("g", "a");
  ASSERT_NE(a, nullptr);
  std::unique_ptr<Client> b = Connect();  // connected (and its session open) before the limit
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(Join(b.get(), "g", "b").ok());
  const std::string cgroup = absl::StrCat(root, "/tpd-trust-test-", getpid());
  std::error_code error;
  std::filesystem::create_directory(cgroup, error);
  if (error || !WriteTo(absl::StrCat(cgroup, "/cgroup.procs"), std::to_string(daemon_->pid()))) {
    std::filesystem::remove(cgroup, error);
    GTEST_SKIP() << "cannot create or join a pids cgroup under " << root;
  }
  // No thread more than the daemon has now.
  std::ifstream current(absl::StrCat(cgroup, "/pids.current"));
  std::string now;
  current >> now;
  ASSERT_TRUE(WriteTo(absl::StrCat(cgroup, "/pids.max"), now)) << now;

  absl::StatusOr<std::shared_ptr<const shm::Segment>> refused = b->AttachSharedMemory();
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("cannot start a thread"));

  ASSERT_TRUE(WriteTo(absl::StrCat(cgroup, "/pids.max"), "max"));
  WriteTo(absl::StrCat(root, "/cgroup.procs"), std::to_string(daemon_->pid()));
  std::filesystem::remove(cgroup, error);
  // The daemon serves on, and the same client attaches now.
  EXPECT_TRUE(b->AttachSharedMemory().ok());
  EXPECT_TRUE(b->Call("g", "a", "echo", "after", {}, absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace tpd
