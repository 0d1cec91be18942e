// A blocking HTTP/1.1 GET for tests of the server's HTTP endpoint (unit and end to end).
#ifndef STRATA_COMMON_TESTING_HTTP_GET_H_
#define STRATA_COMMON_TESTING_HTTP_GET_H_

#include <string>
#include <utility>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace strata::testing {

// GET `target` from 127.0.0.1:`port`: (status, body), or (0, error) when the connection
// failed or closed without a response.
inline std::pair<int, std::string> HttpGet(int port, const std::string& target) {
  namespace asio = boost::asio;
  namespace http = boost::beast::http;
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
  if (ec) return {0, ec.message()};
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "localhost");
  http::write(socket, req, ec);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(socket, buffer, res, ec);
  if (ec) return {0, ec.message()};
  return {static_cast<int>(res.result_int()), res.body()};
}

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_HTTP_GET_H_
