#include "server/auth/tls_credentials.h"

#include <arpa/inet.h>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>


#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/client_security.h"

namespace strata::server::auth {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files) {
  if (files.cert_file.empty() || files.key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  if (absl::Status st =
          rpc::CheckTlsFiles(files.cert_file, files.key_file, files.client_ca_file);
      !st.ok()) {
    return st;
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key_file, files.cert_file, files.client_ca_file, files.refresh_seconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (files.client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    // Requested and verified, not required: readers and operators may come with a token
    // instead; the Authorizer decides what a caller without a certificate may do.
    options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  auto credentials = grpc::experimental::TlsServerCredentials(options);
  if (credentials == nullptr) return absl::InternalError("gRPC refused the TLS options");
  return credentials;
}

bool IsLoopbackAddress(const std::string& address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;  // a name, an empty host or 0.0.0.0: may be reachable from elsewhere
}

}  // namespace strata::server::auth
