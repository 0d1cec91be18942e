#include "server/regress/webhook.h"

#include <chrono>
#include <type_traits>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata::server::regress {

absl::StatusOr<WebhookUrl> ParseWebhookUrl(const std::string& url) {
  std::string_view rest = url;
  WebhookUrl out;
  if (rest.starts_with("https://")) {
    out.tls = true;
    out.port = "443";
    rest.remove_prefix(8);
  } else if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("webhook: not an http:// or https:// URL: '", url, "'"));
  }
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) out.target = std::string(rest.substr(slash));
  const size_t colon = authority.rfind(':');
  if (colon != std::string_view::npos) {
    uint32_t port = 0;
    std::string_view digits = authority.substr(colon + 1);
    if (!absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()), &port) || port == 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("webhook: bad port in '", url, "'"));
    }
    out.port = std::string(digits);
    authority = authority.substr(0, colon);
  }
  if (authority.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("webhook: no host in '", url, "'"));
  }
  out.host = std::string(authority);
  return out;
}

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

// Resolves, connects, shakes hands (over TLS), writes `request` and reads the answer into
// `response`, within the deadline set on the stream's lowest layer; the first failure is kept
// in `failure`.
template <typename Stream>
void Exchange(asio::io_context& io, Stream& stream, const WebhookUrl& url,
              http::request<http::string_body>& request,
              http::response<http::string_body>& response, beast::flat_buffer& buffer,
              beast::error_code& failure) {
  auto write_and_read = [&] {
    http::async_write(stream, request, [&](beast::error_code ec, size_t) {
      if (ec) return void(failure = ec);
      http::async_read(stream, buffer, response, [&](beast::error_code ec, size_t) {
        if (ec) failure = ec;
      });
    });
  };
  asio::ip::tcp::resolver resolver(io);
  resolver.async_resolve(url.host, url.port, [&](beast::error_code ec, auto endpoints) {
    if (ec) return void(failure = ec);
    beast::get_lowest_layer(stream).async_connect(endpoints, [&](beast::error_code ec, auto) {
      if (ec) return void(failure = ec);
      if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
        write_and_read();
      } else {
        stream.async_handshake(asio::ssl::stream_base::client, [&](beast::error_code ec) {
          if (ec) return void(failure = ec);
          write_and_read();
        });
      }
    });
  });
  io.run();
  beast::error_code ignored;
  beast::get_lowest_layer(stream).socket().shutdown(asio::ip::tcp::socket::shutdown_both,
                                                    ignored);
}

}  // namespace

absl::Status PostJson(const WebhookUrl& url, const std::string& json, absl::Duration timeout,
                      const std::string& ca_file) {
  asio::io_context io;
  beast::error_code failure;
  http::response<http::string_body> response;
  beast::flat_buffer buffer;
  http::request<http::string_body> request{http::verb::post, url.target, 11};
  request.set(http::field::host, url.host);
  request.set(http::field::content_type, "application/json");
  request.set(http::field::user_agent, "strata-server");
  request.body() = json;
  request.prepare_payload();
  // One deadline for the whole exchange.
  const auto deadline = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  if (url.tls) {
    asio::ssl::context tls(asio::ssl::context::tls_client);
    beast::error_code ec;
    if (ca_file.empty()) {
      tls.set_default_verify_paths(ec);
    } else {
      tls.load_verify_file(ca_file, ec);
    }
    if (ec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "webhook: CA certificates ", ca_file.empty() ? "of the system" : ca_file, ": ",
          ec.message()));
    }
    tls.set_verify_mode(asio::ssl::verify_peer);
    beast::ssl_stream<beast::tcp_stream> stream(io, tls);
    // The server's certificate must name the URL's host; SNI tells the server which one.
    stream.set_verify_callback(asio::ssl::host_name_verification(url.host));
    SSL_set_tlsext_host_name(stream.native_handle(), url.host.c_str());
    beast::get_lowest_layer(stream).expires_after(deadline);
    Exchange(io, stream, url, request, response, buffer, failure);
  } else {
    beast::tcp_stream stream(io);
    stream.expires_after(deadline);
    Exchange(io, stream, url, request, response, buffer, failure);
  }
  if (failure == beast::error::timeout) {
    return absl::DeadlineExceededError(
        absl::StrCat("webhook ", url.host, ":", url.port, ": no answer within ",
                     absl::FormatDuration(timeout)));
  }
  if (failure) {
    return absl::UnavailableError(
        absl::StrCat("webhook ", url.host, ":", url.port, ": ", failure.message()));
  }
  if (response.result_int() < 200 || response.result_int() >= 300) {
    return absl::UnavailableError(absl::StrCat("webhook ", url.host, ":", url.port,
                                               " answered ", response.result_int()));
  }
  return absl::OkStatus();
}

}  // namespace strata::server::regress
