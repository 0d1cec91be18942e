// A small HTTP/1.1 endpoint on Boost.Beast for health checks, Prometheus metrics, the JSON
// mirror of the query API and the web UI. Routes are exact paths registered before Start().
//
// Fully asynchronous: connections cost a socket and a small buffer, not a thread, so slow
// or idle clients cannot hold the server. Every read and write has a deadline (the whole
// header, the body, an idle keep-alive wait), connections beyond `max_connections` are
// closed at once, and request headers and bodies are bounded. Handlers run on a separate
// pool (a flame graph query may take a while); routes marked inline (/healthz, /metrics)
// answer on the I/O threads, so they stay fast while every handler thread is busy.
//
// HttpServer owns its threads and sockets; Stop() (or the destructor) joins them.
#ifndef STRATA_SERVER_HTTP_HTTP_SERVER_H_
#define STRATA_SERVER_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::server {

struct HttpRequest {
  std::string method;
  std::string path;                          // without the query string
  std::map<std::string, std::string> query;  // decoded query parameters (valid UTF-8)
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

struct HttpServerOptions {
  int io_threads = 2;
  int handler_threads = 2;
  // Open connections; more are closed as soon as they are accepted.
  int max_connections = 1024;
  // A request's header must arrive within header_timeout of the connection (or of the
  // previous response, on a kept-alive connection: idle_timeout); its body within
  // body_timeout; a response must be taken within body_timeout.
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration idle_timeout = absl::Seconds(30);
  absl::Duration body_timeout = absl::Seconds(30);
  uint32_t max_header_bytes = 16 << 10;
  uint32_t max_body_bytes = 1 << 20;
};

struct HttpServerStats {
  int64_t open_connections = 0;
  uint64_t connections = 0;          // accepted
  uint64_t refused_connections = 0;  // over max_connections
  uint64_t timed_out = 0;            // closed by a deadline
  uint64_t bad_requests = 0;         // unparsable, too large, or not UTF-8
  uint64_t requests = 0;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpServer();
  ~HttpServer();

  // `inline_handler`: cheap and non-blocking; runs on an I/O thread, never queued behind
  // slow handlers (health checks, metrics).
  void Route(const std::string& path, Handler handler, bool inline_handler = false);
  // Binds `address` ("host:port"; port 0 picks a free one) and starts serving.
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

}  // namespace strata::server

#endif  // STRATA_SERVER_HTTP_HTTP_SERVER_H_
