#include "tests/testing/impostor_store.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "store/peer_mac.h"

namespace tpd::testing {

ImpostorStore::ImpostorStore(std::string reply_key, std::string host)
    : reply_key_(std::move(reply_key)), host_(std::move(host)) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(host_, ":0"), grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
}

ImpostorStore::~ImpostorStore() { server_->Shutdown(); }

std::string ImpostorStore::address() const { return absl::StrCat(host_, ":", port_); }

grpc::Status ImpostorStore::Set(grpc::ServerContext* context, const v1::SetRequest*,
                                v1::SetResponse* response) {
  return Answer(context, *response);
}

grpc::Status ImpostorStore::CompareSet(grpc::ServerContext* context, const v1::CompareSetRequest*,
                                       v1::CompareSetResponse* response) {
  response->set_value("forged");
  return Answer(context, *response);
}

grpc::Status ImpostorStore::MultiGet(grpc::ServerContext* context,
                                     const v1::MultiGetRequest* request,
                                     v1::MultiGetResponse* response) {
  for (int i = 0; i < request->keys_size(); ++i) response->add_values("forged");
  return Answer(context, *response);
}

grpc::Status ImpostorStore::Answer(grpc::ServerContext* context,
                                   const google::protobuf::Message& response) {
  auto call = context->client_metadata().find(store::kPeerAuthHeader);
  if (!reply_key_.empty() && call != context->client_metadata().end()) {
    absl::StatusOr<store::ParsedPeerAuth> parsed =
        store::ParsePeerAuthHeader(absl::string_view(call->second.data(), call->second.size()));
    if (parsed.ok()) {
      context->AddTrailingMetadata(
          store::kPeerReplyHeader,
          store::FormatPeerReplyHeader(store::ComputeReplyMac(reply_key_, parsed->mac, response)));
    }
  }
  return grpc::Status::OK;
}

}  // namespace tpd::testing
