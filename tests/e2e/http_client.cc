#include "tests/e2e/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

namespace strata::testing {

HttpReply HttpCall(int port, std::string_view method, const std::string& target,
                   const std::vector<std::pair<std::string, std::string>>& headers,
                   const std::string& body) {
  namespace asio = boost::asio;
  namespace http = boost::beast::http;
  const http::verb verb = http::string_to_verb({method.data(), method.size()});
  if (verb == http::verb::unknown) return {0, "", "unknown HTTP method " + std::string(method)};
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
  if (ec) return {0, "", ec.message()};
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, "localhost");
  for (const auto& [name, value] : headers) req.set(name, value);
  if (verb != http::verb::get || !body.empty()) {
    req.body() = body;
    req.prepare_payload();
  }
  http::write(socket, req, ec);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(socket, buffer, res, ec);
  if (ec) return {0, "", ec.message()};
  return {static_cast<int>(res.result_int()), std::string(res[http::field::content_type]),
          res.body()};
}

std::pair<int, std::string> HttpGet(int port, const std::string& target) {
  HttpReply reply = HttpCall(port, "GET", target);
  return {reply.status, std::move(reply.body)};
}

}  // namespace strata::testing
