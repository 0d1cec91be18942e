// Who is calling and what they may do. Every call to the server is made by a principal:
// an agent's or a person's client certificate, a bearer token from the tokens file, or (when
// the server runs without authentication, on loopback) the anonymous principal, which may do
// everything.
//
// Roles: `agent` ships samples (ingest) and nothing else; `reader` queries (gRPC query API,
// /api/v1, the web UI, /metrics); `operator` is a reader that may also start and cancel
// captures; `node` is another node of the same cluster (server/cluster): it may do all of
// that, and it alone may send replica streams and call the nodes' internal Cluster calls.
#ifndef STRATA_SERVER_AUTH_PRINCIPAL_H_
#define STRATA_SERVER_AUTH_PRINCIPAL_H_

#include <optional>
#include <string>
#include <string_view>

namespace strata::server::auth {

enum class Role { kAgent, kReader, kOperator, kNode };

const char* RoleName(Role role);
std::optional<Role> ParseRole(std::string_view name);
// Whether a principal with `have` may do what needs `need` (operator includes reader; node
// includes every role).
bool Grants(Role have, Role need);

struct Principal {
  enum class Kind { kAnonymous, kCertificate, kToken };
  Kind kind = Kind::kAnonymous;
  // The certificate's identity (first DNS subjectAltName, else CN), the token's name in the
  // tokens file, or "anonymous".
  std::string name = "anonymous";
  Role role = Role::kOperator;  // the anonymous principal may also ingest

  // "certificate host-1", "token alice", "anonymous": for errors and logs.
  std::string Describe() const;
};

}  // namespace strata::server::auth

#endif  // STRATA_SERVER_AUTH_PRINCIPAL_H_
