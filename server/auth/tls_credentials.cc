#include "server/auth/tls_credentials.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/log.h"
#include "common/rpc/client_security.h"

namespace strata::server::auth {
namespace fs = std::filesystem;

namespace {

constexpr char kCurrent[] = "current";  // the symbolic link to the generation in force
constexpr char kCert[] = "cert.pem";
constexpr char kKey[] = "key.pem";
constexpr char kClientCa[] = "client-ca.pem";

std::string GenerationName(uint64_t generation) { return absl::StrCat("gen-", generation); }

}  // namespace

absl::Status CheckServerTlsFiles(const ServerTlsFiles& files) {
  if (files.cert_file.empty() || files.key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  return rpc::CheckTlsFiles(files.cert_file, files.key_file, files.client_ca_file);
}

ServerTls::ServerTls(const ServerTlsFiles& files, std::string staging_dir)
    : files_(files), dir_(std::move(staging_dir)) {}

absl::StatusOr<std::unique_ptr<ServerTls>> ServerTls::Create(const ServerTlsFiles& files,
                                                             const std::string& staging_dir) {
  std::unique_ptr<ServerTls> tls(new ServerTls(files, staging_dir));
  const std::vector<base::FileStamp> stamps = tls->Stamps();
  if (absl::Status checked = CheckServerTlsFiles(files); !checked.ok()) return checked;
  tls->WarnOfValidity();
  std::error_code ec;
  fs::remove_all(staging_dir, ec);
  if (!fs::create_directories(staging_dir, ec) ||
      chmod(staging_dir.c_str(), S_IRWXU) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make the TLS staging directory ", staging_dir, ": ",
                     ec ? ec.message() : std::string(strerror(errno))));
  }
  {
    absl::MutexLock lock(&tls->stage_mu_);
    if (absl::Status staged = tls->Stage(stamps); !staged.ok()) return staged;
    tls->stamps_ = stamps;
  }

  const fs::path current = fs::path(staging_dir) / kCurrent;
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      (current / kKey).string(), (current / kCert).string(),
      files.client_ca_file.empty() ? "" : (current / kClientCa).string(), files.refresh_seconds);
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
  tls->credentials_ = grpc::experimental::TlsServerCredentials(options);
  if (tls->credentials_ == nullptr) return absl::InternalError("gRPC refused the TLS options");
  tls->watcher_ = std::thread([p = tls.get()] { p->Watch(); });
  return tls;
}

ServerTls::~ServerTls() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::vector<base::FileStamp> ServerTls::Stamps() const {
  return {base::StampOf(files_.cert_file), base::StampOf(files_.key_file),
          base::StampOf(files_.client_ca_file)};
}

absl::Status ServerTls::Stage(const std::vector<base::FileStamp>& checked) {
  const std::string name = GenerationName(generation_ + 1);
  const fs::path gen = fs::path(dir_) / name;
  std::error_code ec;
  fs::remove_all(gen, ec);
  if (!fs::create_directory(gen, ec)) {
    return absl::UnavailableError(absl::StrCat("cannot make ", gen.string(), ": ", ec.message()));
  }
  // Each generation's files a second newer than the last one's: gRPC's watcher compares
  // whole-second mtimes before and after it reads the pair, so that a switch in between is
  // seen and the pair read again.
  const int64_t mtime = std::max(absl::ToUnixSeconds(absl::Now()), staged_mtime_s_ + 1);
  const std::pair<const std::string*, const char*> copies[] = {
      {&files_.cert_file, kCert}, {&files_.key_file, kKey}, {&files_.client_ca_file, kClientCa}};
  for (const auto& [from, to] : copies) {
    if (from->empty()) continue;
    const fs::path copy = gen / to;
    const timespec times[2] = {{mtime, 0}, {mtime, 0}};
    std::string why;
    if (!fs::copy_file(*from, copy, ec)) {
      why = ec.message();
    } else if (chmod(copy.c_str(), S_IRUSR | S_IWUSR) != 0 ||
               utimensat(AT_FDCWD, copy.c_str(), times, 0) != 0) {
      why = strerror(errno);
    }
    if (!why.empty()) {
      fs::remove_all(gen, ec);
      return absl::UnavailableError(absl::StrCat("cannot copy ", *from, ": ", why));
    }
  }
  // What was copied is what was checked only if nothing changed meanwhile.
  if (Stamps() != checked) {
    fs::remove_all(gen, ec);
    return absl::AbortedError("the files changed while they were copied");
  }
  const fs::path next = fs::path(dir_) / "current.next";
  fs::remove(next, ec);
  if (symlink(name.c_str(), next.c_str()) != 0 ||
      rename(next.c_str(), (fs::path(dir_) / kCurrent).c_str()) != 0) {
    const std::string why = strerror(errno);
    fs::remove_all(gen, ec);
    return absl::UnavailableError(absl::StrCat("cannot switch to ", gen.string(), ": ", why));
  }
  // The generation before the previous one: no read of gRPC's still goes through it.
  if (generation_ > 0) fs::remove_all(fs::path(dir_) / GenerationName(generation_ - 1), ec);
  ++generation_;
  staged_mtime_s_ = mtime;
  return absl::OkStatus();
}

void ServerTls::WarnOfValidity() const {
  // Clients refuse an expired certificate with "certificate verify failed", as one of another
  // CA, and the server hears of it only as a closed connection.
  const std::string warning = rpc::CertificateValidityWarning(files_.cert_file, absl::Now());
  if (!warning.empty()) LogWarn("gRPC: TLS server certificate: {}", warning);
}

bool ServerTls::StageIfChanged() {
  absl::MutexLock lock(&stage_mu_);
  const std::vector<base::FileStamp> stamps = Stamps();
  if (stamps == stamps_) return false;
  if (absl::Status checked = CheckServerTlsFiles(files_); !checked.ok()) {
    stamps_ = stamps;  // reported once, not every second
    refused_.fetch_add(1, std::memory_order_relaxed);
    LogError("gRPC: TLS certificate files changed but cannot be used, still serving the "
             "previous certificate: {}",
             std::string(checked.message()));
    return false;
  }
  if (absl::Status staged = Stage(stamps); !staged.ok()) {
    // Looked at again at the next refresh.
    if (!absl::IsAborted(staged)) {
      LogError("gRPC: TLS certificate files not taken: {}", std::string(staged.message()));
    }
    return false;
  }
  stamps_ = stamps;
  staged_.fetch_add(1, std::memory_order_relaxed);
  LogInfo("gRPC: took the changed TLS certificate '{}'", files_.cert_file);
  WarnOfValidity();
  return true;
}

void ServerTls::Watch() {
  const absl::Duration period = absl::Seconds(std::max(1u, files_.refresh_seconds));
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), period);
    if (stopping_) break;
    mu_.Unlock();
    StageIfChanged();
    mu_.Lock();
  }
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
