// gRPC server credentials from certificate files (--tls-cert, --tls-key, --tls-client-ca),
// re-read while the server runs so certificates rotate without a restart: new connections
// get the new files, existing ones keep the session they have.
#ifndef STRATA_SERVER_AUTH_TLS_CREDENTIALS_H_
#define STRATA_SERVER_AUTH_TLS_CREDENTIALS_H_

#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"

namespace strata::server::auth {

struct ServerTlsFiles {
  std::string cert_file;  // PEM chain, leaf first
  std::string key_file;
  // Client certificates are requested and, when presented, must chain to this CA; empty: not
  // requested.
  std::string client_ca_file;
  unsigned refresh_seconds = 1;
};

// Checks the files now (readable, PEM, the key matches the certificate) so a mistake fails
// at start with the file's name, then returns credentials that watch them.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files);

// Whether `address` (gRPC "host:port", "unix:PATH", or an HTTP "host:port") is reachable
// only from this machine.
bool IsLoopbackAddress(const std::string& address);

}  // namespace strata::server::auth

#endif  // STRATA_SERVER_AUTH_TLS_CREDENTIALS_H_
