// Is a planted slowdown real, end to end: compare_workload runs as version=1 (three processes),
// as version=2 with checksum_block doing twice the work (three), and as version=3, version 1's
// build under another label (three); each process has its own strata-agent, so its own host.
// `strata compare` finds checksum_block, with the planted change inside its interval, and
// /api/v1/compare finds nothing between versions 1 and 3. And an A/A of the load generator's
// synthetic programs over 100 services.
#include <google/protobuf/util/json_util.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "strata/v1/query.grpc.pb.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/http_client.h"

namespace strata::e2e {
namespace {

// Version 2's extra work in checksum_block. Three hosts a version leave the spread between
// hosts itself uncertain (few degrees of freedom): +30 % was found in most runs, not in all on
// a loaded machine. Smaller changes: tests/bench/compare/planted.sh.
constexpr double kSlower = 1.0;
constexpr int kHostsPerVersion = 3;
constexpr uint64_t kSamplesPerHost = 5000;

v1::CompareResponse ParseCompare(const std::string& json) {
  v1::CompareResponse r;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto status = google::protobuf::util::JsonStringToMessage(json, &r, options);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return r;
}

// The top functions of `host` so far (the service over all time).
v1::TopResponse HostTop(v1::Query::Stub* stub, const std::string& host) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::TopRequest request;
  request.mutable_filter()->set_service("cmp");
  request.mutable_filter()->set_host(host);
  request.set_limit(5);
  v1::TopResponse response;
  (void)stub->Top(&ctx, request, &response);
  return response;
}

std::vector<std::string> SignificantRows(const v1::CompareResponse& r) {
  std::vector<std::string> rows;
  for (const auto& f : r.functions()) {
    if (f.self().significant()) rows.push_back(f.function().function() + " (self)");
    if (f.total().significant()) rows.push_back(f.function().function() + " (total)");
  }
  for (const auto& p : r.paths()) {
    if (p.samples().significant()) rows.push_back(p.frames().rbegin()->function() + " (path)");
  }
  return rows;
}

TEST(CompareE2eTest, FindsThePlantedSlowdownAndNothingBetweenTwoLabelsOfOneBuild) {
  const auto started = std::chrono::steady_clock::now();
  strata::testing::TempDir dir("compare_e2e");
  ServerProcess server(dir.File("data"), dir.File("server.log"), {"--http", "127.0.0.1:0"});
  ASSERT_GT(server.port(), 0) << server.process().Output();
  ASSERT_GT(server.http_port(), 0) << server.process().Output();

  std::vector<std::unique_ptr<ChildProcess>> workloads, agents;
  std::vector<std::string> hosts;
  for (int version : {1, 2, 3}) {
    for (int i = 0; i < kHostsPerVersion; ++i) {
      std::vector<std::string> argv{BinPath("compare_workload"), "--seconds", "120"};
      if (version == 2) argv.insert(argv.end(), {"--slower", absl::StrCat(kSlower)});
      hosts.push_back(absl::StrCat("cmp-v", version, "-", i));
      workloads.push_back(std::make_unique<ChildProcess>(
          argv, dir.File(hosts.back() + ".log"),
          std::map<std::string, std::string>{
              {"STRATA_SERVICE", "cmp"}, {"STRATA_LABELS", absl::StrCat("version=", version)}}));
    }
  }
  for (size_t i = 0; i < workloads.size(); ++i) {
    ASSERT_TRUE(workloads[i]->WaitForOutput("ready", 30)) << workloads[i]->Output();
    agents.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{BinPath("strata-agent"), "--server", server.address(), "--pid",
                                 std::to_string(workloads[i]->pid()), "--host", hosts[i],
                                 "--frequency", "2999", "--interval", "1", "--spool-dir", "none"},
        dir.File(hosts[i] + "-agent.log")));
  }
  for (size_t i = 0; i < agents.size(); ++i) {
    ASSERT_TRUE(agents[i]->WaitForOutput(absl::StrCat("profiling pid ", workloads[i]->pid()), 30))
        << agents[i]->Output();
  }
  // Until every host has its samples (or 35 s have passed: the comparison says what it can).
  auto stub = v1::Query::NewStub(server.Channel());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(35);
  uint64_t fewest = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    fewest = UINT64_MAX;
    for (const std::string& host : hosts) {
      fewest = std::min(fewest, HostTop(stub.get(), host).total_samples());
    }
    if (fewest >= kSamplesPerHost) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  for (auto& agent : agents) agent->Stop(SIGTERM, 15);
  for (auto& workload : workloads) workload->Stop(SIGKILL);
  std::printf("fewest samples of a host: %llu (wanted %llu) after %.1f s\n",
              static_cast<unsigned long long>(fewest),
              static_cast<unsigned long long>(kSamplesPerHost),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());

  std::printf("checksum_block's self share per host:");
  for (const std::string& host : hosts) {
    const v1::TopResponse top = HostTop(stub.get(), host);
    for (const auto& f : top.functions()) {
      if (f.function().function() == "checksum_block") {
        std::printf(" %s %.1f %%", host.c_str(), 100.0 * f.self() / top.total_samples());
      }
    }
  }
  std::printf("\n");
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{BinPath("strata"), "--server", server.address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(std::move(argv));
  };
  // 99.9 % intervals: the check that the planted size lies inside may fail 1 run in 1,000
  // (with three hosts a group, the spread between them is itself uncertain: at 99 % it
  // failed 1 run in 12).
  // Rows under 1 % of the samples (an interrupt's kernel paths) are not tested.
  const std::vector<std::string> planted_args{
      "compare",     "-s",          "cmp",     "--baseline", "version=1",
      "--candidate", "version=2",   "--since", "10m",        "--confidence",
      "0.999",        "--min-share", "1",       "-n",         "12"};
  std::vector<std::string> json_args{"--json"};
  json_args.insert(json_args.end(), planted_args.begin(), planted_args.end());
  CommandResult json = cli(json_args);
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const v1::CompareResponse planted = ParseCompare(json.output);
  CommandResult text = cli(planted_args);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  std::printf("%s\n", text.output.c_str());

  EXPECT_FALSE(planted.not_enough_data());
  EXPECT_EQ(planted.baseline_hosts(), 3u);
  EXPECT_EQ(planted.candidate_hosts(), 3u);
  const v1::FunctionComparison* checksum = nullptr;
  for (const auto& f : planted.functions()) {
    if (f.function().function() == "checksum_block") checksum = &f;
    // Only checksum_block grows; the others' shares make room for it.
    if (f.function().function() != "checksum_block" && f.self().significant()) {
      EXPECT_LT(f.self().delta(), 0) << f.DebugString();
    }
  }
  ASSERT_NE(checksum, nullptr) << json.output;
  // "new" marks only what the baseline lacks: a caller with no self time in either group
  // (main, serve) shows no change in its self columns.
  std::vector<std::string> all_args = planted_args;
  all_args.back() = "500";  // -n: every row, the callers ranked last among them
  CommandResult all_text = cli(all_args);
  ASSERT_EQ(all_text.exit_code, 0) << all_text.output;
  all_args.insert(all_args.begin(), "--json");
  CommandResult all_json = cli(all_args);
  ASSERT_EQ(all_json.exit_code, 0) << all_json.output;
  const v1::CompareResponse all = ParseCompare(all_json.output);
  size_t callers_without_self = 0;
  for (const auto& f : all.functions()) {
    if (f.self().share_baseline() != 0 || f.self().share_candidate() != 0) continue;
    ++callers_without_self;
    const std::string name = "  " + f.function().function();
    for (absl::string_view line : absl::StrSplit(all_text.output, '\n')) {
      if (absl::EndsWith(line, name)) EXPECT_EQ(line.find(" new "), line.npos) << line;
    }
  }
  EXPECT_GT(callers_without_self, 0u) << all_json.output;
  EXPECT_TRUE(checksum->self().significant()) << checksum->DebugString();
  EXPECT_GT(checksum->self().delta(), 0);
  // A fraction f more work in a function of share s raises its share by
  // ((1 + f) / (1 + f s)) - 1.
  const double s = checksum->self().share_baseline() / 100;
  const double expected = 100 * ((1 + kSlower) / (1 + s * kSlower) - 1);
  std::printf(
      "checksum_block: share %.2f %% -> %.2f %%, relative %+.1f %% [%+.1f, %+.1f], "
      "planted %+.1f %%, q %.2g\n",
      checksum->self().share_baseline(), checksum->self().share_candidate(),
      checksum->self().relative(), checksum->self().relative_ci_low(),
      checksum->self().relative_ci_high(), expected, checksum->self().q());
  EXPECT_LE(checksum->self().relative_ci_low(), expected);
  EXPECT_GE(checksum->self().relative_ci_high(), expected);

  // One build under two labels: nothing is significant (fdr 0.001: a false alarm at most 1
  // run in 1,000).
  auto [status, body] =
      strata::testing::HttpGet(server.http_port(),
                               "/api/v1/compare?service=cmp&since_s=600&baseline_select=version%3D1"
                               "&candidate_select=version%3D3&fdr=0.001&limit=50");
  ASSERT_EQ(status, 200) << body;
  const v1::CompareResponse same = ParseCompare(body);
  EXPECT_FALSE(same.not_enough_data());
  EXPECT_EQ(same.candidate_hosts(), 3u);
  EXPECT_GT(same.keys_compared(), 5u);
  EXPECT_TRUE(SignificantRows(same).empty()) << body;
  for (const auto& f : same.functions()) {
    if (f.function().function() == "checksum_block") {
      std::printf("A/A checksum_block: relative %+.1f %% [%+.1f, %+.1f], q %.2g\n",
                  f.self().relative(), f.self().relative_ci_low(), f.self().relative_ci_high(),
                  f.self().q());
    }
  }
  auto [bad_status, bad_body] = strata::testing::HttpGet(
      server.http_port(),
      "/api/v1/compare?service=cmp&baseline_select=version%3D1&candidate_select=version%3D2"
      "&fdr=2");
  EXPECT_EQ(bad_status, 400) << bad_body;
  std::printf("compare e2e wall time: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}

// A/A with the load generator's synthetic programs: 100 services, each with three simulated
// agents labelled version=a and three labelled version=b, all running one program. Its 600
// batches are independent draws from one distribution, and agent i sends batches i, i+1, ...:
// the 6 agents of a service (indices 100 apart) send 5 each, none the same. Comparing a with b in every service, at
// the server's false discovery rate of 0.05, finds a difference in about 5 of the 100 (under
// no difference at all, Benjamini-Hochberg's rate of comparisons with any discovery is the
// FDR); more than 13 happens 1 run in 2,000 at exactly 5 %.
TEST(CompareE2eTest, OneProgramUnderTwoLabelsDiffersInAtMostTheFalseDiscoveryRateOfServices) {
  const auto started = std::chrono::steady_clock::now();
  strata::testing::TempDir dir("compare_aa");
  ServerProcess server(dir.File("data"), dir.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  constexpr int kServices = 100;
  ChildProcess load({BinPath("strata-loadgen"), "--server", server.address(), "--agents",
                     absl::StrCat(6 * kServices), "--services", absl::StrCat(kServices),
                     "--programs", "1", "--intervals", absl::StrCat(6 * kServices),
                     "--label", "version=a|b", "--interval", "2",
                     "--duration", "10", "--ramp-up", "2", "--rate", "200", "--query-every",
                     "0", "--service-prefix", "aa", "--json"},
                    dir.File("loadgen.log"));
  ASSERT_EQ(load.Wait(300), 0) << load.Output();
  ASSERT_NE(load.Output().find("\"ok\":true"), std::string::npos) << load.Output();
  const auto loaded = std::chrono::steady_clock::now();

  auto stub = v1::Query::NewStub(server.Channel());
  int different = 0, compared = 0;
  for (int i = 0; i < kServices; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::CompareRequest request;
    request.set_service(absl::StrCat("aa-svc-", i));
    request.mutable_baseline()->set_selector("version=a");
    request.mutable_candidate()->set_selector("version=b");
    v1::CompareResponse r;
    grpc::Status s = stub->Compare(&ctx, request, &r);
    ASSERT_TRUE(s.ok()) << request.service() << ": " << s.error_message();
    ASSERT_FALSE(r.not_enough_data()) << r.DebugString();
    EXPECT_EQ(r.baseline_hosts(), 3u);
    EXPECT_EQ(r.candidate_hosts(), 3u);
    ++compared;
    const std::vector<std::string> rows = SignificantRows(r);
    if (!rows.empty()) {
      ++different;
      std::printf("%s: %zu significant rows, e.g. %s\n", request.service().c_str(), rows.size(),
                  rows[0].c_str());
    }
  }
  const auto done = std::chrono::steady_clock::now();
  std::printf("A/A: %d of %d services differ at FDR 0.05 (%.0f %%); load %.1f s, %d comparisons "
              "%.1f s\n",
              different, compared, 100.0 * different / compared,
              std::chrono::duration<double>(loaded - started).count(), compared,
              std::chrono::duration<double>(done - loaded).count());
  EXPECT_LE(different, 13);
}

}  // namespace
}  // namespace strata::e2e
