// Every RPC of the daemon's unix socket fed random and mutated request bytes (FAULTS B1), by
// a bounded random driver with a fixed seed: every call ends, none with UNKNOWN, and the daemon
// keeps serving (health SERVING, the store still answering) and does not crash (the test
// fixture fails a test whose daemon died). Store keys are bytes: one that is not UTF-8 works.

#include <future>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "proto/control.pb.h"
#include "proto/store.pb.h"
#include "tests/testing/daemon_process.h"

namespace tpd {
namespace {

using testing::DaemonProcess;
using testing::TempDir;

// A valid request per method, as the seed of its mutations.
std::map<std::string, std::string> Seeds() {
  std::map<std::string, std::string> seeds;
  v1::SetRequest set;
  set.set_namespace_("ns");
  set.set_key("k");
  set.set_value("v");
  seeds["/tpd.v1.Store/Set"] = set.SerializeAsString();
  v1::GetRequest get;
  get.set_key("k");
  get.set_timeout_ms(5);
  seeds["/tpd.v1.Store/Get"] = get.SerializeAsString();
  v1::AddRequest add;
  add.set_key("n");
  add.set_delta(3);
  seeds["/tpd.v1.Store/Add"] = add.SerializeAsString();
  v1::CompareSetRequest cas;
  cas.set_key("c");
  cas.set_desired_value("x");
  seeds["/tpd.v1.Store/CompareSet"] = cas.SerializeAsString();
  v1::MultiSetRequest multi;
  multi.add_keys("a");
  multi.add_values("1");
  seeds["/tpd.v1.Store/MultiSet"] = multi.SerializeAsString();
  v1::MultiGetRequest multi_get;
  multi_get.add_keys("a");
  multi_get.set_timeout_ms(5);
  seeds["/tpd.v1.Store/MultiGet"] = multi_get.SerializeAsString();
  v1::WaitRequest wait;
  wait.add_keys("a");
  wait.set_timeout_ms(5);
  seeds["/tpd.v1.Store/Wait"] = wait.SerializeAsString();
  v1::CheckRequest check;
  check.add_keys("a");
  seeds["/tpd.v1.Store/Check"] = check.SerializeAsString();
  seeds["/tpd.v1.Store/DeleteKey"] = set.SerializeAsString();
  seeds["/tpd.v1.Store/NumKeys"] = "";
  seeds["/tpd.v1.Store/Append"] = set.SerializeAsString();
  v1::JoinRequest join;
  join.set_session_id("no-such-session");
  join.set_group("g");
  join.set_name("w0");
  join.set_init_method("tcp://127.0.0.1:1");
  join.set_rank(0);
  join.set_world_size(2);
  join.set_timeout_ms(10);
  join.mutable_options()->add_transports("uv");
  (*(*join.mutable_options()->mutable_device_maps())["w1"].mutable_devices())["cuda:0"] = "cuda:1";
  seeds["/tpd.v1.Control/Join"] = join.SerializeAsString();
  v1::LeaveRequest leave;
  leave.set_session_id("no-such-session");
  leave.set_group("g");
  leave.set_name("w0");
  seeds["/tpd.v1.Control/Leave"] = leave.SerializeAsString();
  v1::BarrierRequest barrier;
  barrier.set_session_id("no-such-session");
  barrier.set_group("g");
  seeds["/tpd.v1.Control/Barrier"] = barrier.SerializeAsString();
  v1::GetGroupRequest get_group;
  get_group.set_group("g");
  get_group.set_init_method("env://");
  seeds["/tpd.v1.Control/GetGroup"] = get_group.SerializeAsString();
  seeds["/tpd.v1.Control/ListGroups"] = "";
  seeds["/tpd.v1.Admin/Status"] = "";
  seeds["/grpc.health.v1.Health/Check"] = "";
  return seeds;
}

std::string Mutate(std::string bytes, std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0:  // random bytes
      bytes.assign(rng() % 64, '\0');
      for (char& c : bytes) c = static_cast<char>(rng());
      return bytes;
    case 1:  // truncated
      if (!bytes.empty()) bytes.resize(rng() % bytes.size());
      return bytes;
    default:  // a few flipped bytes (field numbers, lengths, varints, UTF-8)
      for (int i = 0; i < 1 + static_cast<int>(rng() % 3) && !bytes.empty(); ++i) {
        bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
      }
      return bytes;
  }
}

class RequestFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = absl::StrCat(dir_.path(), "/tpd.sock");
    auto daemon = DaemonProcess::Start(socket_);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    channel_ =
        grpc::CreateChannel(absl::StrCat("unix:", socket_), grpc::InsecureChannelCredentials());
  }

  // One raw call; its status.
  grpc::Status Call(const std::string& method, const std::string& bytes) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status status) { done.set_value(std::move(status)); });
    return done.get_future().get();
  }

  TempDir dir_;
  std::string socket_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(RequestFuzzTest, MutatedRequestsToEveryMethodNeverCrashOrWedgeTheDaemon) {
  const std::map<std::string, std::string> seeds = Seeds();
  std::vector<std::string> methods;
  for (const auto& [method, seed] : seeds) methods.push_back(method);
  std::mt19937_64 rng(1126);
  std::map<int, int> codes;
  for (int round = 0; round < 3000; ++round) {
    const std::string& method = methods[rng() % methods.size()];
    const absl::Time start = absl::Now();
    const grpc::Status status = Call(method, Mutate(seeds.at(method), rng));
    ++codes[status.error_code()];
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNKNOWN)
        << method << ": " << status.error_message();
    // Every call ends by its deadline (2 s, some mutated waits ask for more) + 0.5 s.
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(2500)) << method << " hung";
    if (round % 500 == 0) {
      ASSERT_TRUE(Call("/grpc.health.v1.Health/Check", "").ok()) << "daemon stopped serving";
    }
  }
  for (const auto& [code, count] : codes) {
    std::cout << "status " << code << ": " << count << " calls\n";
  }
  auto client = Client::Connect(socket_);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Serving().value_or(false));
  EXPECT_TRUE((*client)->Store().Set("after", "fuzz").ok());
}

TEST_F(RequestFuzzTest, KeysNeedNotBeUtf8) {
  auto client = Client::Connect(socket_);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string key("\xff\xfe\x00k", 4);
  ASSERT_TRUE((*client)->Store().Set(key, "v").ok());
  absl::StatusOr<std::string> value = (*client)->Store().Get(key);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

}  // namespace
}  // namespace tpd
