// The Regressions service over a real store: verdicts kept across a restart, listed, exported
// to Prometheus, and POSTed to a webhook listening on loopback; bad webhook URLs refused; a
// cluster's copies of release records sent until confirmed, kept, and taken over.
#include "server/regress/regressions_service.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::server::regress {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

// Label sets that change between checks, and a comparison that finds "slow" releases
// regressed in function "hot".
struct Scripted {
  std::vector<labels::LabelSet> sets = {{{"version", "1"}}};
  ReleaseWatcherInputs Inputs() {
    ReleaseWatcherInputs in;
    in.services = []() -> absl::StatusOr<std::vector<std::string>> {
      return std::vector<std::string>{"checkout"};
    };
    in.label_values = [this](const std::string&)
        -> absl::StatusOr<std::map<std::string, std::vector<std::string>>> {
      std::map<std::string, std::vector<std::string>> values;
      for (const labels::LabelSet& set : sets) {
        for (const auto& [key, value] : set) values[key].push_back(value);
      }
      return values;
    };
    in.compare = [](const ComparisonPlan& plan) -> absl::StatusOr<v1::ReleaseVerdict> {
      v1::ReleaseVerdict v;
      if (plan.candidate_selector.ends_with("slow")) {
        v.set_state(v1::ReleaseVerdict::REGRESSED);
        v1::ReleaseFunctionChange* f = v.add_functions();
        f->set_name("parse \"request\"");
        f->set_delta(6.0);
      } else if (plan.candidate_selector.ends_with("fast")) {
        v.set_state(v1::ReleaseVerdict::IMPROVED);
      } else {
        v.set_state(v1::ReleaseVerdict::UNCHANGED);
      }
      return v;
    };
    if (!running.empty()) {
      in.running = [this](const std::string&, const std::string&, int64_t, int64_t)
          -> absl::StatusOr<std::vector<std::string>> { return running; };
    }
    return in;
  }
  std::vector<std::string> running;  // values with samples at each check (empty: not asked)
};

// One HTTP exchange on loopback: the request's body, answered with `status`; over TLS with
// the certificate chain and key of `tls` when given. Gives up after 20 s, so a test that never
// posts fails instead of hanging.
struct TlsFiles {
  std::string cert, key;
};
class WebhookReceiver {
 public:
  explicit WebhookReceiver(int status, const TlsFiles* tls = nullptr)
      : acceptor_(io_, {boost::asio::ip::make_address("127.0.0.1"), 0}), socket_(io_) {
    if (tls != nullptr) {
      tls_.emplace(boost::asio::ssl::context::tls_server);
      tls_->use_certificate_chain_file(tls->cert);
      tls_->use_private_key_file(tls->key, boost::asio::ssl::context::pem);
    }
    acceptor_.async_accept(socket_, [this, status](boost::system::error_code ec) {
      if (ec) return;
      if (!tls_) return Serve(socket_, status);
      tls_stream_.emplace(socket_, *tls_);
      tls_stream_->async_handshake(boost::asio::ssl::stream_base::server,
                                   [this, status](boost::system::error_code ec) {
                                     if (!ec) Serve(*tls_stream_, status);
                                   });
    });
    thread_ = std::thread([this] { io_.run_for(std::chrono::seconds(20)); });
  }
  ~WebhookReceiver() { Wait(); }
  std::string Url() const {
    return std::string(tls_ ? "https" : "http") + "://127.0.0.1:" +
           std::to_string(acceptor_.local_endpoint().port()) + "/hook";
  }
  // After the exchange (or the 20 s).
  const boost::beast::http::request<boost::beast::http::string_body>& Request() {
    Wait();
    return request_;
  }

 private:
  template <typename Stream>
  void Serve(Stream& stream, int status) {
    namespace http = boost::beast::http;
    http::async_read(stream, buffer_, request_,
                     [this, &stream, status](boost::system::error_code ec, size_t) {
                       if (ec) return;
                       response_ = {static_cast<http::status>(status), 11};
                       response_.prepare_payload();
                       http::async_write(stream, response_,
                                         [](boost::system::error_code, size_t) {});
                     });
  }
  void Wait() {
    if (thread_.joinable()) thread_.join();
  }
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::ip::tcp::socket socket_;
  std::optional<boost::asio::ssl::context> tls_;
  std::optional<boost::beast::ssl_stream<boost::asio::ip::tcp::socket&>> tls_stream_;
  boost::beast::flat_buffer buffer_;
  boost::beast::http::request<boost::beast::http::string_body> request_;
  boost::beast::http::response<boost::beast::http::string_body> response_;
  std::thread thread_;
};

class RegressionsServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { OpenStore(); }
  void OpenStore() {
    store_.reset();
    auto store = store::Store::Open(dir_.path(), store::StoreOptions{});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  std::unique_ptr<RegressionsService> Make(RegressionsOptions options = {}) {
    auto service = RegressionsService::Create(options, scripted_.Inputs(), store_.get(), nullptr);
    EXPECT_TRUE(service.ok()) << service.status();
    return service.ok() ? std::move(*service) : nullptr;
  }
  // A service posting to `receiver` that met version 1, then found the slower version 2.
  std::unique_ptr<RegressionsService> SlowerReleaseFound(const WebhookReceiver& receiver) {
    RegressionsOptions options;
    options.webhook_url = receiver.Url();
    std::unique_ptr<RegressionsService> service = Make(options);
    if (service == nullptr) return nullptr;
    EXPECT_TRUE(service->CheckNow().ok());
    scripted_.sets.push_back({{"version", "2-slow"}});
    EXPECT_TRUE(service->CheckNow().ok());
    return service;
  }
  testing::TempDir dir_;
  std::unique_ptr<store::Store> store_;
  Scripted scripted_;
};

TEST_F(RegressionsServiceTest, VerdictsAreListedExportedPostedAndKeptAcrossARestart) {
  WebhookReceiver receiver(204);
  {
    std::unique_ptr<RegressionsService> service = SlowerReleaseFound(receiver);
    ASSERT_NE(service, nullptr);
    const auto& request = receiver.Request();
    const std::string body = request.body();
    EXPECT_EQ(request[boost::beast::http::field::content_type], "application/json");
    EXPECT_THAT(body, HasSubstr("\"state\":\"REGRESSED\""));
    EXPECT_THAT(body, HasSubstr("\"candidate\":\"2-slow\""));
    EXPECT_THAT(body, HasSubstr("\"baseline\":\"1\""));

    const std::string metrics = service->RenderMetrics();
    EXPECT_THAT(metrics, HasSubstr("strata_regression_detected{service=\"checkout\","
                                   "function=\"parse \\\"request\\\"\",candidate=\"2-slow\","
                                   "kind=\"release\"} 1"));
    EXPECT_THAT(metrics, HasSubstr("strata_regression_webhook_posts_total 1"));
    EXPECT_THAT(metrics, HasSubstr("strata_regression_webhook_failures_total 0"));
  }
  OpenStore();
  std::unique_ptr<RegressionsService> restarted = Make();
  ASSERT_NE(restarted, nullptr);
  v1::ListRegressionsRequest request;
  request.set_service("checkout");
  auto list = restarted->RunList(request);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_THAT(list->verdicts(), SizeIs(1));
  EXPECT_EQ(list->verdicts(0).state(), v1::ReleaseVerdict::REGRESSED);
  EXPECT_EQ(list->verdicts(0).functions(0).name(), "parse \"request\"");
  request.set_service("other");
  EXPECT_THAT(restarted->RunList(request)->verdicts(), SizeIs(0));
  request.set_since_ms(-1);
  EXPECT_TRUE(absl::IsInvalidArgument(restarted->RunList(request).status()));

  // A newer release no faster than the slow one carries its regression on; one that is
  // faster ends it.
  scripted_.sets.push_back({{"version", "3"}});
  ASSERT_TRUE(restarted->CheckNow().ok());
  EXPECT_THAT(restarted->RenderMetrics(),
              HasSubstr("strata_regression_detected{service=\"checkout\","
                        "function=\"parse \\\"request\\\"\",candidate=\"2-slow\""));
  scripted_.sets.push_back({{"version", "4-fast"}});
  ASSERT_TRUE(restarted->CheckNow().ok());
  EXPECT_THAT(restarted->RenderMetrics(), Not(HasSubstr("strata_regression_detected{")));
}

TEST_F(RegressionsServiceTest, ARollbackBeforeTheSlowReleaseEndsItsAlert) {
  scripted_.running = {"1"};
  std::unique_ptr<RegressionsService> service = Make();
  ASSERT_NE(service, nullptr);
  ASSERT_TRUE(service->CheckNow().ok());
  scripted_.sets.push_back({{"version", "2-slow"}});
  scripted_.running = {"1", "2-slow"};
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_TRUE(service->CheckNow().ok());
  EXPECT_THAT(service->RenderMetrics(), HasSubstr("candidate=\"2-slow\""));
  scripted_.running = {"1"};  // rolled back
  // Checks a minute apart in life: here at least the clock's next millisecond.
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_TRUE(service->CheckNow().ok());
  EXPECT_THAT(service->RenderMetrics(), Not(HasSubstr("strata_regression_detected{")));
}

TEST_F(RegressionsServiceTest, AWebhookThatFailsIsCountedAndTheVerdictKept) {
  WebhookReceiver receiver(500);
  std::unique_ptr<RegressionsService> service = SlowerReleaseFound(receiver);
  ASSERT_NE(service, nullptr);
  EXPECT_FALSE(receiver.Request().body().empty());
  EXPECT_THAT(service->RenderMetrics(), HasSubstr("strata_regression_webhook_failures_total 1"));
  EXPECT_THAT(service->RunList({})->verdicts(), SizeIs(1));
}

TEST_F(RegressionsServiceTest, BadWebhookUrlsAreRefused) {
  for (const char* url : {"ftp://x", "http://", "https://", "http://h:0/", "http://h:99999/",
                          "http://h:port/"}) {
    RegressionsOptions options;
    options.webhook_url = url;
    auto service = RegressionsService::Create(options, scripted_.Inputs(), store_.get(), nullptr);
    EXPECT_TRUE(absl::IsInvalidArgument(service.status())) << url;
  }
  auto ok = ParseWebhookUrl("http://alerts.internal:9093/api/strata?x=1");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->host, "alerts.internal");
  EXPECT_EQ(ok->port, "9093");
  EXPECT_EQ(ok->target, "/api/strata?x=1");
  EXPECT_FALSE(ok->tls);
  auto secure = ParseWebhookUrl("https://hooks.example");
  ASSERT_TRUE(secure.ok());
  EXPECT_TRUE(secure->tls);
  EXPECT_EQ(secure->port, "443");
  EXPECT_EQ(secure->target, "/");
  // Nobody listening: Unavailable, promptly.
  auto closed = ParseWebhookUrl("http://127.0.0.1:1/");
  ASSERT_TRUE(closed.ok());
  EXPECT_TRUE(absl::IsUnavailable(PostJson(*closed, "{}", absl::Seconds(5))));
}

// An https webhook: the server's certificate checked against the CA file given, refused when
// the system's CAs do not know it.
TEST_F(RegressionsServiceTest, HttpsWebhooksAreVerified) {
  const std::string certs = dir_.path() + "/certs";
  ASSERT_EQ(std::system((std::string(STRATA_SOURCE_DIR) + "/deploy/gen-certs.sh --out " + certs +
                         " >/dev/null")
                            .c_str()),
            0);
  const TlsFiles tls{certs + "/server.pem", certs + "/server.key"};
  {
    WebhookReceiver receiver(200, &tls);
    auto url = ParseWebhookUrl(receiver.Url());
    ASSERT_TRUE(url.ok()) << url.status();
    absl::Status posted = PostJson(*url, R"({"state":"REGRESSED"})", absl::Seconds(10),
                                   certs + "/ca.pem");
    EXPECT_TRUE(posted.ok()) << posted;
    EXPECT_EQ(receiver.Request().body(), R"({"state":"REGRESSED"})");
  }
  {
    WebhookReceiver receiver(200, &tls);
    auto url = ParseWebhookUrl(receiver.Url());
    ASSERT_TRUE(url.ok());
    absl::Status untrusted = PostJson(*url, "{}", absl::Seconds(10));
    EXPECT_TRUE(absl::IsUnavailable(untrusted)) << untrusted;
    EXPECT_TRUE(receiver.Request().body().empty());
  }
  auto url = ParseWebhookUrl("https://127.0.0.1:1/");
  ASSERT_TRUE(url.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      PostJson(*url, "{}", absl::Seconds(5), certs + "/no-such-ca.pem")));
  RegressionsOptions options;
  options.webhook_url = "https://127.0.0.1:1/";
  options.webhook_ca_file = certs + "/no-such-ca.pem";
  EXPECT_TRUE(absl::IsInvalidArgument(
      RegressionsService::Create(options, scripted_.Inputs(), store_.get(), nullptr).status()));
}


// The checking node sends each other node the records it has not confirmed: everything at
// first, then what changed; a node that refused them gets them after the next check. The
// node that keeps them lists them and stores them (they survive its restart).
TEST_F(RegressionsServiceTest, ReleaseRecordsAreCopiedUntilEachNodeConfirmedThem) {
  testing::TempDir other_dir;
  auto other_store = store::Store::Open(other_dir.path(), store::StoreOptions{});
  ASSERT_TRUE(other_store.ok()) << other_store.status();
  Scripted other_scripted;
  auto other = RegressionsService::Create({}, other_scripted.Inputs(), other_store->get(),
                                          nullptr);
  ASSERT_TRUE(other.ok()) << other.status();

  std::map<std::string, std::vector<size_t>> sent;  // by node: records per call
  bool n3_up = false;
  RegressionsOptions options;
  options.other_nodes = [] { return std::vector<std::string>{"n2", "n3"}; };
  options.copy_to = [&](const std::string& node,
                        const std::vector<v1::ReleaseVerdict>& r) -> absl::Status {
    sent[node].push_back(r.size());
    if (node == "n3" && !n3_up) return absl::UnavailableError("n3 down");
    if (node == "n3") return absl::OkStatus();
    return (*other)->Keep(r).status();
  };
  std::unique_ptr<RegressionsService> checker = Make(options);
  ASSERT_NE(checker, nullptr);
  ASSERT_TRUE(checker->CheckNow().ok());  // version 1, met with the service
  scripted_.sets.push_back({{"version", "2-slow"}});
  ASSERT_TRUE(checker->CheckNow().ok());  // version 2 compared
  EXPECT_THAT(sent["n2"], ::testing::ElementsAre(1, 1));
  EXPECT_THAT(sent["n3"], ::testing::ElementsAre(1, 2));  // refused: all again
  n3_up = true;
  ASSERT_TRUE(checker->CheckNow().ok());  // version 2 compared again: changed
  EXPECT_THAT(sent["n2"], ::testing::ElementsAre(1, 1, 1));
  EXPECT_THAT(sent["n3"], ::testing::ElementsAre(1, 2, 2));
  const std::string metrics = checker->RenderMetrics();
  EXPECT_THAT(metrics, HasSubstr("strata_regression_copies_sent_total 5\n"));
  EXPECT_THAT(metrics, HasSubstr("strata_regression_copy_failures_total 2\n"));

  v1::ListRegressionsRequest request;
  auto listed = (*other)->RunList(request);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_THAT(listed->verdicts(), SizeIs(1));
  EXPECT_EQ(listed->verdicts(0).state(), v1::ReleaseVerdict::REGRESSED);
  EXPECT_EQ(listed->verdicts(0).comparisons(), 2u);
  EXPECT_EQ(listed->verdicts(0).SerializeAsString(),
            checker->RunList(request)->verdicts(0).SerializeAsString());
  auto stored = (*other_store)->meta().ListReleases();
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_THAT(*stored, SizeIs(2));
  // A single server (no other nodes) renders no copy counters.
  EXPECT_THAT(Make()->RenderMetrics(), Not(HasSubstr("copies")));
}

// A node that becomes the checking one first keeps the other nodes' release records (in case
// it missed copies), then checks on from there: the release the node before compared is not
// met anew, and the next one is compared with it.
TEST_F(RegressionsServiceTest, ANodeThatTakesOverChecksOnFromTheVerdictsTheOthersList) {
  v1::ReleaseVerdict met;  // with the service, not compared
  met.set_service("checkout");
  met.set_label("version");
  met.set_candidate("1");
  met.set_first_seen_ms(base::NowMs() - 120'000);
  met.set_final(true);
  v1::ReleaseVerdict elsewhere;
  elsewhere.set_service("checkout");
  elsewhere.set_label("version");
  elsewhere.set_baseline("1");
  elsewhere.set_candidate("2-slow");
  elsewhere.set_first_seen_ms(base::NowMs() - 60'000);
  elsewhere.set_updated_ms(base::NowMs() - 1'000);
  elsewhere.set_comparisons(7);
  elsewhere.set_state(v1::ReleaseVerdict::REGRESSED);
  std::atomic<bool> checking{false};
  std::atomic<int> lists{0};
  RegressionsOptions options;
  options.check_interval = absl::Milliseconds(20);
  options.should_check = [&] { return checking.load(); };
  options.records_elsewhere = [&](std::vector<std::string>*) {
    ++lists;
    return std::vector<v1::ReleaseVerdict>{met, elsewhere};
  };
  scripted_.sets = {{{"version", "1"}}, {{"version", "2-slow"}}, {{"version", "3"}}};
  std::unique_ptr<RegressionsService> service = Make(options);
  ASSERT_NE(service, nullptr);
  service->Start();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(lists.load(), 0);  // not checking: not catching up
  checking = true;
  v1::ListRegressionsRequest request;
  auto compared_3 = [&] {
    auto listed = service->RunList(request);
    return listed.ok() && listed->verdicts_size() == 2;
  };
  for (int i = 0; i < 200 && !compared_3(); ++i) absl::SleepFor(absl::Milliseconds(20));
  service->Stop();
  auto listed = service->RunList(request);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_THAT(listed->verdicts(), SizeIs(2));
  // Versions 1 and 2-slow known: 3 was the new one, compared with 2-slow.
  EXPECT_EQ(listed->verdicts(0).candidate(), "3");
  EXPECT_EQ(listed->verdicts(0).baseline(), "2-slow");
  EXPECT_EQ(listed->verdicts(1).candidate(), "2-slow");
  EXPECT_GT(listed->verdicts(1).comparisons(), 7u);
  EXPECT_EQ(lists.load(), 1);  // once: every node answered
}

}  // namespace
}  // namespace strata::server::regress
