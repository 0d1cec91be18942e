// Raw sockets for tests of the server's HTTP endpoint (unit and end to end): loopback
// connections, raw writes (slow, partial or hostile clients) and the open-file limit. Plain
// HTTP calls are tests/e2e/http_client.h's, compiled once.
#ifndef STRATA_COMMON_TESTING_LOOPBACK_SOCKET_H_
#define STRATA_COMMON_TESTING_LOOPBACK_SOCKET_H_

#include <sys/resource.h>

#include <memory>
#include <string>

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include "gtest/gtest.h"

namespace strata::testing {

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

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_LOOPBACK_SOCKET_H_
