#include "server/http/http_server.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/escape.h"

namespace strata::server {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string UrlDecode(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out.push_back(' ');
    } else if (in[i] == '%' && i + 2 < in.size() && HexValue(in[i + 1]) >= 0 &&
               HexValue(in[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(in[i + 1]) * 16 + HexValue(in[i + 2])));
      i += 2;
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not of the form host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) host = "0.0.0.0";
  return std::make_pair(host, port);
}

namespace {

// Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF): query parameters
// end up in protobuf strings and JSON, which require it.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

}  // namespace

struct HttpServer::Impl {
  struct Route {
    Handler handler;
    bool inline_handler = false;
  };

  // One connection. Owned by the completion handlers it has in flight (shared_ptr); every
  // operation runs on the connection's strand.
  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(Impl* impl, tcp::socket socket) : impl_(impl), stream_(std::move(socket)) {}
    ~Session() { --impl_->open; }

    void Start() { ReadHeader(impl_->options.header_timeout); }

   private:
    void ReadHeader(absl::Duration deadline) {
      parser_.emplace();
      parser_->header_limit(impl_->options.max_header_bytes);
      parser_->body_limit(impl_->options.max_body_bytes);
      stream_.expires_after(ToChrono(deadline));
      http::async_read_header(stream_, buffer_, *parser_,
                              [self = shared_from_this()](beast::error_code ec, size_t) {
                                self->OnHeader(ec);
                              });
    }

    void OnHeader(beast::error_code ec) {
      if (ec) return Fail(ec);
      stream_.expires_after(ToChrono(impl_->options.body_timeout));
      http::async_read(stream_, buffer_, *parser_,
                       [self = shared_from_this()](beast::error_code ec, size_t) {
                         self->OnRequest(ec);
                       });
    }

    void OnRequest(beast::error_code ec) {
      if (ec) return Fail(ec);
      ++impl_->requests;
      const auto& req = parser_->get();
      keep_alive_ = req.keep_alive();
      version_ = req.version();
      HttpRequest request;
      if (!Parse(req, &request)) {
        ++impl_->bad_requests;
        keep_alive_ = false;
        return Respond({400, "text/plain; charset=utf-8",
                        "malformed request: the path and query must be valid UTF-8\n"});
      }
      auto route = impl_->routes.find(request.path);
      if (route == impl_->routes.end()) {
        return Respond({404, "text/plain; charset=utf-8",
                        absl::StrCat("no such path: ", EscapeForLog(request.path), "\n")});
      }
      if (route->second.inline_handler) return Respond(route->second.handler(request));
      // Slow handlers run on the handler pool; the response comes back to the strand.
      asio::post(*impl_->handlers, [self = shared_from_this(), handler = &route->second.handler,
                                   request = std::move(request)] {
        HttpResponse response = (*handler)(request);
        asio::post(self->stream_.get_executor(),
                   [self, response = std::move(response)]() mutable {
                     self->Respond(std::move(response));
                   });
      });
    }

    static bool Parse(const http::request<http::string_body>& req, HttpRequest* out) {
      out->method = std::string(req.method_string());
      std::string_view target(req.target().data(), req.target().size());
      const size_t q = target.find('?');
      out->path = UrlDecode(target.substr(0, q));
      if (!IsValidUtf8(out->path)) return false;
      if (q != std::string_view::npos) {
        const std::string_view params = target.substr(q + 1);
        for (absl::string_view part :
             absl::StrSplit(absl::string_view(params.data(), params.size()), '&',
                            absl::SkipEmpty())) {
          const std::string_view kv(part.data(), part.size());
          const size_t eq = kv.find('=');
          std::string key = UrlDecode(kv.substr(0, eq));
          std::string value = eq == std::string_view::npos ? "" : UrlDecode(kv.substr(eq + 1));
          if (!IsValidUtf8(key) || !IsValidUtf8(value)) return false;
          out->query[std::move(key)] = std::move(value);
        }
      }
      out->body = req.body();
      return true;
    }

    void Respond(HttpResponse response) {
      response_.emplace(static_cast<http::status>(response.status), version_);
      response_->set(http::field::server, "strata-server");
      response_->set(http::field::content_type, response.content_type);
      response_->keep_alive(keep_alive_);
      response_->body() = std::move(response.body);
      response_->prepare_payload();
      stream_.expires_after(ToChrono(impl_->options.body_timeout));
      http::async_write(stream_, *response_,
                        [self = shared_from_this()](beast::error_code ec, size_t) {
                          self->OnWritten(ec);
                        });
    }

    void OnWritten(beast::error_code ec) {
      if (ec) return Fail(ec);
      if (!keep_alive_) return Close();
      response_.reset();
      ReadHeader(impl_->options.idle_timeout);
    }

    void Fail(beast::error_code ec) {
      if (ec == beast::error::timeout) {
        ++impl_->timed_out;
      } else if (ec != http::error::end_of_stream && ec != asio::error::eof &&
                 ec != asio::error::connection_reset && ec != asio::error::operation_aborted) {
        // Malformed or over a limit: say so if the connection still takes it.
        ++impl_->bad_requests;
        if (!responded_bad_) {
          responded_bad_ = true;
          keep_alive_ = false;
          return Respond({ec == http::error::body_limit || ec == http::error::header_limit
                              ? 413
                              : 400,
                          "text/plain; charset=utf-8", "malformed or oversized request\n"});
        }
      }
      Close();
    }

    void Close() {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream_.close();
    }

    static std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
      return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          absl::ToChronoNanoseconds(d));
    }

    Impl* const impl_;
    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::optional<http::response<http::string_body>> response_;
    bool keep_alive_ = false;
    bool responded_bad_ = false;
    unsigned version_ = 11;
  };

  HttpServerOptions options;
  asio::io_context io;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::map<std::string, Route> routes;
  std::vector<std::thread> threads;
  std::unique_ptr<asio::thread_pool> handlers;
  std::atomic<bool> stopped{false};
  std::atomic<int64_t> open{0};
  std::atomic<uint64_t> connections{0}, refused{0}, timed_out{0}, bad_requests{0}, requests{0};

  void Accept() {
    acceptor->async_accept(asio::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (!stopped) Accept();
        return;
      }
      if (open.load() >= options.max_connections) {
        // Over the limit: close at once (a reset, not a wait) and keep accepting.
        ++refused;
        beast::error_code ignored;
        socket.set_option(asio::socket_base::linger(true, 0), ignored);
        socket.close(ignored);
      } else {
        ++open;
        ++connections;
        std::make_shared<Session>(this, std::move(socket))->Start();
      }
      Accept();
    });
  }
};

HttpServer::HttpServer() : impl_(std::make_unique<Impl>()) {}
HttpServer::~HttpServer() { Stop(); }

void HttpServer::Route(const std::string& path, Handler handler, bool inline_handler) {
  impl_->routes[path] = {std::move(handler), inline_handler};
}

absl::Status HttpServer::Start(const std::string& address, const HttpServerOptions& options) {
  if (options.io_threads < 1 || options.handler_threads < 1 || options.max_connections < 1) {
    return absl::InvalidArgumentError("HTTP server needs threads and connections");
  }
  impl_->options = options;
  auto hp = SplitHostPort(address);
  if (!hp.ok()) return hp.status();
  beast::error_code ec;
  auto ip = asio::ip::make_address(hp->first, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad HTTP address: ", address));
  tcp::endpoint endpoint(ip, static_cast<unsigned short>(hp->second));
  auto acceptor = std::make_unique<tcp::acceptor>(impl_->io);
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", address, ": ", ec.message()));
  }
  impl_->acceptor = std::move(acceptor);
  impl_->handlers =
      std::make_unique<asio::thread_pool>(static_cast<size_t>(options.handler_threads));
  impl_->Accept();
  for (int i = 0; i < options.io_threads; ++i) {
    impl_->threads.emplace_back([this] { impl_->io.run(); });
  }
  return absl::OkStatus();
}

int HttpServer::port() const {
  return impl_->acceptor ? impl_->acceptor->local_endpoint().port() : 0;
}

HttpServerStats HttpServer::stats() const {
  return {impl_->open.load(),     impl_->connections.load(),  impl_->refused.load(),
          impl_->timed_out.load(), impl_->bad_requests.load(), impl_->requests.load()};
}

void HttpServer::Stop() {
  if (impl_->stopped.exchange(true)) return;
  beast::error_code ec;
  if (impl_->acceptor) impl_->acceptor->close(ec);
  if (impl_->handlers) impl_->handlers->join();
  impl_->io.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace strata::server
