#include "tests/testing/raw_session.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "shm/attach.h"
#include "shm/message.h"

namespace tpd::testing {

absl::StatusOr<std::unique_ptr<RawSession>> RawSession::Open(std::unique_ptr<Client> client) {
  auto raw = std::make_unique<RawSession>();
  raw->client = std::move(client);
  absl::StatusOr<std::shared_ptr<const shm::Segment>> segment = raw->client->AttachSharedMemory();
  if (!segment.ok()) return segment.status();
  raw->segment = *segment;
  raw->layout = raw->segment->layout();
  raw->size = raw->segment->size();
  void* w = mmap(nullptr, raw->size, PROT_READ | PROT_WRITE, MAP_SHARED, raw->segment->fd(), 0);
  if (w == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap of the segment: ", std::strerror(errno)));
  }
  raw->writable = static_cast<uint8_t*>(w);
  raw->submit = std::make_unique<shm::RingProducer>(raw->segment->base(), raw->layout.submission,
                                                    "submission ring");
  raw->complete = std::make_unique<shm::RingConsumer>(raw->segment->base(), raw->layout.completion,
                                                      "completion ring");
  return raw;
}

RawSession::~RawSession() {
  if (writable != nullptr) munmap(writable, size);
}

shm::Descriptor RawSession::WriteMessage(shm::Op op, uint64_t offset,
                                         const shm::MessageNames& names, const std::string& body,
                                         uint64_t call_id) {
  const uint64_t prefix = shm::MessagePrefixBytes(names);
  shm::WriteMessagePrefix(writable + offset, 0, names);
  std::memcpy(writable + offset + prefix, body.data(), body.size());
  shm::Descriptor d{};
  d.op = static_cast<uint8_t>(op);
  d.call_id = call_id;
  d.payload_offset = offset;
  d.payload_length = prefix + body.size();
  return d;
}

bool RawSession::SubmitCall(uint64_t offset, const std::string& group, const std::string& worker,
                            const std::string& method, const std::string& from,
                            const std::string& body, uint64_t call_id, absl::Duration timeout,
                            std::vector<shm::TensorEntry> tensors,
                            const std::vector<shm::CudaExport>& records) {
  shm::Descriptor call =
      WriteMessage(shm::Op::kCall, offset, {group, worker, method, from}, body, call_id);
  call.deadline_unix_ns = absl::ToUnixNanos(absl::Now() + timeout);
  if (!tensors.empty()) {
    const uint64_t table = offset + shm::AlignUp(call.payload_length);
    uint64_t record = table + shm::AlignUp(tensors.size() * sizeof(shm::TensorEntry));
    size_t next = 0;
    for (shm::TensorEntry& entry : tensors) {
      if (entry.device_type != static_cast<uint8_t>(shm::DeviceType::kCuda) ||
          next >= records.size()) {
        continue;
      }
      std::memcpy(writable + record, &records[next++], sizeof(shm::CudaExport));
      entry.device_handle = record;
      record += shm::AlignUp(sizeof(shm::CudaExport));
    }
    std::memcpy(writable + table, tensors.data(), tensors.size() * sizeof(shm::TensorEntry));
    call.tensor_count = static_cast<uint32_t>(tensors.size());
    call.tensor_table_offset = table;
  }
  absl::StatusOr<bool> pushed = submit->TryPush(call);
  return pushed.ok() && *pushed;
}

bool RawSession::SubmitStore(uint64_t offset, const std::string& group, const std::string& method,
                             const std::string& body, uint64_t call_id) {
  const shm::Descriptor store =
      WriteMessage(shm::Op::kStore, offset, {group, "", method, ""}, body, call_id);
  absl::StatusOr<bool> pushed = submit->TryPush(store);
  return pushed.ok() && *pushed;
}

std::map<uint64_t, std::pair<absl::StatusCode, std::string>> RawSession::Replies(size_t want,
                                                                                 absl::Time until) {
  std::map<uint64_t, std::pair<absl::StatusCode, std::string>> replies;
  while (replies.size() < want && absl::Now() < until) {
    absl::StatusOr<bool> ready =
        complete->WaitForData(std::min(until, absl::Now() + absl::Milliseconds(50)));
    if (!ready.ok()) break;
    shm::Descriptor d{};
    while (complete->TryPop(&d).value_or(false)) {
      if (d.op != static_cast<uint8_t>(shm::Op::kReply)) continue;
      if (!shm::ValidateDescriptor(d, layout, shm::Direction::kCompletion).ok()) {
        replies[d.call_id] = {absl::StatusCode::kInternal, "invalid descriptor from the daemon"};
        continue;
      }
      auto parsed = shm::ParseMessage(segment->base(), d.payload_offset, d.payload_length);
      if (!parsed.ok()) {
        // The daemon wrote it into our rx heap; a test that scribbles that heap may have
        // overwritten it before we read it.
        replies[d.call_id] = {absl::StatusCode::kDataLoss,
                              absl::StrCat("unparsable reply: ", parsed.status().message())};
        continue;
      }
      replies[d.call_id] = {static_cast<absl::StatusCode>(parsed->code), parsed->names[2]};
    }
  }
  return replies;
}

absl::Status SendDataRequest(const std::string& grpc_socket,
                             const std::array<uint8_t, shm::kAttachRequestBytes>& request) {
  const std::string path = shm::DataSocketPath(grpc_socket);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot reach the data socket ", path));
  }
  std::string reply(shm::kAttachReplyBytes, '\0');
  const ssize_t got = recv(fd, reply.data(), reply.size(), MSG_WAITALL);
  close(fd);  // with any memfd that came
  if (got != static_cast<ssize_t>(reply.size())) {
    return absl::UnavailableError("the daemon closed the data connection without a reply");
  }
  absl::StatusOr<shm::AttachReply> decoded = shm::DecodeAttachReply(reply);
  return decoded.ok() ? decoded->status : decoded.status();
}

absl::Status IdentifyRawSession(const std::string& grpc_socket, const std::string& session_id) {
  auto request = shm::EncodeIdentifyRequest(session_id);
  if (!request.ok()) return request.status();
  return SendDataRequest(grpc_socket, *request);
}

std::string RawSessionStreams::Open(absl::Status* refused) {
  if (control_ == nullptr) {
    control_ = v1::Control::NewStub(
        grpc::CreateChannel(absl::StrCat("unix:", socket_), grpc::InsecureChannelCredentials()));
  }
  contexts_.push_back(std::make_unique<grpc::ClientContext>());
  streams_.push_back(control_->OpenSession(contexts_.back().get(), v1::OpenSessionRequest()));
  v1::SessionEvent event;
  if (streams_.back()->Read(&event)) return event.session_id();
  if (refused != nullptr) {
    const grpc::Status finished = streams_.back()->Finish();
    *refused = absl::Status(static_cast<absl::StatusCode>(finished.error_code()),
                            finished.error_message());
  }
  return "";
}

void RawSessionStreams::CloseAll() {
  for (auto& context : contexts_) context->TryCancel();
  streams_.clear();
  contexts_.clear();
  control_.reset();
}

}  // namespace tpd::testing
