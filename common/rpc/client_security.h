// How Strata's clients (strata-agent, the strata CLI, strata-loadgen) reach the server
// securely: TLS with the server verified against a CA (--tls-ca), an optional client
// certificate (--tls-cert/--tls-key: mutual TLS, the agent's identity), and an optional bearer
// token read from a file (--token-file or $STRATA_TOKEN_FILE; tokens never go on a command
// line, where `ps` shows them). Certificate files are re-read while the client runs, so they
// rotate without a restart.
//
// Also the checks both sides make of certificate files (readable PEM, the key belongs to the
// certificate), so a mistake fails at start, naming the file.
#ifndef STRATA_COMMON_RPC_CLIENT_SECURITY_H_
#define STRATA_COMMON_RPC_CLIENT_SECURITY_H_

#include <memory>
#include <string>
#include <string_view>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace CLI {
class App;
}

namespace strata::rpc {

struct ClientSecurityOptions {
  std::string ca_file;      // TLS when set: the CA that signed the server's certificate
  std::string cert_file;    // client certificate (mutual TLS)
  std::string key_file;
  std::string server_name;  // the name to verify instead of the address's host
  std::string token_file;   // a bearer token, first line of the file
};

// Adds --tls-ca, --tls-cert, --tls-key, --tls-server-name and --token-file (also
// $STRATA_TOKEN_FILE) to `app`.
void AddClientSecurityFlags(CLI::App* app, ClientSecurityOptions* options);

// Reads a token file: its first line, without surrounding whitespace; an error names the file
// (never its content).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Checks PEM files: `cert_file` and `key_file` must both be given or both be empty, and the
// key must belong to the certificate; `ca_file`, when given, must be PEM.
absl::Status CheckTlsFiles(const std::string& cert_file, const std::string& key_file,
                           const std::string& ca_file);

// What an operator should hear about the validity period of the certificate in `cert_file`
// at `now`: "expired on 2026-11-01T00:00:00Z", "not valid before ...", or "expires on ..., in
// N days" when that is within `soon`. Empty when it is valid beyond `soon`, or cannot be read
// (CheckTlsFiles reports that). A warning, not an error: a renewal may be on its way, and the
// programs watch their certificate files.
std::string CertificateValidityWarning(const std::string& cert_file, absl::Time now,
                                       absl::Duration soon = absl::Hours(24 * 7));

class ClientSecurity {
 public:
  // Plaintext, no token.
  ClientSecurity() = default;
  static absl::StatusOr<ClientSecurity> Load(const ClientSecurityOptions& options);

  // A channel to `target` with these credentials; `args` may carry other settings.
  std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target,
                                               grpc::ChannelArguments args = {}) const;
  // Adds the bearer token (if any) to a call.
  void Authorize(grpc::ClientContext* context) const;

  bool tls() const { return !options_.ca_file.empty(); }
  // What to add to a failed connection's error: with a client certificate, a server that
  // refuses it (another CA, expired) closes the connection after the handshake, and gRPC says
  // only "Socket closed". Empty when there is nothing to add.
  std::string ConnectionErrorHint(std::string_view error) const;

 private:
  ClientSecurityOptions options_;
  std::string authorization_;  // "Bearer TOKEN" or empty
};

}  // namespace strata::rpc

#endif  // STRATA_COMMON_RPC_CLIENT_SECURITY_H_
