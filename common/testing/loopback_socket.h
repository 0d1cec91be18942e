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

// A loopback port that answers no connection, as a server behind a dead link: a listener
// with a backlog of 0 whose queue holds a connection of its own, so the kernel drops every
// later SYN and a client's connect hangs until its own deadline. port() is 0 if the listener
// could not be made.
class SilentPort {
 public:
  SilentPort() {
    boost::system::error_code ec;
    listener_.open(boost::asio::ip::tcp::v4(), ec);
    if (!ec) listener_.bind(Local(0), ec);
    if (!ec) listener_.listen(0, ec);
    const int port = ec ? 0 : listener_.local_endpoint(ec).port();
    if (!ec) filler_.connect(Local(port), ec);  // the one connection the queue takes
    if (!ec) port_ = port;
  }
  int port() const { return port_; }

 private:
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor listener_{io_};
  boost::asio::ip::tcp::socket filler_{io_};
  int port_ = 0;
};

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
