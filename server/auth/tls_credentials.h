// gRPC server credentials from certificate files (--tls-cert, --tls-key, --tls-client-ca),
// re-read while the server runs so certificates rotate without a restart: new connections
// get the new files, existing ones keep the session they have.
//
// gRPC's file watcher takes whatever its paths hold at each refresh, a certificate renewed
// before its key included, and would then fail every new handshake until the key came. So it
// watches copies: ServerTls checks each change of the operator's files (parsed, the key the
// certificate's) and only then copies them into the next generation of a staging directory,
// switched in by one rename. A change refused leaves the previous pair in force, as the HTTP
// server does with its context. ServerTls owns its watcher thread and the staging directory;
// the credentials need it alive.
#ifndef STRATA_SERVER_AUTH_TLS_CREDENTIALS_H_
#define STRATA_SERVER_AUTH_TLS_CREDENTIALS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/file_stamp.h"

namespace strata::server::auth {

struct ServerTlsFiles {
  std::string cert_file;  // PEM chain, leaf first
  std::string key_file;
  // Client certificates are requested and, when presented, must chain to this CA; empty: not
  // requested.
  std::string client_ca_file;
  unsigned refresh_seconds = 1;
};

// Checks the files (readable, PEM, the key matches the certificate) so a mistake fails at
// start with the file's name.
absl::Status CheckServerTlsFiles(const ServerTlsFiles& files);

class ServerTls {
 public:
  // Checks the files, copies them into `staging_dir` (created, private to the server's user;
  // what an earlier run left there goes) and makes credentials that watch the copies.
  static absl::StatusOr<std::unique_ptr<ServerTls>> Create(const ServerTlsFiles& files,
                                                           const std::string& staging_dir);
  ~ServerTls();

  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }
  // One look at the files (the watcher's, every refresh_seconds): true when a change was
  // checked and staged.
  bool StageIfChanged();
  uint64_t staged() const { return staged_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  ServerTls(const ServerTlsFiles& files, std::string staging_dir);
  // Copies the operator's files into a new generation and switches to it; Aborted when they
  // no longer have the stamps `checked` (they changed since they were checked).
  absl::Status Stage(const std::vector<base::FileStamp>& checked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stage_mu_);
  std::vector<base::FileStamp> Stamps() const;
  void Watch();
  // Logs a warning when the certificate is expired, not yet valid or expires within a week.
  void WarnOfValidity() const;

  const ServerTlsFiles files_;
  const std::string dir_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  absl::Mutex stage_mu_;  // one look at a time: the watcher's, or a caller's
  uint64_t generation_ ABSL_GUARDED_BY(stage_mu_) = 0;
  int64_t staged_mtime_s_ ABSL_GUARDED_BY(stage_mu_) = 0;  // of the current generation's files
  // Of the files staged or refused last.
  std::vector<base::FileStamp> stamps_ ABSL_GUARDED_BY(stage_mu_);
  std::atomic<uint64_t> staged_{0}, refused_{0};
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

// Whether `address` (gRPC "host:port", "unix:PATH", or an HTTP "host:port") is reachable
// only from this machine.
bool IsLoopbackAddress(const std::string& address);

}  // namespace strata::server::auth

#endif  // STRATA_SERVER_AUTH_TLS_CREDENTIALS_H_
