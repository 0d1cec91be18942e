#include "server/grafana/querier.h"

#include <google/protobuf/util/json_util.h>

#include <cstdint>
#include <limits>

#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "server/registry/agent_registry.h"

namespace strata::server::grafana {
namespace {

constexpr int64_t kWindow = 1'700'000'000'000;  // a commit window's start
constexpr char kCpu[] = "process_cpu:samples:count:cpu:nanoseconds";

TEST(LabelSelectorTest, PyroscopeSelectorsBecomeStrataSelectors) {
  auto s = ParseLabelSelector(
      R"({service_name="api", version="2", region=~"eu-.*", canary!="true", zone!~"a\\.b"})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->service, "api");
  EXPECT_EQ(s->selector, "version=2,region=eu-*,canary!=true,zone!=a.b");
  EXPECT_EQ(ParseLabelSelector("{}")->selector, "");
  EXPECT_EQ(ParseLabelSelector("")->service, "");
  EXPECT_EQ(ParseLabelSelector(R"({ service_name = "a b" })")->service, "a b");
  for (const char* bad : {R"({service_name=~"a.*"})", R"({version=~"1|2"})", R"({version="1,2"})",
                          R"({version=1})", R"({version="1")", R"({="1"})", R"({version>"1"})",
                          R"({version="1" region="eu"})"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseLabelSelector(bad).status())) << bad;
  }
}

TEST(ProfileTypeTest, IdsNameStrataTypes) {
  EXPECT_EQ(*ProfileTypeOf(kCpu), v1::PROFILE_CPU);
  EXPECT_EQ(*ProfileTypeOf("off_cpu:samples:count:off_cpu:nanoseconds"), v1::PROFILE_OFF_CPU);
  EXPECT_EQ(*ProfileTypeOf("wall:samples:count:wall:nanoseconds"), v1::PROFILE_WALL);
  auto unknown = ProfileTypeOf("memory:alloc_space:bytes:space:bytes");
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_NE(unknown.status().message().find(kCpu), std::string::npos) << unknown.status();
}

TEST(FlameGraphTest, LevelsAreFlamebearers) {
  // total 10: main (self 1) -> a 6 (self 6), b 3 (self 1) -> c 2
  v1::FlameGraphResponse tree;
  for (const char* f : {"all", "main", "a", "b", "c"}) tree.add_functions()->set_function(f);
  auto node = [&](uint32_t function, uint32_t parent, uint64_t total, uint64_t self) {
    v1::FlameNode* n = tree.add_nodes();
    n->set_function(function);
    n->set_parent(parent);
    n->set_total(total);
    n->set_self(self);
  };
  node(0, 0, 10, 0);
  node(1, 0, 10, 1);
  node(2, 1, 6, 6);
  node(3, 1, 3, 1);
  node(4, 3, 2, 2);
  querier::v1::FlameGraph fg = ToFlameGraph(tree);
  EXPECT_EQ(fg.total(), 10);
  EXPECT_EQ(fg.max_self(), 6);
  ASSERT_EQ(fg.names_size(), 5);
  EXPECT_EQ(fg.names(0), "total");
  ASSERT_EQ(fg.levels_size(), 4);
  auto values = [&](int level) {
    return std::vector<int64_t>(fg.levels(level).values().begin(), fg.levels(level).values().end());
  };
  EXPECT_EQ(values(0), (std::vector<int64_t>{0, 10, 0, 0}));
  EXPECT_EQ(values(1), (std::vector<int64_t>{0, 10, 1, 1}));
  // main's self first (x 0-1), then a at 1, b right after a.
  EXPECT_EQ(values(2), (std::vector<int64_t>{1, 6, 6, 2, 0, 3, 1, 3}));
  EXPECT_EQ(values(3), (std::vector<int64_t>{8, 2, 2, 4}));  // c at x 8 (b's self at 7)
}

class QuerierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = store::Store::Open(dir_.path(), {});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    query_ = std::make_unique<query::QueryService>(store_.get(), &registry_);
    store::WriteBatch wb;
    auto fn = [&](const char* name) {
      return *store_->interner().InternFunction({name, "app", "", 0}, &wb);
    };
    const uint64_t main = fn("main"), hash = fn("hash"), idle = fn("idle");
    const uint64_t hot = *store_->interner().InternStack({{main, hash}, false, {}}, &wb);
    const uint64_t cold = *store_->interner().InternStack({{main, idle}, false, {}}, &wb);
    const uint64_t v1 = *store_->interner().InternLabelSet("api", {{"version", "1"}}, 100, &wb);
    const uint64_t v2 = *store_->interner().InternLabelSet("api", {{"version", "2"}}, 100, &wb);
    wb.AddSamples("api", kWindow, "h1", hot, 30, v1);
    wb.AddSamples("api", kWindow + 10'000, "h2", hot, 20, v2);
    wb.AddSamples("api", kWindow + 10'000, "h2", cold, 5, v2);
    wb.AddSamples("web", kWindow, "h3", cold, 7);
    ASSERT_TRUE(store_->Commit(&wb).ok());
  }

  // A Connect call as Grafana's data source makes it (binary protobuf).
  template <typename Response>
  Response Call(const std::string& method, const google::protobuf::Message& request,
                int expected_status = 200) {
    http::HttpRequest r;
    r.method = "POST";
    r.path = "/querier.v1.QuerierService/" + method;
    r.content_type = "application/proto";
    request.SerializeToString(&r.body);
    http::HttpResponse answer = ServeQuerierCall(query_.get(), r);
    EXPECT_EQ(answer.status, expected_status) << answer.body;
    Response response;
    if (answer.status == 200) {
      EXPECT_EQ(answer.content_type, "application/proto");
      EXPECT_TRUE(response.ParseFromString(answer.body));
    }
    return response;
  }
  http::HttpResponse Raw(const std::string& method, const std::string& path,
                         const std::string& content_type, const std::string& body) {
    http::HttpRequest r;
    r.method = method;
    r.path = path;
    r.content_type = content_type;
    r.body = body;
    return ServeQuerierCall(query_.get(), r);
  }

  strata::testing::TempDir dir_;
  std::unique_ptr<store::Store> store_;
  registry::AgentRegistry registry_;
  std::unique_ptr<query::QueryService> query_;
};

TEST_F(QuerierTest, TypesLabelsAndSeriesOfTheStore) {
  auto types = Call<querier::v1::ProfileTypesResponse>("ProfileTypes",
                                                       querier::v1::ProfileTypesRequest());
  ASSERT_EQ(types.profile_types_size(), 3);
  EXPECT_EQ(types.profile_types(0).id(), kCpu);
  EXPECT_EQ(types.profile_types(0).sample_unit(), "count");

  types::v1::LabelNamesRequest names_request;
  names_request.add_matchers("{}");
  auto names = Call<types::v1::LabelNamesResponse>("LabelNames", names_request);
  EXPECT_EQ(std::vector<std::string>(names.names().begin(), names.names().end()),
            (std::vector<std::string>{"service_name", "version"}));

  types::v1::LabelValuesRequest values_request;
  values_request.set_name("service_name");
  auto services = Call<types::v1::LabelValuesResponse>("LabelValues", values_request);
  EXPECT_EQ(std::vector<std::string>(services.names().begin(), services.names().end()),
            (std::vector<std::string>{"api", "web"}));
  values_request.set_name("version");
  values_request.add_matchers(R"({service_name="api"})");
  auto versions = Call<types::v1::LabelValuesResponse>("LabelValues", values_request);
  EXPECT_EQ(std::vector<std::string>(versions.names().begin(), versions.names().end()),
            (std::vector<std::string>{"1", "2"}));

  querier::v1::SeriesRequest series_request;
  series_request.add_matchers(R"({service_name="api", version="2"})");
  auto series = Call<querier::v1::SeriesResponse>("Series", series_request);
  ASSERT_EQ(series.labels_set_size(), 1);
  ASSERT_EQ(series.labels_set(0).labels_size(), 2);
  EXPECT_EQ(series.labels_set(0).labels(0).name(), "service_name");
  EXPECT_EQ(series.labels_set(0).labels(1).value(), "2");

  // Each matcher lists the label sets again: a request may not bring thousands.
  for (int i = 0; i < 100; ++i) names_request.add_matchers("{}");
  Call<types::v1::LabelNamesResponse>("LabelNames", names_request, 400);
}

// Times and steps at the ends of their types: refused, not wrapped into a huge interval
// count (which took the process down from an HTTP handler) or converted from a double out
// of int64's range.
TEST_F(QuerierTest, TimesAndStepsOutOfRangeAreRefused) {
  querier::v1::SelectSeriesRequest series;
  series.set_profile_typeid(kCpu);
  series.set_label_selector(R"({service_name="api"})");
  series.set_start(0);
  series.set_end(9223372036854770000);
  series.set_step(10);
  Call<querier::v1::SelectSeriesResponse>("SelectSeries", series, 400);
  series.set_start(-9223372036854770000);
  series.set_end(kWindow + 60'000);
  Call<querier::v1::SelectSeriesResponse>("SelectSeries", series, 400);
  series.set_start(kWindow - 60'000);
  for (double step : {1e300, std::numeric_limits<double>::infinity(),
                      std::numeric_limits<double>::quiet_NaN()}) {
    series.set_step(step);
    auto answer = Call<querier::v1::SelectSeriesResponse>("SelectSeries", series);
    EXPECT_EQ(answer.series_size(), 1) << step;
  }
  querier::v1::SelectMergeStacktracesRequest flame;
  flame.set_profile_typeid(kCpu);
  flame.set_label_selector(R"({service_name="api"})");
  flame.set_start(0);
  flame.set_end(std::numeric_limits<int64_t>::max());
  Call<querier::v1::SelectMergeStacktracesResponse>("SelectMergeStacktraces", flame, 400);
}

TEST_F(QuerierTest, FlameGraphTimelineAndProfileOfASelection) {
  querier::v1::SelectMergeStacktracesRequest flame_request;
  flame_request.set_profile_typeid(kCpu);
  flame_request.set_label_selector(R"({service_name="api"})");
  flame_request.set_start(kWindow - 60'000);
  flame_request.set_end(kWindow + 60'000);
  auto flame = Call<querier::v1::SelectMergeStacktracesResponse>("SelectMergeStacktraces",
                                                                 flame_request);
  EXPECT_EQ(flame.flamegraph().total(), 55);
  EXPECT_EQ(flame.flamegraph().max_self(), 50);
  ASSERT_EQ(flame.flamegraph().levels_size(), 3);
  EXPECT_NE(std::find(flame.flamegraph().names().begin(), flame.flamegraph().names().end(),
                      "hash"),
            flame.flamegraph().names().end());
  flame_request.set_label_selector(R"({service_name="api", version="1"})");
  EXPECT_EQ(Call<querier::v1::SelectMergeStacktracesResponse>("SelectMergeStacktraces",
                                                              flame_request)
                .flamegraph()
                .total(),
            30);

  querier::v1::SelectSeriesRequest series_request;
  series_request.set_profile_typeid(kCpu);
  series_request.set_label_selector(R"({service_name="api"})");
  series_request.set_start(kWindow);
  series_request.set_end(kWindow + 20'000);
  series_request.set_step(10);
  series_request.add_group_by("version");
  auto series = Call<querier::v1::SelectSeriesResponse>("SelectSeries", series_request);
  ASSERT_EQ(series.series_size(), 2);
  // Largest first: version 1 (30 in the first window), then version 2 (25 in the second).
  EXPECT_EQ(series.series(0).labels(1).value(), "1");
  ASSERT_EQ(series.series(0).points_size(), 2);
  EXPECT_EQ(series.series(0).points(0).value(), 30);
  EXPECT_EQ(series.series(0).points(0).timestamp(), kWindow);
  EXPECT_EQ(series.series(1).points(1).value(), 25);
  EXPECT_EQ(series.series(1).points(1).timestamp(), kWindow + 10'000);

  querier::v1::SelectMergeProfileRequest profile_request;
  profile_request.set_profile_typeid(kCpu);
  profile_request.set_label_selector(R"({service_name="api"})");
  profile_request.set_start(kWindow - 60'000);
  profile_request.set_end(kWindow + 60'000);
  auto profile = Call<google::v1::Profile>("SelectMergeProfile", profile_request);
  auto sum = [](const google::v1::Profile& p) {
    int64_t samples = 0;
    for (const google::v1::Sample& s : p.sample()) samples += s.value(0);
    return samples;
  };
  EXPECT_EQ(sum(profile), 55);
  // The same through SelectMergeStacktraces in the pprof format.
  flame_request.set_label_selector(R"({service_name="api"})");
  flame_request.set_format(querier::v1::PROFILE_FORMAT_PPROF);
  auto pprof = Call<querier::v1::SelectMergeStacktracesResponse>("SelectMergeStacktraces",
                                                                 flame_request);
  EXPECT_EQ(sum(pprof.pprof().profile()), 55);
  EXPECT_FALSE(pprof.has_flamegraph());
}

TEST_F(QuerierTest, JsonBodiesAndClearErrors) {
  // JSON as Connect's JSON codec sends it (camelCase field names).
  http::HttpResponse json = Raw("POST", "/querier.v1.QuerierService/LabelValues",
                                "application/json", R"({"name":"version","matchers":["{}"]})");
  EXPECT_EQ(json.status, 200) << json.body;
  EXPECT_EQ(json.content_type, "application/json");
  EXPECT_EQ(json.body, R"({"names":["1","2"]})");

  http::HttpResponse unknown_type = Raw(
      "POST", "/querier.v1.QuerierService/SelectMergeStacktraces", "application/json",
      R"({"profileTypeID":"memory:alloc:bytes:space:bytes","labelSelector":"{service_name=\"api\"}"})");
  EXPECT_EQ(unknown_type.status, 400);
  EXPECT_NE(unknown_type.body.find(R"("code":"invalid_argument")"), std::string::npos)
      << unknown_type.body;
  EXPECT_NE(unknown_type.body.find("unknown profile type"), std::string::npos);
  http::HttpResponse no_service = Raw("POST", "/querier.v1.QuerierService/SelectMergeStacktraces",
                                      "application/json",
                                      std::string(R"({"profileTypeID":")") + kCpu + R"("})");
  EXPECT_EQ(no_service.status, 400);
  EXPECT_NE(no_service.body.find("must name a service"), std::string::npos) << no_service.body;
  http::HttpResponse unknown_service = Raw(
      "POST", "/querier.v1.QuerierService/SelectMergeStacktraces", "application/json",
      std::string(R"({"profileTypeID":")") + kCpu + R"(","labelSelector":"{service_name=\"x\"}"})");
  EXPECT_EQ(unknown_service.status, 404) << unknown_service.body;
  EXPECT_NE(unknown_service.body.find(R"("code":"not_found")"), std::string::npos);
  EXPECT_EQ(Raw("POST", "/querier.v1.QuerierService/LabelNames", "application/proto", "\xff\xff")
                .status,
            400);
  EXPECT_EQ(Raw("POST", "/querier.v1.QuerierService/LabelNames", "text/plain", "").status, 415);
  EXPECT_EQ(Raw("GET", "/querier.v1.QuerierService/LabelNames", "application/json", "").status,
            405);
  EXPECT_EQ(Raw("POST", "/querier.v1.QuerierService/Diff", "application/json", "{}").status, 501);
}

}  // namespace
}  // namespace strata::server::grafana
