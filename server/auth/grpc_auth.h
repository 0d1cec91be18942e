// The Authorizer for gRPC calls: credentials from a call's metadata ("authorization") and
// its TLS peer (a verified client certificate), and the answer as a gRPC status.
#ifndef STRATA_SERVER_AUTH_GRPC_AUTH_H_
#define STRATA_SERVER_AUTH_GRPC_AUTH_H_

#include <string_view>

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "server/auth/authorizer.h"

namespace strata::server::auth {

Credentials CallCredentials(const grpc::ServerContextBase& context);

// Authorizes a call for `action`; a null authorizer allows everything (tests and embedders
// that call the services directly, with a null context). Query calls (`rate_limited`) also
// take one request from the principal's rate budget.
absl::StatusOr<Principal> AuthorizeCall(Authorizer* authorizer,
                                        const grpc::ServerContextBase* context, Role need,
                                        std::string_view action, bool rate_limited = false);

}  // namespace strata::server::auth

#endif  // STRATA_SERVER_AUTH_GRPC_AUTH_H_
