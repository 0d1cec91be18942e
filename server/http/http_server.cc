#include "server/http/http_server.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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

struct HttpServer::Impl {
  asio::io_context io;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::map<std::string, Handler> routes;
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};

  void Accept() {
    acceptor->async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (!stopped) Accept();
        return;
      }
      // One short-lived connection at a time per thread; a blocking handler is fine here
      // because the pool has several threads and requests are small.
      asio::post(io, [this, s = std::make_shared<tcp::socket>(std::move(socket))] { Serve(*s); });
      Accept();
    });
  }

  void Serve(tcp::socket& socket) {
    // Idle keep-alive clients must not pin a pool thread: reads time out after 5 s.
    timeval timeout{5, 0};
    ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    beast::error_code ec;
    beast::flat_buffer buffer;
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(1 << 20);
      http::read(socket, buffer, parser, ec);
      if (ec) break;
      const auto& req = parser.get();
      HttpRequest request;
      request.method = std::string(req.method_string());
      std::string_view target(req.target().data(), req.target().size());
      const size_t q = target.find('?');
      request.path = UrlDecode(target.substr(0, q));
      if (q != std::string_view::npos) {
        const std::string_view params = target.substr(q + 1);
        for (absl::string_view part :
             absl::StrSplit(absl::string_view(params.data(), params.size()), '&',
                            absl::SkipEmpty())) {
          const std::string_view kv(part.data(), part.size());
          const size_t eq = kv.find('=');
          request.query[UrlDecode(kv.substr(0, eq))] =
              eq == std::string_view::npos ? "" : UrlDecode(kv.substr(eq + 1));
        }
      }
      request.body = req.body();
      HttpResponse response;
      auto route = routes.find(request.path);
      if (route == routes.end()) {
        response.status = 404;
        response.body = absl::StrCat("no such path: ", request.path, "\n");
      } else {
        response = route->second(request);
      }
      http::response<http::string_body> res{static_cast<http::status>(response.status),
                                            req.version()};
      res.set(http::field::server, "strata-server");
      res.set(http::field::content_type, response.content_type);
      res.keep_alive(req.keep_alive());
      res.body() = std::move(response.body);
      res.prepare_payload();
      http::write(socket, res, ec);
      if (ec || !res.keep_alive()) break;
    }
    socket.shutdown(tcp::socket::shutdown_send, ec);
  }
};

HttpServer::HttpServer() : impl_(std::make_unique<Impl>()) {}
HttpServer::~HttpServer() { Stop(); }

void HttpServer::Route(const std::string& path, Handler handler) {
  impl_->routes[path] = std::move(handler);
}

absl::Status HttpServer::Start(const std::string& address, int threads) {
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
  impl_->Accept();
  for (int i = 0; i < std::max(1, threads); ++i) {
    impl_->threads.emplace_back([this] { impl_->io.run(); });
  }
  return absl::OkStatus();
}

int HttpServer::port() const {
  return impl_->acceptor ? impl_->acceptor->local_endpoint().port() : 0;
}

void HttpServer::Stop() {
  if (impl_->stopped.exchange(true)) return;
  beast::error_code ec;
  if (impl_->acceptor) impl_->acceptor->close(ec);
  impl_->io.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace strata::server
