// The HTTP server's TLS: the OpenSSL context built from the certificate, key and client CA
// files (rebuilt when they change on disk: base::FileStamp), and the identity of a verified
// client certificate. Used by http_server.cc only.
#ifndef STRATA_SERVER_HTTP_TLS_CONTEXT_H_
#define STRATA_SERVER_HTTP_TLS_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <openssl/ssl.h>

#include <boost/asio/ssl.hpp>

#include "absl/status/statusor.h"
#include "common/base/file_stamp.h"
#include "server/http/http_server.h"

namespace strata::server::http {

using TlsStamp = std::vector<base::FileStamp>;  // certificate, key, client CA
TlsStamp StampAll(const HttpServerOptions::Tls& tls);

// TLS 1.2 and later, the certificate chain and key, and with a client CA the request and
// verification (not the requirement) of client certificates. InvalidArgument names the file
// that could not be used and why.
absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> BuildTlsContext(
    const HttpServerOptions::Tls& tls);

// The identity of the peer's certificate, if one was presented and verified: its first DNS
// subjectAltName, else its subject CN; empty otherwise, or if the name holds control
// characters or invalid UTF-8.
std::string PeerIdentity(SSL* ssl);

}  // namespace strata::server::http

#endif  // STRATA_SERVER_HTTP_TLS_CONTEXT_H_
