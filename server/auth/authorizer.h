// Authentication and authorization of every call to the server: gRPC (ingest, query,
// capture) and HTTP (/api/v1, the web UI, /metrics). The server owns one Authorizer and
// passes it to each service; services ask it, first thing, whether a call may do what it
// asks (Authorize) and, for queries, whether the caller is within its request rate.
//
// Principals come from verified client certificates (TLS with --tls-client-ca) and from
// bearer tokens in the tokens file (--auth-file, see auth_file.h), which is re-read when it
// changes. A server with neither runs open: every caller is the anonymous operator (allowed
// on loopback only, or with --insecure; see server/app/server_flags.cc).
//
// Every refusal says what is missing (UNAUTHENTICATED: no or unknown credentials;
// PERMISSION_DENIED: the role needed; RESOURCE_EXHAUSTED: over the query rate) and is counted
// in stats(). Tokens never appear in errors or logs. Thread-safe.
#ifndef STRATA_SERVER_AUTH_AUTHORIZER_H_
#define STRATA_SERVER_AUTH_AUTHORIZER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/file_stamp.h"
#include "server/auth/auth_file.h"
#include "server/auth/principal.h"

namespace strata::server::auth {

// What a call presents.
struct Credentials {
  // The Authorization header or metadata: "Bearer TOKEN", or "Basic base64(user:TOKEN)"
  // (browsers); empty if absent.
  std::string authorization;
  // The verified client certificate's identity (first DNS subjectAltName, else CN); empty
  // without one.
  std::string certificate_identity;
};

struct AuthorizerOptions {
  std::string auth_file;  // empty: no tokens
  // Client certificates are verified by the TLS layer (--tls-client-ca): they are principals.
  bool client_certificates = false;
  // The role of a verified certificate the tokens file does not list; nullopt: only listed
  // certificates are principals.
  std::optional<Role> certificate_role = Role::kAgent;
  absl::Duration reload_interval = absl::Seconds(1);
  // Query requests per second and burst per principal; 0: unlimited.
  double query_rate = 0;
  double query_burst = 0;
};

struct AuthStats {
  uint64_t unauthenticated = 0;
  uint64_t permission_denied = 0;
  uint64_t rate_limited = 0;
  uint64_t reloads = 0;        // tokens file changes taken
  uint64_t reload_errors = 0;  // changes refused (the previous table stays)
};

class Authorizer {
 public:
  // Loads the tokens file (an error names the file and line) and starts watching it.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(AuthorizerOptions options);
  ~Authorizer();
  Authorizer(const Authorizer&) = delete;
  Authorizer& operator=(const Authorizer&) = delete;

  // Whether callers must authenticate (a tokens file or client certificates).
  bool enabled() const { return enabled_; }

  // Who presents `credentials`. A bearer token, when given, is the principal; otherwise the
  // certificate.
  absl::StatusOr<Principal> Authenticate(const Credentials& credentials) const;
  // Authenticate, then check the role `need` for `action` ("queries", "starting captures").
  absl::StatusOr<Principal> Authorize(const Credentials& credentials, Role need,
                                      std::string_view action);
  // Takes one query request from the principal's rate budget.
  absl::Status AdmitQuery(const Principal& principal);

  AuthStats stats() const;
  // Changes with every reload of the tokens file: a long-lived call (an agent's stream)
  // authorized before it checks its credentials again, so that a removed token or a lowered
  // role stops it too.
  uint64_t reloads() const { return reloads_.load(std::memory_order_relaxed); }

 private:
  explicit Authorizer(AuthorizerOptions options);
  void Watch();
  bool ReloadIfChanged();

  struct Bucket {
    double tokens;
    absl::Time refilled;
  };

  const AuthorizerOptions options_;
  const bool enabled_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const AuthTable> table_ ABSL_GUARDED_BY(mu_);
  base::FileStamp stamp_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  mutable std::atomic<uint64_t> unauthenticated_{0};
  std::atomic<uint64_t> permission_denied_{0}, rate_limited_{0}, reloads_{0}, reload_errors_{0};
  std::thread watcher_;
};

}  // namespace strata::server::auth

#endif  // STRATA_SERVER_AUTH_AUTHORIZER_H_
