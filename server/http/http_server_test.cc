#include "server/http/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/synchronization/notification.h"
#include "common/testing/http_get.h"
#include "gtest/gtest.h"

namespace strata::server {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

using strata::testing::HttpGet;

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Best of `tries` /healthz round trips, milliseconds (a loaded 2-core machine may deschedule
// one request; a blocked server delays all of them).
double HealthzMs(int port, int tries = 5) {
  double best = 1e9;
  for (int i = 0; i < tries; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto r = HttpGet(port, "/healthz");
    const double ms = MsSince(start);
    EXPECT_EQ(r.first, 200) << r.second;
    best = std::min(best, ms);
  }
  return best;
}

bool RaiseFileLimit(rlim_t wanted) {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0) return false;
  if (l.rlim_cur >= wanted) return true;
  l.rlim_cur = std::min(l.rlim_max, wanted);
  return setrlimit(RLIMIT_NOFILE, &l) == 0 && l.rlim_cur >= wanted;
}

// Waits until `done()` or `timeout`; false on timeout.
template <typename Pred>
bool WaitFor(Pred done, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

HttpServer::Handler Ok() {
  return [](const HttpRequest&) { return HttpResponse{200, "text/plain", "ok\n"}; };
}

TEST(HttpServerTest, RoutesAndDecodesQuery) {
  HttpServer server;
  server.Route("/echo", [](const HttpRequest& r) {
    auto it = r.query.find("q");
    return HttpResponse{200, "text/plain", it == r.query.end() ? "-" : it->second};
  });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(HttpGet(server.port(), "/echo?q=a%20b+c&x=1"), std::make_pair(200, std::string("a b c")));
  EXPECT_EQ(HttpGet(server.port(), "/echo?q=%C3%A9"), std::make_pair(200, std::string("\xc3\xa9")));
  EXPECT_EQ(HttpGet(server.port(), "/missing").first, 404);
  // Invalid UTF-8 in a parameter (it would end up in protobuf strings and JSON).
  EXPECT_EQ(HttpGet(server.port(), "/echo?q=%FF%FE").first, 400);
  EXPECT_EQ(HttpGet(server.port(), "/echo?q=%C0%AF").first, 400);  // overlong '/'
  server.Stop();
}

TEST(HttpServerTest, BadAddress) {
  HttpServer server;
  EXPECT_FALSE(server.Start("nonsense").ok());
  EXPECT_FALSE(SplitHostPort("host:99999").ok());
  EXPECT_EQ(SplitHostPort("[::1]:80")->first, "::1");
}

// 1,000 idle connections, a few that stall mid-header and one that trickles a body: the
// health check still answers at once.
TEST(HttpServerTest, IdleAndSlowClientsDoNotDelayHealthChecks) {
  if (!RaiseFileLimit(2200)) GTEST_SKIP() << "needs 2,200 open files (RLIMIT_NOFILE)";
  HttpServer server;
  server.Route("/healthz", Ok(), /*inline_handler=*/true);
  server.Route("/upload", Ok());
  HttpServerOptions options;
  options.max_connections = 1100;
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  const double idle_before = HealthzMs(server.port());

  asio::io_context io;
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"),
                               static_cast<unsigned short>(server.port()));
  std::vector<std::unique_ptr<tcp::socket>> clients;
  for (int i = 0; i < 1000; ++i) {
    auto s = std::make_unique<tcp::socket>(io);
    s->connect(endpoint);
    clients.push_back(std::move(s));
  }
  for (int i = 0; i < 5; ++i) {  // half a header, then nothing
    asio::write(*clients[i], asio::buffer(std::string("GET /healthz HTTP/1.1\r\nHost: x")));
  }
  asio::write(*clients[5], asio::buffer(std::string(
                               "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nab")));
  ASSERT_TRUE(WaitFor([&] { return server.stats().open_connections >= 1000; }));
  const double with_idle = HealthzMs(server.port());
  std::printf("healthz with 1000 idle connections: %.2f ms (%.2f ms before)\n", with_idle,
              idle_before);
  EXPECT_LT(with_idle, 100.0);
  server.Stop();
}

// Handlers are slow (a long query); health checks are not queued behind them.
TEST(HttpServerTest, SlowHandlersDoNotBlockHealthChecks) {
  HttpServer server;
  absl::Notification release;
  std::atomic<int> inside{0};
  server.Route("/slow", [&](const HttpRequest&) {
    ++inside;
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
    return HttpResponse{200, "text/plain", "done\n"};
  });
  server.Route("/healthz", Ok(), /*inline_handler=*/true);
  HttpServerOptions options;
  options.handler_threads = 2;
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  std::vector<std::thread> slow;
  for (int i = 0; i < 4; ++i) {  // more than there are handler threads
    slow.emplace_back([&] { EXPECT_EQ(HttpGet(server.port(), "/slow").first, 200); });
  }
  ASSERT_TRUE(WaitFor([&] { return inside.load() == 2; }));
  EXPECT_LT(HealthzMs(server.port()), 100.0);
  release.Notify();
  for (auto& t : slow) t.join();
  EXPECT_EQ(inside.load(), 4);
  server.Stop();
}

// A client that never finishes its header is disconnected at the header deadline; one
// that idles after a response, at the idle deadline.
TEST(HttpServerTest, DeadlinesCloseStalledConnections) {
  HttpServer server;
  server.Route("/healthz", Ok(), /*inline_handler=*/true);
  HttpServerOptions options;
  options.header_timeout = absl::Milliseconds(300);
  options.idle_timeout = absl::Milliseconds(300);
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  asio::io_context io;
  tcp::socket stalled(io);
  stalled.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(server.port())});
  asio::write(stalled, asio::buffer(std::string("GET /healthz HTTP/1.1\r\n")));
  // The server closes it: a read returns end of file (or a reset).
  char byte;
  boost::system::error_code ec;
  const auto start = std::chrono::steady_clock::now();
  stalled.read_some(asio::buffer(&byte, 1), ec);
  EXPECT_TRUE(ec) << "the stalled connection got data";
  EXPECT_LT(MsSince(start), 20'000);
  ASSERT_TRUE(WaitFor([&] { return server.stats().timed_out >= 1; }));
  EXPECT_TRUE(WaitFor([&] { return server.stats().open_connections == 0; }));
  server.Stop();
}

// Past max_connections new connections are closed at once; slots free up as clients leave.
TEST(HttpServerTest, ConnectionLimitRefusesTheExcess) {
  HttpServer server;
  server.Route("/healthz", Ok(), /*inline_handler=*/true);
  HttpServerOptions options;
  options.max_connections = 3;
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  asio::io_context io;
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"),
                               static_cast<unsigned short>(server.port()));
  std::vector<std::unique_ptr<tcp::socket>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<tcp::socket>(io));
    held.back()->connect(endpoint);
  }
  ASSERT_TRUE(WaitFor([&] { return server.stats().open_connections == 3; }));
  EXPECT_EQ(HttpGet(server.port(), "/healthz").first, 0);  // closed without an answer
  EXPECT_GE(server.stats().refused_connections, 1u);
  held.clear();
  ASSERT_TRUE(WaitFor([&] { return server.stats().open_connections == 0; }));
  EXPECT_EQ(HttpGet(server.port(), "/healthz").first, 200);
  server.Stop();
}

TEST(HttpServerTest, OversizedRequestsAreRefused) {
  HttpServer server;
  server.Route("/upload", Ok());
  HttpServerOptions options;
  options.max_body_bytes = 1000;
  options.max_header_bytes = 2000;
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  asio::io_context io;
  auto send = [&](const std::string& request) {
    tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(server.port())});
    boost::system::error_code ec;
    asio::write(s, asio::buffer(request), ec);
    boost::beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(s, buffer, res, ec);
    return ec ? 0 : res.result_int();
  };
  EXPECT_EQ(send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" +
                 std::string(5000, 'b')),
            413);
  EXPECT_EQ(send("GET /upload HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(5000, 'h') +
                 "\r\n\r\n"),
            413);
  EXPECT_EQ(send("NOT HTTP AT ALL\r\n\r\n"), 400);
  EXPECT_GE(server.stats().bad_requests, 3u);
  server.Stop();
}

}  // namespace
}  // namespace strata::server
