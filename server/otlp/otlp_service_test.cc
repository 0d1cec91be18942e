#include "server/otlp/otlp_service.h"

#include <cstdint>
#include <memory>

#include "common/base/clock.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/otlp/otlp_builder.h"
#include "server/query/profile.h"

namespace strata::server::otlp {
namespace {

using strata::testing::TempDir;

class OtlpServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = store::Store::Open(dir_.path(), {});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    service_ = std::make_unique<OtlpService>(store_.get(), OtlpService::Options{});
  }

  // Two hosts of service "api", 3 + 4 samples of main -> handle.
  RequestBuilder::Request TwoHosts() {
    RequestBuilder b;
    const int32_t bin = b.Mapping("/usr/bin/api");
    const int32_t stack = b.Stack({b.Location(bin, 0, {{"handle", "h.go"}}, "go"),
                                   b.Location(bin, 0, {{"main", "m.go"}}, "go")});
    const uint64_t now_ns = static_cast<uint64_t>(base::NowMs()) * 1'000'000;
    for (const char* host : {"host-1", "host-2"}) {
      auto* r = b.AddResource({{"service.name", "api"}, {"host.name", host}});
      auto* p = b.AddProfile(r, "samples", "count", now_ns);
      b.AddSample(p, stack, {}, host[5] == '1' ? 3 : 4);
    }
    return b.Take();
  }

  static query::ProfileQuery AllTime(const std::string& service, const std::string& host = "") {
    query::ProfileQuery q;
    q.service = service;
    q.to_ms = INT64_MAX;
    q.host = host;
    return q;
  }

  // Samples of `service` over all time; 0 for a service the store does not know.
  uint64_t Total(const std::string& service) {
    query::ProfileReader reader(store_.get());
    auto p = reader.Load(AllTime(service));
    EXPECT_TRUE(p.ok() || absl::IsNotFound(p.status())) << p.status();
    return p.ok() ? p->total : 0;
  }

  TempDir dir_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<OtlpService> service_;
};

TEST_F(OtlpServiceTest, StoresSamplesOnceAcrossRetries) {
  const auto request = TwoHosts();
  ASSERT_TRUE(service_->Apply(request, "").ok());
  EXPECT_EQ(Total("api"), 7u);
  // The sender did not get the answer and sends the same request again.
  ASSERT_TRUE(service_->Apply(request, "").ok());
  EXPECT_EQ(Total("api"), 7u);
  EXPECT_EQ(service_->metrics().duplicate_commits.load(), 2u);
  query::ProfileReader reader(store_.get());
  auto p = reader.Load(AllTime("api", "host-2"));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->stacks.size(), 1u);
  EXPECT_EQ(p->stacks[0].count, 4u);
  ASSERT_EQ(p->stacks[0].frames.size(), 2u);
  EXPECT_EQ(p->functions[p->stacks[0].frames[0]].name, "main");
  EXPECT_EQ(p->functions[p->stacks[0].frames[1]].name, "handle");
}

TEST_F(OtlpServiceTest, RetriesBeyondTheBoundAreStoredAgain) {
  OtlpService::Options options;
  options.dedup_window = absl::ZeroDuration();
  service_ = std::make_unique<OtlpService>(store_.get(), options);
  const auto request = TwoHosts();
  ASSERT_TRUE(service_->Apply(request, "").ok());
  absl::SleepFor(absl::Milliseconds(2));
  ASSERT_TRUE(service_->Apply(request, "").ok());
  EXPECT_EQ(Total("api"), 14u);
}

TEST_F(OtlpServiceTest, RefusedRequestStoresNothing) {
  auto request = TwoHosts();
  // The second resource's sample points outside the stack table: the first one, valid, is
  // not stored either.
  request.mutable_resource_profiles(1)->mutable_scope_profiles(0)->mutable_profiles(0)
      ->mutable_samples(0)->set_stack_index(77);
  absl::Status s = service_->Apply(request, "");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(Total("api"), 0u);
  auto services = query::ListServices(store_.get(), nullptr);
  ASSERT_TRUE(services.ok());
  EXPECT_TRUE(services->empty());
  // A certificate of host-1 may not write host-2's samples.
  s = service_->Apply(TwoHosts(), "host-1");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_EQ(Total("api"), 0u);
}

}  // namespace
}  // namespace strata::server::otlp
