// A store server that is no daemon of the cluster: what a user who serves a store of its own,
// or a host on the path, answers a daemon's peer calls with. It answers every Set, CompareSet
// and MultiGet with success ("forged" values), and signs its answers with `reply_key` when
// that is not empty (a token other than the cluster's, or the cluster's own for a control).
//
// Thread safety: gRPC's threads serve it; construct and destroy on one thread.

#ifndef TPD_TESTS_TESTING_IMPOSTOR_STORE_H_
#define TPD_TESTS_TESTING_IMPOSTOR_STORE_H_

#include <memory>
#include <string>

#include "grpcpp/server.h"
#include "proto/store.grpc.pb.h"

namespace tpd::testing {

class ImpostorStore final : public v1::Store::Service {
 public:
  // Listens on `host` (an IP literal of the caller's network namespace), a port of its own.
  explicit ImpostorStore(std::string reply_key, std::string host = "127.0.0.1");
  ~ImpostorStore() override;
  std::string address() const;

  grpc::Status Set(grpc::ServerContext* context, const v1::SetRequest* request,
                   v1::SetResponse* response) override;
  grpc::Status CompareSet(grpc::ServerContext* context, const v1::CompareSetRequest* request,
                          v1::CompareSetResponse* response) override;
  grpc::Status MultiGet(grpc::ServerContext* context, const v1::MultiGetRequest* request,
                        v1::MultiGetResponse* response) override;

 private:
  grpc::Status Answer(grpc::ServerContext* context, const google::protobuf::Message& response);

  const std::string reply_key_;
  const std::string host_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace tpd::testing

#endif  // TPD_TESTS_TESTING_IMPOSTOR_STORE_H_
