#include "server/regress/webhook.h"

#include <chrono>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata::server::regress {

absl::StatusOr<WebhookUrl> ParseWebhookUrl(const std::string& url) {
  std::string_view rest = url;
  if (rest.starts_with("https://")) {
    return absl::InvalidArgumentError("webhook: https is not supported, use http://");
  }
  if (!rest.starts_with("http://")) {
    return absl::InvalidArgumentError(absl::StrCat("webhook: not an http:// URL: '", url, "'"));
  }
  rest.remove_prefix(7);
  WebhookUrl out;
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

absl::Status PostJson(const WebhookUrl& url, const std::string& json, absl::Duration timeout) {
  namespace asio = boost::asio;
  namespace beast = boost::beast;
  namespace http = beast::http;
  asio::io_context io;
  beast::tcp_stream stream(io);
  beast::error_code failure;
  http::response<http::string_body> response;
  beast::flat_buffer buffer;
  http::request<http::string_body> request{http::verb::post, url.target, 11};
  request.set(http::field::host, url.host);
  request.set(http::field::content_type, "application/json");
  request.set(http::field::user_agent, "strata-server");
  request.body() = json;
  request.prepare_payload();

  // One deadline for the whole exchange; the handlers chain and record the first failure.
  stream.expires_after(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  asio::ip::tcp::resolver resolver(io);
  resolver.async_resolve(url.host, url.port, [&](beast::error_code ec, auto endpoints) {
    if (ec) return void(failure = ec);
    stream.async_connect(endpoints, [&](beast::error_code ec, auto) {
      if (ec) return void(failure = ec);
      http::async_write(stream, request, [&](beast::error_code ec, size_t) {
        if (ec) return void(failure = ec);
        http::async_read(stream, buffer, response, [&](beast::error_code ec, size_t) {
          if (ec) failure = ec;
        });
      });
    });
  });
  io.run();
  beast::error_code ignored;
  stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
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
