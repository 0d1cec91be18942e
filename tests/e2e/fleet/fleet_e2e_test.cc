// A fleet of simulated agents (strata-loadgen) against the real strata-server on loopback:
// steady load, and a reconnect storm of every agent at once. strata-loadgen compares the
// server's totals with what it delivered, per service, and exits non-zero on any loss,
// double count, rejected or unacknowledged batch; its JSON line carries the figures.
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/http_client.h"

namespace strata::e2e {
namespace {

// A number from strata-loadgen's JSON line.
double Field(const std::string& json, const std::string& name) {
  std::smatch m;
  const std::regex re("\"" + name + "\":([-0-9.]+)");
  double v = -1;
  if (std::regex_search(json, m, re)) (void)absl::SimpleAtod(m[1].str(), &v);
  return v;
}

class FleetTest : public ::testing::Test {
 protected:
  // Runs strata-loadgen against a fresh server; returns its JSON line. `after` runs while the
  // server is still up (to read its metrics).
  std::string RunLoad(std::vector<std::string> server_args, std::vector<std::string> load_args,
                      double timeout_s,
                      const std::function<void(ServerProcess&)>& after = nullptr) {
    ServerProcess server(dir_.path() + "/data", dir_.path() + "/server.log",
                         std::move(server_args));
    EXPECT_NE(server.port(), 0) << server.process().Output();
    std::vector<std::string> argv{BinPath("strata-loadgen"), "--server", server.address(),
                                  "--server-pid", std::to_string(server.process().pid()),
                                  "--json"};
    argv.insert(argv.end(), load_args.begin(), load_args.end());
    CommandResult r = RunCommand(argv, timeout_s);
    std::printf("%s", r.output.c_str());
    EXPECT_EQ(r.exit_code, 0) << r.output << "\nserver log:\n" << server.process().Output();
    EXPECT_TRUE(server.process().running());
    if (after) after(server);
    return r.output;
  }

  strata::testing::TempDir dir_{"fleet_e2e"};
};

// 500 agents for 60 s: every sample delivered is stored exactly once.
TEST_F(FleetTest, FiveHundredAgentsForAMinute) {
  const std::string json = RunLoad({}, {"--agents", "500", "--interval", "10", "--duration", "60",
                                        "--ramp-up", "10", "--rate", "99"},
                                   240);
  EXPECT_NE(json.find("\"ok\":true"), std::string::npos) << json;
  EXPECT_EQ(Field(json, "lost"), 0);
  EXPECT_EQ(Field(json, "extra"), 0);
  EXPECT_GE(Field(json, "batches"), 500 * 4);
}

// Every agent drops its stream at once and reconnects: nothing acknowledged is lost or
// applied twice, and the server's memory stays bounded.
TEST_F(FleetTest, ReconnectStormOfFiveHundredAgents) {
  const std::string json =
      RunLoad({"--table-memory", "64MiB"},
              {"--agents", "500", "--interval", "5", "--duration", "30", "--ramp-up", "5",
               "--rate", "99", "--reconnect-storm-at", "12", "--reconnect-storm-at", "21",
               "--max-backoff", "5"},
              240);
  EXPECT_NE(json.find("\"ok\":true"), std::string::npos) << json;
  EXPECT_GE(Field(json, "reconnects"), 2 * 500);
  const double peak_rss = Field(json, "server_peak_rss_mib");
  std::printf("server peak RSS through two reconnect storms of 500 agents: %.0f MiB\n", peak_rss);
  EXPECT_GT(peak_rss, 0);
  EXPECT_LT(peak_rss, 1024);
}

// The same fleet speaking OTLP (one Export request per agent and interval, on the same
// listener): every sample is stored exactly once, under the agents' services and hosts.
TEST_F(FleetTest, OtlpExportersAreStoredExactly) {
  const std::string json =
      RunLoad({}, {"--protocol", "otlp", "--agents", "50", "--interval", "2", "--duration", "12",
                   "--ramp-up", "2", "--rate", "99", "--label", "version=a|b"},
              120);
  EXPECT_NE(json.find("\"ok\":true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"protocol\":\"otlp\""), std::string::npos) << json;
  EXPECT_GE(Field(json, "batches"), 50 * 4);
  EXPECT_GT(Field(json, "bytes_per_sample"), 0);
}

// A session memory budget far below what the agents' graphs need: sessions drop their
// graphs after each message and load them again for the next; nothing is lost.
TEST_F(FleetTest, SessionBudgetDropsGraphsAndLosesNothing) {
  double unloaded = -1;
  const std::string json = RunLoad(
      {"--session-memory", "64KiB", "--http", "127.0.0.1:0"},
      {"--agents", "50", "--interval", "2", "--duration", "16", "--ramp-up", "2", "--rate", "99"},
      120, [&](ServerProcess& server) {
        const int port = server.http_port();
        ASSERT_GT(port, 0) << server.process().Output();
        auto [status, metrics] = strata::testing::HttpGet(port, "/metrics");
        ASSERT_EQ(status, 200);
        std::smatch m;
        if (std::regex_search(metrics, m, std::regex("strata_ingest_sessions_unloaded_total ([0-9]+)"))) {
          (void)absl::SimpleAtod(m[1].str(), &unloaded);
        }
      });
  EXPECT_NE(json.find("\"ok\":true"), std::string::npos) << json;
  EXPECT_GT(unloaded, 50) << "sessions should have dropped their graphs";
}

}  // namespace
}  // namespace strata::e2e
