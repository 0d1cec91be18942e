// The tokens file (--auth-file): which bearer tokens and which client certificates are
// principals, with their roles. Tokens are stored as SHA-256 hashes, never in clear, and are
// looked up in constant time (every entry is compared, with CRYPTO_memcmp).
//
// Format, one principal per line; '#' starts a comment:
//   token <name> <role> sha256:<64 hex digits>   a bearer token (`strata-server hash-token`)
//   cert  <identity> <role>                      a client certificate's identity
// Roles: agent, reader, operator, node (principal.h). Names and identities are unique per kind.
#ifndef STRATA_SERVER_AUTH_AUTH_FILE_H_
#define STRATA_SERVER_AUTH_AUTH_FILE_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/auth/principal.h"

namespace strata::server::auth {

using TokenHash = std::array<uint8_t, 32>;

TokenHash HashToken(std::string_view token);
// "sha256:<hex>", the form the tokens file takes.
std::string FormatTokenHash(const TokenHash& hash);

struct AuthTable {
  struct Token {
    std::string name;
    Role role;
    TokenHash hash;
  };
  std::vector<Token> tokens;
  std::map<std::string, Role> certificates;

  // The token's entry, comparing against every entry so the time does not depend on which
  // (or whether one) matches.
  const Token* FindToken(std::string_view token) const;
};

// Parses a tokens file; errors name `path` and the line.
absl::StatusOr<AuthTable> ParseAuthFile(std::string_view text, std::string_view path);
absl::StatusOr<AuthTable> LoadAuthFile(const std::string& path);

}  // namespace strata::server::auth

#endif  // STRATA_SERVER_AUTH_AUTH_FILE_H_
