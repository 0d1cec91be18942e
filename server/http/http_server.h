// A small HTTP/1.1 endpoint on Boost.Beast for health checks, Prometheus metrics, the JSON
// mirror of the query API and the web UI. Routes are exact paths registered before Start();
// handlers run on the server's thread pool and must be thread-safe.
//
// HttpServer owns its threads and sockets; Stop() (or the destructor) joins them.
#ifndef STRATA_SERVER_HTTP_HTTP_SERVER_H_
#define STRATA_SERVER_HTTP_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::server {

struct HttpRequest {
  std::string method;
  std::string path;                          // without the query string
  std::map<std::string, std::string> query;  // decoded query parameters
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpServer();
  ~HttpServer();

  void Route(const std::string& path, Handler handler);
  // Binds `address` ("host:port"; port 0 picks a free one) and starts serving.
  absl::Status Start(const std::string& address, int threads = 2);
  // The bound port (after Start).
  int port() const;
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Splits "host:port"; InvalidArgument on malformed input.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address);

}  // namespace strata::server

#endif  // STRATA_SERVER_HTTP_HTTP_SERVER_H_
