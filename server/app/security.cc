#include "server/app/security.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/auth/principal.h"
#include "server/auth/tls_credentials.h"
#include "server/cluster/etcd/etcd_client.h"

namespace strata::server::app {
namespace {

// A node whose own tokens file does not give its token role node is refused at start: the
// other nodes, configured alike, would refuse every replica it sends.
absl::Status CheckNodeToken(const auth::Authorizer& authorizer, const std::string& token_file) {
  auto token = rpc::ReadTokenFile(token_file);
  if (!token.ok()) return token.status();
  auth::Credentials credentials;
  credentials.authorization = "Bearer " + *token;
  auto principal = authorizer.Authenticate(credentials);
  if (!principal.ok()) {
    return absl::InvalidArgumentError(
        "the token of --cluster-token-file is not in --auth-file: list it with role node "
        "(strata-server hash-token --role node)");
  }
  if (principal->role != auth::Role::kNode) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the token of --cluster-token-file is ", principal->Describe(), " with role ",
        auth::RoleName(principal->role), " in --auth-file; nodes need role node"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<rpc::ClientSecurity> LoadEtcdSecurity(const std::string& endpoints,
                                                     const rpc::ClientSecurityOptions& etcd) {
  auto security = rpc::ClientSecurity::Load(etcd);
  if (!security.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd's TLS: ", security.status().message()));
  }
  if (auto client = cluster::EtcdClient::Create(endpoints, {.security = *security});
      !client.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster-etcd: ", client.status().message(), " (TLS to etcd: --cluster-etcd-ca)"));
  }
  return security;
}

absl::StatusOr<ServerSecurity> LoadSecurity(const ServerOptions& options) {
  ServerSecurity security;
  auto authorizer = auth::Authorizer::Create(options.security.authorizer);
  if (!authorizer.ok()) return authorizer.status();
  security.authorizer = std::move(*authorizer);
  if (options.security.tls_on()) {
    // Staged and watched once the store is open (ServerApp::Listen).
    if (absl::Status checked = auth::CheckServerTlsFiles(options.security.tls); !checked.ok()) {
      return checked;
    }
  } else {
    security.grpc_credentials = grpc::InsecureServerCredentials();
  }
  const ClusterOptions& cluster = options.cluster;
  if (!cluster.enabled()) return security;
  if (security.authorizer->enabled() && !cluster.node_client.token_file.empty()) {
    absl::Status token = CheckNodeToken(*security.authorizer, cluster.node_client.token_file);
    if (!token.ok()) return token;
  }
  auto nodes = rpc::ClientSecurity::Load(cluster.node_client);
  if (!nodes.ok()) return nodes.status();
  security.node_client = *std::move(nodes);
  auto etcd = LoadEtcdSecurity(cluster.etcd_endpoints, cluster.etcd_client);
  if (!etcd.ok()) return etcd.status();
  security.etcd_client = *std::move(etcd);
  return security;
}

}  // namespace strata::server::app
