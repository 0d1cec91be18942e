#include "server/auth/auth_file.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/escape.h"

namespace strata::server::auth {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kAgent:
      return "agent";
    case Role::kReader:
      return "reader";
    case Role::kOperator:
      return "operator";
    case Role::kNode:
      return "node";
  }
  return "?";
}

std::optional<Role> ParseRole(std::string_view name) {
  for (Role r : {Role::kAgent, Role::kReader, Role::kOperator, Role::kNode}) {
    if (RoleName(r) == name) return r;
  }
  return std::nullopt;
}

bool Grants(Role have, Role need) {
  return have == need || have == Role::kNode ||
         (have == Role::kOperator && need == Role::kReader);
}

std::string Principal::Describe() const {
  switch (kind) {
    case Kind::kAnonymous:
      return "anonymous";
    case Kind::kCertificate:
      return absl::StrCat("certificate ", base::EscapeForLog(name));
    case Kind::kToken:
      return absl::StrCat("token ", base::EscapeForLog(name));
  }
  return name;
}

TokenHash HashToken(std::string_view token) {
  TokenHash hash{};
  unsigned int size = 0;
  EVP_Digest(token.data(), token.size(), hash.data(), &size, EVP_sha256(), nullptr);
  return hash;
}

std::string FormatTokenHash(const TokenHash& hash) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (uint8_t b : hash) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

const AuthTable::Token* AuthTable::FindToken(std::string_view token) const {
  const TokenHash hash = HashToken(token);
  const Token* found = nullptr;
  for (const Token& t : tokens) {
    // No early exit: every entry costs the same whether or not an earlier one matched.
    const bool match = CRYPTO_memcmp(t.hash.data(), hash.data(), hash.size()) == 0;
    if (match && found == nullptr) found = &t;
  }
  return found;
}

namespace {

bool ParseHash(std::string_view text, TokenHash* out) {
  constexpr std::string_view kPrefix = "sha256:";
  if (text.substr(0, kPrefix.size()) != kPrefix || text.size() != kPrefix.size() + 64) {
    return false;
  }
  text.remove_prefix(kPrefix.size());
  for (size_t i = 0; i < 32; ++i) {
    int v = 0;
    for (char c : {text[2 * i], text[2 * i + 1]}) {
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        return false;
      }
      v = v * 16 + d;
    }
    (*out)[i] = static_cast<uint8_t>(v);
  }
  return true;
}

}  // namespace

absl::StatusOr<AuthTable> ParseAuthFile(std::string_view text, std::string_view path) {
  AuthTable table;
  int line_number = 0;
  for (absl::string_view raw : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_number;
    auto fail = [&](std::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(absl::string_view(path.data(), path.size()),
                                                     ":", line_number, ": ",
                                                     absl::string_view(why.data(), why.size())));
    };
    absl::string_view line = raw.substr(0, raw.find('#'));
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const std::string_view kind(fields[0].data(), fields[0].size());
    if (kind != "token" && kind != "cert") {
      return fail(absl::StrCat("unknown entry '", base::EscapeForLog(std::string(kind)),
                               "' (expected 'token NAME ROLE sha256:HEX' or 'cert IDENTITY ROLE')"));
    }
    const size_t expected = kind == "token" ? 4 : 3;
    if (fields.size() != expected) {
      return fail(kind == "token" ? "expected 'token NAME ROLE sha256:HEX'"
                                  : "expected 'cert IDENTITY ROLE'");
    }
    std::string name(fields[1]);
    std::optional<Role> role = ParseRole(std::string_view(fields[2].data(), fields[2].size()));
    if (!role) {
      return fail(absl::StrCat("unknown role '", base::EscapeForLog(std::string(fields[2])),
                               "' (agent, reader, operator or node)"));
    }
    if (kind == "cert") {
      if (!table.certificates.emplace(name, *role).second) {
        return fail(absl::StrCat("certificate '", base::EscapeForLog(name), "' is listed twice"));
      }
      continue;
    }
    AuthTable::Token token{name, *role, {}};
    if (!ParseHash(std::string_view(fields[3].data(), fields[3].size()), &token.hash)) {
      // Never echo the value: it may be a token pasted in clear.
      return fail("the token must be given as sha256:<64 hex digits> (its hash, not the "
                  "token itself; see strata-server hash-token)");
    }
    for (const auto& t : table.tokens) {
      if (t.name == name) {
        return fail(absl::StrCat("token '", base::EscapeForLog(name), "' is listed twice"));
      }
    }
    table.tokens.push_back(std::move(token));
  }
  return table;
}

absl::StatusOr<AuthTable> LoadAuthFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the tokens file ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > (4u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": larger than 4 MiB"));
  }
  return ParseAuthFile(text.str(), path);
}

}  // namespace strata::server::auth
