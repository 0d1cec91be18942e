#include "server/http/http_server.h"

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/testing/loopback_socket.h"
#include "common/testing/wait_for.h"
#include "gtest/gtest.h"

namespace strata::server::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
namespace fs = std::filesystem;
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
  // A parameter given twice (which value would be used was the route's to decide).
  EXPECT_EQ(Get(server.port(), "/echo?q=a&x=1&q=b"),
            std::make_pair(400, std::string("malformed request: query parameter 'q' is given "
                                            "more than once\n")));
  EXPECT_EQ(Get(server.port(), "/echo?q=a&q%3Db"), std::make_pair(200, std::string("a")));
  EXPECT_EQ(server.stats().requests, 7u);
  server.Stop();
}

// The server's own answers take the form the owner gives them (JSON, as its routes answer).
TEST(HttpServerTest, ItsOwnErrorsTakeTheOwnersForm) {
  HttpServer server;
  server.Route("/echo", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "-"}; });
  server.Route("/throws", [](const HttpRequest&) -> HttpResponse {
    throw std::runtime_error("bug");
  });
  HttpServerOptions options;
  options.error_response = [](int status, const std::string& message) {
    return HttpResponse{status, "application/json", "{\"error\":\"" + message + "\"}"};
  };
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  EXPECT_EQ(Get(server.port(), "/nope"),
            std::make_pair(404, std::string("{\"error\":\"no such path: /nope\"}")));
  EXPECT_EQ(Get(server.port(), "/echo?q=a&q=b"),
            std::make_pair(400, std::string("{\"error\":\"malformed request: query parameter "
                                            "'q' is given more than once\"}")));
  EXPECT_EQ(Get(server.port(), "/throws"),
            std::make_pair(500, std::string("{\"error\":\"internal error\"}")));
  server.Stop();
}

// A handler that throws (a bug, not an input) answers 500 on every dispatch; the process,
// whose handler pool would otherwise terminate it, serves on.
TEST(HttpServerTest, AHandlerThatThrowsAnswers500AndTheServerServesOn) {
  HttpServer server;
  auto thrower = [](const HttpRequest&) -> HttpResponse {
    std::vector<int> v;
    v.reserve(v.max_size() + 1);  // std::length_error
    return {200, "text/plain", "unreachable"};
  };
  server.Route("/pool", thrower);
  server.Route("/inline", thrower, HttpServer::Dispatch::kInline);
  server.Route("/priority", thrower, HttpServer::Dispatch::kPriority);
  server.Route("/ok", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "ok"}; });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  for (const char* path : {"/pool", "/inline", "/priority", "/pool"}) {
    EXPECT_EQ(Get(server.port(), path), std::make_pair(500, std::string("internal error\n")))
        << path;
  }
  EXPECT_EQ(Get(server.port(), "/ok"), std::make_pair(200, std::string("ok")));
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

// HEAD gets a GET's header with no body, so the next response on the connection is read
// whole; methods the routes do not take get 405 naming those they do.
TEST(HttpServerTest, HeadHasNoBodyAndOtherMethodsAreNotAllowed) {
  HttpServer server;
  server.Route("/a", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "AAAA"}; });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  asio::io_context io;
  auto s = Connect(io, server.port());
  Send(*s, "HEAD /a HTTP/1.1\r\nHost: x\r\n\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\n");
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> head;
  head.skip(true);  // a HEAD answer's Content-Length says what a GET would get
  beast::error_code ec;
  http::read(*s, buffer, head, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(head.get().result_int(), 200);
  EXPECT_EQ(head.get()[http::field::content_length], "4");
  EXPECT_EQ(head.get().body(), "");
  http::response<http::string_body> get;
  http::read(*s, buffer, get, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(get.body(), "AAAA");
  for (const char* method : {"PUT", "DELETE", "TRACE", "OPTIONS", "FOO"}) {
    Send(*s, absl::StrCat(method, " /a HTTP/1.1\r\nHost: x\r\n\r\n"));
    http::response<http::string_body> res;
    http::read(*s, buffer, res, ec);
    ASSERT_FALSE(ec) << method << ": " << ec.message();
    EXPECT_EQ(res.result_int(), 405) << method;
    EXPECT_EQ(res[http::field::allow], "GET, HEAD, POST") << method;
  }
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


// --- TLS ---------------------------------------------------------------------------------

// Runs a shell command; true if it exited 0.
bool RunShell(const std::string& command) {
  const int rc = std::system(command.c_str());
  if (rc != 0) ADD_FAILURE() << "command failed (" << rc << "): " << command;
  return rc == 0;
}

// Certificates made once per test binary by deploy/gen-certs.sh (and, for a certificate
// without a subjectAltName, by openssl directly), in a temporary directory:
//   main/    the CA, server (localhost, 127.0.0.1), agents/agent-1, clients/alice,
//            expired/old, cn-only.pem (CN=cn-only-client, no SAN)
//   other/   another CA and its clients/mallory
class TestCerts {
 public:
  static const TestCerts& Get() {
    static TestCerts certs;  // removes the directory at exit
    return certs;
  }
  ~TestCerts() {
    std::error_code ignored;
    if (!root_.empty()) fs::remove_all(root_, ignored);
  }
  std::string Main(const std::string& file) const { return root_ + "/main/" + file; }
  std::string Other(const std::string& file) const { return root_ + "/other/" + file; }
  const std::string& root() const { return root_; }
  bool ok() const { return ok_; }

 private:
  TestCerts() {
    std::string dir = (fs::temp_directory_path() / "strata-http-tls-XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr) return;
    root_ = dir;
    const std::string script = std::string(STRATA_SOURCE_DIR) + "/deploy/gen-certs.sh";
    const std::string main = root_ + "/main";
    const std::string quiet = " >/dev/null";
    ok_ = RunShell(script + " --out " + main +
              " --agent agent-1 --client alice --expired old" + quiet) &&
          RunShell(script + " --out " + root_ + "/other --ca-name 'Other CA' --client mallory" +
              quiet) &&
          // A client certificate whose identity is only its CN.
          RunShell("cd " + main + " && umask 077 && printf '%s\\n' '[v3]' " +
              "'basicConstraints = CA:FALSE' 'extendedKeyUsage = clientAuth' > cn-only.ext && " +
              "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 " +
              "-out cn-only.key 2>/dev/null && " +
              "openssl req -new -key cn-only.key -subj /CN=cn-only-client -out cn-only.csr && " +
              "openssl x509 -req -in cn-only.csr -CA ca.pem -CAkey ca.key -set_serial 77 " +
              "-days 30 -extfile cn-only.ext -extensions v3 -out cn-only.pem 2>/dev/null");
  }

  std::string root_;
  bool ok_ = false;
};

// The serial number of a certificate, in hex.
std::string SerialHex(X509* cert) {
  if (cert == nullptr) return "";
  BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get_serialNumber(cert), nullptr);
  char* hex = BN_bn2hex(bn);
  std::string out(hex);
  OPENSSL_free(hex);
  BN_free(bn);
  return out;
}

std::string SerialOfFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  std::string serial = SerialHex(cert);
  X509_free(cert);
  return serial;
}

struct TlsClientOptions {
  std::string ca_file;  // verify the server (and its name, localhost) against this CA
  std::string cert_file, key_file;  // a client certificate
  int min_version = TLS1_2_VERSION;
  int max_version = 0;  // 0: the newest
};

struct HttpsResult {
  int status = 0;  // 0: no response (error says why)
  std::string error;
  std::string body;
  http::fields headers;
  std::string server_serial;  // of the certificate the server presented
  int version = 0;            // the negotiated protocol, e.g. TLS1_3_VERSION
};

// One HTTPS client connection to 127.0.0.1; every step bounded by a timeout sized for a
// loaded machine.
class HttpsConnection {
 public:
  HttpsConnection(int port, const TlsClientOptions& options)
      : port_(port), ctx_(ssl::context::tls_client) {
    SSL_CTX* native = ctx_.native_handle();
    if (options.min_version < TLS1_2_VERSION) {
      // Willing to speak the old protocols (Debian's defaults forbid them), so that the
      // server is the one refusing.
      SSL_CTX_set_security_level(native, 0);
      SSL_CTX_set_cipher_list(native, "DEFAULT:@SECLEVEL=0");
    }
    SSL_CTX_set_min_proto_version(native, options.min_version);
    SSL_CTX_set_max_proto_version(native, options.max_version);
    beast::error_code ec;
    if (!options.ca_file.empty()) {
      ctx_.load_verify_file(options.ca_file, ec);
      EXPECT_FALSE(ec) << ec.message();
      ctx_.set_verify_mode(ssl::verify_peer, ec);
    } else {
      ctx_.set_verify_mode(ssl::verify_none, ec);
    }
    if (!options.cert_file.empty()) {
      ctx_.use_certificate_chain_file(options.cert_file, ec);
      EXPECT_FALSE(ec) << options.cert_file << ": " << ec.message();
      ctx_.use_private_key_file(options.key_file, ssl::context::pem, ec);
      EXPECT_FALSE(ec) << options.key_file << ": " << ec.message();
    }
    stream_ = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(io_, ctx_);
    if (!options.ca_file.empty()) {
      stream_->set_verify_callback(ssl::host_name_verification("localhost"));
    }
    SSL_set_tlsext_host_name(stream_->native_handle(), "localhost");
  }

  // Connects and completes the handshake; false with error() set on failure.
  bool Connect(milliseconds timeout = milliseconds(20'000)) {
    beast::error_code result;
    auto& tcp_layer = beast::get_lowest_layer(*stream_);
    tcp_layer.expires_after(timeout);
    tcp_layer.async_connect(Local(port_), [&](beast::error_code ec) {
      if (ec) {
        result = ec;
        return;
      }
      stream_->async_handshake(ssl::stream_base::client,
                               [&](beast::error_code ec) { result = ec; });
    });
    RunIo();
    if (result) {
      error_ = "connect/handshake: " + result.message();
      return false;
    }
    server_serial_ = SerialHex(SSL_get0_peer_certificate(stream_->native_handle()));
    version_ = SSL_version(stream_->native_handle());
    return true;
  }

  // One request on the connection.
  HttpsResult Request(const std::string& target, const std::string& authorization = "",
                      milliseconds timeout = milliseconds(20'000)) {
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, "localhost");
    if (!authorization.empty()) req.set(http::field::authorization, authorization);
    http::response<http::string_body> res;
    beast::error_code result;
    beast::get_lowest_layer(*stream_).expires_after(timeout);
    http::async_write(*stream_, req, [&](beast::error_code ec, size_t) {
      if (ec) {
        result = ec;
        return;
      }
      http::async_read(*stream_, buffer_, res,
                       [&](beast::error_code ec, size_t) { result = ec; });
    });
    RunIo();
    HttpsResult out;
    out.server_serial = server_serial_;
    out.version = version_;
    if (result) {
      out.error = "request: " + result.message();
      return out;
    }
    out.status = static_cast<int>(res.result_int());
    out.body = res.body();
    for (const auto& field : res.base()) out.headers.insert(field.name_string(), field.value());
    return out;
  }

  const std::string& error() const { return error_; }

 private:
  void RunIo() {
    io_.restart();
    io_.run();
  }

  const int port_;
  asio::io_context io_;
  ssl::context ctx_;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> stream_;
  beast::flat_buffer buffer_;
  std::string error_;
  std::string server_serial_;
  int version_ = 0;
};

// A GET on a new HTTPS connection.
HttpsResult HttpsGet(int port, const TlsClientOptions& options, const std::string& target,
                     const std::string& authorization = "") {
  HttpsConnection c(port, options);
  if (!c.Connect()) {
    HttpsResult r;
    r.error = c.error();
    return r;
  }
  return c.Request(target, authorization);
}

// Answers with what the server made of the request: "secure=1 peer=agent-1 auth=...".
HttpResponse Describe(const HttpRequest& r) {
  HttpResponse response{200, "text/plain",
                        absl::StrCat("secure=", r.secure, " peer=", r.peer_identity,
                                     " auth=", r.authorization)};
  return response;
}

HttpServerOptions TlsOptions(const TestCerts& certs, bool client_ca) {
  HttpServerOptions options;
  options.tls.cert_file = certs.Main("server.pem");
  options.tls.key_file = certs.Main("server.key");
  if (client_ca) options.tls.client_ca_file = certs.Main("ca.pem");
  return options;
}

#define REQUIRE_TEST_CERTS()                                      \
  const TestCerts& certs = TestCerts::Get();                      \
  ASSERT_TRUE(certs.ok()) << "deploy/gen-certs.sh failed"

TEST(HttpServerTlsTest, ServesHttpsOverTls12And13) {
  REQUIRE_TEST_CERTS();
  HttpServer server;
  server.Route("/who", Describe);
  ASSERT_TRUE(server.Start("127.0.0.1:0", TlsOptions(certs, false)).ok());
  TlsClientOptions client;
  client.ca_file = certs.Main("ca.pem");  // verifies the chain and the name localhost
  HttpsResult r = HttpsGet(server.port(), client, "/who");
  EXPECT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.body, "secure=1 peer= auth=");
  EXPECT_EQ(r.version, TLS1_3_VERSION);
  EXPECT_EQ(r.server_serial, SerialOfFile(certs.Main("server.pem")));
  client.max_version = TLS1_2_VERSION;
  r = HttpsGet(server.port(), client, "/who");
  EXPECT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.version, TLS1_2_VERSION);
  EXPECT_EQ(server.stats().tls_handshake_failures, 0u);
  EXPECT_EQ(server.stats().requests, 2u);
  server.Stop();
}

TEST(HttpServerTlsTest, AuthorizationAndExtraResponseHeadersPassThrough) {
  REQUIRE_TEST_CERTS();
  auto handler = [](const HttpRequest& r) {
    HttpResponse response = Describe(r);
    response.status = 401;
    response.headers = {{"WWW-Authenticate", "Bearer realm=\"strata\""},
                        {"X-Strata-Test", "1"},
                        {"X-Strata-Test", "2"},
                        {"Content-Length", "999"},         // the server's own: ignored
                        {"X-Split", "a\r\nX-Injected: b"},  // control characters: dropped
                        {"Bad Name", "c"}};
    return response;
  };
  HttpServer tls_server, plain_server;
  tls_server.Route("/auth", handler);
  plain_server.Route("/auth", handler);
  ASSERT_TRUE(tls_server.Start("127.0.0.1:0", TlsOptions(certs, true)).ok());
  ASSERT_TRUE(plain_server.Start("127.0.0.1:0").ok());

  auto check = [](const HttpsResult& r, bool secure) {
    EXPECT_EQ(r.status, 401) << r.error;
    EXPECT_EQ(r.body, absl::StrCat("secure=", secure, " peer= auth=Bearer s3cr3t token"));
    EXPECT_EQ(r.headers[http::field::www_authenticate], "Bearer realm=\"strata\"");
    std::vector<std::string> values;
    const auto [begin, end] = r.headers.equal_range("X-Strata-Test");
    for (auto it = begin; it != end; ++it) values.push_back(std::string(it->value()));
    EXPECT_EQ(values, (std::vector<std::string>{"1", "2"}));
    EXPECT_EQ(r.headers[http::field::content_length], std::to_string(r.body.size()));
    EXPECT_EQ(r.headers.count("X-Split"), 0u);
    EXPECT_EQ(r.headers.count("X-Injected"), 0u);
    EXPECT_EQ(r.headers.count("Bad Name"), 0u);
  };
  TlsClientOptions client;
  client.ca_file = certs.Main("ca.pem");
  check(HttpsGet(tls_server.port(), client, "/auth", "Bearer s3cr3t token"), true);

  // The same over plaintext.
  asio::io_context io;
  auto s = Connect(io, plain_server.port());
  Send(*s, "GET /auth HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cr3t token\r\n\r\n");
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  beast::error_code ec;
  http::read(*s, buffer, res, ec);
  ASSERT_FALSE(ec) << ec.message();
  HttpsResult plain;
  plain.status = static_cast<int>(res.result_int());
  plain.body = res.body();
  for (const auto& field : res.base()) plain.headers.insert(field.name_string(), field.value());
  check(plain, false);
  tls_server.Stop();
  plain_server.Stop();
}

// Plaintext HTTP on the TLS port gets no answer: the connection is closed and counted.
TEST(HttpServerTlsTest, PlaintextOnTheTlsPortIsRefused) {
  REQUIRE_TEST_CERTS();
  HttpServer server;
  server.Route("/healthz", Ok(), HttpServer::Dispatch::kInline);
  ASSERT_TRUE(server.Start("127.0.0.1:0", TlsOptions(certs, false)).ok());
  EXPECT_EQ(Get(server.port(), "/healthz", milliseconds(20'000)).first, 0);
  EXPECT_TRUE(WaitFor([&] { return server.stats().tls_handshake_failures == 1; }));
  EXPECT_TRUE(WaitFor([&] { return server.stats().open_connections == 0; }));
  EXPECT_EQ(server.stats().requests, 0u);
  EXPECT_EQ(server.stats().timed_out, 0u);
  server.Stop();
}

// A client that offers at most TLS 1.1 is refused by the server (the client itself would
// go ahead: it allows TLS 1.0 and 1.1 at security level 0).
TEST(HttpServerTlsTest, OldProtocolsAreRefused) {
  REQUIRE_TEST_CERTS();
  HttpServer server;
  server.Route("/healthz", Ok(), HttpServer::Dispatch::kInline);
  ASSERT_TRUE(server.Start("127.0.0.1:0", TlsOptions(certs, false)).ok());
  TlsClientOptions client;
  client.min_version = TLS1_VERSION;
  for (int max : {TLS1_1_VERSION, TLS1_VERSION}) {
    client.max_version = max;
    HttpsConnection c(server.port(), client);
    EXPECT_FALSE(c.Connect());
    // The server's protocol_version alert, not a client-side refusal to try.
    EXPECT_TRUE(absl::StrContains(c.error(), "protocol version")) << c.error();
  }
  EXPECT_TRUE(WaitFor([&] { return server.stats().tls_handshake_failures == 2; }));
  // The same client allowed TLS 1.2 gets through.
  client.max_version = TLS1_2_VERSION;
  EXPECT_EQ(HttpsGet(server.port(), client, "/healthz").status, 200);
  EXPECT_EQ(server.stats().tls_handshake_failures, 2u);
  server.Stop();
}

// With a client CA: a certificate from it names the peer (first DNS SAN, else CN); none at
// all is allowed; one from another CA, an expired one or a server certificate (no
// clientAuth) fails the handshake. Over TLS 1.3 the client learns of it on its first read.
TEST(HttpServerTlsTest, ClientCertificates) {
  REQUIRE_TEST_CERTS();
  HttpServer server;
  std::atomic<int> handled{0};
  server.Route("/who", [&](const HttpRequest& r) {
    ++handled;
    return Describe(r);
  });
  ASSERT_TRUE(server.Start("127.0.0.1:0", TlsOptions(certs, true)).ok());
  uint64_t failures = 0;
  for (int version : {TLS1_3_VERSION, TLS1_2_VERSION}) {
    SCOPED_TRACE(version == TLS1_3_VERSION ? "TLS 1.3" : "TLS 1.2");
    auto get = [&](const std::string& cert, const std::string& key) {
      TlsClientOptions client;
      client.ca_file = certs.Main("ca.pem");
      client.cert_file = cert;
      client.key_file = key;
      client.max_version = version;
      return HttpsGet(server.port(), client, "/who");
    };
    HttpsResult r = get(certs.Main("agents/agent-1.pem"), certs.Main("agents/agent-1.key"));
    EXPECT_EQ(r.status, 200) << r.error;
    EXPECT_EQ(r.body, "secure=1 peer=agent-1 auth=");
    r = get(certs.Main("clients/alice.pem"), certs.Main("clients/alice.key"));
    EXPECT_EQ(r.body, "secure=1 peer=alice auth=") << r.error;
    r = get(certs.Main("cn-only.pem"), certs.Main("cn-only.key"));
    EXPECT_EQ(r.body, "secure=1 peer=cn-only-client auth=") << r.error;
    r = get("", "");
    EXPECT_EQ(r.status, 200) << r.error;
    EXPECT_EQ(r.body, "secure=1 peer= auth=");
    const int handled_before = handled.load();
    for (const auto& [cert, key] :
         std::vector<std::pair<std::string, std::string>>{
             {certs.Other("clients/mallory.pem"), certs.Other("clients/mallory.key")},
             {certs.Main("expired/old.pem"), certs.Main("expired/old.key")},
             {certs.Main("server.pem"), certs.Main("server.key")}}) {
      r = get(cert, key);
      EXPECT_EQ(r.status, 0) << cert << ": " << r.body;
      ++failures;
      EXPECT_TRUE(WaitFor([&] { return server.stats().tls_handshake_failures == failures; }))
          << cert;
    }
    EXPECT_EQ(handled.load(), handled_before);
  }
  EXPECT_EQ(server.stats().tls_handshake_failures, 6u);
  server.Stop();
}

// A connection that never starts its handshake is closed at the header deadline.
TEST(HttpServerTlsTest, HandshakeDeadline) {
  REQUIRE_TEST_CERTS();
  HttpServer server;
  HttpServerOptions options = TlsOptions(certs, false);
  options.header_timeout = absl::Milliseconds(300);
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  asio::io_context io;
  auto silent = Connect(io, server.port());
  const auto start = Clock::now();
  EXPECT_TRUE(WaitUntilClosed(*silent));
  EXPECT_GE(MsSince(start), 250);
  EXPECT_TRUE(WaitFor([&] { return server.stats().tls_handshake_failures == 1; }));
  EXPECT_EQ(server.stats().timed_out, 1u);
  EXPECT_TRUE(WaitFor([&] { return server.stats().open_connections == 0; }));
  server.Stop();
}

TEST(HttpServerTlsTest, StartFailsOnUnloadableFiles) {
  REQUIRE_TEST_CERTS();
  auto start = [](HttpServerOptions options) {
    HttpServer server;
    return server.Start("127.0.0.1:0", options);
  };
  HttpServerOptions options = TlsOptions(certs, true);
  ASSERT_TRUE(start(options).ok());

  HttpServerOptions o = options;
  o.tls.cert_file = certs.root() + "/missing.pem";
  absl::Status status = start(o);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), "missing.pem")) << status;

  o = options;
  o.tls.key_file = certs.Main("agents/agent-1.key");  // a key, but not the certificate's
  status = start(o);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), "agent-1.key")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "does not match")) << status;

  o = options;
  o.tls.cert_file = certs.Main("server.key");  // not a certificate
  status = start(o);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), "server.key")) << status;

  o = options;
  o.tls.client_ca_file = certs.Main("server.key");  // no certificate in it
  status = start(o);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), "client CA")) << status;

  o = options;
  o.tls.key_file.clear();
  EXPECT_EQ(start(o).code(), absl::StatusCode::kInvalidArgument);
  o = HttpServerOptions();
  o.tls.client_ca_file = certs.Main("ca.pem");  // a CA but no certificate
  EXPECT_EQ(start(o).code(), absl::StatusCode::kInvalidArgument);
}

// Replaces `to` with a copy of `from`, atomically (rename), as a deployment would.
void Replace(const std::string& from, const std::string& to) {
  const std::string tmp = to + ".new";
  fs::copy_file(from, tmp, fs::copy_options::overwrite_existing);
  fs::rename(tmp, to);
}

// New certificate files are picked up by new connections without a restart; connections
// already open keep working. A broken set of files (a key that does not match) keeps the
// previous certificate in use until a good set arrives.
TEST(HttpServerTlsTest, CertificateRotation) {
  REQUIRE_TEST_CERTS();
  // This test's own server certificates, from the same CA: live/ is what the server reads.
  const std::string dir = certs.root() + "/rotation";
  const std::string live = dir + "/live";
  fs::create_directories(live);
  for (const char* f : {"ca.pem", "ca.key"}) {
    fs::copy_file(certs.Main(f), dir + "/" + f, fs::copy_options::overwrite_existing);
  }
  const std::string script = std::string(STRATA_SOURCE_DIR) + "/deploy/gen-certs.sh";
  auto issue = [&](const std::string& name) {  // a new server certificate in dir/name/
    const std::string out = dir + "/" + name;
    fs::create_directories(out);
    for (const char* f : {"ca.pem", "ca.key"}) {
      fs::copy_file(dir + "/" + f, out + "/" + f, fs::copy_options::overwrite_existing);
    }
    return RunShell(script + " --out " + out + " >/dev/null");
  };
  ASSERT_TRUE(issue("first"));
  ASSERT_TRUE(issue("second"));
  ASSERT_TRUE(issue("third"));
  const std::string first = SerialOfFile(dir + "/first/server.pem");
  const std::string second = SerialOfFile(dir + "/second/server.pem");
  const std::string third = SerialOfFile(dir + "/third/server.pem");
  ASSERT_NE(first, second);
  ASSERT_NE(second, third);
  Replace(dir + "/first/server.pem", live + "/server.pem");
  Replace(dir + "/first/server.key", live + "/server.key");

  HttpServer server;
  server.Route("/healthz", Ok(), HttpServer::Dispatch::kInline);
  HttpServerOptions options;
  options.tls.cert_file = live + "/server.pem";
  options.tls.key_file = live + "/server.key";
  options.tls.client_ca_file = dir + "/ca.pem";
  ASSERT_TRUE(server.Start("127.0.0.1:0", options).ok());
  TlsClientOptions client;
  client.ca_file = dir + "/ca.pem";

  // A kept-alive connection from before the rotation.
  HttpsConnection kept(server.port(), client);
  ASSERT_TRUE(kept.Connect()) << kept.error();
  HttpsResult r = kept.Request("/healthz");
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.server_serial, first);

  // The serial of the certificate a new connection is served (after a successful request).
  auto serve_serial = [&]() -> std::string {
    HttpsResult r = HttpsGet(server.port(), client, "/healthz");
    EXPECT_EQ(r.status, 200) << r.error;
    return r.status == 200 ? r.server_serial : "failed: " + r.error;
  };
  // Waits until new connections get `serial`; the files are looked at at most once a second.
  auto wait_for_serial = [&](const std::string& serial) {
    return WaitFor([&] { return serve_serial() == serial; }, milliseconds(30'000));
  };

  // Key first, then the certificate, each renamed into place: the server may look in
  // between, see a key that does not match, and keep the first certificate for a while.
  Replace(dir + "/second/server.key", live + "/server.key");
  Replace(dir + "/second/server.pem", live + "/server.pem");
  ASSERT_TRUE(wait_for_serial(second));
  // The kept-alive connection still works, on the certificate it started with.
  r = kept.Request("/healthz");
  EXPECT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.server_serial, first);

  // A broken set: the third certificate with the second's key. Once the server has
  // certainly looked (a connection accepted over a second after the change), it still
  // serves the second certificate, with every connection in between.
  Replace(dir + "/third/server.pem", live + "/server.pem");
  const auto changed = Clock::now();
  int after_look = 0;
  while (after_look < 3) {
    const bool looked = Clock::now() - changed > milliseconds(1100);
    ASSERT_EQ(serve_serial(), second);
    if (looked) ++after_look;
  }
  // Unreadable garbage instead of the key: the same.
  {
    std::ofstream(live + "/garbage.key") << "not a key\n";
    fs::rename(live + "/garbage.key", live + "/server.key");
  }
  const auto changed_again = Clock::now();
  after_look = 0;
  while (after_look < 3) {
    const bool looked = Clock::now() - changed_again > milliseconds(1100);
    ASSERT_EQ(serve_serial(), second);
    if (looked) ++after_look;
  }
  // The matching key arrives: the third certificate is served.
  Replace(dir + "/third/server.key", live + "/server.key");
  ASSERT_TRUE(wait_for_serial(third));
  r = kept.Request("/healthz");
  EXPECT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(server.stats().tls_handshake_failures, 0u);
  server.Stop();
}

}  // namespace
}  // namespace strata::server::http
