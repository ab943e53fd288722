// second_user: what another user of the node tries against a daemon, step by step, for the
// tests that run it as uid 65534 (tests/testing/second_user.h). Each step prints one line,
// "<step>: OK" or "<step>: <CODE>: <message>", so a test can assert what was refused and how.
//
//   second_user --socket=S --raw_session=ID --raw_leave=g:a     Control.Leave with a given id
//   second_user --socket=S --raw_session=ID --raw_barrier=g:a   Control.Barrier with it
//   second_user --socket=S --raw_session=ID --raw_attach        attach its shared memory
//   second_user --socket=S --group=g --name=x --init_method=tcp://... [--secret=...] --call=a
//       [--tensor_bytes=N]                                     ... with an arena tensor
//   second_user --socket=S --attach_sessions=40                 attach as many sessions
//   second_user --socket=S --user_secret=P                      print its user's secret for P
//   second_user --socket=S --store_fill_mib=N [--store_without_session]
//       write 1 MiB values to the daemon's store until N are in or one is refused
//   second_user --socket=S --group=g --name=x --init_method=tcp://... --group_store_fill_mib=N
//       ... to the store of the group it joined
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/control.grpc.pb.h"
#include "proto/store.grpc.pb.h"
#include "proto/store_scope.h"
#include "shm/attach.h"
#include "shm/descriptor.h"
#include "tests/testing/raw_session.h"

ABSL_FLAG(std::string, socket, "", "the daemon's gRPC socket");
ABSL_FLAG(std::string, raw_session, "", "a session id to use in raw requests");
ABSL_FLAG(std::string, raw_leave, "", "group:name to leave with --raw_session");
ABSL_FLAG(std::string, raw_barrier, "", "group:name to enter a barrier with --raw_session");
ABSL_FLAG(bool, raw_attach, false, "attach --raw_session's shared memory");
ABSL_FLAG(std::string, group, "g", "the group to join");
ABSL_FLAG(std::string, name, "", "the worker name to join as (nothing joins without one)");
ABSL_FLAG(std::string, init_method, "", "the group's init_method");
ABSL_FLAG(std::string, secret, "", "the group's secret to join with");
ABSL_FLAG(std::string, call, "", "a worker of --group to call method echo on");
ABSL_FLAG(std::string, group_store, "",
          "a group whose store to read and write key k in, after joining --group");
ABSL_FLAG(bool, forged_cuda_call, false,
          "after joining, call --call with a CUDA tensor whose IPC handle is forged");
ABSL_FLAG(int64_t, tensor_bytes, 0,
          "--call sends an arena tensor of this many bytes and prints where the reply's lay");
ABSL_FLAG(int, attach_sessions, 0, "sessions to open and attach, one client each");
ABSL_FLAG(int, hold_ms, 0, "how long to hold what was attached before exiting");
ABSL_FLAG(std::string, user_secret, "", "a purpose to ask Control.UserSecret for");
ABSL_FLAG(int, store_fill_mib, 0, "1 MiB values to write to the daemon's store");
ABSL_FLAG(int, group_store_fill_mib, 0, "1 MiB values to write to the joined group's store");
ABSL_FLAG(bool, store_without_session, false,
          "--store_fill_mib writes with raw gRPC calls that name no session (and first one that "
          "names --raw_session)");

namespace {

void Print(const std::string& step, const absl::Status& status) {
  std::printf("%s: %s\n", step.c_str(), status.ok() ? "OK" : status.ToString().c_str());
  std::fflush(stdout);
}

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// Writes 1 MiB values "fill<i>" with `set` until `n` are in or one is refused; prints
// "<step>ed: <count>" and the refusal as <step>.
void Fill(const std::string& step, int n,
          const std::function<absl::Status(const std::string&, const std::string&)>& set) {
  const std::string value(1 << 20, 'v');
  absl::Status refused;
  int stored = 0;
  for (; stored < n && refused.ok(); stored += refused.ok()) {
    refused = set(absl::StrCat("fill", stored), value);
  }
  std::printf("%sed: %d\n", step.c_str(), stored);
  Print(step, refused);
}

// Fills the daemon's store: through the client library (its session's uid is charged), or by
// raw gRPC calls that name no session.
void FillStore(const std::string& socket, int n, bool without_session) {
  if (without_session) {
    auto store = tpd::v1::Store::NewStub(
        grpc::CreateChannel(absl::StrCat("unix:", socket), grpc::InsecureChannelCredentials()));
    auto set = [&](const std::string& key, const std::string& value, const std::string& session) {
      tpd::v1::SetRequest request;
      request.set_key(key);
      request.set_value(value);
      tpd::v1::SetResponse response;
      grpc::ClientContext context;
      if (!session.empty()) context.AddMetadata(tpd::kStoreSessionMetadata, session);
      return FromGrpc(store->Set(&context, request, &response));
    };
    if (const std::string forged = absl::GetFlag(FLAGS_raw_session); !forged.empty()) {
      Print("store_named_session", set("named", "v", forged));
    }
    Fill("store_fill", n,
         [&](const std::string& key, const std::string& value) { return set(key, value, ""); });
    return;
  }
  absl::StatusOr<std::unique_ptr<tpd::Client>> client = tpd::Client::Connect(socket);
  if (!client.ok()) {
    Print("connect", client.status());
    return;
  }
  Fill("store_fill", n, [&](const std::string& key, const std::string& value) {
    return (*client)->Store().Set(key, value);
  });
}

void Raw(const std::string& socket) {
  auto stub = tpd::v1::Control::NewStub(
      grpc::CreateChannel(absl::StrCat("unix:", socket), grpc::InsecureChannelCredentials()));
  const std::string session = absl::GetFlag(FLAGS_raw_session);
  if (!absl::GetFlag(FLAGS_raw_leave).empty()) {
    std::pair<std::string, std::string> at = absl::StrSplit(absl::GetFlag(FLAGS_raw_leave), ':');
    tpd::v1::LeaveRequest request;
    request.set_session_id(session);
    request.set_group(at.first);
    request.set_name(at.second);
    tpd::v1::LeaveResponse response;
    grpc::ClientContext context;
    Print("raw_leave", FromGrpc(stub->Leave(&context, request, &response)));
  }
  if (!absl::GetFlag(FLAGS_raw_barrier).empty()) {
    std::pair<std::string, std::string> at = absl::StrSplit(absl::GetFlag(FLAGS_raw_barrier), ':');
    tpd::v1::BarrierRequest request;
    request.set_session_id(session);
    request.set_group(at.first);
    request.set_name(at.second);
    request.set_timeout_ms(2000);
    tpd::v1::BarrierResponse response;
    grpc::ClientContext context;
    Print("raw_barrier", FromGrpc(stub->Barrier(&context, request, &response)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string socket = absl::GetFlag(FLAGS_socket);
  Raw(socket);
  if (absl::GetFlag(FLAGS_raw_attach)) {
    auto request = tpd::shm::EncodeAttachRequest(absl::GetFlag(FLAGS_raw_session));
    Print("raw_attach",
          request.ok() ? tpd::testing::SendDataRequest(socket, *request) : request.status());
  }
  if (!absl::GetFlag(FLAGS_name).empty()) {
    absl::StatusOr<std::unique_ptr<tpd::Client>> client = tpd::Client::Connect(socket);
    if (!client.ok()) {
      Print("connect", client.status());
      return 0;
    }
    tpd::JoinOptions options;
    options.group = absl::GetFlag(FLAGS_group);
    options.name = absl::GetFlag(FLAGS_name);
    options.init_method = absl::GetFlag(FLAGS_init_method);
    options.secret = absl::GetFlag(FLAGS_secret);
    options.timeout = absl::Seconds(10);
    Print("join", (*client)->Join(options).status());
    if (absl::GetFlag(FLAGS_forged_cuda_call)) {
      auto raw = tpd::testing::RawSession::Open(*std::move(client));
      if (!raw.ok()) {
        Print("forged_cuda_call", raw.status());
        return 0;
      }
      // A CUDA tensor whose export record holds made-up handle bytes: the daemon must not
      // open it for a user who cannot open the GPUs.
      tpd::shm::TensorEntry entry{};
      entry.dtype = static_cast<uint8_t>(tpd::shm::DType::kFloat32);
      entry.ndim = 1;
      entry.shape[0] = 1024;
      entry.length = 4096;
      entry.device_type = static_cast<uint8_t>(tpd::shm::DeviceType::kCuda);
      entry.offset = 1 << 20;
      tpd::shm::CudaExport forged{};
      for (size_t i = 0; i < sizeof(forged.memory); ++i) forged.memory[i] = static_cast<uint8_t>(i);
      const uint64_t at = (*raw)->layout.tx_heap.offset;
      if (!(*raw)->SubmitCall(at, options.group, absl::GetFlag(FLAGS_call), "echo", options.name,
                              "x", 1, absl::Seconds(5), {entry}, {forged})) {
        Print("forged_cuda_call", absl::UnavailableError("the submission ring is full"));
        return 0;
      }
      auto replies = (*raw)->Replies(1, absl::Now() + absl::Seconds(10));
      Print("forged_cuda_call", replies.count(1) == 0
                                    ? absl::DeadlineExceededError("no answer")
                                    : absl::Status(replies[1].first, replies[1].second));
      return 0;
    }
    if (!absl::GetFlag(FLAGS_call).empty()) {
      std::vector<tpd::Tensor> tensors;
      if (const int64_t bytes = absl::GetFlag(FLAGS_tensor_bytes); bytes > 0) {
        absl::StatusOr<tpd::Tensor> tensor =
            (*client)->AllocateTensor(tpd::shm::DType::kUInt8, {bytes});
        if (!tensor.ok()) {
          Print("call", tensor.status());
          return 0;
        }
        tensors.push_back(*std::move(tensor));
      }
      absl::StatusOr<tpd::Message> reply = (*client)->Call(options.group, absl::GetFlag(FLAGS_call),
                                                           "echo", "x", tensors, absl::Seconds(5));
      Print("call", reply.status());
      if (reply.ok() && !tensors.empty()) {
        // Whether this process was handed the caller's memory instead of a copy.
        const tpd::CallEngineStats stats = *(*client)->GetCallStats();
        std::printf("shared: %d tensors in sender memory, %d peer segments mapped\n",
                    static_cast<int>(stats.tensors_received_shared),
                    static_cast<int>(stats.peer_segments_mapped));
      }
    }
    if (const int n = absl::GetFlag(FLAGS_group_store_fill_mib); n > 0) {
      const tpd::StoreView store = (*client)->GroupStore(options.group);
      Fill("group_store_fill", n,
           [&](const std::string& key, const std::string& value) { return store.Set(key, value); });
    }
    if (const std::string other = absl::GetFlag(FLAGS_group_store); !other.empty()) {
      const tpd::StoreView store = (*client)->GroupStore(other);
      Print("group_store_get", store.Get("k", absl::Seconds(1)).status());
      Print("group_store_set", store.Set("k", "forged"));
    }
  }
  if (const std::string purpose = absl::GetFlag(FLAGS_user_secret); !purpose.empty()) {
    absl::StatusOr<std::unique_ptr<tpd::Client>> client = tpd::Client::Connect(socket);
    absl::StatusOr<std::string> secret =
        client.ok() ? (*client)->UserSecret(purpose) : client.status();
    Print("user_secret", secret.status());
    if (secret.ok()) std::printf("user_secret_hex: %s\n", absl::BytesToHexString(*secret).c_str());
  }
  if (const int n = absl::GetFlag(FLAGS_store_fill_mib); n > 0) {
    FillStore(socket, n, absl::GetFlag(FLAGS_store_without_session));
  }
  if (const int n = absl::GetFlag(FLAGS_attach_sessions); n > 0) {
    std::vector<std::unique_ptr<tpd::Client>> clients;
    int attached = 0;
    absl::Status first_error;
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<std::unique_ptr<tpd::Client>> client = tpd::Client::Connect(socket);
      absl::Status status = client.status();
      if (client.ok()) status = (*client)->AttachSharedMemory().status();
      if (status.ok()) {
        ++attached;
        clients.push_back(*std::move(client));
      } else if (first_error.ok()) {
        first_error = status;
      }
    }
    std::printf("attached: %d\n", attached);
    Print("attach_error", first_error);
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_hold_ms)));
  }
  return 0;
}
