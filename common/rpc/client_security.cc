#include "common/rpc/client_security.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/log.h"

namespace strata::rpc {
namespace {

// How often certificate files are re-read.
constexpr unsigned kRefreshSeconds = 1;

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the ", what, " ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " ", path, " is not PEM"));
  }
  return text.str();
}

}  // namespace

void AddClientSecurityFlags(CLI::App* app, ClientSecurityOptions* options) {
  app->add_option("--tls-ca", options->ca_file,
                  "PEM CA of the server's certificate: connect over TLS and verify the server");
  app->add_option("--tls-cert", options->cert_file,
                  "PEM client certificate for mutual TLS (re-read when it changes)");
  app->add_option("--tls-key", options->key_file, "PEM private key of --tls-cert");
  app->add_option("--tls-server-name", options->server_name,
                  "name to verify in the server's certificate (default: the --server host)");
  app->add_option("--token-file", options->token_file,
                  "file holding a bearer token for the server (first line)")
      ->envname("STRATA_TOKEN_FILE");
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the token file ", path));
  std::string line;
  std::getline(in, line);
  const size_t begin = line.find_first_not_of(" \t\r");
  const size_t end = line.find_last_not_of(" \t\r");
  if (begin == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("the token file ", path, " is empty"));
  }
  return line.substr(begin, end - begin + 1);
}

absl::Status CheckTlsFiles(const std::string& cert_file, const std::string& key_file,
                           const std::string& ca_file) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError("a certificate needs its key: give both --tls-cert and "
                                      "--tls-key");
  }
  if (!ca_file.empty()) {
    if (auto ca = ReadPem(ca_file, "CA certificate"); !ca.ok()) return ca.status();
  }
  if (cert_file.empty()) return absl::OkStatus();
  auto cert_pem = ReadPem(cert_file, "certificate");
  if (!cert_pem.ok()) return cert_pem.status();
  auto key_pem = ReadPem(key_file, "private key");
  if (!key_pem.ok()) return key_pem.status();
  BIO* cert_bio = BIO_new_mem_buf(cert_pem->data(), static_cast<int>(cert_pem->size()));
  X509* cert = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  BIO_free(cert_bio);
  BIO* key_bio = BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  absl::Status status;
  if (cert == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat("the certificate ", cert_file, " cannot be parsed"));
  } else if (key == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat("the private key ", key_file, " cannot be parsed"));
  } else if (X509_check_private_key(cert, key) != 1) {
    // Otherwise every handshake would fail later with nothing but a log line of gRPC's.
    status = absl::InvalidArgumentError(absl::StrCat(
        "the private key ", key_file, " does not belong to the certificate ", cert_file));
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  return status;
}

std::string CertificateValidityWarning(const std::string& cert_file, absl::Time now,
                                       absl::Duration soon) {
  auto pem = ReadPem(cert_file, "certificate");
  if (!pem.ok()) return "";
  BIO* bio = BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (cert == nullptr) return "";
  auto time_of = [](const ASN1_TIME* t) -> std::optional<absl::Time> {
    tm parts{};
    if (t == nullptr || ASN1_TIME_to_tm(t, &parts) != 1) return std::nullopt;
    return absl::FromTimeT(timegm(&parts));
  };
  const std::optional<absl::Time> not_before = time_of(X509_get0_notBefore(cert));
  const std::optional<absl::Time> not_after = time_of(X509_get0_notAfter(cert));
  X509_free(cert);
  auto date = [](absl::Time t) {
    return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
  };
  if (not_after.has_value() && *not_after <= now) {
    return absl::StrCat("the certificate ", cert_file, " expired on ", date(*not_after));
  }
  if (not_before.has_value() && *not_before > now) {
    return absl::StrCat("the certificate ", cert_file, " is not valid before ", date(*not_before));
  }
  if (not_after.has_value() && *not_after - now <= soon) {
    return absl::StrCat("the certificate ", cert_file, " expires on ", date(*not_after), ", in ",
                        absl::ToInt64Hours(*not_after - now) / 24, " days");
  }
  return "";
}

absl::StatusOr<ClientSecurity> ClientSecurity::Load(const ClientSecurityOptions& options) {
  ClientSecurity s;
  s.options_ = options;
  if (options.ca_file.empty() && !options.cert_file.empty()) {
    return absl::InvalidArgumentError("a client certificate needs TLS: give --tls-ca too");
  }
  if (absl::Status st = CheckTlsFiles(options.cert_file, options.key_file, options.ca_file);
      !st.ok()) {
    return st;
  }
  if (!options.cert_file.empty()) {
    // The server refuses the handshake, and its client sees only "Socket closed".
    const std::string warning = CertificateValidityWarning(options.cert_file, absl::Now());
    if (!warning.empty()) LogWarn("TLS client certificate: {}", warning);
  }
  if (!options.token_file.empty()) {
    auto token = ReadTokenFile(options.token_file);
    if (!token.ok()) return token.status();
    s.authorization_ = absl::StrCat("Bearer ", *token);
  }
  return s;
}

std::string ClientSecurity::ConnectionErrorHint(std::string_view error) const {
  if (!tls() || options_.cert_file.empty() || error.find("Socket closed") == error.npos) return "";
  return absl::StrCat(" (a server that refuses this client's certificate closes the connection: "
                      "is ", options_.cert_file, " signed by the CA of its --tls-client-ca, and "
                      "valid now?)");
}

std::shared_ptr<grpc::Channel> ClientSecurity::CreateChannel(const std::string& target,
                                                             grpc::ChannelArguments args) const {
  if (!tls()) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> provider;
  if (options_.cert_file.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        options_.ca_file, kRefreshSeconds);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        options_.key_file, options_.cert_file, options_.ca_file, kRefreshSeconds);
  }
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  tls.watch_root_certs();
  if (!options_.cert_file.empty()) tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  if (!options_.server_name.empty()) {
    args.SetString(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, options_.server_name);
  }
  return grpc::CreateCustomChannel(target, grpc::experimental::TlsCredentials(tls), args);
}

void ClientSecurity::Authorize(grpc::ClientContext* context) const {
  if (!authorization_.empty()) context->AddMetadata("authorization", authorization_);
}

}  // namespace strata::rpc
