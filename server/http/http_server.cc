#include "server/http/http_server.h"

#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/escape.h"
#include "common/base/log.h"
#include "server/http/tls_context.h"

namespace strata::server::http {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
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


// Extra response header names the server writes itself: framing and connection management.
bool IsReservedHeader(std::string_view name) {
  for (std::string_view reserved :
       {"content-type", "content-length", "transfer-encoding", "connection"}) {
    if (absl::EqualsIgnoreCase(absl::string_view(name.data(), name.size()),
                               absl::string_view(reserved.data(), reserved.size()))) {
      return true;
    }
  }
  return false;
}

bool IsSafeHeaderText(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

bool IsHeaderName(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') ||
                    std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

}  // namespace

struct HttpServer::Impl {
  struct RouteEntry {
    Handler handler;
    Dispatch dispatch = Dispatch::kPool;
  };

  HttpResponse ErrorResponse(int status, const std::string& message) const {
    if (options.error_response) return options.error_response(status, message);
    return {status, "text/plain; charset=utf-8", message + "\n"};
  }

  // One connection, over plaintext (beast::tcp_stream) or TLS
  // (beast::ssl_stream<beast::tcp_stream>). Owned by the completion handlers it has in
  // flight (shared_ptr); every operation runs on the connection's strand.
  template <class Stream>
  class Session : public std::enable_shared_from_this<Session<Stream>> {
   public:
    static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

    Session(Impl* impl, tcp::socket socket)
      requires(!kTls)
        : impl_(impl), stream_(std::move(socket)) {}
    Session(Impl* impl, tcp::socket socket, std::shared_ptr<ssl::context> tls)
      requires kTls
        : impl_(impl), tls_(std::move(tls)), stream_(std::move(socket), *tls_) {}
    ~Session() { --impl_->open; }

    void Start() {
      if constexpr (kTls) {
        Lowest().expires_after(ToChrono(impl_->options.header_timeout));
        stream_.async_handshake(ssl::stream_base::server,
                                [self = this->shared_from_this()](beast::error_code ec) {
                                  self->OnHandshake(ec);
                                });
      } else {
        ReadHeader();
      }
    }

   private:
    beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

    void OnHandshake(beast::error_code ec) {
      if (ec) {
        // Nothing to answer in: a plaintext request, an old protocol or a refused client
        // certificate already got an alert, if anything.
        ++impl_->tls_handshake_failures;
        if (ec == beast::error::timeout) ++impl_->timed_out;
        return Close();
      }
      if constexpr (kTls) peer_identity_ = PeerIdentity(stream_.native_handle());
      ReadHeader();
    }

    // Between kept-alive requests: the next request's first byte may take idle_timeout;
    // from there, its header has header_timeout like any other.
    void AwaitRequest() {
      if (buffer_.size() > 0) return ReadHeader();  // pipelined
      Lowest().expires_after(ToChrono(impl_->options.idle_timeout));
      stream_.async_read_some(buffer_.prepare(kFirstRead),
                              [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                                self->buffer_.commit(n);
                                if (ec) return self->Fail(ec);
                                self->ReadHeader();
                              });
    }

    void ReadHeader() {
      parser_.emplace();
      parser_->header_limit(impl_->options.max_header_bytes);
      parser_->body_limit(impl_->options.max_body_bytes);
      Lowest().expires_after(ToChrono(impl_->options.header_timeout));
      http::async_read_header(stream_, buffer_, *parser_,
                              [self = this->shared_from_this()](beast::error_code ec, size_t) {
                                self->OnHeader(ec);
                              });
    }

    void OnHeader(beast::error_code ec) {
      if (ec) return Fail(ec);
      Lowest().expires_after(ToChrono(impl_->options.body_timeout));
      http::async_read(stream_, buffer_, *parser_,
                       [self = this->shared_from_this()](beast::error_code ec, size_t) {
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
      if (std::string malformed = Parse(std::move(req), &request); !malformed.empty()) {
        ++impl_->bad_requests;
        keep_alive_ = false;
        return Respond(impl_->ErrorResponse(400, absl::StrCat("malformed request: ", malformed)));
      }
      request.secure = kTls;
      request.peer_identity = peer_identity_;
      auto route = impl_->routes.find(request.path);
      if (route == impl_->routes.end()) {
        return Respond(impl_->ErrorResponse(
            404, absl::StrCat("no such path: ", base::EscapeForLog(request.path))));
      }
      head_ = request.method == "HEAD";
      if (!head_ && request.method != "GET" && request.method != "POST") {
        HttpResponse refused = impl_->ErrorResponse(
            405, absl::StrCat("method ", base::EscapeForLog(request.method),
                              " not allowed: GET, HEAD or POST"));
        refused.headers.emplace_back("Allow", "GET, HEAD, POST");
        return Respond(std::move(refused));
      }
      const RouteEntry& entry = route->second;
      switch (entry.dispatch) {
        case Dispatch::kInline:
          return Respond(Call(impl_, entry.handler, request));
        case Dispatch::kPriority:
          return RunOn(*impl_->priority, entry.handler, std::move(request));
        case Dispatch::kPool:
          return RunOn(*impl_->pool, entry.handler, std::move(request));
      }
    }

    // The handler's response. An exception must not leave it: on the handler pool it would
    // end the process (asio's thread_pool terminates), ingest and all. The client gets a
    // 500 and the server goes on.
    static HttpResponse Call(Impl* impl, const Handler& handler, const HttpRequest& request) {
      std::string what = "an exception";
      try {
        return handler(request);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      LogError("http: {} {}: {}", base::EscapeForLog(request.method),
               base::EscapeForLog(request.path), what);
      return impl->ErrorResponse(500, "internal error");
    }

    // Runs `handler` on `pool`; the response comes back to the connection's strand. Routes
    // do not change after Start(), so the handler outlives the task.
    void RunOn(asio::thread_pool& pool, const Handler& handler, HttpRequest request) {
      asio::post(pool, [self = this->shared_from_this(), &handler,
                        request = std::move(request)] {
        HttpResponse response = Call(self->impl_, handler, request);
        asio::post(self->stream_.get_executor(),
                   [self, response = std::move(response)]() mutable {
                     self->Respond(std::move(response));
                   });
      });
    }

    // What is wrong with the request, for its 400 answer; empty when it parsed.
    static std::string Parse(http::request<http::string_body> req, HttpRequest* out) {
      constexpr char kNotUtf8[] = "the path and query must be valid UTF-8";
      out->method = std::string(req.method_string());
      std::string_view target(req.target().data(), req.target().size());
      const size_t q = target.find('?');
      out->path = UrlDecode(target.substr(0, q));
      if (!base::IsValidUtf8(out->path)) return kNotUtf8;
      if (q != std::string_view::npos) {
        const std::string_view params = target.substr(q + 1);
        for (absl::string_view part :
             absl::StrSplit(absl::string_view(params.data(), params.size()), '&',
                            absl::SkipEmpty())) {
          const std::string_view kv(part.data(), part.size());
          const size_t eq = kv.find('=');
          std::string key = UrlDecode(kv.substr(0, eq));
          std::string value = eq == std::string_view::npos ? "" : UrlDecode(kv.substr(eq + 1));
          if (!base::IsValidUtf8(key) || !base::IsValidUtf8(value)) return kNotUtf8;
          // Which of two values a route would take is not for the client to guess.
          if (!out->query.try_emplace(key, std::move(value)).second) {
            return absl::StrCat("query parameter '", base::EscapeForLog(key, 64),
                                "' is given more than once");
          }
        }
      }
      const auto auth = req.find(http::field::authorization);
      if (auth != req.end()) out->authorization = std::string(auth->value());
      const auto type = req.find(http::field::content_type);
      if (type != req.end()) out->content_type = std::string(type->value());
      out->body = std::move(req.body());
      return {};
    }

    void Respond(HttpResponse response) {
      response_.emplace(static_cast<http::status>(response.status), version_);
      response_->set(http::field::server, "strata-server");
      response_->set(http::field::content_type, response.content_type);
      for (const auto& [name, value] : response.headers) {
        if (IsHeaderName(name) && IsSafeHeaderText(value) && !IsReservedHeader(name)) {
          response_->insert(name, value);
        }
      }
      response_->keep_alive(keep_alive_);
      response_->body() = std::move(response.body);
      response_->prepare_payload();
      // A HEAD answer is a GET's header, its Content-Length included, with no body: a body
      // there would be read as the start of the next response.
      if (head_) response_->body().clear();
      head_ = false;
      Lowest().expires_after(ToChrono(impl_->options.body_timeout));
      http::async_write(stream_, *response_,
                        [self = this->shared_from_this()](beast::error_code ec, size_t) {
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
                 ec != asio::error::operation_aborted &&
                 // A TLS record layer error (or a peer gone without close_notify): the
                 // connection cannot carry an answer.
                 ec.category() != asio::error::get_ssl_category() &&
                 ec != ssl::error::stream_truncated) {
        // Malformed or over a limit: say so if the connection still takes it.
        ++impl_->bad_requests;
        if (!responded_bad_) {
          responded_bad_ = true;
          keep_alive_ = false;
          const bool too_large =
              ec == http::error::body_limit || ec == http::error::header_limit;
          return Respond(impl_->ErrorResponse(
              too_large ? 413 : 400,
              too_large ? "request header or body too large" : "malformed request"));
        }
      }
      Close();
    }

    // Over TLS without close_notify: responses are length-delimited, so a client can tell a
    // truncated one anyway, and waiting for the peer's close_notify would hold the
    // connection open on the client's terms.
    void Close() {
      beast::error_code ignored;
      Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
      Lowest().close();
    }

    // The first read of a kept-alive connection; the header parser reads the rest.
    static constexpr size_t kFirstRead = 1024;

    Impl* const impl_;
    // The context this connection was created with; declared before the stream, which uses
    // it until destroyed. Later rotations do not affect it.
    std::shared_ptr<ssl::context> tls_;
    Stream stream_;
    std::string peer_identity_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::optional<http::response<http::string_body>> response_;
    bool keep_alive_ = false;
    bool head_ = false;  // the request being answered is a HEAD
    bool responded_bad_ = false;
    unsigned version_ = 11;
  };

  using PlainSession = Session<beast::tcp_stream>;
  using TlsSession = Session<beast::ssl_stream<beast::tcp_stream>>;

  // The context for a new connection. At most once a second, looks at the files: when
  // they changed since the last look, builds a context from them; if that fails (a
  // half-written file, a key that does not match yet) the current context stays and the
  // error is logged once for this set of files.
  std::shared_ptr<ssl::context> TlsContextForNewConnection() {
    std::lock_guard<std::mutex> lock(tls_mu);
    const auto now = std::chrono::steady_clock::now();
    if (now - tls_checked < std::chrono::seconds(1)) return tls_context;
    tls_checked = now;
    TlsStamp stamp = StampAll(options.tls);
    if (stamp == tls_stamp) return tls_context;
    tls_stamp = stamp;
    auto built = BuildTlsContext(options.tls);
    if (!built.ok()) {
      LogError("http: TLS certificate files changed but cannot be loaded, still serving "
                    "the previous certificate: {}",
                    built.status().ToString());
      return tls_context;
    }
    tls_context = std::move(*built);
    LogInfo("http: loaded the changed TLS certificate '{}'",
                 base::EscapeForLog(options.tls.cert_file));
    return tls_context;
  }

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
        if (tls_on) {
          std::shared_ptr<TlsSession> session;
          try {  // OpenSSL out of memory for a new connection (SSL_new): drop just that one
            session = std::make_shared<TlsSession>(this, std::move(socket),
                                                   TlsContextForNewConnection());
          } catch (const std::exception& e) {
            --open;  // no Session to do it
            ++tls_handshake_failures;
            LogError("http: cannot start a TLS connection: {}", e.what());
          }
          if (session != nullptr) session->Start();
        } else {
          std::make_shared<PlainSession>(this, std::move(socket))->Start();
        }
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
  std::atomic<uint64_t> tls_handshake_failures{0};
  int bound_port = 0;

  // HTTPS: the context new connections get (set by Start, then only replaced), and what
  // its files looked like when last examined.
  bool tls_on = false;
  std::mutex tls_mu;
  std::shared_ptr<ssl::context> tls_context;
  TlsStamp tls_stamp;
  std::chrono::steady_clock::time_point tls_checked;

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
        absl::StrCat("bad HTTP address '", base::EscapeForLog(address), "'"));
  }
  const tcp::endpoint endpoint(ip, static_cast<unsigned short>(hp->second));
  std::shared_ptr<ssl::context> tls_context;
  TlsStamp tls_stamp;
  const HttpServerOptions::Tls& tls = options.tls;
  if (!tls.cert_file.empty()) {
    if (tls.key_file.empty()) {
      return absl::InvalidArgumentError("a TLS certificate needs its key (tls.key_file)");
    }
    // Stamped before reading: a file replaced in between is seen as changed at the next
    // look and loaded again.
    tls_stamp = StampAll(tls);
    auto built = BuildTlsContext(tls);
    if (!built.ok()) return built.status();
    tls_context = std::move(*built);
  } else if (!tls.key_file.empty() || !tls.client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS key or client CA without a certificate (tls.cert_file)");
  }
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
                                               base::EscapeForLog(address), ": ", ec.message()));
  }
  Impl& s = *impl_;
  s.options = options;
  s.bound_port = bound.port();
  s.tls_on = tls_context != nullptr;
  s.tls_context = std::move(tls_context);
  s.tls_stamp = std::move(tls_stamp);
  s.tls_checked = std::chrono::steady_clock::now();
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
  HttpServerStats stats;
  stats.open_connections = s.open.load();
  stats.connections = s.connections.load();
  stats.refused_connections = s.refused.load();
  stats.timed_out = s.timed_out.load();
  stats.bad_requests = s.bad_requests.load();
  stats.requests = s.requests.load();
  stats.tls_handshake_failures = s.tls_handshake_failures.load();
  return stats;
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

}  // namespace strata::server::http
