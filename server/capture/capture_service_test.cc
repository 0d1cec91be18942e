#include "server/capture/capture_service.h"

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"

namespace strata::server::capture {
namespace {

TEST(ParseRetentionTest, UnitsAndErrors) {
  EXPECT_EQ(*ParseRetention("7d"), absl::Hours(24 * 7));
  EXPECT_EQ(*ParseRetention("12h"), absl::Hours(12));
  EXPECT_EQ(*ParseRetention("30m"), absl::Minutes(30));
  EXPECT_EQ(*ParseRetention("45s"), absl::Seconds(45));
  EXPECT_EQ(*ParseRetention("500ms"), absl::Milliseconds(500));
  EXPECT_EQ(*ParseRetention("2w"), absl::Hours(24 * 14));
  EXPECT_EQ(*ParseRetention("0"), absl::ZeroDuration());
  for (const char* bad : {"", "d", "-1d", "7 days", "1x", "m5"}) {
    EXPECT_FALSE(ParseRetention(bad).ok()) << bad;
  }
}

class CaptureServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = store::Store::Open(dir_.path(), {});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  void Put(const std::string& id, int64_t start_ms, int64_t end_ms, bool finished) {
    store::WriteBatch wb;
    store::CaptureInfo info;
    info.capture_id = id;
    info.service = "svc";
    info.frequency_hz = 499;
    info.start_ms = start_ms;
    info.end_ms = end_ms;
    info.finished = finished;
    wb.PutCapture(info);
    ASSERT_TRUE(store_->Commit(&wb).ok());
  }
  std::vector<std::string> Listed(CaptureService* service) {
    v1::ListCapturesResponse response;
    EXPECT_TRUE(service->List(nullptr, nullptr, &response).ok());
    std::vector<std::string> ids;
    for (const auto& c : response.captures()) ids.push_back(c.capture_id());
    return ids;
  }

  strata::testing::TempDir dir_;
  std::unique_ptr<store::Store> store_;
  registry::AgentRegistry registry_;
};

TEST_F(CaptureServiceTest, RequestsWithoutAServingAgentFailBeforeStreaming) {
  CaptureService service(store_.get(), &registry_, {});
  v1::RunCaptureRequest request;
  request.set_service("svc");
  request.set_duration_ms(5000);
  // Validation and agent lookup happen before the stream or the context are touched.
  grpc::Status st = service.Run(nullptr, &request, nullptr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(st.error_message().find("no connected agent profiles service 'svc'"),
            std::string::npos)
      << st.error_message();

  request.set_duration_ms(0);
  EXPECT_EQ(service.Run(nullptr, &request, nullptr).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  request.set_duration_ms(5000);
  request.set_frequency_hz(100'000);
  EXPECT_EQ(service.Run(nullptr, &request, nullptr).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::RunCaptureRequest no_target;
  no_target.set_duration_ms(5000);
  EXPECT_EQ(service.Run(nullptr, &no_target, nullptr).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  no_target.set_service(std::string("a\0b", 3));
  EXPECT_EQ(service.Run(nullptr, &no_target, nullptr).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Nothing was stored for refused requests.
  EXPECT_TRUE(store_->meta().ListCaptures()->empty());
}

TEST_F(CaptureServiceTest, RetentionHidesOrDeletesCapturesThatEndedLongAgo) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  const int64_t day = 24 * 3600 * 1000;
  Put("cap-old", now - 10 * day, now - 10 * day + 5000, true);
  Put("cap-new", now - day, now - day + 5000, true);
  CaptureService::Options options;
  options.retention = absl::Hours(24 * 7);
  std::vector<std::string> deleted;
  options.deleter = [&](const std::string& id) {
    deleted.push_back(id);
    return absl::OkStatus();
  };
  CaptureService service(store_.get(), &registry_, options);
  EXPECT_EQ(Listed(&service), std::vector<std::string>{"cap-new"});
  v1::GetCaptureRequest get;
  get.set_capture_id("cap-old");
  v1::CaptureRecord record;
  EXPECT_EQ(service.Get(nullptr, &get, &record).error_code(), grpc::StatusCode::NOT_FOUND);
  get.set_capture_id("cap-new");
  ASSERT_TRUE(service.Get(nullptr, &get, &record).ok());
  EXPECT_EQ(record.frequency_hz(), 499u);
  get.set_capture_id("cap-none");
  EXPECT_EQ(service.Get(nullptr, &get, &record).error_code(), grpc::StatusCode::NOT_FOUND);

  auto swept = service.Sweep(now);
  ASSERT_TRUE(swept.ok());
  EXPECT_EQ(*swept, 1);
  EXPECT_EQ(deleted, std::vector<std::string>{"cap-old"});
}

TEST_F(CaptureServiceTest, StartMarksCapturesOfAPreviousProcessAsInterrupted) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  Put("cap-running", now - 60'000, 0, false);
  {
    CaptureService service(store_.get(), &registry_, {});
    service.Start();
    v1::GetCaptureRequest get;
    get.set_capture_id("cap-running");
    v1::CaptureRecord record;
    ASSERT_TRUE(service.Get(nullptr, &get, &record).ok());
    EXPECT_TRUE(record.finished());
    EXPECT_NE(record.error().find("interrupted"), std::string::npos);
    EXPECT_GE(record.end_ms(), now);
  }  // the sweeper thread stops with the service
}

}  // namespace
}  // namespace strata::server::capture
