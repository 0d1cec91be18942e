#include "server/http/http_server.h"

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
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
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using strata::testing::Connect;
using strata::testing::Local;
using strata::testing::RaiseFileLimit;
using strata::testing::Send;
using strata::testing::WaitFor;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// GET `target` on a fresh connection, bounded by `timeout` as a whole: (status, body), or
// (0, error) when the connection failed, closed without a response or took too long.
std::pair<int, std::string> Get(int port, const std::string& target,
                                milliseconds timeout = milliseconds(5000)) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "localhost");
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  beast::error_code result;
  stream.expires_after(timeout);
  stream.async_connect(Local(port), [&](beast::error_code ec) {
    if (ec) {
      result = ec;
      return;
    }
    http::async_write(stream, req, [&](beast::error_code ec, size_t) {
      if (ec) {
        result = ec;
        return;
      }
      http::async_read(stream, buffer, res, [&](beast::error_code ec, size_t) { result = ec; });
    });
  });
  io.run();
  if (result) return {0, result.message()};
  return {static_cast<int>(res.result_int()), res.body()};
}

// Best of `tries` /healthz round trips, milliseconds: a loaded 2-core machine may deschedule
// one request; a server held up by its clients delays every one of them.
double HealthzMs(int port, int tries = 5) {
  double best = 1e9;
  for (int i = 0; i < tries; ++i) {
    const auto start = Clock::now();
    auto r = Get(port, "/healthz", milliseconds(2000));
    const double ms = MsSince(start);
    EXPECT_EQ(r.first, 200) << r.second;
    best = std::min(best, ms);
  }
  return best;
}

// Reads and discards until the peer closes `socket` (end of file or a reset); false if it
// is still open after `timeout`.
bool WaitUntilClosed(tcp::socket& socket, milliseconds timeout = milliseconds(20'000)) {
  const auto deadline = Clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{socket.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::recv(socket.native_handle(), buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
}

// Sends one byte of a body every `every` until stopped or the server closes the connection.
class Trickle {
 public:
  Trickle(tcp::socket& socket, milliseconds every)
      : thread_([this, &socket, every] {
          while (!stop_.WaitForNotificationWithTimeout(absl::FromChrono(every))) {
            if (::send(socket.native_handle(), "x", 1, MSG_NOSIGNAL) != 1) return;
          }
        }) {}
  ~Trickle() {
    stop_.Notify();
    thread_.join();
  }

 private:
  absl::Notification stop_;
  std::thread thread_;
};

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
  EXPECT_EQ(Get(server.port(), "/echo?q=a%20b+c&x=1"), std::make_pair(200, std::string("a b c")));
  EXPECT_EQ(Get(server.port(), "/echo?q=%C3%A9"), std::make_pair(200, std::string("\xc3\xa9")));
  // Unknown paths come back escaped.
  auto missing = Get(server.port(), "/missing%1B%5B31m");
  EXPECT_EQ(missing.first, 404);
  EXPECT_EQ(missing.second.find('\x1b'), std::string::npos) << missing.second;
  EXPECT_NE(missing.second.find("\\x1b[31m"), std::string::npos) << missing.second;
  // Invalid UTF-8 in a parameter (it would end up in protobuf strings and JSON).
  EXPECT_EQ(Get(server.port(), "/echo?q=%FF%FE").first, 400);
  EXPECT_EQ(Get(server.port(), "/echo?q=%C0%AF").first, 400);  // overlong '/'
  EXPECT_EQ(server.stats().requests, 5u);
  server.Stop();
}

TEST(HttpServerTest, BadAddressAndOptions) {
  HttpServer server;
  EXPECT_FALSE(server.Start("nonsense").ok());
  EXPECT_FALSE(server.Start("not-an-ip:80").ok());
  HttpServerOptions no_threads;
  no_threads.handler_threads = 0;
  EXPECT_FALSE(server.Start("127.0.0.1:0", no_threads).ok());
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  EXPECT_EQ(server.Start("127.0.0.1:0").code(), absl::StatusCode::kFailedPrecondition);
  server.Stop();
  EXPECT_FALSE(server.Start("127.0.0.1:0").ok());
  EXPECT_FALSE(SplitHostPort("host:99999").ok());
  EXPECT_EQ(SplitHostPort("[::1]:80")->first, "::1");
}

TEST(HttpServerTest, KeepAliveAndPipelinedRequests) {
  HttpServer server;
  server.Route("/a", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "A"}; });
  server.Route("/b", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "B"}; },
               HttpServer::Dispatch::kInline);
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  asio::io_context io;
  auto s = Connect(io, server.port());
  // Two requests in one write: answered in order on the one connection.
  Send(*s, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n");
  beast::flat_buffer buffer;
  for (const char* want : {"A", "B"}) {
    http::response<http::string_body> res;
    beast::error_code ec;
    http::read(*s, buffer, res, ec);
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_EQ(res.body(), want);
    EXPECT_TRUE(res.keep_alive());
  }
  EXPECT_EQ(server.stats().connections, 1u);
  EXPECT_EQ(server.stats().requests, 2u);
  server.Stop();
}

// 1,000 idle connections, a few that stall mid-header and one that trickles a body: the
// health check still answers at once, and so do priority routes.
TEST(HttpServerTest, IdleAndSlowClientsDoNotDelayHealthChecks) {
  // Both ends of every connection live in this process.
  if (!RaiseFileLimit(2100)) {
    std::printf("skipped: needs 2,100 open files (RLIMIT_NOFILE)\n");
    GTEST_SKIP() << "needs 2,100 open files (RLIMIT_NOFILE)";
  }
  HttpServer server;
  server.Route("/healthz", Ok(), HttpServer::Dispatch::kInline);
  server.Route("/metrics", Ok(), HttpServer::Dispatch::kPriority);
  server.Route("/upload", Ok());
  HttpServerOptions options;
  options.max_connections = 1100;
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  const double before = HealthzMs(server.port());

  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> clients;
  for (int i = 0; i < 1000; ++i) clients.push_back(Connect(io, server.port()));
  for (int i = 0; i < 5; ++i) {  // half a header, then nothing
    Send(*clients[i], "GET /healthz HTTP/1.1\r\nHost: x");
  }
  Send(*clients[5], "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nab");
  Trickle trickle(*clients[5], milliseconds(10));
  // All accepted (after the five requests above), and open.
  ASSERT_TRUE(WaitFor([&] { return server.stats().connections == 1005; }))
      << server.stats().connections;
  ASSERT_GE(server.stats().open_connections, 1000);

  const double with_idle = HealthzMs(server.port());
  std::printf("healthz with 1000 idle connections: %.2f ms (%.2f ms before)\n", with_idle,
              before);
  EXPECT_LT(with_idle, 100.0);
  EXPECT_EQ(Get(server.port(), "/metrics", milliseconds(2000)).first, 200);
  EXPECT_EQ(server.stats().refused_connections, 0u);
  EXPECT_EQ(server.stats().timed_out, 0u);
  server.Stop();
}

// Handlers are slow (a long query); health checks and priority routes are not queued
// behind them, even with every handler thread busy and more requests waiting.
TEST(HttpServerTest, SlowHandlersDoNotBlockHealthChecks) {
  HttpServer server;
  absl::Notification release;
  std::atomic<int> inside{0};
  server.Route("/slow", [&](const HttpRequest&) {
    ++inside;
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
    return HttpResponse{200, "text/plain", "done\n"};
  });
  server.Route("/healthz", Ok(), HttpServer::Dispatch::kInline);
  server.Route("/metrics", Ok(), HttpServer::Dispatch::kPriority);
  HttpServerOptions options;
  options.handler_threads = 2;
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  std::vector<std::thread> slow;
  for (int i = 0; i < 4; ++i) {  // more than there are handler threads
    slow.emplace_back(
        [&] { EXPECT_EQ(Get(server.port(), "/slow", milliseconds(60'000)).first, 200); });
  }
  ASSERT_TRUE(WaitFor([&] { return inside.load() == 2 && server.stats().requests == 4; }));
  const double healthz = HealthzMs(server.port());
  std::printf("healthz with every handler thread busy: %.2f ms\n", healthz);
  EXPECT_LT(healthz, 100.0);
  EXPECT_EQ(Get(server.port(), "/metrics", milliseconds(2000)).first, 200);
  EXPECT_EQ(inside.load(), 2);  // the pool was busy all along
  release.Notify();
  for (auto& t : slow) t.join();
  EXPECT_EQ(inside.load(), 4);
  server.Stop();
}

// A client that never finishes its header is disconnected at the header deadline.
TEST(HttpServerTest, HeaderDeadlineClosesStalledConnection) {
  HttpServer server;
  server.Route("/healthz", Ok(), HttpServer::Dispatch::kInline);
  HttpServerOptions options;
  options.header_timeout = absl::Milliseconds(300);
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  asio::io_context io;
  auto stalled = Connect(io, server.port());
  const auto start = Clock::now();
  Send(*stalled, "GET /healthz HTTP/1.1\r\n");
  EXPECT_TRUE(WaitUntilClosed(*stalled));
  EXPECT_GE(MsSince(start), 250);
  EXPECT_TRUE(WaitFor([&] { return server.stats().timed_out == 1; }));
  EXPECT_TRUE(WaitFor([&] { return server.stats().open_connections == 0; }));
  server.Stop();
}

// A body that keeps arriving, but too slowly, is cut off at the body deadline.
TEST(HttpServerTest, BodyDeadlineClosesTricklingUpload) {
  HttpServer server;
  server.Route("/upload", Ok());
  HttpServerOptions options;
  options.body_timeout = absl::Milliseconds(400);
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  asio::io_context io;
  auto s = Connect(io, server.port());
  const auto start = Clock::now();
  Send(*s, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n");
  Trickle trickle(*s, milliseconds(20));
  EXPECT_TRUE(WaitUntilClosed(*s));
  EXPECT_GE(MsSince(start), 350);
  EXPECT_TRUE(WaitFor([&] { return server.stats().timed_out == 1; }));
  EXPECT_EQ(server.stats().requests, 0u);
  server.Stop();
}

// A kept-alive connection may idle between requests up to the idle deadline, then closes.
TEST(HttpServerTest, IdleDeadlineClosesKeptAliveConnection) {
  HttpServer server;
  server.Route("/healthz", Ok(), HttpServer::Dispatch::kInline);
  HttpServerOptions options;
  options.idle_timeout = absl::Milliseconds(300);
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  asio::io_context io;
  auto s = Connect(io, server.port());
  Send(*s, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  beast::error_code ec;
  http::read(*s, buffer, res, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_TRUE(res.keep_alive());
  const auto start = Clock::now();
  EXPECT_TRUE(WaitUntilClosed(*s));
  EXPECT_GE(MsSince(start), 250);
  EXPECT_TRUE(WaitFor([&] { return server.stats().timed_out == 1; }));
  EXPECT_TRUE(WaitFor([&] { return server.stats().open_connections == 0; }));
  server.Stop();
}

// Past max_connections new connections are accepted and closed at once, without an
// answer; slots free up as clients leave.
TEST(HttpServerTest, ConnectionLimitRefusesTheExcess) {
  HttpServer server;
  server.Route("/healthz", Ok(), HttpServer::Dispatch::kInline);
  HttpServerOptions options;
  options.max_connections = 3;
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> held;
  for (int i = 0; i < 3; ++i) held.push_back(Connect(io, server.port()));
  ASSERT_TRUE(WaitFor([&] { return server.stats().open_connections == 3; }));
  const auto start = Clock::now();
  EXPECT_EQ(Get(server.port(), "/healthz").first, 0);  // closed without an answer
  EXPECT_LT(MsSince(start), 2000);                     // and at once, not at a deadline
  EXPECT_EQ(server.stats().refused_connections, 1u);
  // One client leaves: one slot.
  held.pop_back();
  ASSERT_TRUE(WaitFor([&] { return server.stats().open_connections == 2; }));
  EXPECT_EQ(Get(server.port(), "/healthz").first, 200);
  held.clear();
  ASSERT_TRUE(WaitFor([&] { return server.stats().open_connections == 0; }));
  EXPECT_EQ(Get(server.port(), "/healthz").first, 200);
  EXPECT_EQ(server.stats().refused_connections, 1u);
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
    auto s = Connect(io, server.port());
    beast::error_code ec;
    asio::write(*s, asio::buffer(request), ec);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(*s, buffer, res, ec);
    return ec ? 0 : res.result_int();
  };
  EXPECT_EQ(send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" +
                 std::string(5000, 'b')),
            413);
  EXPECT_EQ(send("GET /upload HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(5000, 'h') +
                 "\r\n\r\n"),
            413);
  EXPECT_EQ(send("NOT HTTP AT ALL\r\n\r\n"), 400);
  EXPECT_EQ(send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" +
                 std::string(1000, 'b')),
            200);
  EXPECT_EQ(server.stats().bad_requests, 3u);
  server.Stop();
}

// Stop() closes open connections and returns, with clients still connected and requests
// waiting for a handler thread.
TEST(HttpServerTest, StopClosesConnections) {
  auto server = std::make_unique<HttpServer>();
  absl::Notification release;
  std::atomic<int> inside{0};
  server->Route("/slow", [&](const HttpRequest&) {
    ++inside;
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
    return HttpResponse{200, "text/plain", "done\n"};
  });
  HttpServerOptions options;
  options.handler_threads = 1;
  ASSERT_TRUE(server->Start("127.0.0.1:0", options).ok());
  asio::io_context io;
  auto idle = Connect(io, server->port());
  auto running = Connect(io, server->port());
  auto queued = Connect(io, server->port());
  Send(*running, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(WaitFor([&] { return inside.load() == 1; }));
  Send(*queued, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(WaitFor([&] { return server->stats().requests == 2; }));
  // The running handler finishes once released; Stop() waits for it (and, depending on
  // timing, the queued one may start before the pool stops).
  std::thread stopper([&] { server->Stop(); });
  release.Notify();
  stopper.join();
  for (auto* s : {idle.get(), running.get(), queued.get()}) EXPECT_TRUE(WaitUntilClosed(*s));
  EXPECT_LE(inside.load(), 2);
  EXPECT_EQ(server->stats().open_connections, 0);
  server.reset();
}

}  // namespace
}  // namespace strata::server
