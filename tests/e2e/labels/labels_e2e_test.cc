// Fleet labels end to end: two demo_service processes of one service, "version 1" (the usual
// mix, tokenize ~60 %) and "version 2" (changed phase at once: deflate_block ~85 %), each
// labelled by its STRATA_LABELS; a real strata-agent given both pids and a --service rule
// (so they are named by the rule) and --label; the real server, CLI, HTTP API and web UI.
// Selectors see one process each, the diff by label shows the deploy's change, and the
// labels survive a server restart.
#include <signal.h>

#include <cstdio>
#include <algorithm>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "querier/v1/querier.pb.h"
#include "strata/v1/query.grpc.pb.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/http_client.h"

namespace strata::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::HotPathsResponse HotPaths(const std::string& address, const std::string& selector) {
  auto stub = v1::Query::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::HotPathsRequest request;
  request.mutable_filter()->set_service("demo");
  request.mutable_filter()->set_selector(selector);
  request.set_limit(1000);
  v1::HotPathsResponse response;
  grpc::Status s = stub->HotPaths(&ctx, request, &response);
  EXPECT_TRUE(s.ok()) << selector << ": " << s.error_message();
  return response;
}

// Share of `kind` among the classified demo paths of a response, percent.
double Share(const v1::HotPathsResponse& r, DemoPath kind) {
  uint64_t of_kind = 0, total = 0;
  for (const auto& p : r.paths()) {
    const DemoPath k = ClassifyDemoPath(UserFrameNames(p));
    if (k == DemoPath::kOther) continue;
    total += p.samples();
    if (k == kind) of_kind += p.samples();
  }
  return total == 0 ? 0 : 100.0 * of_kind / total;
}

// 12345 -> "12,345", as the web UI prints counts.
std::string WithThousandsForTest(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

template <typename Message>
Message ParseJson(const std::string& json) {
  Message m;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto status = google::protobuf::util::JsonStringToMessage(json, &m, options);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return m;
}

class LabelsE2eTest : public ::testing::Test {
 protected:
  void StartServer(const std::string& log) {
    server_ = std::make_unique<ServerProcess>(dir_.File("data"), dir_.File(log),
                                              std::vector<std::string>{"--http", "127.0.0.1:0"});
    ASSERT_GT(server_->port(), 0) << server_->process().Output();
    http_port_ = server_->http_port();
    ASSERT_GT(http_port_, 0) << server_->process().Output();
  }
  CommandResult Cli(std::vector<std::string> args) {
    std::vector<std::string> argv{BinPath("strata"), "--server", server_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(std::move(argv));
  }

  strata::testing::TempDir dir_{"labels_e2e"};
  std::unique_ptr<ServerProcess> server_;
  int http_port_ = 0;
};

TEST_F(LabelsE2eTest, SelectorsSplitTwoVersionsOfOneService) {
  ASSERT_NO_FATAL_FAILURE(StartServer("server.log"));
  // A command line no other test's demo has, for the agent's --service rule.
  const std::string tag = absl::StrCat("360", getpid());
  ChildProcess v1({BinPath("demo_service"), "--threads", "1", "--seconds", tag},
                  dir_.File("demo1.log"),
                  {{"STRATA_LABELS", "version=1,region=eu-west"}});
  ChildProcess v2({BinPath("demo_service"), "--threads", "1", "--seconds", tag, "--switch-after",
                   "0.001"},
                  dir_.File("demo2.log"), {{"STRATA_LABELS", "version=2,region=us-east"}});
  ASSERT_TRUE(v1.WaitForOutput("ready", 30)) << v1.Output();
  ASSERT_TRUE(v2.WaitForOutput("ready", 30)) << v2.Output();
  // Both pids given explicitly and a rule that names them: they are profiled as "demo" (not
  // as their executable's name).
  ChildProcess agent({BinPath("strata-agent"), "--server", server_->address(), "--pid",
                      std::to_string(v1.pid()), "--pid", std::to_string(v2.pid()), "--service",
                      absl::StrCat("demo=demo_service .*--seconds ", tag), "--label",
                      "team=checkout", "--label", "version=0", "--interval", "2", "--spool-dir",
                      "none"},
                     dir_.File("agent.log"));
  ASSERT_TRUE(agent.WaitForOutput(absl::StrCat("profiling pid ", v2.pid()), 30)) << agent.Output();
  std::this_thread::sleep_for(std::chrono::seconds(12));
  ASSERT_TRUE(agent.running()) << agent.Output();
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();
  for (size_t at = agent.Output().find("profiling pid"); at != std::string::npos;
       at = agent.Output().find("profiling pid", at + 1)) {
    std::printf("agent: %s\n", agent.Output().substr(at, agent.Output().find('\n', at) - at).c_str());
  }
  EXPECT_THAT(agent.Output(), HasSubstr("as service 'demo'"));
  EXPECT_THAT(agent.Output(), ::testing::Not(HasSubstr("as service 'demo_service'")));

  // With --service rules the agent also profiles processes that name themselves with
  // STRATA_SERVICE (other tests' demos may run beside this one): ours are the ones with a
  // region label ("region!=": the label is there, not empty).
  const v1::HotPathsResponse all = HotPaths(server_->address(), "");
  const v1::HotPathsResponse ours = HotPaths(server_->address(), "region!=");
  const v1::HotPathsResponse one = HotPaths(server_->address(), "version=1");
  const v1::HotPathsResponse two = HotPaths(server_->address(), "version=2");
  ASSERT_GT(one.total_samples(), 100u);
  ASSERT_GT(two.total_samples(), 100u);
  // Every sample of ours is one version's or the other's; the agent's version=0 is
  // overridden by theirs.
  EXPECT_EQ(one.total_samples() + two.total_samples(), ours.total_samples());
  EXPECT_GE(all.total_samples(), ours.total_samples());
  EXPECT_EQ(HotPaths(server_->address(), "version=0,region!=").total_samples(), 0u);
  // Each selector sees only its process: version 1's mix, version 2's changed phase.
  EXPECT_GT(Share(one, DemoPath::kTokenize), 40);
  EXPECT_LT(Share(two, DemoPath::kTokenize), 20);
  EXPECT_GT(Share(two, DemoPath::kDeflate), 65);
  // Globs, !=, several terms, the agent's --label on every target.
  EXPECT_EQ(HotPaths(server_->address(), "region=eu-*").total_samples(), one.total_samples());
  EXPECT_EQ(HotPaths(server_->address(), "version!=1,region!=").total_samples(),
            two.total_samples());
  EXPECT_EQ(HotPaths(server_->address(), "version=2,region=us-*").total_samples(),
            two.total_samples());
  EXPECT_EQ(HotPaths(server_->address(), "version=2,region=eu-*").total_samples(), 0u);
  EXPECT_EQ(HotPaths(server_->address(), "team=checkout").total_samples(), all.total_samples());
  EXPECT_EQ(HotPaths(server_->address(), "build_id!=,region!=").total_samples(),
            ours.total_samples());

  // The CLI: --select on hot-paths, the label listing, diff between two selectors.
  CommandResult paths = Cli({"--json", "hot-paths", "--service", "demo", "--select", "version=2"});
  ASSERT_EQ(paths.exit_code, 0) << paths.output;
  EXPECT_EQ(ParseJson<v1::HotPathsResponse>(paths.output).total_samples(), two.total_samples());
  CommandResult top = Cli({"top", "--service", "demo", "--select", "version=1", "--limit", "3"});
  ASSERT_EQ(top.exit_code, 0) << top.output;
  EXPECT_THAT(top.output, HasSubstr("tokenize"));
  CommandResult labels = Cli({"labels", "--service", "demo"});
  ASSERT_EQ(labels.exit_code, 0) << labels.output;
  EXPECT_THAT(labels.output, ::testing::ContainsRegex("version +[0-9,]*1,2"));
  EXPECT_THAT(labels.output, ::testing::ContainsRegex("region +eu-west,us-east"));
  EXPECT_THAT(labels.output, HasSubstr("build_id"));
  CommandResult bad = Cli({"hot-paths", "--service", "demo", "--select", "version"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("KEY=VALUE"));

  CommandResult diff_json = Cli({"--json", "diff", "--service", "demo", "--select-a", "version=1",
                                 "--select-b", "version=2"});
  ASSERT_EQ(diff_json.exit_code, 0) << diff_json.output;
  const auto diff = ParseJson<v1::DiffResponse>(diff_json.output);
  EXPECT_EQ(diff.base_total_samples(), one.total_samples());
  EXPECT_EQ(diff.total_samples(), two.total_samples());
  std::map<std::string, double> self_delta;
  for (const auto& f : diff.functions()) self_delta[f.function().function()] = f.self_delta_pct();
  EXPECT_GT(self_delta["deflate_block"], 25) << diff_json.output;
  EXPECT_LT(self_delta["tokenize"], -25) << diff_json.output;
  CommandResult diff_text = Cli({"diff", "--service", "demo", "--select", "version=2",
                                 "--base-select", "version=1"});
  ASSERT_EQ(diff_text.exit_code, 0) << diff_text.output;
  EXPECT_THAT(diff_text.output, HasSubstr("Diff of demo {version=2}"));
  EXPECT_THAT(diff_text.output, HasSubstr("against demo {version=1} (the same range"));
  EXPECT_THAT(diff_text.output, Not(HasSubstr("warning")));
  // Against a selection with no samples, every function is new: the diff says so.
  CommandResult against_none = Cli({"diff", "--service", "demo", "--select", "version=2",
                                    "--base-select", "version=9"});
  ASSERT_EQ(against_none.exit_code, 0) << against_none.output;
  EXPECT_THAT(against_none.output, HasSubstr("warning: the base range has no samples"));
  // A selection that matches nothing is named as what is empty; stack quality of nothing is
  // not "0 % complete".
  for (const char* command : {"top", "quality"}) {
    CommandResult none = Cli({command, "--service", "demo", "--select", "version=9"});
    ASSERT_EQ(none.exit_code, 0) << none.output;
    EXPECT_THAT(none.output, HasSubstr("No samples in this range match --select version=9"))
        << command;
    EXPECT_THAT(none.output, Not(HasSubstr("complete stacks"))) << command;
  }
  std::printf("version 1: %lu samples, version 2: %lu samples\n%s\n",
              static_cast<unsigned long>(one.total_samples()),
              static_cast<unsigned long>(two.total_samples()), diff_text.output.c_str());

  // HTTP: select= on every query, and the label listing.
  auto [status, body] = strata::testing::HttpGet(
      http_port_, "/api/v1/hot-paths?service=demo&since_s=3600&select=version%3D2&limit=1000");
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(ParseJson<v1::HotPathsResponse>(body).total_samples(), two.total_samples());
  auto [diff_status, diff_body] = strata::testing::HttpGet(
      http_port_, "/api/v1/diff?service=demo&since_s=3600&select=version%3D2&base_select=version%3D1");
  ASSERT_EQ(diff_status, 200) << diff_body;
  EXPECT_EQ(ParseJson<v1::DiffResponse>(diff_body).base_total_samples(), one.total_samples());
  auto [labels_status, labels_body] =
      strata::testing::HttpGet(http_port_, "/api/v1/labels?service=demo");
  ASSERT_EQ(labels_status, 200) << labels_body;
  EXPECT_THAT(labels_body, HasSubstr("\"us-east\""));
  auto [bad_status, bad_body] = strata::testing::HttpGet(
      http_port_, "/api/v1/top?service=demo&select=%3D%3D");
  EXPECT_EQ(bad_status, 400) << bad_body;
  // The timeline's series, one per version: every sample of each, open windows included.
  auto [series_status, series_body] = strata::testing::HttpGet(
      http_port_, "/api/v1/series?service=demo&since_s=3600&select=region!%3D&group_by=version");
  ASSERT_EQ(series_status, 200) << series_body;
  const auto series = ParseJson<v1::SeriesResponse>(series_body);
  EXPECT_EQ(series.step_ms(), 60'000);
  EXPECT_EQ(series.total_samples(), ours.total_samples());
  std::map<std::string, uint64_t> version_totals;
  for (const v1::SampleSeries& s : series.series()) {
    uint64_t sum = 0;
    for (uint64_t c : s.counts()) sum += c;
    EXPECT_EQ(sum, s.total());
    version_totals[s.value()] = s.total();
  }
  EXPECT_EQ(version_totals, (std::map<std::string, uint64_t>{{"1", one.total_samples()},
                                                             {"2", two.total_samples()}}))
      << series_body;
  // Grafana's Pyroscope data source: its calls as it sends them (Connect over HTTP POST,
  // binary protobuf, connect-go's headers), answered with the same samples.
  auto connect = [&](const std::string& method, const google::protobuf::Message& request,
                     google::protobuf::Message* response) {
    std::string body;
    request.SerializeToString(&body);
    strata::testing::HttpReply reply = strata::testing::HttpCall(
        http_port_, "POST", "/querier.v1.QuerierService/" + method,
        {{"Content-Type", "application/proto"}, {"Connect-Protocol-Version", "1"},
         {"Accept-Encoding", "gzip"}, {"User-Agent", "connect-go/1.18.1 (go1.24.4)"}},
        body);
    EXPECT_EQ(reply.status, 200) << method << ": " << reply.body;
    EXPECT_EQ(reply.content_type, "application/proto") << method;
    EXPECT_TRUE(response->ParseFromString(reply.body)) << method;
  };
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  querier::v1::SelectMergeStacktracesRequest flame_request;
  flame_request.set_profile_typeid("process_cpu:samples:count:cpu:nanoseconds");
  flame_request.set_label_selector(R"({service_name="demo", region!=""})");
  flame_request.set_start(now_ms - 3'600'000);
  flame_request.set_end(now_ms);
  querier::v1::SelectMergeStacktracesResponse flame;
  connect("SelectMergeStacktraces", flame_request, &flame);
  EXPECT_EQ(flame.flamegraph().total(), static_cast<int64_t>(ours.total_samples()));
  EXPECT_NE(std::find(flame.flamegraph().names().begin(), flame.flamegraph().names().end(),
                      "deflate_block"),
            flame.flamegraph().names().end());
  querier::v1::SelectSeriesRequest select_series;
  select_series.set_profile_typeid(flame_request.profile_typeid());
  select_series.set_label_selector(flame_request.label_selector());
  select_series.set_start(now_ms - 3'600'000);
  select_series.set_end(now_ms);
  select_series.set_step(15);  // Grafana's default for an hour: 20 s intervals here
  select_series.add_group_by("version");
  querier::v1::SelectSeriesResponse grafana_series;
  connect("SelectSeries", select_series, &grafana_series);
  std::map<std::string, uint64_t> grafana_totals;
  for (const types::v1::Series& s : grafana_series.series()) {
    ASSERT_EQ(s.labels_size(), 2);
    for (const types::v1::Point& p : s.points()) {
      grafana_totals[s.labels(1).value()] += static_cast<uint64_t>(p.value());
      EXPECT_EQ(p.timestamp() % 20'000, 0);
    }
  }
  EXPECT_EQ(grafana_totals, version_totals);
  types::v1::LabelValuesRequest values_request;
  values_request.set_name("version");
  values_request.add_matchers(R"({service_name="demo"})");
  types::v1::LabelValuesResponse values;
  connect("LabelValues", values_request, &values);
  EXPECT_NE(std::find(values.names().begin(), values.names().end(), "2"), values.names().end());
  auto [bad_step_status, bad_step_body] = strata::testing::HttpGet(
      http_port_, "/api/v1/series?service=demo&since_s=3600&step_ms=15000");
  EXPECT_EQ(bad_step_status, 400) << bad_step_body;
  EXPECT_THAT(bad_step_body, HasSubstr("multiple of the 10000 ms window"));

  // The web UI's label filter, in headless Chromium when installed.
  if (ChromiumInstalled()) {
    // The page at `query`, as the DOM once its scripts ran.
    auto page = [&](const std::string& query) {
      CommandResult dom = RunCommand(
          {"/bin/sh", "-c",
           absl::StrCat(HeadlessChromium(dir_.File("chromium-profile")), " --dump-dom ",
                        "'http://127.0.0.1:", http_port_, "/?", query, "' 2>/dev/null")},
          90);
      EXPECT_EQ(dom.exit_code, 0) << dom.output;
      return dom;
    };
    CommandResult dom = page("service=demo&since_s=3600&select=version%3D2");
    EXPECT_THAT(dom.output, HasSubstr("data-loaded=\"flame\""));
    EXPECT_THAT(dom.output, HasSubstr(absl::StrCat("demo {version=2}: ",
                                                   WithThousandsForTest(two.total_samples()),
                                                   " samples")));
    EXPECT_THAT(dom.output, HasSubstr("<option>version=1</option>"));  // the filter's hints
    EXPECT_THAT(dom.output, ::testing::ContainsRegex("<div class=\"frame\"[^>]*>deflate_block</div>"));
    // A shared link with a search and a zoom: matching frames highlighted and counted, the
    // zoom applied, the view's state written back to the page's link.
    CommandResult searched = page(
        "service=demo&since_s=3600&select=version%3D2&search=deflate&zoom=_start%0A__libc_start_main");
    EXPECT_THAT(searched.output,
                ::testing::ContainsRegex("<div class=\"frame match\"[^>]*>deflate_block</div>"));
    EXPECT_THAT(searched.output, ::testing::ContainsRegex("Matched /deflate/: [0-9,]+ samples"));
    EXPECT_THAT(searched.output, ::testing::ContainsRegex(
                                     "id=\"share\" href=\"/\\?since_s=3600&amp;service=demo&amp;"
                                     "select=version%3D2&amp;view=flame&amp;search=deflate&amp;"
                                     "zoom=_start%0A__libc_start_main\""));
    EXPECT_THAT(searched.output, HasSubstr("<button id=\"flame-reset\">Reset zoom</button>"));
    // The sandwich of deflate_block: compress_response among its callers.
    CommandResult sandwich = page("service=demo&since_s=3600&view=sandwich&function=deflate_block");
    EXPECT_THAT(sandwich.output, HasSubstr("data-loaded=\"sandwich\""));
    const size_t callers = sandwich.output.find("id=\"sandwich-callers\"");
    const size_t callees = sandwich.output.find("id=\"sandwich-callees\"");
    ASSERT_NE(callers, std::string::npos) << sandwich.output;
    ASSERT_NE(callees, std::string::npos) << sandwich.output;
    EXPECT_THAT(sandwich.output.substr(callers, callees - callers),
                ::testing::ContainsRegex("<div class=\"frame\"[^>]*>compress_response</div>"))
        << sandwich.output;
    EXPECT_THAT(sandwich.output, HasSubstr("Callers of deflate_block"));
    // The timeline stacked by version; dragging across its second half picks that half as
    // the range, which the flame graph, the timeline and the link then show.
    if (RunCommand({"/bin/sh", "-c", "command -v node"}).exit_code == 0) {
      CommandResult drive = RunCommand(
          {"/usr/bin/env", "node", "--experimental-websocket", STRATA_DRIVE_PAGE, dir_.File("chromium-cdp"),
           absl::StrCat("http://127.0.0.1:", http_port_,
                        "/?service=demo&since_s=3600&select=region!%3D&group_by=version"),
           "drag", "#timeline-chart", "0.5", "1", "screenshot", dir_.File("timeline.png")},
          120);
      ASSERT_EQ(drive.exit_code, 0) << drive.output;
      std::vector<std::string> states = absl::StrSplit(drive.output, '\n', absl::SkipEmpty());
      ASSERT_EQ(states.size(), 3u) << drive.output;
      // An hour at one-minute steps: 60 intervals, 61 when the hour starts mid-minute.
      EXPECT_THAT(states[0], ::testing::ContainsRegex("\"intervals\":\"6[01]\""));
      EXPECT_THAT(states[0], ::testing::ContainsRegex("\"bars\":[1-9]"));
      EXPECT_THAT(states[0], ::testing::ContainsRegex("\"legend\":\"[^\"]*2 [0-9,]+"));
      const std::string ours_text = absl::StrCat(": ", WithThousandsForTest(ours.total_samples()),
                                                 " samples");
      EXPECT_THAT(states[0], HasSubstr(ours_text));
      // After the drag: a custom range of whole one-minute intervals, the chart's second half
      // (30.5 of its 61 intervals, snapped to 30 or 31), every sample still in it.
      const std::string& after = states[1];
      std::smatch range;
      ASSERT_TRUE(std::regex_search(after, range, std::regex("from_ms=([0-9]+)&to_ms=([0-9]+)")))
          << after;
      const int64_t picked = std::stoll(range[2]) - std::stoll(range[1]);
      EXPECT_TRUE(picked == 30 * 60'000 || picked == 31 * 60'000) << after;
      EXPECT_EQ(std::stoll(range[1]) % 60'000, 0) << after;
      EXPECT_THAT(after, HasSubstr("\"loaded\":\"flame\""));
      EXPECT_THAT(after, HasSubstr("group_by=version"));
      EXPECT_THAT(after, HasSubstr(ours_text));
      EXPECT_THAT(after, HasSubstr("\"error\":\"\""));
      // What the browser drew: a PNG of the viewport (the window's 1280 wide; its 900 high
      // less the browser's own bars) with the timeline, the flame graph and the legend in it,
      // far larger than a blank page's few kilobytes.
      EXPECT_THAT(states[2], HasSubstr("\"screenshot\":"));
      const std::string png = ReadWholeFile(dir_.File("timeline.png"));
      ASSERT_GT(png.size(), 24u);
      EXPECT_EQ(png.substr(1, 3), "PNG");
      auto be32 = [&png](size_t at) {
        return (uint32_t{static_cast<uint8_t>(png[at])} << 24) |
               (uint32_t{static_cast<uint8_t>(png[at + 1])} << 16) |
               (uint32_t{static_cast<uint8_t>(png[at + 2])} << 8) | static_cast<uint8_t>(png[at + 3]);
      };
      EXPECT_EQ(be32(16), 1280u);  // IHDR's width and height
      EXPECT_GT(be32(20), 600u);
      EXPECT_GT(png.size(), 30'000u) << "a nearly blank page";
    } else {
      std::printf("node not installed: the timeline's drag was not checked\n");
    }
  } else {
    std::printf("chromium not installed: the web UI's label filter was not checked\n");
  }

  // A restarted server has the same label sets and splits.
  EXPECT_EQ(server_->process().Stop(SIGTERM, 15), 0) << server_->process().Output();
  ASSERT_NO_FATAL_FAILURE(StartServer("server2.log"));
  EXPECT_EQ(HotPaths(server_->address(), "version=1").total_samples(), one.total_samples());
  EXPECT_EQ(HotPaths(server_->address(), "version=2").total_samples(), two.total_samples());
  v1.Stop(SIGKILL);
  v2.Stop(SIGKILL);
}

}  // namespace
}  // namespace strata::e2e
