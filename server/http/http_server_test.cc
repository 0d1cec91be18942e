#include "server/http/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "gtest/gtest.h"

namespace strata::server {
namespace {

namespace http = boost::beast::http;

std::pair<int, std::string> Get(int port, const std::string& target) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  socket.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "localhost");
  http::write(socket, req);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(socket, buffer, res);
  return {res.result_int(), res.body()};
}

TEST(HttpServerTest, RoutesAndDecodesQuery) {
  HttpServer server;
  server.Route("/echo", [](const HttpRequest& r) {
    auto it = r.query.find("q");
    return HttpResponse{200, "text/plain", it == r.query.end() ? "-" : it->second};
  });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(Get(server.port(), "/echo?q=a%20b+c&x=1"), std::make_pair(200, std::string("a b c")));
  EXPECT_EQ(Get(server.port(), "/missing").first, 404);
  server.Stop();
}

TEST(HttpServerTest, BadAddress) {
  HttpServer server;
  EXPECT_FALSE(server.Start("nonsense").ok());
  EXPECT_FALSE(SplitHostPort("host:99999").ok());
  EXPECT_EQ(SplitHostPort("[::1]:80")->first, "::1");
}

}  // namespace
}  // namespace strata::server
