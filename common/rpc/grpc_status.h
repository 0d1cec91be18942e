// absl::Status -> grpc::Status for the services: the codes are the same numbers by design
// (both follow google.rpc.Code), so the conversion keeps code and message.
#ifndef STRATA_COMMON_RPC_GRPC_STATUS_H_
#define STRATA_COMMON_RPC_GRPC_STATUS_H_

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace strata::rpc {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace strata::rpc

#endif  // STRATA_COMMON_RPC_GRPC_STATUS_H_
