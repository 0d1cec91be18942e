#include "server/http/tls_context.h"

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/escape.h"

namespace strata::server::http {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace ssl = boost::asio::ssl;

namespace {

// The OpenSSL error queue is per thread: whatever a failed load left there must not be
// mistaken for the next connection's error on this I/O thread.
std::string TakeOpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

// What went wrong in an asio ssl::context call: asio takes the first OpenSSL error off the
// queue into `ec`; anything still queued adds detail.
std::string ErrorText(const beast::error_code& ec) {
  std::string text = ec.message();
  if (ERR_peek_error() != 0) absl::StrAppend(&text, " (", TakeOpenSslErrors(), ")");
  return text;
}

// Keys are never encrypted here: a server has nobody to ask for a passphrase.
int NoPassphrase(char*, int, int, void*) { return 0; }

absl::StatusOr<std::string> ReadWhole(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read TLS ", what, " '",
                                                   base::EscapeForLog(path),
                                                   "': ", std::strerror(errno)));
  }
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read TLS ", what, " '", base::EscapeForLog(path), "'"));
  }
  return data;
}

// A server context for `tls`: TLS 1.2 and 1.3 only, the certificate (chain) and its key, and
// with a client CA, client certificates requested and verified (but not required). The files
// are read whole first so that an unreadable file is named with its errno.

}  // namespace

TlsStamp StampAll(const HttpServerOptions::Tls& tls) {
  return {base::StampOf(tls.cert_file), base::StampOf(tls.key_file),
          base::StampOf(tls.client_ca_file)};
}

absl::StatusOr<std::shared_ptr<ssl::context>> BuildTlsContext(const HttpServerOptions::Tls& tls) {
  auto cert = ReadWhole("certificate", tls.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadWhole("key", tls.key_file);
  if (!key.ok()) return key.status();
  std::string ca;
  if (!tls.client_ca_file.empty()) {
    auto read = ReadWhole("client CA", tls.client_ca_file);
    if (!read.ok()) return read.status();
    ca = std::move(*read);
  }
  ERR_clear_error();
  auto fail = [](const std::string& what, const std::string& path, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("cannot load TLS ", what, " '",
                                                   base::EscapeForLog(path), "': ", why));
  };
  std::shared_ptr<ssl::context> ctx;
  try {  // the context's constructor throws if OpenSSL cannot make one
    ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  } catch (const std::exception& e) {
    TakeOpenSslErrors();
    return absl::InternalError(absl::StrCat("cannot create a TLS context: ", e.what()));
  }
  SSL_CTX* native = ctx->native_handle();
  // No SSLv2/3, TLS 1.0/1.1; no renegotiation (a client could make the server redo the
  // expensive part of a handshake at will).
  SSL_CTX_set_options(native, SSL_OP_NO_SSLv2 | SSL_OP_NO_SSLv3 | SSL_OP_NO_TLSv1 |
                                  SSL_OP_NO_TLSv1_1 | SSL_OP_NO_RENEGOTIATION |
                                  SSL_OP_NO_COMPRESSION);
  if (SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION) != 1 ||
      // TLS 1.2: forward secrecy and AEAD only (TLS 1.3's suites are all of that).
      SSL_CTX_set_cipher_list(native,
                              "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                              "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
                              "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305") != 1) {
    return absl::InternalError(
        absl::StrCat("cannot configure TLS protocols: ", TakeOpenSslErrors()));
  }
  beast::error_code ec;
  SSL_CTX_set_default_passwd_cb(native, NoPassphrase);
  ctx->use_certificate_chain(asio::buffer(*cert), ec);
  if (ec) return fail("certificate", tls.cert_file, ErrorText(ec));
  // The key is parsed here rather than by asio: an encrypted key fails instead of OpenSSL
  // asking for a passphrase on the terminal, and a key for another certificate is named so.
  BIO* key_bio = BIO_new_mem_buf(key->data(), static_cast<int>(key->size()));
  EVP_PKEY* pkey = key_bio == nullptr
                       ? nullptr
                       : PEM_read_bio_PrivateKey(key_bio, nullptr, NoPassphrase, nullptr);
  BIO_free(key_bio);
  OPENSSL_cleanse(key->data(), key->size());  // the parsed key is all that stays in memory
  if (pkey == nullptr) {
    return fail("key", tls.key_file,
                absl::StrCat("not an unencrypted PEM private key: ", TakeOpenSslErrors()));
  }
  const bool matches = X509_check_private_key(SSL_CTX_get0_certificate(native), pkey) == 1;
  const bool used = matches && SSL_CTX_use_PrivateKey(native, pkey) == 1;
  EVP_PKEY_free(pkey);
  if (!matches) {
    TakeOpenSslErrors();
    return fail("key", tls.key_file,
                absl::StrCat("it does not match the certificate '", base::EscapeForLog(tls.cert_file),
                             "'"));
  }
  if (!used || SSL_CTX_check_private_key(native) != 1) {
    return fail("key", tls.key_file, TakeOpenSslErrors());
  }
  if (!tls.client_ca_file.empty()) {
    // Every certificate in the file is trusted, and named to clients as an acceptable issuer.
    BIO* bio = BIO_new_mem_buf(ca.data(), static_cast<int>(ca.size()));
    int added = 0;
    bool bad = bio == nullptr;
    while (!bad) {
      X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
      if (x == nullptr) break;
      if (X509_STORE_add_cert(SSL_CTX_get_cert_store(native), x) != 1 ||
          SSL_CTX_add_client_CA(native, x) != 1) {
        bad = true;
      }
      X509_free(x);
      ++added;
    }
    BIO_free(bio);
    // The loop ends on a "no start line" error past the last certificate.
    const std::string errors = TakeOpenSslErrors();
    if (bad || added == 0) {
      return fail("client CA", tls.client_ca_file,
                  added == 0 ? "no PEM certificate in it" : errors);
    }
    // A certificate is asked for but optional: without one the handlers see an empty
    // peer_identity. One that is presented must verify, or the handshake fails.
    ctx->set_verify_mode(ssl::verify_peer, ec);
    if (ec) return fail("client CA", tls.client_ca_file, ErrorText(ec));
    // Sessions are cached per context; OpenSSL refuses to resume a verified session without
    // a context id.
    static constexpr unsigned char kSessionContext[] = "strata-http";
    SSL_CTX_set_session_id_context(native, kSessionContext, sizeof(kSessionContext) - 1);
  }
  return ctx;
}

// The identity of the peer's certificate, if one was presented and verified: its first DNS
// subjectAltName, else its subject CN; empty otherwise, or if the name holds control
// characters or invalid UTF-8 (handlers log it and compare it with configured names).
std::string PeerIdentity(SSL* ssl) {
  if ((SSL_get_verify_mode(ssl) & SSL_VERIFY_PEER) == 0) return "";
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (cert == nullptr || SSL_get_verify_result(ssl) != X509_V_OK) return "";
  std::string id;
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (names != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(names) && id.empty(); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
      if (name->type == GEN_DNS) {
        id.assign(reinterpret_cast<const char*>(ASN1_STRING_get0_data(name->d.dNSName)),
                  static_cast<size_t>(ASN1_STRING_length(name->d.dNSName)));
      }
    }
    GENERAL_NAMES_free(names);
  }
  if (id.empty()) {
    X509_NAME* subject = X509_get_subject_name(cert);
    const int i = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
    if (i >= 0) {
      unsigned char* utf8 = nullptr;
      const int n =
          ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i)));
      if (n > 0) id.assign(reinterpret_cast<const char*>(utf8), static_cast<size_t>(n));
      OPENSSL_free(utf8);
    }
  }
  ERR_clear_error();
  for (char c : id) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return "";
  }
  return base::IsValidUtf8(id) ? id : "";
}

}  // namespace strata::server::http
