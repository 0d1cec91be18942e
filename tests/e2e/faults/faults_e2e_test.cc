// Fault injection with the real binaries: agents killed with SIGKILL during a server outage
// and while shipping, a torn spool record, a server killed again and again under several
// agents, and a lossy, slow, partitioned network between an agent in its own network
// namespace and the server. Every case ends with exact totals: the server holds precisely
// the samples the agents spooled or counted, none lost, none twice.
//
// What the agents spooled and recovered is read from their debug log ("spooled batch N (M
// samples)", "recovered batch N (M samples)"): a batch killed between its spool write and its
// log line is still recovered by the next run, so the union by sequence number is exactly
// the set of batches that reached the spool.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/testing/loopback_socket.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/http_client.h"

namespace strata::e2e {
namespace {

namespace fs = std::filesystem;

constexpr char kService[] = "faults";

// sequence -> samples of every "<verb> batch N (M samples)" line.
std::map<uint64_t, uint64_t> BatchLines(const std::string& log, const std::string& verb) {
  std::map<uint64_t, uint64_t> out;
  std::regex re(verb + " batch ([0-9]+) \\(([0-9]+) samples\\)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    uint64_t seq = 0, samples = 0;
    if (absl::SimpleAtoi((*it)[1].str(), &seq) && absl::SimpleAtoi((*it)[2].str(), &samples)) {
      out[seq] = samples;
    }
  }
  return out;
}

uint64_t Sum(const std::map<uint64_t, uint64_t>& batches) {
  uint64_t total = 0;
  for (const auto& [seq, samples] : batches) total += samples;
  return total;
}

// Waits for `done()` up to `timeout_s`, polling.
template <typename F>
bool WaitUntil(F done, double timeout_s) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

// The case's figure for the record, then the check: the server holds exactly `expected`.
void ExpectExact(const std::string& address, uint64_t expected) {
  const uint64_t held = ServiceTotal(address, kService);
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::printf("faults: %s.%s: server holds %llu of %llu samples (lost %llu, counted twice %llu)\n",
              test->test_suite_name(), test->name(), static_cast<unsigned long long>(held),
              static_cast<unsigned long long>(expected),
              static_cast<unsigned long long>(held < expected ? expected - held : 0),
              static_cast<unsigned long long>(held > expected ? held - expected : 0));
  EXPECT_EQ(held, expected);
}

class FaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    demo_ = std::make_unique<ChildProcess>(std::vector<std::string>{BinPath("demo_service")},
                                           dir_.File("demo.log"),
                                           std::map<std::string, std::string>{
                                               {"STRATA_SERVICE", kService}});
    ASSERT_TRUE(demo_->WaitForOutput("ready", 30)) << demo_->Output();
  }

  // A port for a server that comes and goes: one the kernel gave a server that then left.
  int ReservePort() {
    ServerProcess probe(dir_.File("probe-data"), dir_.File("probe.log"));
    const int port = probe.port();
    probe.process().Stop(SIGTERM, 30);
    return port;
  }
  std::unique_ptr<ChildProcess> StartServer(const std::string& listen, const std::string& log,
                                            const std::vector<std::string>& flags = {}) {
    // The fault tests' links are test networks between namespaces: plaintext on purpose.
    std::vector<std::string> argv = {BinPath("strata-server"), "--listen", listen, "--http", "",
                                     "--data", dir_.File("data"), "--insecure"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto server = std::make_unique<ChildProcess>(argv, dir_.File(log));
    EXPECT_TRUE(server->WaitForOutput("ready on port", 30)) << server->Output();
    return server;
  }
  // The agent command line; `prefix` runs it inside something (ip netns exec).
  std::vector<std::string> AgentArgs(const std::string& server, const std::string& agent_id,
                                     std::vector<std::string> prefix = {}) {
    std::vector<std::string> argv = std::move(prefix);
    argv.push_back(BinPath("strata-agent"));
    for (std::string a : {std::string("--server"), server, std::string("--pid"),
                          std::to_string(demo_->pid()), std::string("--interval"),
                          std::string("0.5"), std::string("--spool-dir"), dir_.File("spool"),
                          std::string("--log-level"), std::string("debug"),
                          std::string("--flush-timeout"), std::string("60")}) {
      argv.push_back(std::move(a));
    }
    if (!agent_id.empty()) {  // else the agent generates its own
      argv.push_back("--agent-id");
      argv.push_back(agent_id);
    }
    return argv;
  }
  std::unique_ptr<ChildProcess> StartAgent(const std::string& server, const std::string& agent_id,
                                           const std::string& log,
                                           std::vector<std::string> prefix = {}) {
    return std::make_unique<ChildProcess>(AgentArgs(server, agent_id, std::move(prefix)),
                                          dir_.File(log));
  }
  // Stops an agent that must deliver everything on its way out; its run's samples.
  uint64_t StopAndCount(ChildProcess& agent) {
    EXPECT_EQ(agent.Stop(SIGTERM, 90), 0) << agent.Output();
    EXPECT_EQ(agent.Output().find("stay in the spool"), std::string::npos) << agent.Output();
    const uint64_t samples = AgentSampleCount(agent.Output());
    EXPECT_GT(samples, 0u) << agent.Output();
    return samples;
  }

  strata::testing::TempDir dir_{"strata_e2e_faults"};
  std::unique_ptr<ChildProcess> demo_;
};

class AgentKillTest : public FaultsTest, public ::testing::WithParamInterface<bool> {};

// Killed during a server outage, restarted, the server back: every spooled batch arrives
// once. With the parameter set, the newest spool record is cut as by a crash in the middle
// of its write: that batch is skipped (and reported), every other one arrives.
TEST_P(AgentKillTest, KilledDuringAnOutageDeliversItsSpoolAfterARestart) {
  const bool torn = GetParam();
  const int port = ReservePort();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto first = StartAgent(address, "fault-outage", "agent1.log");
  ASSERT_TRUE(WaitUntil([&] { return BatchLines(first->Output(), "spooled").size() >= 4; }, 60))
      << first->Output();
  first->Stop(SIGKILL);
  const auto spooled = BatchLines(first->Output(), "spooled");
  if (torn) {
    fs::path newest;
    for (const auto& e : fs::directory_iterator(dir_.File("spool") + "/given/fault-outage")) {
      const std::string name = e.path().filename().string();
      if (name.rfind("batches-", 0) == 0 && (newest.empty() || e.path() > newest)) newest = e.path();
    }
    ASSERT_FALSE(newest.empty());
    ASSERT_GT(fs::file_size(newest), 17u);  // the magic and at least one record header
    fs::resize_file(newest, fs::file_size(newest) - 3);
  }

  auto second = StartAgent(address, "fault-outage", "agent2.log");
  ASSERT_TRUE(second->WaitForOutput("resuming as agent fault-outage", 30)) << second->Output();
  // The agent lists the batches it recovered after that line: wait for all it announced.
  std::smatch announced;
  const std::string resumed_log = second->Output();
  ASSERT_TRUE(std::regex_search(resumed_log, announced,
                                std::regex("resuming as agent fault-outage [^:]*: ([0-9]+) batches")))
      << resumed_log;
  const size_t batches = std::stoul(announced[1].str());
  ASSERT_TRUE(WaitUntil(
      [&] { return BatchLines(second->Output(), "recovered").size() >= batches; }, 30))
      << second->Output();
  const auto recovered = BatchLines(second->Output(), "recovered");
  // Every batch the first run logged as spooled came back (one more may have been spooled
  // and killed before its log line), except the torn one.
  size_t logged_and_recovered = 0;
  for (const auto& [seq, samples] : spooled) {
    auto it = recovered.find(seq);
    if (it == recovered.end()) continue;
    EXPECT_EQ(it->second, samples) << seq;
    ++logged_and_recovered;
  }
  EXPECT_GE(logged_and_recovered + (torn ? 1 : 0), spooled.size()) << second->Output();
  if (torn) {
    EXPECT_TRUE(second->WaitForOutput("skipped 1 torn or corrupt records", 10)) << second->Output();
  }

  auto server = StartServer(address, "server.log");
  ASSERT_TRUE(second->WaitForOutput("connected to strata-server", 60)) << second->Output();
  // The agent's health reaches the operator: a spool on disk, and the torn record counted.
  CommandResult agents;
  ASSERT_TRUE(WaitUntil(
      [&] {
        agents = RunCommand({BinPath("strata"), "--server", address, "--json", "agents"});
        return agents.output.find("\"spool_on_disk\": true") != std::string::npos;
      },
      30))
      << agents.output;
  EXPECT_NE(agents.output.find(torn ? "\"spool_corrupt_records\": \"1\""
                                    : "\"spool_corrupt_records\": \"0\""),
            std::string::npos)
      << agents.output;
  // And the size of its call graph, which a long-lived agent may grow to the server's limits.
  EXPECT_NE(agents.output.find("\"graph_edges\": \""), std::string::npos) << agents.output;
  EXPECT_EQ(agents.output.find("\"graph_edges\": \"0\""), std::string::npos) << agents.output;
  // The spooled batches, and then samples of the second run's own: it may connect before it
  // has found its target (StopAndCount expects it to have sampled).
  ASSERT_TRUE(WaitUntil([&] { return ServiceTotal(address, kService) > Sum(recovered); }, 60))
      << second->Output();
  const uint64_t counted = StopAndCount(*second);
  ExpectExact(address, Sum(recovered) + counted);
}

INSTANTIATE_TEST_SUITE_P(Spool, AgentKillTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "TornRecord" : "Whole"; });

// An agent whose call graph passes half of the server's graph limits starts again with a
// new graph (at a limit its deltas would be refused and it would deliver nothing more): the
// same process and agent ID (here a generated one), a new incarnation, nothing lost on the
// way. The server takes 48 edges: the demo's graph passes 24 within seconds (25-28 edges
// when the agent started again, 3-10 s in), and needs about 30 s to reach 40.
TEST_F(FaultsTest, AnAgentPastHalfOfTheGraphLimitsStartsANewGraphAndLosesNothing) {
  const int port = ReservePort();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto server = StartServer(address, "server.log", {"--max-graph-edges", "48"});
  auto agent = StartAgent(address, "", "agent.log");
  const auto count = [&](const std::string& what) {
    const std::string log = agent->Output();
    size_t n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return n;
  };
  // Started again, connected, and shipping under the new graph.
  ASSERT_TRUE(WaitUntil(
      [&] {
        const std::string log = agent->Output();
        const size_t again = log.find("starting again with a new graph");
        return again != std::string::npos &&
               log.find("spooled batch 2 ", again) != std::string::npos;
      },
      120))
      << agent->Output();
  uint64_t counted = 0;
  EXPECT_EQ(agent->Stop(SIGTERM, 90), 0) << agent->Output();
  // Each run's "stopping: N samples": the first runs' batches were all acknowledged before
  // they started again.
  const std::string log = agent->Output();
  for (size_t at = log.find("stopping: "); at != std::string::npos;
       at = log.find("stopping: ", at + 1)) {
    counted += AgentSampleCount(log.substr(at));
  }
  EXPECT_EQ(log.find("stay in the spool"), std::string::npos) << log;
  EXPECT_GE(count("connected to strata-server"), 2u) << log;
  // One agent ID for every run of the process, and a graph of its own for each.
  std::set<std::string> ids;
  const std::regex started("strata-agent (\\S+) on ");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), started);
       it != std::sregex_iterator(); ++it) {
    ids.insert((*it)[1].str());
  }
  ASSERT_EQ(ids.size(), 1u) << log;
  const std::string id = *ids.begin();
  const std::string server_log = server->Output();
  std::set<std::string> graphs, agents;
  const std::regex connected("agent (\\S+) connected \\([^)]*graph ([0-9a-f]+)");
  for (auto it = std::sregex_iterator(server_log.begin(), server_log.end(), connected);
       it != std::sregex_iterator(); ++it) {
    agents.insert((*it)[1].str());
    graphs.insert((*it)[2].str());
  }
  EXPECT_EQ(agents, std::set<std::string>{id}) << server_log;
  // Runs that connected (the graph can pass half again within a second, and the stop can
  // come before the next run connects).
  size_t connected_runs = 0;
  const std::string start = "strata-agent " + id + " on ";
  for (size_t at = log.find(start); at != std::string::npos;) {
    const size_t next = log.find(start, at + 1);
    const size_t connect = log.find("connected to strata-server", at);
    connected_runs += connect < next;
    at = next;
  }
  EXPECT_EQ(graphs.size(), connected_runs) << server_log << log;
  ExpectExact(address, counted);
}

// A stop signal sent as the agent starts again for a new graph (the new run needs a few
// hundred milliseconds before it handles signals) stops it cleanly: status 0, nothing left in
// the spool, every sample counted once.
TEST_F(FaultsTest, AStopWhileTheAgentStartsAgainStopsItCleanly) {
  const int port = ReservePort();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto server = StartServer(address, "server.log", {"--max-graph-edges", "48"});
  auto agent = StartAgent(address, "fault-stop-restart", "agent.log");
  ASSERT_TRUE(agent->WaitForOutput("starting again with a new graph", 120)) << agent->Output();
  EXPECT_EQ(agent->Stop(SIGTERM, 90), 0) << agent->Output();
  const std::string log = agent->Output();
  EXPECT_EQ(log.find("stay in the spool"), std::string::npos) << log;
  uint64_t counted = 0;
  for (size_t at = log.find("stopping: "); at != std::string::npos;
       at = log.find("stopping: ", at + 1)) {
    counted += AgentSampleCount(log.substr(at));
  }
  ExpectExact(address, counted);
}

// Killed while connected and shipping: batches acknowledged, in flight, applied but not
// acknowledged, spooled but not sent. The restart resends what the server lacks; the server
// applies each batch once.
TEST_F(FaultsTest, AgentKilledWhileShippingLosesNothingAndCountsNothingTwice) {
  ServerProcess server(dir_.File("data"), dir_.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  // Batches by (incarnation, sequence): a run that had nothing left to deliver starts a new
  // incarnation (new graph, sequence numbers from 1); one that resumed continues the last.
  std::map<std::pair<int, uint64_t>, uint64_t> spooled;
  int incarnation = 0;
  auto take = [&](const std::string& log, const std::string& verb) {
    for (const auto& [seq, samples] : BatchLines(log, verb)) spooled[{incarnation, seq}] = samples;
  };
  for (int run = 0; run < 4; ++run) {
    auto agent = StartAgent(server.address(), "fault-shipping", absl::StrCat("agent", run, ".log"));
    ASSERT_TRUE(agent->WaitForOutput("strata-agent fault-shipping", 30)) << agent->Output();
    if (agent->Output().find("resuming as agent") == std::string::npos) ++incarnation;
    if (run == 3) {
      ASSERT_TRUE(agent->WaitForOutput("connected to strata-server", 60)) << agent->Output();
      ASSERT_TRUE(WaitUntil([&] { return BatchLines(agent->Output(), "spooled").size() >= 2; }, 60));
      take(agent->Output(), "recovered");
      const uint64_t counted = StopAndCount(*agent);
      uint64_t expected = counted;
      for (const auto& [key, samples] : spooled) expected += samples;
      ExpectExact(server.address(), expected);
      break;
    }
    // Killed at different points: soon after connecting, and later.
    const uint64_t before = ServiceTotal(server.address(), kService);
    ASSERT_TRUE(WaitUntil(
        [&] {
          return BatchLines(agent->Output(), "spooled").size() >= 3u + run &&
                 ServiceTotal(server.address(), kService) > before;
        },
        60))
        << agent->Output();
    agent->Stop(SIGKILL);
    take(agent->Output(), "recovered");
    take(agent->Output(), "spooled");
  }
}

// The server killed with SIGKILL three times under three agents, restarted each time on the
// same data and port: every sample every agent counted is stored once.
TEST_F(FaultsTest, ServerKilledAgainAndAgainUnderSeveralAgents) {
  const int port = ReservePort();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto server = StartServer(address, "server0.log");
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 3; ++i) {
    agents.push_back(StartAgent(address, absl::StrCat("fault-fleet-", i), absl::StrCat("agent", i, ".log")));
  }
  for (int kill = 1; kill <= 3; ++kill) {
    const uint64_t before = ServiceTotal(address, kService);
    ASSERT_TRUE(WaitUntil([&] { return ServiceTotal(address, kService) > before; }, 60));
    server->Stop(SIGKILL);
    server = StartServer(address, absl::StrCat("server", kill, ".log"));
  }
  ASSERT_TRUE(WaitUntil([&] { return ServiceTotal(address, kService) > 0; }, 60));
  uint64_t counted = 0;
  for (auto& agent : agents) counted += StopAndCount(*agent);
  ExpectExact(address, counted);
}

// The first server in the agent's list sits behind a dead link (its SYNs go unanswered): the
// connection attempt ends at its deadline (10 s, a gRPC timer the agent's shipper runs) and
// the agent goes on to the next server, which gets every sample.
TEST_F(FaultsTest, AFirstServerThatNeverAnswersIsLeftForTheNext) {
  strata::testing::SilentPort silent;
  ASSERT_GT(silent.port(), 0);
  const int port = ReservePort();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const std::string dead = "127.0.0.1:" + std::to_string(silent.port());
  auto server = StartServer(address, "server.log");
  const auto start = std::chrono::steady_clock::now();
  auto agent = StartAgent(dead + "," + address, "fault-dead-link", "agent.log");
  ASSERT_TRUE(agent->WaitForOutput("connected to strata-server at " + address, 60))
      << agent->Output();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("faults: connected to the second server %.1f s after the agent started\n",
              seconds);
  EXPECT_NE(agent->Output().find("cannot connect to strata-server at " + dead), std::string::npos)
      << agent->Output();
  ASSERT_TRUE(WaitUntil([&] { return ServiceTotal(address, kService) > 0; }, 60));
  const uint64_t counted = StopAndCount(*agent);
  ExpectExact(address, counted);
}

// An agent in its own network namespace behind a veth pair: a slow link (netem delay,
// jitter and loss both ways where the kernel has sch_netem, else a 512 kbit/s token bucket),
// then cut off for a while (the link down) and healed.
TEST_F(FaultsTest, SlowLossyAndPartitionedLinkLosesNothing) {
  const std::string tag = std::to_string(getpid() % 100000);
  const std::string ns = "sfault" + tag, host_if = "sfh" + tag, ns_if = "sfn" + tag;
  const std::string subnet = absl::StrCat("10.", 200 + getpid() % 50, ".", getpid() % 250);
  const std::string host_ip = subnet + ".1", ns_ip = subnet + ".2";
  const std::string ip = "/usr/sbin/ip", tc = "/usr/sbin/tc";
  if (RunCommand({ip, "netns", "add", ns}).exit_code != 0) {
    GTEST_SKIP() << "cannot create a network namespace (needs root and iproute2)";
  }
  struct Cleanup {
    std::string ip, ns, host_if;
    ~Cleanup() {
      RunCommand({ip, "link", "del", host_if});
      RunCommand({ip, "netns", "del", ns});
    }
  } cleanup{ip, ns, host_if};
  auto run = [](std::vector<std::string> argv) {
    CommandResult r = RunCommand(argv);
    std::string line;
    for (const auto& a : argv) line += a + " ";
    EXPECT_EQ(r.exit_code, 0) << line << ": " << r.output;
    return r.exit_code == 0;
  };
  const std::vector<std::string> in_ns = {ip, "netns", "exec", ns};
  auto inside = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), in_ns.begin(), in_ns.end());
    return argv;
  };
  ASSERT_TRUE(run({ip, "link", "add", host_if, "type", "veth", "peer", "name", ns_if}));
  ASSERT_TRUE(run({ip, "link", "set", ns_if, "netns", ns}));
  ASSERT_TRUE(run({ip, "addr", "add", host_ip + "/30", "dev", host_if}));
  ASSERT_TRUE(run({ip, "link", "set", host_if, "up"}));
  ASSERT_TRUE(run(inside({ip, "addr", "add", ns_ip + "/30", "dev", ns_if})));
  ASSERT_TRUE(run(inside({ip, "link", "set", ns_if, "up"})));
  ASSERT_TRUE(run(inside({ip, "link", "set", "lo", "up"})));
  // Both directions slow (and lossy where netem exists).
  const std::vector<std::string> netem = {"netem", "delay", "40ms", "10ms", "loss", "5%"};
  const std::vector<std::string> tbf = {"tbf", "rate", "512kbit", "burst", "16kb", "latency",
                                        "200ms"};
  std::vector<std::string> qdisc = netem;
  std::vector<std::string> probe = {tc, "qdisc", "add", "dev", host_if, "root"};
  probe.insert(probe.end(), netem.begin(), netem.end());
  if (RunCommand(probe).exit_code != 0) {
    std::printf("kernel without sch_netem: the link is slow (512 kbit/s) and partitioned, "
                "not lossy\n");
    qdisc = tbf;
    std::vector<std::string> add = {tc, "qdisc", "add", "dev", host_if, "root"};
    add.insert(add.end(), tbf.begin(), tbf.end());
    ASSERT_TRUE(run(add));
  }
  std::vector<std::string> add_ns = {tc, "qdisc", "add", "dev", ns_if, "root"};
  add_ns.insert(add_ns.end(), qdisc.begin(), qdisc.end());
  ASSERT_TRUE(run(inside(add_ns)));

  const int port = ReservePort();
  ASSERT_GT(port, 0);
  const std::string address = host_ip + ":" + std::to_string(port);
  auto server = StartServer(address, "server.log");
  auto agent = StartAgent(address, "fault-net", "agent.log", in_ns);
  ASSERT_TRUE(agent->WaitForOutput("connected to strata-server", 60)) << agent->Output();
  ASSERT_TRUE(WaitUntil([&] { return ServiceTotal(address, kService) > 0; }, 60));
  // Cut off for ten batches, then healed.
  ASSERT_TRUE(run({ip, "link", "set", host_if, "down"}));
  const size_t at_cut = BatchLines(agent->Output(), "spooled").size();
  ASSERT_TRUE(WaitUntil(
      [&] { return BatchLines(agent->Output(), "spooled").size() >= at_cut + 10; }, 60));
  ASSERT_TRUE(run({ip, "link", "set", host_if, "up"}));
  const uint64_t spooled = Sum(BatchLines(agent->Output(), "spooled"));
  ASSERT_TRUE(WaitUntil([&] { return ServiceTotal(address, kService) >= spooled; }, 120))
      << agent->Output();
  const uint64_t counted = StopAndCount(*agent);
  ExpectExact(address, counted);
}

// The server's disk fills up (a tmpfs the test mounts, larger than RocksDB's 64 MiB recovery
// reserve, then a file taking what is
// left) while a real agent and simulated ones ship: the store refuses writes, the batches
// are not acknowledged (UNAVAILABLE, retry later), queries are still answered; the file goes,
// the store resumes by itself, and every sample arrives once.
TEST_F(FaultsTest, DiskFullOnTheServerLosesNothingAndRecovers) {
  const std::string mount_point = dir_.File("disk");
  fs::create_directories(mount_point);
  if (RunCommand({"/usr/bin/mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", mount_point})
          .exit_code != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs (needs root)";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { RunCommand({"/usr/bin/umount", "-l", path}); }
  } unmount{mount_point};
  const int port = ReservePort();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto server = std::make_unique<ChildProcess>(
      std::vector<std::string>{BinPath("strata-server"), "--listen", address, "--http",
                               "127.0.0.1:0", "--data", mount_point + "/data"},
      dir_.File("server.log"));
  ASSERT_TRUE(server->WaitForOutput("ready on port", 30)) << server->Output();
  int http_port = 0;
  {
    const std::string out = server->Output();
    const size_t at = out.find("HTTP on port ") + std::string("HTTP on port ").size();
    ASSERT_TRUE(absl::SimpleAtoi(out.substr(at, out.find('\n', at) - at), &http_port)) << out;
  }
  EXPECT_EQ(strata::testing::HttpGet(http_port, "/readyz").first, 200);
  auto agent = StartAgent(address, "fault-disk", "agent.log");
  ASSERT_TRUE(WaitUntil([&] { return ServiceTotal(address, kService) > 0; }, 60));

  // Everything left on the disk taken, then writes until the store fails. The server writes
  // meanwhile: what was free when measured may be gone by the fallocate, so measure again.
  bool filled = false;
  for (int attempt = 0; attempt < 20 && !filled; ++attempt) {
    const fs::space_info space = fs::space(mount_point);
    filled = RunCommand({"/usr/bin/fallocate", "-l", std::to_string(space.available),
                         mount_point + "/fill" + std::to_string(attempt)})
                 .exit_code == 0;
  }
  ASSERT_TRUE(filled);
  ChildProcess load({BinPath("strata-loadgen"), "--server", address, "--agents", "8",
                     "--interval", "0.5", "--rate", "20000", "--contexts", "2000", "--duration",
                     "15", "--ramp-up", "0", "--max-backoff", "2", "--drain-timeout", "120",
                     "--query-every", "0", "--service-prefix", "diskfull"},
                    dir_.File("loadgen.log"));
  ASSERT_TRUE(server->WaitForOutput("store: writes fail", 60))
      << "server exit status " << server->Wait(0) << "\n" << server->Output();
  // Queries are still answered while the disk is full; the server says it is not ready.
  const uint64_t during = ServiceTotal(address, kService);
  EXPECT_GT(during, 0u);
  const auto not_ready = strata::testing::HttpGet(http_port, "/readyz");
  EXPECT_EQ(not_ready.first, 503) << not_ready.second;
  EXPECT_EQ(strata::testing::HttpGet(http_port, "/healthz").first, 200);  // alive
  ASSERT_TRUE(agent->WaitForOutput("server ends the stream", 60)) << agent->Output();

  for (int attempt = 0; attempt < 20; ++attempt) {
    fs::remove(mount_point + "/fill" + std::to_string(attempt));
  }
  ASSERT_TRUE(server->WaitForOutput("store: writes resumed", 60)) << server->Output();
  EXPECT_TRUE(WaitUntil(
      [&] { return strata::testing::HttpGet(http_port, "/readyz").first == 200; }, 60));
  EXPECT_EQ(load.Wait(240), 0) << load.Output();
  ASSERT_TRUE(WaitUntil([&] { return ServiceTotal(address, kService) > during; }, 60));
  const uint64_t counted = StopAndCount(*agent);
  ExpectExact(address, counted);
  EXPECT_TRUE(server->running()) << server->Output();
  // The aggregator's failures are logged once a minute, not at every 100 ms tick.
  const std::string log = server->Output();
  size_t failure_lines = 0;
  for (size_t at = log.find("closing aggregation windows ("); at != std::string::npos;
       at = log.find("closing aggregation windows (", at + 1)) {
    ++failure_lines;
  }
  EXPECT_LE(failure_lines, 3u) << log;
  // Refusals say why, also while RocksDB recovers on its own (its Busy carries no text).
  EXPECT_EQ(log.find("resuming failed: Resource busy"), std::string::npos) << log;
}

// An online backup while an agent ships, restored into a new directory: a server on it
// holds what the store held at the backup (between the totals before and after it). Both
// the backup's and the restored store's directories are made, with their parents.
TEST_F(FaultsTest, OnlineBackupRestoresIntoAWorkingStore) {
  auto server = std::make_unique<ServerProcess>(dir_.File("data"), dir_.File("server.log"));
  ASSERT_GT(server->port(), 0) << server->process().Output();
  const std::string address = server->address();
  auto agent = StartAgent(address, "fault-backup", "agent.log");
  ASSERT_TRUE(WaitUntil([&] { return ServiceTotal(address, kService) > 0; }, 60));
  const uint64_t before = ServiceTotal(address, kService);
  // Into directories that do not exist yet, parents included: they are made.
  const std::string backup_dir = dir_.File("backups/strata/1");
  CommandResult backup = RunCommand({BinPath("strata-server"), "backup", "--data",
                                     dir_.File("data"), "--to", backup_dir});
  ASSERT_EQ(backup.exit_code, 0) << backup.output;
  const uint64_t after = ServiceTotal(address, kService);
  StopAndCount(*agent);
  server->process().Stop(SIGTERM, 30);

  // Restoring over a store is refused; into a new directory it works.
  CommandResult refused = RunCommand({BinPath("strata-server"), "restore", "--from",
                                      backup_dir, "--data", dir_.File("data")});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("not empty"), std::string::npos) << refused.output;
  const std::string restored_dir = dir_.File("restored/strata");
  CommandResult restore = RunCommand({BinPath("strata-server"), "restore", "--from",
                                      backup_dir, "--data", restored_dir});
  ASSERT_EQ(restore.exit_code, 0) << restore.output;
  ServerProcess restored(restored_dir, dir_.File("restored.log"));
  ASSERT_GT(restored.port(), 0) << restored.process().Output();
  const uint64_t total = ServiceTotal(restored.address(), kService);
  EXPECT_GE(total, before);
  EXPECT_LE(total, after);
}

// The agent's wall clock stepped back an hour, then forward two (libfaketime, the monotonic
// clock left alone): batches keep going out every interval, none is refused, and every
// sample arrives once.
TEST_F(FaultsTest, AgentClockJumpsLoseNothing) {
  const std::string faketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
  if (!fs::exists(faketime)) GTEST_SKIP() << "libfaketime not installed (Debian libfaketime)";
  ServerProcess server(dir_.File("data"), dir_.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  const std::string offset_file = dir_.File("clock");
  auto set_offset = [&](const std::string& offset) {
    std::ofstream(offset_file + ".tmp") << offset << "\n";
    fs::rename(offset_file + ".tmp", offset_file);
  };
  set_offset("+0");
  ChildProcess agent(AgentArgs(server.address(), "fault-clock"), dir_.File("agent.log"),
                     {{"LD_PRELOAD", faketime},
                      {"FAKETIME_TIMESTAMP_FILE", offset_file},
                      {"FAKETIME_NO_CACHE", "1"},
                      {"FAKETIME_DONT_FAKE_MONOTONIC", "1"}});
  auto spooled = [&] { return BatchLines(agent.Output(), "spooled").size(); };
  ASSERT_TRUE(WaitUntil([&] { return spooled() >= 3; }, 60)) << agent.Output();
  for (const char* offset : {"-1h", "+1h", "+0"}) {
    set_offset(offset);
    const size_t at_jump = spooled();
    // Two intervals of 0.5 s, with room for a loaded machine.
    ASSERT_TRUE(WaitUntil([&] { return spooled() >= at_jump + 4; }, 30))
        << "clock " << offset << ": batches stopped\n" << agent.Output();
  }
  const uint64_t counted = StopAndCount(agent);
  EXPECT_EQ(agent.Output().find("rejected batch"), std::string::npos) << agent.Output();
  ExpectExact(server.address(), counted);
}

}  // namespace
}  // namespace strata::e2e
