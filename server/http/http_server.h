// server/http: the HTTP endpoint, free of Strata's types. The routes that put the query
// service, metrics and web UI on it are registered by server_metrics.h (server/).
//
// A small HTTP/1.1 endpoint on Boost.Beast for health checks, Prometheus metrics, the JSON
// mirror of the query API and the web UI. Routes are exact paths registered before Start().
//
// Plaintext, or HTTPS when HttpServerOptions::tls names a certificate (TLS 1.2 and 1.3
// only, OpenSSL). With a client CA the server asks for a client certificate but does not
// require one: browsers and token clients present none, while a certificate that is
// presented must chain to the CA. Authentication itself is the handlers' business; the
// server hands them what they need to decide: the Authorization header, the verified client
// certificate's identity, and whether the request came over TLS.
//
// Certificates rotate without a restart: at most once a second, on accept, the server
// checks whether the certificate, key or CA files changed (inode, size, mtime) and loads
// them for new connections; open connections keep the certificate they started with. A
// broken set of files (unreadable, a key that does not match) is logged and the previous
// certificate stays in use.
//
// Fully asynchronous: a connection costs a socket and a small buffer, not a thread, so slow
// or idle clients cannot hold the server. Every read and write has a deadline (the TLS
// handshake, the whole header, the body, the response, the idle wait between kept-alive
// requests); connections beyond `max_connections` are accepted and closed at once (no
// response), and request headers and bodies are bounded (413 past the limit).
//
// Handlers run off the I/O threads, on a pool (a flame graph query may take a while). Two
// kinds of route are never queued behind it: inline routes (/healthz) answer on the I/O
// thread itself, and priority routes (/metrics, which takes locks and reads RocksDB
// properties) run on a thread of their own.
//
// HttpServer owns its threads, sockets and TLS contexts (a connection shares ownership of
// the context it started with); Stop() (or the destructor) closes every connection and
// joins the threads. A server starts once.
#ifndef STRATA_SERVER_HTTP_HTTP_SERVER_H_
#define STRATA_SERVER_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::server::http {

struct HttpRequest {
  std::string method;
  std::string path;                          // without the query string
  std::map<std::string, std::string> query;  // decoded query parameters (valid UTF-8)
  std::string body;
  std::string content_type;  // the request's Content-Type header; empty if absent
  // The raw Authorization header value; empty if absent.
  std::string authorization;
  // The verified client certificate's identity: its first DNS subjectAltName, else its
  // subject CN. Empty without a certificate (or without tls.client_ca_file).
  std::string peer_identity;
  bool secure = false;  // came over TLS
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  // Extra response headers (e.g. WWW-Authenticate), written in order. The server owns the
  // framing: Content-Type, Content-Length, Transfer-Encoding and Connection here are
  // ignored, and so is any name or value with a control character (response splitting).
  std::vector<std::pair<std::string, std::string>> headers = {};
};

struct HttpServerOptions {
  // The server's own answers, to requests it cannot parse or route and for handlers that
  // threw (400, 404, 405, 413, 500): their body and type from `status` and a message (e.g.
  // JSON, as the routes answer their errors). Null: plain text.
  std::function<HttpResponse(int status, const std::string& message)> error_response;
  int io_threads = 2;
  // Pooled handlers running at once; more requests wait for a thread.
  int handler_threads = 2;
  // Connections open at once; more are closed as soon as they are accepted.
  int max_connections = 1024;
  // A request's header must arrive within header_timeout of the connection, or of its
  // first byte on a kept-alive connection, which may first wait idle_timeout for it. The
  // body must arrive within body_timeout of the header, and the response be taken within
  // body_timeout. A TLS handshake, too, must complete within header_timeout.
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(30);
  absl::Duration idle_timeout = absl::Seconds(30);
  uint32_t max_header_bytes = 16 << 10;
  uint32_t max_body_bytes = 1 << 20;
  // HTTPS when cert_file is set (then key_file is required); PEM files. cert_file may hold
  // the chain after the server certificate. With client_ca_file, client certificates are
  // requested and verified against it, but not required.
  struct Tls {
    std::string cert_file, key_file;
    std::string client_ca_file;
  } tls;
};

// Counters since Start().
struct HttpServerStats {
  int64_t open_connections = 0;
  uint64_t connections = 0;          // accepted and served
  uint64_t refused_connections = 0;  // closed at once: over max_connections
  uint64_t timed_out = 0;            // closed by a handshake, header, body, write or idle deadline
  uint64_t bad_requests = 0;         // unparsable, too large, or not UTF-8
  uint64_t requests = 0;
  // TLS handshakes that did not complete (plaintext or an old protocol on the TLS port, a
  // refused client certificate, the header deadline); the connection is closed.
  uint64_t tls_handshake_failures = 0;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Where a route's handler runs.
  enum class Dispatch {
    kPool,      // the handler pool: anything, including slow queries
    kInline,    // the I/O thread: must be cheap and never block (health checks)
    kPriority,  // a thread of its own, never behind the pool: brief work that may wait on
                // a lock or a file (metrics)
  };

  HttpServer();
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void Route(const std::string& path, Handler handler, Dispatch dispatch = Dispatch::kPool);
  // Binds `address` ("host:port"; port 0 picks a free one) and starts serving. Fails if
  // the TLS certificate, key or client CA cannot be loaded.
  absl::Status Start(const std::string& address, const HttpServerOptions& options = {});
  // The bound port (after Start).
  int port() const;
  HttpServerStats stats() const;
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Splits "host:port"; InvalidArgument on malformed input.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address);

}  // namespace strata::server::http

#endif  // STRATA_SERVER_HTTP_HTTP_SERVER_H_
