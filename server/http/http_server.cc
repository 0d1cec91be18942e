#include "server/http/http_server.h"

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

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
  struct RouteEntry {
    Handler handler;
    Dispatch dispatch = Dispatch::kPool;
  };

  // One connection. Owned by the completion handlers it has in flight (shared_ptr); every
  // operation runs on the connection's strand.
  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(Impl* impl, tcp::socket socket) : impl_(impl), stream_(std::move(socket)) {}
    ~Session() { --impl_->open; }

    void Start() { ReadHeader(); }

   private:
    // Between kept-alive requests: the next request's first byte may take idle_timeout;
    // from there, its header has header_timeout like any other.
    void AwaitRequest() {
      if (buffer_.size() > 0) return ReadHeader();  // pipelined
      stream_.expires_after(ToChrono(impl_->options.idle_timeout));
      stream_.async_read_some(buffer_.prepare(kFirstRead),
                              [self = shared_from_this()](beast::error_code ec, size_t n) {
                                self->buffer_.commit(n);
                                if (ec) return self->Fail(ec);
                                self->ReadHeader();
                              });
    }

    void ReadHeader() {
      parser_.emplace();
      parser_->header_limit(impl_->options.max_header_bytes);
      parser_->body_limit(impl_->options.max_body_bytes);
      stream_.expires_after(ToChrono(impl_->options.header_timeout));
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
      http::request<http::string_body> req = parser_->release();
      keep_alive_ = req.keep_alive();
      version_ = req.version();
      HttpRequest request;
      if (!Parse(std::move(req), &request)) {
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
      const RouteEntry& entry = route->second;
      switch (entry.dispatch) {
        case Dispatch::kInline:
          return Respond(entry.handler(request));
        case Dispatch::kPriority:
          return RunOn(*impl_->priority, entry.handler, std::move(request));
        case Dispatch::kPool:
          return RunOn(*impl_->pool, entry.handler, std::move(request));
      }
    }

    // Runs `handler` on `pool`; the response comes back to the connection's strand. Routes
    // do not change after Start(), so the handler outlives the task.
    void RunOn(asio::thread_pool& pool, const Handler& handler, HttpRequest request) {
      asio::post(pool, [self = shared_from_this(), &handler, request = std::move(request)] {
        HttpResponse response = handler(request);
        asio::post(self->stream_.get_executor(),
                   [self, response = std::move(response)]() mutable {
                     self->Respond(std::move(response));
                   });
      });
    }

    static bool Parse(http::request<http::string_body> req, HttpRequest* out) {
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
      out->body = std::move(req.body());
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
      AwaitRequest();
    }

    void Fail(beast::error_code ec) {
      if (ec == beast::error::timeout) {
        ++impl_->timed_out;
      } else if (ec != http::error::end_of_stream && ec != asio::error::eof &&
                 ec != asio::error::connection_reset && ec != asio::error::broken_pipe &&
                 ec != asio::error::operation_aborted) {
        // Malformed or over a limit: say so if the connection still takes it.
        ++impl_->bad_requests;
        if (!responded_bad_) {
          responded_bad_ = true;
          keep_alive_ = false;
          const bool too_large =
              ec == http::error::body_limit || ec == http::error::header_limit;
          return Respond({too_large ? 413 : 400, "text/plain; charset=utf-8",
                          too_large ? "request header or body too large\n"
                                    : "malformed request\n"});
        }
      }
      Close();
    }

    void Close() {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream_.close();
    }

    // The first read of a kept-alive connection; the header parser reads the rest.
    static constexpr size_t kFirstRead = 1024;

    Impl* const impl_;
    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::optional<http::response<http::string_body>> response_;
    bool keep_alive_ = false;
    bool responded_bad_ = false;
    unsigned version_ = 11;
  };

  static std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        absl::ToChronoNanoseconds(d));
  }

  void Accept() {
    acceptor->async_accept(asio::make_strand(*io), [this](beast::error_code ec,
                                                          tcp::socket socket) {
      if (stopped) return;
      if (ec) {
        // Typically out of file descriptors: try again shortly instead of spinning.
        accept_retry->expires_after(std::chrono::milliseconds(100));
        accept_retry->async_wait([this](beast::error_code) {
          if (!stopped) Accept();
        });
        return;
      }
      if (open.load() >= options.max_connections) {
        // Over the limit: a reset at once, so the client neither waits nor holds a slot.
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

  // Declared before the I/O objects: sessions still queued in `io` or in a pool reach the
  // options and counters when they are destroyed.
  HttpServerOptions options;
  std::map<std::string, RouteEntry> routes;
  std::atomic<bool> stopped{false};
  std::atomic<int64_t> open{0};
  std::atomic<uint64_t> connections{0}, refused{0}, timed_out{0}, bad_requests{0}, requests{0};
  int bound_port = 0;

  std::unique_ptr<asio::io_context> io;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::unique_ptr<asio::steady_timer> accept_retry;
  std::unique_ptr<asio::thread_pool> pool;
  std::unique_ptr<asio::thread_pool> priority;
  std::vector<std::thread> threads;
};

HttpServer::HttpServer() : impl_(std::make_unique<Impl>()) {}
HttpServer::~HttpServer() { Stop(); }

void HttpServer::Route(const std::string& path, Handler handler, Dispatch dispatch) {
  impl_->routes[path] = {std::move(handler), dispatch};
}

absl::Status HttpServer::Start(const std::string& address, const HttpServerOptions& options) {
  if (impl_->io != nullptr || impl_->stopped) {
    return absl::FailedPreconditionError("an HTTP server starts once");
  }
  if (options.io_threads < 1 || options.handler_threads < 1 || options.max_connections < 1) {
    return absl::InvalidArgumentError(
        "the HTTP server needs an I/O thread, a handler thread and a connection");
  }
  auto hp = SplitHostPort(address);
  if (!hp.ok()) return hp.status();
  beast::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(hp->first, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad HTTP address '", EscapeForLog(address), "'"));
  }
  const tcp::endpoint endpoint(ip, static_cast<unsigned short>(hp->second));
  auto io = std::make_unique<asio::io_context>(options.io_threads);
  auto acceptor = std::make_unique<tcp::acceptor>(*io);
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  tcp::endpoint bound;
  if (!ec) bound = acceptor->local_endpoint(ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ",
                                               EscapeForLog(address), ": ", ec.message()));
  }
  Impl& s = *impl_;
  s.options = options;
  s.bound_port = bound.port();
  s.io = std::move(io);
  s.acceptor = std::move(acceptor);
  s.accept_retry = std::make_unique<asio::steady_timer>(*s.io);
  s.pool = std::make_unique<asio::thread_pool>(static_cast<size_t>(options.handler_threads));
  s.priority = std::make_unique<asio::thread_pool>(1);
  s.Accept();
  for (int i = 0; i < options.io_threads; ++i) {
    s.threads.emplace_back([&s] { s.io->run(); });
  }
  return absl::OkStatus();
}

int HttpServer::port() const { return impl_->bound_port; }

HttpServerStats HttpServer::stats() const {
  const Impl& s = *impl_;
  return {s.open.load(),      s.connections.load(),  s.refused.load(),
          s.timed_out.load(), s.bad_requests.load(), s.requests.load()};
}

void HttpServer::Stop() {
  Impl& s = *impl_;
  if (s.io == nullptr || s.stopped.exchange(true)) return;
  // No more I/O: then no more work reaches the pools.
  s.io->stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  // Handlers already running finish (their responses are dropped); queued ones are not run.
  for (asio::thread_pool* p : {s.pool.get(), s.priority.get()}) {
    p->stop();
    p->join();
  }
  // Destroying what still holds sessions closes their sockets: the pools' queued tasks
  // first, then the acceptor, then the I/O context with its pending operations.
  s.pool.reset();
  s.priority.reset();
  s.accept_retry.reset();
  s.acceptor.reset();
  s.io.reset();
}

}  // namespace strata::server
