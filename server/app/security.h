// The credentials strata-server's options name, loaded and checked against each other: the
// Authorizer (tokens file, client certificates), the gRPC server's TLS credentials, and a
// cluster node's credentials for the other nodes and for etcd. A mistake here is the
// operator's (a file that does not load, a node token the tokens file does not give role
// node), reported at start with the file or flag it concerns.
#ifndef STRATA_SERVER_APP_SECURITY_H_
#define STRATA_SERVER_APP_SECURITY_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "common/rpc/client_security.h"
#include "server/app/server_options.h"
#include "server/auth/authorizer.h"

namespace strata::server::app {

struct ServerSecurity {
  std::unique_ptr<auth::Authorizer> authorizer;
  // Plaintext; null with TLS (ServerApp makes them from auth::ServerTls).
  std::shared_ptr<grpc::ServerCredentials> grpc_credentials;
  // A cluster node's calls (plaintext and no token for a single server).
  rpc::ClientSecurity node_client;  // to the other nodes
  rpc::ClientSecurity etcd_client;  // to etcd
};

// Loads what `options` (from ServerOptionsFromFlags) name.
absl::StatusOr<ServerSecurity> LoadSecurity(const ServerOptions& options);

// Loads etcd's TLS files (after ResolveEtcdTls) and checks the endpoints against them by the
// etcd client's own rules, so a mismatch is a flag error at start. Shared with forget-node.
absl::StatusOr<rpc::ClientSecurity> LoadEtcdSecurity(const std::string& endpoints,
                                                     const rpc::ClientSecurityOptions& etcd);

}  // namespace strata::server::app

#endif  // STRATA_SERVER_APP_SECURITY_H_
