#include "server/auth/authorizer.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/escape.h"
#include "common/base/log.h"

namespace strata::server::auth {
namespace {

// Principals kept in the rate table at once; past it, full buckets are forgotten.
constexpr size_t kMaxBuckets = 100'000;

// The token in "Bearer TOKEN" or "Basic base64(user:TOKEN)"; nullopt for anything else.
std::optional<std::string> TokenOf(std::string_view authorization) {
  const size_t space = authorization.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::string_view scheme = authorization.substr(0, space);
  std::string_view rest = authorization.substr(space + 1);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  const absl::string_view scheme_a(scheme.data(), scheme.size());
  if (absl::EqualsIgnoreCase(scheme_a, "bearer")) return std::string(rest);
  if (absl::EqualsIgnoreCase(scheme_a, "basic")) {
    std::string decoded;
    if (!absl::Base64Unescape(absl::string_view(rest.data(), rest.size()), &decoded)) return std::nullopt;
    const size_t colon = decoded.find(':');
    if (colon == std::string::npos) return std::nullopt;
    return decoded.substr(colon + 1);
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(AuthorizerOptions options) {
  std::unique_ptr<Authorizer> a(new Authorizer(std::move(options)));
  if (!a->options_.auth_file.empty()) {
    const base::FileStamp stamp = base::StampOf(a->options_.auth_file);
    auto table = LoadAuthFile(a->options_.auth_file);
    if (!table.ok()) return table.status();
    {
      absl::MutexLock lock(&a->mu_);
      a->table_ = std::make_shared<const AuthTable>(std::move(*table));
      a->stamp_ = stamp;
    }
    a->watcher_ = std::thread([p = a.get()] { p->Watch(); });
  }
  return a;
}

Authorizer::Authorizer(AuthorizerOptions options)
    : options_(std::move(options)),
      enabled_(!options_.auth_file.empty() || options_.client_certificates),
      table_(std::make_shared<const AuthTable>()) {}

Authorizer::~Authorizer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
}

void Authorizer::Watch() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.reload_interval);
    if (stopping_) break;
    mu_.Unlock();
    ReloadIfChanged();
    mu_.Lock();
  }
}

bool Authorizer::ReloadIfChanged() {
  const base::FileStamp stamp = base::StampOf(options_.auth_file);
  {
    absl::MutexLock lock(&mu_);
    if (stamp == stamp_) return false;
    // Taken even if the load fails: a broken file is reported once, not every second.
    stamp_ = stamp;
  }
  auto table = LoadAuthFile(options_.auth_file);
  if (!table.ok()) {
    ++reload_errors_;
    LogError("tokens file not reloaded, the previous one stays in force: {}",
                  std::string(table.status().message()));
    return false;
  }
  LogInfo("tokens file {} reloaded: {} tokens, {} certificates", options_.auth_file,
               table->tokens.size(), table->certificates.size());
  auto shared = std::make_shared<const AuthTable>(std::move(*table));
  absl::MutexLock lock(&mu_);
  table_ = std::move(shared);
  ++reloads_;
  return true;
}

absl::StatusOr<Principal> Authorizer::Authenticate(const Credentials& credentials) const {
  if (!enabled_) return Principal{};
  std::shared_ptr<const AuthTable> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  if (!credentials.authorization.empty()) {
    std::optional<std::string> token = TokenOf(credentials.authorization);
    if (!token) {
      ++unauthenticated_;
      return absl::UnauthenticatedError(
          "malformed authorization: expected 'Bearer TOKEN' (or HTTP Basic with the token as "
          "the password)");
    }
    const AuthTable::Token* entry = table->FindToken(*token);
    if (entry == nullptr) {
      ++unauthenticated_;
      return absl::UnauthenticatedError(
          options_.auth_file.empty()
              ? "bearer tokens are not accepted: the server has no tokens file (--auth-file)"
              : "unknown bearer token: it is not in the server's tokens file");
    }
    return Principal{Principal::Kind::kToken, entry->name, entry->role};
  }
  if (!credentials.certificate_identity.empty() && options_.client_certificates) {
    auto listed = table->certificates.find(credentials.certificate_identity);
    if (listed != table->certificates.end()) {
      return Principal{Principal::Kind::kCertificate, credentials.certificate_identity,
                       listed->second};
    }
    if (options_.certificate_role) {
      return Principal{Principal::Kind::kCertificate, credentials.certificate_identity,
                       *options_.certificate_role};
    }
    ++unauthenticated_;
    return absl::UnauthenticatedError(absl::StrCat(
        "client certificate ", base::EscapeForLog(credentials.certificate_identity),
        " is not listed in the server's tokens file"));
  }
  ++unauthenticated_;
  return absl::UnauthenticatedError(
      options_.client_certificates
          ? "no credentials: this server requires a client certificate (--tls-cert/--tls-key) "
            "or a bearer token (--token-file)"
          : "no credentials: this server requires a bearer token (--token-file)");
}

absl::StatusOr<Principal> Authorizer::Authorize(const Credentials& credentials, Role need,
                                                std::string_view action) {
  auto principal = Authenticate(credentials);
  if (!principal.ok()) return principal.status();
  // Without authentication (loopback, or --insecure) the anonymous caller may do everything.
  if (principal->kind == Principal::Kind::kAnonymous) return principal;
  if (!Grants(principal->role, need)) {
    ++permission_denied_;
    return absl::PermissionDeniedError(
        absl::StrCat(principal->Describe(), " has role ", RoleName(principal->role), "; ",
                     std::string(action), " needs role ", RoleName(need),
                     need == Role::kReader ? " or operator" : ""));
  }
  return principal;
}

absl::Status Authorizer::AdmitQuery(const Principal& principal) {
  if (options_.query_rate <= 0) return absl::OkStatus();
  const double burst = std::max(1.0, options_.query_burst > 0 ? options_.query_burst
                                                               : options_.query_rate);
  const absl::Time now = absl::Now();
  const std::string key = principal.Describe();
  absl::MutexLock lock(&mu_);
  if (buckets_.size() >= kMaxBuckets && buckets_.find(key) == buckets_.end()) {
    // Forget the principals whose budget has refilled: they lose nothing.
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      const double refilled = it->second.tokens + absl::ToDoubleSeconds(now - it->second.refilled) *
                                                      options_.query_rate;
      it = refilled >= burst ? buckets_.erase(it) : std::next(it);
    }
  }
  auto [it, inserted] = buckets_.try_emplace(key, Bucket{burst, now});
  Bucket& b = it->second;
  b.tokens = std::min(burst, b.tokens + absl::ToDoubleSeconds(now - b.refilled) *
                                            options_.query_rate);
  b.refilled = now;
  if (b.tokens < 1) {
    ++rate_limited_;
    return absl::ResourceExhaustedError(absl::StrCat(
        principal.Describe(), " is over its query rate of ", options_.query_rate,
        " requests per second (strata-server --query-rate); retry later"));
  }
  b.tokens -= 1;
  return absl::OkStatus();
}

AuthStats Authorizer::stats() const {
  return {unauthenticated_.load(), permission_denied_.load(), rate_limited_.load(),
          reloads_.load(), reload_errors_.load()};
}

}  // namespace strata::server::auth
