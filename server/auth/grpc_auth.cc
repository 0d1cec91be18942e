#include "server/auth/grpc_auth.h"

#include <grpc/grpc_security_constants.h>

namespace strata::server::auth {

Credentials CallCredentials(const grpc::ServerContextBase& context) {
  Credentials c;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    c.authorization.assign(it->second.data(), it->second.size());
  }
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    // The identity is the first DNS subjectAltName, else the subject's common name: the same
    // rule as the HTTP server's.
    for (const char* property : {GRPC_PEER_DNS_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
      std::vector<grpc::string_ref> values = auth->FindPropertyValues(property);
      if (!values.empty()) {
        c.certificate_identity.assign(values[0].data(), values[0].size());
        break;
      }
    }
  }
  return c;
}

absl::StatusOr<Principal> AuthorizeCall(Authorizer* authorizer,
                                        const grpc::ServerContextBase* context, Role need,
                                        std::string_view action, bool rate_limited) {
  if (authorizer == nullptr) return Principal{};
  if (context == nullptr) return absl::InternalError("a call without a server context");
  auto principal = authorizer->Authorize(CallCredentials(*context), need, action);
  if (!principal.ok() || !rate_limited) return principal;
  if (absl::Status st = authorizer->AdmitQuery(*principal); !st.ok()) return st;
  return principal;
}

}  // namespace strata::server::auth
