// Socket helpers for tests of the server's HTTP endpoint (unit and end to end): a blocking
// GET (or any call), loopback connections, raw writes, the open-file limit, and waiting on a
// condition.
#ifndef STRATA_COMMON_TESTING_HTTP_GET_H_
#define STRATA_COMMON_TESTING_HTTP_GET_H_

#include <sys/resource.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "gtest/gtest.h"

namespace strata::testing {

struct HttpReply {
  int status = 0;  // 0: the connection failed or closed without a response (body: why)
  std::string content_type;
  std::string body;
};

// `method` `target` with `headers` and `body` to 127.0.0.1:`port`.
inline HttpReply HttpCall(int port, boost::beast::http::verb method, const std::string& target,
                          const std::vector<std::pair<std::string, std::string>>& headers = {},
                          const std::string& body = "") {
  namespace asio = boost::asio;
  namespace http = boost::beast::http;
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
  if (ec) return {0, "", ec.message()};
  http::request<http::string_body> req{method, target, 11};
  req.set(http::field::host, "localhost");
  for (const auto& [name, value] : headers) req.set(name, value);
  if (method != http::verb::get || !body.empty()) {
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

// GET `target` from 127.0.0.1:`port`: (status, body), or (0, error) when the connection
// failed or closed without a response.
inline std::pair<int, std::string> HttpGet(int port, const std::string& target) {
  HttpReply reply = HttpCall(port, boost::beast::http::verb::get, target);
  return {reply.status, std::move(reply.body)};
}

inline boost::asio::ip::tcp::endpoint Local(int port) {
  return {boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)};
}

// A connection to 127.0.0.1:`port`; check is_open() (a failure leaves it closed).
inline std::unique_ptr<boost::asio::ip::tcp::socket> ConnectLocal(boost::asio::io_context& io,
                                                                  int port) {
  auto s = std::make_unique<boost::asio::ip::tcp::socket>(io);
  boost::system::error_code ec;
  s->connect(Local(port), ec);
  if (ec) s->close(ec);
  return s;
}

// ConnectLocal and SendAll for tests: a failure is a test failure.
inline std::unique_ptr<boost::asio::ip::tcp::socket> Connect(boost::asio::io_context& io,
                                                             int port) {
  auto s = ConnectLocal(io, port);
  EXPECT_TRUE(s->is_open()) << "cannot connect to 127.0.0.1:" << port;
  return s;
}

// Writes all of `bytes`; false on error.
inline bool SendAll(boost::asio::ip::tcp::socket& s, const std::string& bytes) {
  boost::system::error_code ec;
  boost::asio::write(s, boost::asio::buffer(bytes), ec);
  return !ec;
}

inline void Send(boost::asio::ip::tcp::socket& s, const std::string& bytes) {
  EXPECT_TRUE(SendAll(s, bytes));
}

// Raises the soft open-file limit to the hard one; true if `wanted` files are allowed.
inline bool RaiseFileLimit(rlim_t wanted) {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0) return false;
  if (l.rlim_cur >= wanted) return true;
  l.rlim_cur = l.rlim_max;
  return setrlimit(RLIMIT_NOFILE, &l) == 0 && l.rlim_cur >= wanted;
}

// Polls `done()` until it holds or `timeout` passes; false on timeout.
template <typename Pred>
bool WaitFor(Pred done, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_HTTP_GET_H_
