// The HTTP server's TLS: the OpenSSL context built from the certificate, key and client CA
// files (rebuilt when they change on disk: FileStamp), and the identity of a verified client
// certificate. Used by http_server.cc only.
#ifndef STRATA_SERVER_HTTP_TLS_CONTEXT_H_
#define STRATA_SERVER_HTTP_TLS_CONTEXT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <openssl/ssl.h>

#include <boost/asio/ssl.hpp>

#include "absl/status/statusor.h"
#include "server/http/http_server.h"

namespace strata::server::http {

// What identifies one version of a file: a rename gives a new inode, an edit in place a new
// size or mtime. A file that cannot be stat'ed has its errno instead, so that it appearing
// (or changing from one error to another) is a change too.
struct FileStamp {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0;
  int error = 0;
  bool operator==(const FileStamp&) const = default;
};

using TlsStamp = std::vector<FileStamp>;  // certificate, key, client CA
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
