// Calling-context encoding across server crashes: the real strata-server is killed with
// SIGKILL (twice) and restarted on the same data directory and port while the real
// strata-agent keeps profiling the demo workload and shipping packed batches every second.
//
// What must hold:
//  * the agent reconnects, and the Welcome tells it the server kept its graph (the graph is
//    persisted per agent and graph_id), so later batches decode against it;
//  * no batch is decoded against the wrong graph: every batch the server stored decoded, no
//    batch was rejected, and the decoded paths keep the demo's known shape and mix;
//  * nothing acknowledged is lost and nothing is applied twice: after the agent's final flush
//    (every batch acknowledged), the server's total equals the samples the agent counted.
//    The kills hit windows still in the server's aggregation tables (their counts live only
//    in the journal), with the default table size and with tables so small that nearly every
//    batch forces a capacity flush.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "strata/v1/query.grpc.pb.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// All matches of `re`'s first group in `text`.
std::vector<std::string> Matches(const std::string& text, const std::string& re) {
  std::vector<std::string> out;
  std::regex r(re);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), r); it != std::sregex_iterator();
       ++it) {
    out.push_back((*it)[1].str());
  }
  return out;
}

// Number of times `text` occurs in `haystack`.
size_t Count(const std::string& haystack, const std::string& text) {
  size_t n = 0;
  for (size_t at = haystack.find(text); at != std::string::npos; at = haystack.find(text, at + 1)) {
    ++n;
  }
  return n;
}

constexpr char kConnected[] = "connected to strata-server at";

// Waits until the agent has connected `n` times in total.
bool WaitForConnects(ChildProcess& agent, size_t n, double timeout_s) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    if (Count(agent.Output(), kConnected) >= n) return true;
    if (!agent.running()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Parameter: extra strata-server flags.
class EncodingRestartTest : public ::testing::TestWithParam<std::vector<std::string>> {
 protected:
  // strata-server on a fixed port (the agent keeps its address across restarts).
  std::unique_ptr<ChildProcess> StartServer(int port, const std::string& log) {
    std::vector<std::string> argv{BinPath("strata-server"), "--listen",
                                  "127.0.0.1:" + std::to_string(port), "--http", "", "--data",
                                  dir_.File("data")};
    argv.insert(argv.end(), GetParam().begin(), GetParam().end());
    auto server = std::make_unique<ChildProcess>(std::move(argv), dir_.File(log));
    EXPECT_TRUE(server->WaitForOutput("ready on port", 30)) << server->Output();
    return server;
  }

  strata::testing::TempDir dir_{"strata_e2e_encoding"};
};

TEST_P(EncodingRestartTest, AgentSurvivesServerKillsWithoutLossOrDoubleCounting) {
  auto first = std::make_unique<ServerProcess>(dir_.File("data"), dir_.File("server0.log"),
                                               GetParam());
  const int port = first->port();
  ASSERT_GT(port, 0) << first->process().Output();
  const std::string address = first->address();

  ChildProcess demo({BinPath("demo_service")}, dir_.File("demo.log"), {{"STRATA_SERVICE", "demo"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  ChildProcess agent({BinPath("strata-agent"), "--server", address, "--pid",
                      std::to_string(demo.pid()), "--interval", "1", "--spool-dir",
                      dir_.File("spool")},
                     dir_.File("agent.log"));
  ASSERT_TRUE(WaitForConnects(agent, 1, 30)) << agent.Output();
  std::this_thread::sleep_for(std::chrono::seconds(5));
  ASSERT_TRUE(agent.running()) << agent.Output();
  const uint64_t before_kill = QueryHotPaths(address, "demo").total_samples();
  EXPECT_GT(before_kill, 0u);

  // Kill the first server hard: whatever it acknowledged is in RocksDB's log; batches in
  // flight are resent by the agent.
  first->process().Stop(SIGKILL, 5);
  first.reset();
  std::this_thread::sleep_for(std::chrono::seconds(2));  // the agent spools meanwhile
  auto server = StartServer(port, "server1.log");
  // The agent retries with a growing backoff (0.5 s doubling); allow for a slow restart.
  ASSERT_TRUE(WaitForConnects(agent, 2, 60)) << agent.Output();
  std::this_thread::sleep_for(std::chrono::seconds(4));

  // Second crash, a few seconds into the new connection (new graph records went out since).
  server->Stop(SIGKILL, 5);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  server = StartServer(port, "server2.log");
  ASSERT_TRUE(WaitForConnects(agent, 3, 60)) << agent.Output();
  std::this_thread::sleep_for(std::chrono::seconds(4));
  ASSERT_TRUE(agent.running()) << agent.Output();

  // SIGTERM: the agent ships its last interval and waits for every acknowledgement.
  EXPECT_EQ(agent.Stop(SIGTERM, 20), 0) << agent.Output();
  demo.Stop(SIGKILL);
  const std::string log = agent.Output();
  EXPECT_THAT(log, Not(HasSubstr("did not acknowledge"))) << log;
  EXPECT_THAT(log, Not(HasSubstr("rejected"))) << log;
  EXPECT_THAT(log, Not(HasSubstr("[error]"))) << log;
  // A killed server is told as such, not by the agent's own cancel of the stream.
  EXPECT_THAT(log, HasSubstr("lost: the server ended the stream or the connection broke"));
  EXPECT_THAT(log, Not(HasSubstr("lost: CANCELLED"))) << log;

  // Three connections; the two after a restart found the graph the server had persisted
  // (beyond the root and the truncation marker, which every graph starts with).
  const auto welcomes =
      Matches(log, R"(connected to strata-server at \S+ \(server has (\d+) nodes)");
  ASSERT_EQ(welcomes.size(), 3u) << log;
  EXPECT_EQ(welcomes[0], "2");
  for (size_t i = 1; i < welcomes.size(); ++i) EXPECT_GT(std::stoul(welcomes[i]), 2u) << log;

  // Nothing acknowledged lost, nothing applied twice.
  const auto counted = Matches(log, R"(stopping: (\d+) samples)");
  ASSERT_EQ(counted.size(), 1u) << log;
  const uint64_t agent_samples = std::stoull(counted[0]);
  v1::HotPathsResponse paths = QueryHotPaths(address, "demo");
  EXPECT_EQ(paths.total_samples(), agent_samples) << log;
  EXPECT_GT(paths.total_samples(), before_kill);
  RecordProperty("samples", std::to_string(paths.total_samples()));

  // Every batch decoded against its own graph: the demo's shape and mix are intact.
  std::map<DemoPath, uint64_t> by_path;
  for (const auto& p : paths.paths()) by_path[ClassifyDemoPath(UserFrameNames(p))] += p.samples();
  const double total = static_cast<double>(paths.total_samples());
  EXPECT_LT(100 * by_path[DemoPath::kOther] / total, 10);
  // The demo's threads share the CPU as the scheduler lets them: on a loaded machine the mix
  // drifts by up to 15 points; a batch decoded against another graph lands in kOther.
  EXPECT_NEAR(100 * by_path[DemoPath::kTokenize] / total, 60, 20);
  EXPECT_NEAR(100 * by_path[DemoPath::kDeflate] / total, 30, 20);
  EXPECT_NEAR(100 * by_path[DemoPath::kFib] / total, 10, 10);
  for (const char* name : {"server0.log", "server1.log", "server2.log"}) {
    std::ifstream in(dir_.File(name));
    const std::string server_log((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
    EXPECT_THAT(server_log, Not(HasSubstr("undecodable"))) << name;
    EXPECT_THAT(server_log, Not(HasSubstr("malformed"))) << name;
    EXPECT_THAT(server_log, Not(HasSubstr("rejected"))) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Tables, EncodingRestartTest,
                         ::testing::Values(std::vector<std::string>{},
                                           std::vector<std::string>{"--table-entries", "16"}),
                         [](const auto& info) {
                           return info.param.empty() ? std::string("DefaultTables")
                                                     : std::string("TinyTables");
                         });

}  // namespace
}  // namespace strata::e2e
