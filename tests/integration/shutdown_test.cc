// What SIGTERM promises (README "Running under systemd", docs/groups.md "Shutdown"), checked
// against the real tpd binary: health turns NOT_SERVING first, calls still running after
// shutdown_grace_ms are cancelled (the daemon exits 0 without waiting longer), and session
// and watch streams end with UNAVAILABLE.

#include <signal.h>

#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "proto/control.grpc.pb.h"
#include "proto/store.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WaitUntil;

std::unique_ptr<DaemonProcess> StartDaemon(const TempDir& dir, const std::string& config_text) {
  const std::string config = dir.WriteFile("tpd.toml", config_text);
  auto daemon = DaemonProcess::Start(absl::StrCat(dir.path(), "/tpd.sock"), {"--config", config});
  EXPECT_TRUE(daemon.ok()) << daemon.status();
  return daemon.ok() ? *std::move(daemon) : nullptr;
}

std::unique_ptr<Client> Connect(const TempDir& dir) {
  auto client = Client::Connect(absl::StrCat(dir.path(), "/tpd.sock"));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// A Store.Get whose client never reads the answer: with a value far larger than the HTTP/2
// flow-control window (and window growth turned off), the daemon cannot finish sending it, so
// the call stays in flight until the daemon cancels it. Only its completion queue is polled,
// never a Read.
class StuckGet {
 public:
  StuckGet(const std::string& socket, const std::string& key) : thread_([this] { Poll(); }) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetMaxReceiveMessageSize(-1);
    channel_ = grpc::CreateCustomChannel(absl::StrCat("unix:", socket),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = std::make_unique<grpc::GenericStub>(channel_);
    call_ = stub_->PrepareCall(&context_, "/tpd.v1.Store/Get", &cq_);
    v1::GetRequest request;
    request.set_key(key);
    std::string bytes = request.SerializeAsString();
    grpc::Slice slice(bytes);
    request_ = grpc::ByteBuffer(&slice, 1);
    call_->StartCall(Tag(1));
    started_.WaitForNotificationWithTimeout(absl::Seconds(20));
    call_->WriteLast(request_, grpc::WriteOptions(), Tag(2));
    // Deliberately no Read: the answer stays unread.
  }

  // The call's final status, once the daemon has ended it: reads what is left of the answer
  // (gRPC finishes a call only once its messages are read), then finishes.
  grpc::Status Finish() {
    call_->Read(&response_, Tag(3));
    if (!read_.WaitForNotificationWithTimeout(absl::Seconds(20))) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "test: Read never completed");
    }
    grpc::Status status;
    call_->Finish(&status, Tag(4));
    if (!finished_.WaitForNotificationWithTimeout(absl::Seconds(20))) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "test: Finish never completed");
    }
    return status;
  }

  ~StuckGet() {
    context_.TryCancel();
    cq_.Shutdown();
    thread_.join();
  }

 private:
  static void* Tag(intptr_t n) { return reinterpret_cast<void*>(n); }

  void Poll() {
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
      if (tag == Tag(1)) started_.Notify();
      if (tag == Tag(3)) read_.Notify();
      if (tag == Tag(4)) finished_.Notify();
    }
  }

  grpc::CompletionQueue cq_;
  std::thread thread_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  grpc::ByteBuffer response_;
  absl::Notification started_;
  absl::Notification read_;
  absl::Notification finished_;
};

TEST(ShutdownTest, HealthTurnsNotServingAndTheGraceCancelsCallsStillRunning) {
  TempDir dir;
  auto daemon = StartDaemon(dir, "[daemon]\nshutdown_grace_ms = 3000\n");
  ASSERT_NE(daemon, nullptr);
  auto client = Connect(dir);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Store().Set("big", std::string(12 << 20, 'x')).ok());

  StuckGet stuck(absl::StrCat(dir.path(), "/tpd.sock"), "big");
  // In flight: the client's session stream, the Status call asking and the stuck Get. (At 2
  // the Get may not have reached the daemon yet: then nothing holds the grace.)
  ASSERT_TRUE(WaitUntil([&] {
    absl::StatusOr<v1::StatusResponse> status = client->Status();
    return status.ok() && status->calls_in_flight() >= 3;
  })) << "the unread Get never showed as a call in flight";

  const absl::Time sigterm = absl::Now();
  daemon->Signal(SIGTERM);
  // During the grace the daemon still answers, and says it is going away.
  auto probe = Connect(dir);
  ASSERT_NE(probe, nullptr);
  EXPECT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<bool> serving = probe->Serving();
        return serving.ok() && !*serving;
      },
      absl::Seconds(2), absl::Milliseconds(20)))
      << "health never turned NOT_SERVING during the grace period";
  absl::StatusOr<v1::StatusResponse> status = probe->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->serving_status(), "NOT_SERVING");

  // The stuck call holds the daemon for the grace period, and no longer.
  EXPECT_EQ(daemon->WaitExit(absl::Seconds(30)), 0);
  const absl::Duration took = absl::Now() - sigterm;
  EXPECT_GE(took, absl::Milliseconds(2900));
  EXPECT_LT(took, absl::Seconds(20));
  EXPECT_THAT(daemon->Output(), HasSubstr("cancelling 1 calls still in flight"));
  const grpc::Status stuck_end = stuck.Finish();
  EXPECT_THAT(stuck_end.error_code(),
              ::testing::AnyOf(grpc::StatusCode::CANCELLED, grpc::StatusCode::UNAVAILABLE))
      << stuck_end.error_message();
}

TEST(ShutdownTest, SessionAndWatchStreamsEndWithUnavailable) {
  TempDir dir;
  // The grace (ten minutes) is far longer than the test: streams must not sit it out.
  auto daemon = StartDaemon(dir,
                            "[daemon]\nshutdown_grace_ms = 600000\n"
                            "[peer]\nlisten_address = \"127.0.0.1:0\"\ntoken = \"secret\"\n"
                            "node_name = \"node-a\"\n");
  ASSERT_NE(daemon, nullptr);
  auto client = Connect(dir);
  ASSERT_NE(client, nullptr);
  const std::string init_method = absl::StrCat("tcp://", client->Status()->peer_address());

  // A session, as the client library opens it, and a watch, through a raw stub to see how
  // they end. Their deadlines only bound the test: the daemon must end them long before.
  auto channel = grpc::CreateChannel(absl::StrCat("unix:", dir.path(), "/tpd.sock"),
                                     grpc::InsecureChannelCredentials());
  auto control = v1::Control::NewStub(channel);
  const auto bound = absl::ToChronoTime(absl::Now() + absl::Seconds(60));
  grpc::ClientContext session_context;
  session_context.set_deadline(bound);
  auto session = control->OpenSession(&session_context, v1::OpenSessionRequest());
  v1::SessionEvent opened;
  ASSERT_TRUE(session->Read(&opened));
  ASSERT_FALSE(opened.session_id().empty());

  // A watched group with a member, so the watch has something to follow.
  JoinOptions options;
  options.group = "watched";
  options.name = "w0";
  options.init_method = init_method;
  ASSERT_TRUE(client->Join(options).ok());
  grpc::ClientContext watch_context;
  watch_context.set_deadline(bound);
  v1::WatchGroupRequest watch_request;
  watch_request.set_group("watched");
  watch_request.set_init_method(init_method);
  auto watch = control->WatchGroup(&watch_context, watch_request);
  v1::GroupEvent event;
  ASSERT_TRUE(watch->Read(&event));
  EXPECT_EQ(event.group().members_size(), 1);

  daemon->Signal(SIGTERM);
  v1::SessionEvent more;
  while (session->Read(&more)) {
  }
  grpc::Status session_end = session->Finish();
  EXPECT_EQ(session_end.error_code(), grpc::StatusCode::UNAVAILABLE) << session_end.error_message();
  while (watch->Read(&event)) {
  }
  grpc::Status watch_end = watch->Finish();
  EXPECT_EQ(watch_end.error_code(), grpc::StatusCode::UNAVAILABLE) << watch_end.error_message();
  EXPECT_EQ(daemon->WaitExit(absl::Seconds(60)), 0);
}

}  // namespace
}  // namespace tpd
