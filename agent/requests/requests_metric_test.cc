#include "agent/requests/requests_metric.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace strata::agent::requests {
namespace {

// An HTTP server on loopback answering every GET with the current response.
class ExpositionServer {
 public:
  ExpositionServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    socklen_t size = sizeof(address);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size);
    port_ = ntohs(address.sin_port);
    EXPECT_EQ(listen(fd_, 8), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ExpositionServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }

  // The body of a 200 response.
  void SetBody(const std::string& body) {
    SetResponse("HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\r\n" + body);
  }
  void SetResponse(const std::string& response) {
    absl::MutexLock lock(&mu_);
    response_ = response;
  }
  // Accept connections but never answer them.
  void SetSilent(bool silent) { silent_ = silent; }
  MetricSource Source(const std::string& name) const {
    MetricSource source;
    source.host = "127.0.0.1";
    source.port = port_;
    source.path = "/metrics";
    source.name = name;
    return source;
  }
  std::string last_request() {
    absl::MutexLock lock(&mu_);
    return last_request_;
  }

 private:
  void Serve() {
    while (!stop_) {
      const int client = accept(fd_, nullptr, nullptr);
      if (client < 0) continue;
      std::string request;
      char buffer[1024];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = read(client, buffer, sizeof(buffer));
        if (n <= 0) break;
        request.append(buffer, static_cast<size_t>(n));
      }
      std::string response;
      {
        absl::MutexLock lock(&mu_);
        last_request_ = request;
        response = response_;
      }
      if (silent_) {
        // Hold the connection past the client's timeout.
        absl::SleepFor(absl::Milliseconds(400));
      } else {
        (void)!write(client, response.data(), response.size());
      }
      close(client);
    }
  }

  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false}, silent_{false};
  absl::Mutex mu_;
  std::string response_, last_request_;
  std::thread thread_;
};

constexpr char kExposition[] = R"(# HELP http_requests_total Requests served.
# TYPE http_requests_total counter
http_requests_total{code="200",path="/a"} 100
http_requests_total{code="200",path="/b"} 20.5 1700000000000
http_requests_total{code="500",path="/a\"q\\"} 7
http_requests_total 1
other_total{code="200"} 1e3

process_cpu_seconds_total 12.25
)";

TEST(RequestsMetricTest, FlagsParse) {
  auto s = ParseMetricSource("http://127.0.0.1:9100/metrics#http_requests_total");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->service, "");
  EXPECT_EQ(s->host, "127.0.0.1");
  EXPECT_EQ(s->port, 9100);
  EXPECT_EQ(s->path, "/metrics");
  EXPECT_EQ(s->name, "http_requests_total");
  EXPECT_TRUE(s->matchers.empty());

  s = ParseMetricSource(R"(api=http://[::1]:8080/m?x=1#reqs{code="200",path="/a"})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->service, "api");
  EXPECT_EQ(s->host, "::1");
  EXPECT_EQ(s->path, "/m?x=1");
  EXPECT_EQ(s->matchers.size(), 2u);
  EXPECT_EQ(s->matchers[1].second, "/a");

  s = ParseMetricSource("http://metrics.local#reqs");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->port, 80);
  EXPECT_EQ(s->path, "/");

  for (const char* bad :
       {"127.0.0.1:9100/metrics#x", "https://h/m#x", "http://h/m", "http://h/m#", "http://:80/m#x",
        "http://h:0/m#x", "http://h:99999/m#x", "http://h/m#x{code=200}", "http://h/m#x{a=\"b\"} z",
        "=http://h/m#x", "http://h/m#9x"}) {
    EXPECT_FALSE(ParseMetricSource(bad).ok()) << bad;
  }
}

// A count without SERVICE= goes to the batch's one service; with several (another process
// with STRATA_SERVICE set showed up) it cannot be told apart.
TEST(RequestsMetricTest, ACountGoesToItsServiceOrTheBatchsOneService) {
  MetricSource source;
  EXPECT_EQ(ServiceOfCount(source, {"cmp", "cmp"}), "cmp");
  EXPECT_EQ(ServiceOfCount(source, {"cmp", "faults", "cmp"}), "");
  EXPECT_EQ(ServiceOfCount(source, {}), "");
  source.service = "cmp";
  EXPECT_EQ(ServiceOfCount(source, {"faults", "demo"}), "cmp");
}

TEST(RequestsMetricTest, SumsTheMatchingSeries) {
  MetricSource source;
  source.name = "http_requests_total";
  EXPECT_DOUBLE_EQ(*SumCounter(kExposition, source), 128.5);
  source.matchers = {{"code", "200"}};
  EXPECT_DOUBLE_EQ(*SumCounter(kExposition, source), 120.5);
  source.matchers = {{"path", "/a\"q\\"}};
  EXPECT_DOUBLE_EQ(*SumCounter(kExposition, source), 7);
  source.matchers = {{"code", ""}};  // series without the label
  EXPECT_DOUBLE_EQ(*SumCounter(kExposition, source), 1);
  source.matchers = {{"code", "404"}};
  EXPECT_EQ(SumCounter(kExposition, source).status().code(), absl::StatusCode::kNotFound);
  source.matchers.clear();
  source.name = "other_total";
  EXPECT_DOUBLE_EQ(*SumCounter(kExposition, source), 1000);
}

TEST(RequestsMetricTest, MalformedExpositionsAreErrorsWithTheLine) {
  MetricSource source;
  source.name = "reqs";
  for (const char* bad : {"reqs", "reqs{code=\"200\" 5", "reqs{code=200} 5", "reqs 5 6 7",
                          "reqs five", "reqs{code=\"a\\x\"} 1", "reqs 1 12.5", "9reqs 1",
                          "reqs{\"code\"=\"1\"} 1", "reqs{code=\"1\"}1", "reqs inf",
                          "reqs -1", "reqs NaN", "reqs +Inf", "reqs 1\r"}) {
    auto sum = SumCounter(std::string("# TYPE reqs counter\n") + bad + "\n", source);
    ASSERT_FALSE(sum.ok()) << bad;
    EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(sum.status().message().find("line 2"), absl::string_view::npos)
        << bad << ": " << sum.status();
  }
  // Other metrics' special values are fine.
  EXPECT_TRUE(SumCounter("temp NaN\ntemp2 -Inf\nreqs 3\n", source).ok());
  // Anything at all: an error, never a crash.
  std::string noise;
  for (int i = 0; i < 2000; ++i) noise.push_back(static_cast<char>((i * 7919) % 251));
  EXPECT_FALSE(SumCounter(noise, source).ok());
}

TEST(RequestsMetricTest, CounterResetsCountTheNewValue) {
  CounterDelta delta;
  EXPECT_EQ(delta.Add(100), std::nullopt);
  EXPECT_EQ(delta.Add(150), 50u);
  EXPECT_EQ(delta.Add(150), 0u);
  EXPECT_EQ(delta.Add(7), 7u);  // the process restarted
  EXPECT_EQ(delta.Add(10.4), 3u);
  EXPECT_EQ(delta.resets(), 1u);
}

TEST(RequestsMetricTest, ScrapesARealServer) {
  ExpositionServer server;
  auto scraper =
      RequestsScraper::ForTesting(server.Source("http_requests_total"), absl::Seconds(2));
  server.SetBody(kExposition);
  scraper->ScrapeOnce();  // the baseline: 128.5
  EXPECT_EQ(scraper->TakeRequests(), 0u);
  EXPECT_NE(server.last_request().find("GET /metrics HTTP/1.0\r\n"), std::string::npos);

  server.SetBody("http_requests_total{code=\"200\"} 200.5\nhttp_requests_total 8\n");
  scraper->ScrapeOnce();
  server.SetBody("http_requests_total{code=\"200\"} 210.5\nhttp_requests_total 8\n");
  scraper->ScrapeOnce();
  EXPECT_EQ(scraper->TakeRequests(), 90u);  // 208.5 - 128.5, then 10
  EXPECT_EQ(scraper->TakeRequests(), 0u);

  // Failures count nothing: a 500, a malformed body, a missing series.
  server.SetResponse("HTTP/1.0 500 Internal Server Error\r\n\r\noops");
  scraper->ScrapeOnce();
  server.SetBody("http_requests_total{code=200} 1\n");
  scraper->ScrapeOnce();
  server.SetBody("other 1\n");
  scraper->ScrapeOnce();
  EXPECT_EQ(scraper->TakeRequests(), 0u);
  EXPECT_EQ(scraper->stats().failures, 3u);

  // A restarted process: the counter starts again.
  server.SetBody("http_requests_total 5\n");
  scraper->ScrapeOnce();
  EXPECT_EQ(scraper->TakeRequests(), 5u);
  EXPECT_EQ(scraper->stats().resets, 1u);
  EXPECT_EQ(scraper->stats().scrapes, 4u);

  // A Content-Length shorter than what came: the body is cut there.
  server.SetResponse(
      "HTTP/1.1 200 OK\r\nContent-Length: 23\r\n\r\nhttp_requests_total 25\ntrailing junk");
  scraper->ScrapeOnce();
  EXPECT_EQ(scraper->TakeRequests(), 20u);
}

TEST(RequestsMetricTest, TimeoutsAndClosedPortsFail) {
  ExpositionServer server;
  server.SetSilent(true);
  const absl::Time start = absl::Now();
  auto body = FetchExposition(server.Source("x"), absl::Milliseconds(150));
  EXPECT_EQ(body.status().code(), absl::StatusCode::kDeadlineExceeded) << body.status();
  // Ends at its deadline, not at some later one (slack for a loaded machine or an emulator).
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));

  MetricSource closed = server.Source("x");
  {
    ExpositionServer gone;
    closed.port = gone.Source("x").port;
  }
  EXPECT_FALSE(FetchExposition(closed, absl::Seconds(1)).ok());
}

TEST(RequestsMetricTest, TheThreadScrapesOnItsOwn) {
  ExpositionServer server;
  server.SetBody("reqs 1\n");
  RequestsScraper scraper(server.Source("reqs"), absl::Milliseconds(50), absl::Seconds(1));
  for (int i = 0; i < 200 && scraper.stats().scrapes == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  server.SetBody("reqs 11\n");
  uint64_t requests = 0;
  for (int i = 0; i < 200 && requests == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    requests += scraper.TakeRequests();
  }
  EXPECT_EQ(requests, 10u);
}

}  // namespace
}  // namespace strata::agent::requests
