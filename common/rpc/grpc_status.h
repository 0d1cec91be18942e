// absl::Status <-> grpc::Status for services and their clients: the codes are the same numbers
// by design (both follow google.rpc.Code), so the conversion keeps code and message. And a handler's
// tail: run the transport-free form, answer with its result or its error.
#ifndef STRATA_COMMON_RPC_GRPC_STATUS_H_
#define STRATA_COMMON_RPC_GRPC_STATUS_H_

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::rpc {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// Runs `run` and moves its result into `*response`.
template <typename Response, typename Run>
grpc::Status Respond(Run run, Response* response) {
  absl::StatusOr<Response> r = run();
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

}  // namespace strata::rpc

#endif  // STRATA_COMMON_RPC_GRPC_STATUS_H_
