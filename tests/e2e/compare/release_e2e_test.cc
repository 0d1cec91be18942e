// Releases found by themselves, end to end: three hosts run compare_workload as version=1,
// then switch to version=2, whose checksum_block does twice the work. Nobody asks: the server
// notices the new release, compares it with version 1 as samples accrue and reports
// REGRESSED with checksum_block on /api/v1/regressions, in `strata regressions` and on
// /metrics; the verdict is still there after a restart. The same deploy on a service that
// runs on one host is judged too, over that host's windows.
#include <google/protobuf/util/json_util.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "strata/v1/query.grpc.pb.h"
#include "strata/v1/regress.pb.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/http_client.h"

namespace strata::e2e {
namespace {

constexpr int kHosts = 3;
constexpr uint64_t kSamplesPerHost = 4000;

v1::ListRegressionsResponse Regressions(int http_port, const std::string& service = "cmp") {
  auto [status, body] =
      strata::testing::HttpGet(http_port, "/api/v1/regressions?service=" + service);
  v1::ListRegressionsResponse r;
  EXPECT_EQ(status, 200) << body;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(body, &r, options).ok()) << body;
  return r;
}

// The service's samples of `selector` on `host` so far, or in [from_ms, to_ms).
uint64_t Samples(v1::Query::Stub* stub, const std::string& host, const std::string& selector,
                 const std::string& service = "cmp", int64_t from_ms = 0, int64_t to_ms = 0) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::TopRequest request;
  request.mutable_filter()->set_service(service);
  if (to_ms > 0) {
    request.mutable_filter()->mutable_range()->set_from_ms(from_ms);
    request.mutable_filter()->mutable_range()->set_to_ms(to_ms);
  }
  request.mutable_filter()->set_host(host);
  request.mutable_filter()->set_selector(selector);
  request.set_limit(1);
  v1::TopResponse response;
  (void)stub->Top(&ctx, request, &response);
  return response.total_samples();
}

// One version's processes, each profiled by its own agent under a fixed host name.
struct Release {
  std::vector<std::unique_ptr<ChildProcess>> workloads, agents;
};

Release StartRelease(const ServerProcess& server, const strata::testing::TempDir& dir, int version,
                     const std::vector<std::string>& hosts, const std::string& service = "cmp") {
  Release r;
  for (const std::string& host : hosts) {
    std::vector<std::string> argv{BinPath("compare_workload"), "--seconds", "120"};
    // Twice the work: with three hosts a release the spread between them is itself uncertain,
    // and smaller changes (tests/bench/compare/planted.sh) are not found every time.
    if (version == 2) argv.insert(argv.end(), {"--slower", "1"});
    r.workloads.push_back(std::make_unique<ChildProcess>(
        argv, dir.File(absl::StrCat(host, "-v", version, ".log")),
        std::map<std::string, std::string>{{"STRATA_SERVICE", service},
                                           {"STRATA_LABELS", absl::StrCat("version=", version)}}));
  }
  for (size_t i = 0; i < hosts.size(); ++i) {
    EXPECT_TRUE(r.workloads[i]->WaitForOutput("ready", 30)) << r.workloads[i]->Output();
    r.agents.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{BinPath("strata-agent"), "--server", server.address(), "--pid",
                                 std::to_string(r.workloads[i]->pid()), "--host", hosts[i],
                                 "--frequency", "2999", "--interval", "1", "--spool-dir", "none"},
        dir.File(absl::StrCat(hosts[i], "-v", version, "-agent.log"))));
  }
  return r;
}

void Stop(Release& r) {
  for (auto& agent : r.agents) agent->Stop(SIGTERM, 15);
  for (auto& workload : r.workloads) workload->Stop(SIGKILL);
}

// Until every host has `want` samples of `selector`, or `seconds` pass.
void WaitForSamples(v1::Query::Stub* stub, const std::vector<std::string>& hosts,
                    const std::string& selector, uint64_t want, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    uint64_t fewest = UINT64_MAX;
    for (const std::string& host : hosts) fewest = std::min(fewest, Samples(stub, host, selector));
    if (fewest >= want) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

// The service's verdicts once its one release is REGRESSED, or as they are after `seconds`.
v1::ListRegressionsResponse WaitForRegressed(int http_port, const std::string& service,
                                             int seconds) {
  v1::ListRegressionsResponse found;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    found = Regressions(http_port, service);
    if (found.verdicts_size() == 1 &&
        found.verdicts(0).state() == v1::ReleaseVerdict::REGRESSED) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return found;
}

TEST(ReleaseE2eTest, ANewSlowerReleaseIsReportedWithoutBeingAsked) {
  const auto started = std::chrono::steady_clock::now();
  strata::testing::TempDir dir("release_e2e");
  const std::vector<std::string> server_args{"--http", "127.0.0.1:0", "--regression-interval",
                                             "1s", "--regression-window", "10m"};
  auto server = std::make_unique<ServerProcess>(dir.File("data"), dir.File("server.log"),
                                                server_args);
  ASSERT_GT(server->http_port(), 0) << server->process().Output();
  auto stub = v1::Query::NewStub(server->Channel());
  std::vector<std::string> hosts;
  for (int i = 0; i < kHosts; ++i) hosts.push_back(absl::StrCat("cmp-", i));

  Release v1 = StartRelease(*server, dir, 1, hosts);
  WaitForSamples(stub.get(), hosts, "version=1", kSamplesPerHost, 40);
  // The server has met version 1 (a check ran after its samples were stored).
  auto checks = [&] {
    auto [status, body] = strata::testing::HttpGet(server->http_port(), "/metrics");
    const size_t at = body.find("\nstrata_regression_checks_total ");
    return at == std::string::npos ? 0 : std::stoull(body.substr(at + 32));
  };
  const uint64_t checks_before = checks();
  const auto met_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (checks() < checks_before + 2 && std::chrono::steady_clock::now() < met_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(checks(), checks_before + 2) << "the release watcher does not run";
  EXPECT_EQ(Regressions(server->http_port()).verdicts_size(), 0);
  Stop(v1);

  // The deploy: the same hosts now run version 2.
  Release v2 = StartRelease(*server, dir, 2, hosts);
  WaitForSamples(stub.get(), hosts, "version=2", kSamplesPerHost, 40);
  // The verdict comes by itself; more samples only sharpen it.
  const v1::ListRegressionsResponse found = WaitForRegressed(server->http_port(), "cmp", 40);
  Stop(v2);
  ASSERT_EQ(found.verdicts_size(), 1) << found.DebugString();
  const v1::ReleaseVerdict& verdict = found.verdicts(0);
  std::printf("%s\n", verdict.DebugString().c_str());
  EXPECT_EQ(verdict.state(), v1::ReleaseVerdict::REGRESSED) << verdict.DebugString();
  EXPECT_EQ(verdict.label(), "version");
  EXPECT_EQ(verdict.baseline(), "1");
  EXPECT_EQ(verdict.candidate(), "2");
  EXPECT_EQ(verdict.baseline_units(), 3u);
  EXPECT_EQ(verdict.candidate_units(), 3u);
  bool checksum_rose = false;
  for (const v1::ReleaseFunctionChange& f : verdict.functions()) {
    if (f.name() == "checksum_block" && f.delta() > 0) checksum_rose = true;
  }
  EXPECT_TRUE(checksum_rose) << verdict.DebugString();

  auto [status, metrics] = strata::testing::HttpGet(server->http_port(), "/metrics");
  EXPECT_NE(metrics.find("strata_regression_detected{service=\"cmp\",function=\"checksum_block\""),
            std::string::npos)
      << metrics;

  // Kept across a restart, and shown by the CLI.
  server.reset();
  server = std::make_unique<ServerProcess>(dir.File("data"), dir.File("server2.log"), server_args);
  ASSERT_GT(server->port(), 0) << server->process().Output();
  CommandResult cli = RunCommand({BinPath("strata"), "--server", server->address(), "regressions",
                                  "--service", "cmp"});
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  std::printf("%s\n", cli.output.c_str());
  EXPECT_NE(cli.output.find("version 1 -> 2"), std::string::npos) << cli.output;
  EXPECT_NE(cli.output.find("REGRESSED"), std::string::npos) << cli.output;
  EXPECT_NE(cli.output.find("checksum_block"), std::string::npos) << cli.output;
  std::smatch hint;
  ASSERT_TRUE(std::regex_search(
      cli.output, hint,
      std::regex("Which lines: strata (diff -s cmp --by line --language-self --select-a "
                 "version=1 --select-b version=2 --from [^ ]+ --to [^ ]+ --base-from [^ ]+ "
                 "--base-to [^ \\n]+)\\n")))
      << cli.output;
  // The command it names runs, and finds checksum_block's code rose.
  std::vector<std::string> argv = {BinPath("strata"), "--server", server->address()};
  for (absl::string_view word : absl::StrSplit(hint[1].str(), ' ')) argv.emplace_back(word);
  CommandResult lines = RunCommand(argv);
  ASSERT_EQ(lines.exit_code, 0) << lines.output;
  std::printf("%s\n", lines.output.c_str());
  EXPECT_TRUE(std::regex_search(lines.output, std::regex("\\n\\+[0-9.]+ [^\\n]*checksum_block")))
      << lines.output;

  // The web UI's Regressions tab, in headless Chromium when installed: the verdict, and the
  // differential flame graph with checksum_block grown (red).
  if (ChromiumInstalled()) {
    const std::string flags = absl::StrCat(HeadlessChromium(dir.File("chromium-profile")), " --dump-dom ");
    CommandResult dom = RunCommand(
        {"/bin/sh", "-c",
         absl::StrCat(flags, "'http://127.0.0.1:", server->http_port(),
                      "/?service=cmp&view=regressions' 2>/dev/null")},
        90);
    ASSERT_EQ(dom.exit_code, 0) << dom.output;
    EXPECT_NE(dom.output.find("data-loaded=\"regressions\""), std::string::npos) << dom.output;
    EXPECT_NE(dom.output.find("version 1 → 2"), std::string::npos) << dom.output;
    EXPECT_NE(dom.output.find(">REGRESSED"), std::string::npos) << dom.output;
    // A grown frame is red: rgb(255, g, g) with g < 255.
    EXPECT_TRUE(std::regex_search(
        dom.output, std::regex("background: rgb\\(255, ([0-9]|[1-9][0-9]|1[0-9][0-9]|2[0-4][0-9]|"
                               "25[0-4]), \\1\\);[^>]*>checksum_block<")))
        << dom.output;
    // Its Which lines link opens the Diff tab by line for the two releases: checksum_block's
    // code grown (no debug information here: its line is the function's, unnamed), first.
    std::smatch link;
    ASSERT_TRUE(std::regex_search(dom.output, link,
                                  std::regex("id=\"regression-lines\"[^>]*href=\"\\?([^\"]*)\"")))
        << dom.output;
    const std::string query = std::regex_replace(link[1].str(), std::regex("&amp;"), "&");
    EXPECT_NE(query.find("select=version%3D2"), std::string::npos) << query;
    EXPECT_NE(query.find("base_select=version%3D1"), std::string::npos) << query;
    EXPECT_NE(query.find("language_self=1"), std::string::npos) << query;
    CommandResult diff_page = RunCommand(
        {"/bin/sh", "-c",
         absl::StrCat(flags, "'http://127.0.0.1:", server->http_port(), "/?", query,
                      "' 2>/dev/null")},
        90);
    ASSERT_EQ(diff_page.exit_code, 0) << diff_page.output;
    EXPECT_NE(diff_page.output.find("data-loaded=\"diff\""), std::string::npos)
        << diff_page.output;
    EXPECT_TRUE(std::regex_search(
        diff_page.output,
        std::regex("<tbody><tr><td class=\"num up\">\\+[0-9.]+</td>(<td[^>]*>[^<]*</td>){2}"
                   "<td class=\"fn\">checksum_block</td>")))
        << diff_page.output;
  } else {
    std::printf("chromium not installed: the web UI's Regressions tab was not checked\n");
  }
  std::printf("release e2e wall time: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}

// A service on one host, deployed in place: with hosts as units it could never be judged; the
// host's 10 s windows are the units instead (--regression-phase-unit), and the verdict says so.
TEST(ReleaseE2eTest, ASlowerReleaseOnOneHostIsJudgedOverItsWindows) {
  const auto started = std::chrono::steady_clock::now();
  strata::testing::TempDir dir("release_e2e_one_host");
  ServerProcess server(dir.File("data"), dir.File("server.log"),
                       {"--http", "127.0.0.1:0", "--regression-interval", "1s",
                        "--regression-window", "10m", "--regression-phase-unit", "10s",
                        // 60 units of the baseline's range: within the loads a group may take,
                        // so no unit is widened past 10 s.
                        "--regression-lookback", "10m"});
  ASSERT_GT(server.http_port(), 0) << server.process().Output();
  auto stub = v1::Query::NewStub(server.Channel());
  const std::vector<std::string> host{"solo-0"};
  constexpr int64_t kWindowMs = 10'000;  // the server's windows
  // The store windows of [from_ms, now) holding samples of `selector`: the units it makes.
  auto windows_with = [&](const std::string& selector, int64_t from_ms) {
    int windows = 0;
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    for (int64_t w = from_ms / kWindowMs * kWindowMs; w < now_ms; w += kWindowMs) {
      if (Samples(stub.get(), host[0], selector, "solo", w, w + kWindowMs) > 0) ++windows;
    }
    return windows;
  };
  auto wait_for_windows = [&](const std::string& selector, int64_t from_ms, int want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    while (windows_with(selector, from_ms) < want &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return windows_with(selector, from_ms);
  };
  const int64_t start_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  Release v1 = StartRelease(server, dir, 1, host, "solo");
  // Three windows of version 1: two whole ones and the partial first.
  ASSERT_GE(wait_for_windows("version=1", start_ms, 3), 3) << v1.agents[0]->Output();
  Stop(v1);

  const int64_t v2_start_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  Release v2 = StartRelease(server, dir, 2, host, "solo");
  const v1::ListRegressionsResponse found = WaitForRegressed(server.http_port(), "solo", 90);
  Stop(v2);
  ASSERT_EQ(found.verdicts_size(), 1) << found.DebugString();
  const v1::ReleaseVerdict& verdict = found.verdicts(0);
  std::printf("%s\n", verdict.DebugString().c_str());
  EXPECT_EQ(verdict.state(), v1::ReleaseVerdict::REGRESSED) << verdict.DebugString();
  EXPECT_EQ(verdict.window_s(), 10u);
  EXPECT_GE(verdict.baseline_units(), 3u);
  EXPECT_GE(verdict.candidate_units(), 2u);
  ASSERT_GE(verdict.functions_size(), 1);
  EXPECT_EQ(verdict.functions(0).name(), "checksum_block") << verdict.DebugString();
  EXPECT_GT(verdict.functions(0).delta(), 0);

  CommandResult cli = RunCommand({BinPath("strata"), "--server", server.address(), "regressions",
                                  "--service", "solo"});
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  std::printf("%s\n", cli.output.c_str());
  EXPECT_NE(cli.output.find("REGRESSED"), std::string::npos) << cli.output;
  EXPECT_NE(cli.output.find(" of 10s"), std::string::npos) << cli.output;

  // Which line got slower: the lines of the windows before the deploy against those after,
  // the binary's DWARF uploaded. The line that rose most is in checksum_block's code.
  CommandResult upload = RunCommand({BinPath("strata"), "--server", server.address(),
                                     "debuginfo", "upload", BinPath("compare_workload")});
  ASSERT_EQ(upload.exit_code, 0) << upload.output;
  grpc::ClientContext ctx;
  v1::DiffRequest diff;
  diff.set_by_line(true);
  diff.set_limit(1000);
  diff.mutable_base()->set_service("solo");
  diff.mutable_base()->mutable_range()->set_from_ms(start_ms);
  diff.mutable_base()->mutable_range()->set_to_ms(v2_start_ms);
  diff.mutable_filter()->set_service("solo");
  diff.mutable_filter()->mutable_range()->set_from_ms(v2_start_ms);
  v1::DiffResponse lines;
  ASSERT_TRUE(stub->Diff(&ctx, diff, &lines).ok());
  const v1::LineDelta* rose = nullptr;
  for (const v1::LineDelta& l : lines.lines()) {
    if (rose == nullptr || l.self_delta_pct() > rose->self_delta_pct()) rose = &l;
  }
  ASSERT_NE(rose, nullptr) << lines.ShortDebugString();
  bool in_checksum = false;
  for (const v1::Frame& f : rose->frames()) in_checksum |= f.function() == "checksum_block";
  EXPECT_TRUE(in_checksum && rose->frames(0).line() > 0) << lines.ShortDebugString();
  EXPECT_GT(rose->self_delta_pct(), 1) << lines.ShortDebugString();
  auto rfc3339 = [](int64_t ms) {
    return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(ms),
                            absl::UTCTimeZone());
  };
  CommandResult by_line = RunCommand(
      {BinPath("strata"), "--server", server.address(), "diff", "-s", "solo", "--by", "line",
       "--from", rfc3339(v2_start_ms), "--base-from", rfc3339(start_ms), "--base-to",
       rfc3339(v2_start_ms)});
  ASSERT_EQ(by_line.exit_code, 0) << by_line.output;
  EXPECT_TRUE(std::regex_search(by_line.output,
                                std::regex("compare_workload\\.cc:[0-9]+[^\\n]*checksum_block")))
      << by_line.output;
  std::printf("%s\n", by_line.output.c_str());
  // The web UI's Diff tab with Lines ticked, against the same earlier range: the same line,
  // grown.
  if (ChromiumInstalled()) {
    CommandResult dom = RunCommand(
        {"/bin/sh", "-c",
         absl::StrCat(HeadlessChromium(dir.File("chromium-profile")), " --dump-dom ",
                      "'http://127.0.0.1:", server.http_port(), "/?service=solo&from_ms=",
                      v2_start_ms, "&base_from_ms=", start_ms, "&base_to_ms=", v2_start_ms,
                      "&view=diff&lines=1' 2>/dev/null")},
        90);
    ASSERT_EQ(dom.exit_code, 0) << dom.output;
    EXPECT_NE(dom.output.find("data-loaded=\"diff\""), std::string::npos) << dom.output;
    EXPECT_NE(dom.output.find("<span id=\"diff-range\">"), std::string::npos) << dom.output;
    EXPECT_TRUE(std::regex_search(
        dom.output, std::regex("class=\"num up\">\\+[0-9.]+</td>(<td[^>]*>[^<]*</td>){2}"
                               "<td class=\"fn\">checksum_block [^<]*compare_workload\\.cc:")))
        << dom.output;
  }
  std::printf("one-host release e2e wall time: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}

}  // namespace
}  // namespace strata::e2e
