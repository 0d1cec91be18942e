// Ad hoc captures end to end on loopback: real strata-server, the demo workload, a real
// strata-agent sampling with perf events, and the strata CLI.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/testing/cpu_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "strata/v1/capture.grpc.pb.h"
#include "strata/v1/query.grpc.pb.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

std::chrono::system_clock::time_point Deadline(int seconds) {
  return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
}

// A server, the demo service and an agent that profiles it continuously at 99 Hz with 1 s
// batches (the server learns the agent's targets from its batches).
class CaptureTest : public ::testing::Test {
 protected:
  void StartAll(std::vector<std::string> agent_flags = {},
                std::vector<std::string> server_flags = {}) {
    server_ = std::make_unique<ServerProcess>(dir_.File("data"), dir_.File("server.log"),
                                              server_flags);
    ASSERT_GT(server_->port(), 0) << server_->process().Output();
    demo_ = std::make_unique<ChildProcess>(std::vector<std::string>{BinPath("demo_service")},
                                           dir_.File("demo.log"),
                                           std::map<std::string, std::string>{
                                               {"STRATA_SERVICE", "demo"}});
    ASSERT_TRUE(demo_->WaitForOutput("ready", 30)) << demo_->Output();
    std::vector<std::string> argv = {BinPath("strata-agent"), "--server", server_->address(),
                                     "--pid", std::to_string(demo_->pid()), "--interval", "1",
                                     "--frequency", "99", "--host", "capture-host",
                                     "--spool-dir", dir_.File("spool")};
    argv.insert(argv.end(), agent_flags.begin(), agent_flags.end());
    agent_ = std::make_unique<ChildProcess>(argv, dir_.File("agent.log"));
    ASSERT_TRUE(WaitForTarget(20)) << agent_->Output();
  }

  bool WaitForTarget(double timeout_s) {
    auto stub = v1::Query::NewStub(server_->Channel());
    const std::string want = "demo/" + std::to_string(demo_->pid());
    const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (Clock::now() < end) {
      grpc::ClientContext context;
      context.set_deadline(Deadline(5));
      v1::ListAgentsResponse agents;
      if (stub->ListAgents(&context, v1::ListAgentsRequest(), &agents).ok()) {
        for (const auto& a : agents.agents()) {
          if (a.connected() && std::count(a.targets().begin(), a.targets().end(), want)) {
            return true;
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  std::vector<std::string> Cli(std::vector<std::string> args) {
    std::vector<std::string> argv = {BinPath("strata"), "--server", server_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  v1::HotPathsResponse HotPaths(const v1::ProfileFilter& filter) {
    auto stub = v1::Query::NewStub(server_->Channel());
    v1::HotPathsRequest request;
    *request.mutable_filter() = filter;
    request.set_limit(100000);
    grpc::ClientContext context;
    context.set_deadline(Deadline(30));
    v1::HotPathsResponse response;
    grpc::Status status = stub->HotPaths(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  // Runs a capture through the gRPC API, returning every progress message.
  std::vector<v1::CaptureProgress> RunCapture(const v1::RunCaptureRequest& request,
                                              grpc::Status* status) {
    auto stub = v1::Capture::NewStub(server_->Channel());
    grpc::ClientContext context;
    context.set_deadline(Deadline(60));
    auto reader = stub->Run(&context, request);
    std::vector<v1::CaptureProgress> out;
    v1::CaptureProgress p;
    while (reader->Read(&p)) out.push_back(p);
    *status = reader->Finish();
    return out;
  }

  std::string CaptureIdIn(const std::string& output) {
    std::smatch m;
    if (std::regex_search(output, m, std::regex("(cap-[0-9]{8}-[0-9]{6}-[0-9a-f]{4})"))) {
      return m[1];
    }
    return "";
  }

  strata::testing::TempDir dir_{"strata_capture_e2e"};
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<ChildProcess> demo_;
  std::unique_ptr<ChildProcess> agent_;
};

// A process's CPU time over wall-clock time, by the clock its samples are taken on (a
// cpu-clock counter per thread it has when the recorder starts), recorded every 20 ms by a
// thread of its own, so a test can tell how much CPU the process had in any interval it
// learns of later.
class CpuRecorder {
 public:
  explicit CpuRecorder(pid_t pid) {
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(
             "/proc/" + std::to_string(pid) + "/task", ec)) {
      clocks_.emplace_back(std::stoi(task.path().filename()));
    }
    EXPECT_FALSE(clocks_.empty()) << "no threads of " << pid << ": " << ec.message();
    thread_ = std::thread([this] { Run(); });
  }
  ~CpuRecorder() {
    stop_ = true;
    thread_.join();
  }
  // CPU nanoseconds between two Unix-ms times (the nearest recorded points).
  uint64_t CpuBetween(int64_t from_ms, int64_t to_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    return At(to_ms) - At(from_ms);
  }

 private:
  void Run() {
    while (!stop_) {
      const int64_t now = base::NowMs();
      uint64_t cpu = 0;
      for (const strata::testing::CpuClock& clock : clocks_) cpu += clock.ns();
      {
        std::lock_guard<std::mutex> lock(mu_);
        points_.emplace_back(now, cpu);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  uint64_t At(int64_t ms) const {
    auto it = std::lower_bound(points_.begin(), points_.end(), std::make_pair(ms, uint64_t{0}));
    if (it == points_.end()) return points_.empty() ? 0 : points_.back().second;
    return it->second;
  }

  std::vector<strata::testing::CpuClock> clocks_;
  std::mutex mu_;
  std::vector<std::pair<int64_t, uint64_t>> points_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The demo's hottest path, from its serve loop inwards.
constexpr char kTokenizePath[] = "serve_forever > handle_request > parse_request > tokenize";

TEST_F(CaptureTest, HighRateCaptureOfDemoHasItsHotPathsAndFiveTimesTheSamples) {
  // A generous budget: this test checks rates, the budget test checks the budget.
  ASSERT_NO_FATAL_FAILURE(StartAll({"--capture-cpu-budget", "50"}));

  // Start the capture half a second into a 10 s server window, and compare it with that
  // window's continuous profile as samples per second of the demo's CPU time: on a loaded
  // machine the demo gets more CPU in some seconds than in others.
  CpuRecorder demo_cpu(demo_->pid());
  const int64_t window_ms = 10'000;
  int64_t now = base::NowMs();
  int64_t window = (now / window_ms + 1) * window_ms;
  std::this_thread::sleep_until(std::chrono::system_clock::time_point(
      std::chrono::milliseconds(window + 500)));
  const auto started = Clock::now();
  CommandResult capture = RunCommand(
      Cli({"capture", "--service", "demo", "--duration", "5s", "--frequency", "499", "--format",
           "hot-paths", "--limit", "5"}),
      40);
  const double took_s = std::chrono::duration<double>(Clock::now() - started).count();
  ASSERT_EQ(capture.exit_code, 0) << capture.output << agent_->Output();
  EXPECT_THAT(capture.output, HasSubstr(kTokenizePath));
  EXPECT_THAT(capture.output, HasSubstr("Hot paths of capture cap-"));
  EXPECT_LT(took_s, 12) << capture.output;
  const std::string id = CaptureIdIn(capture.output);
  ASSERT_FALSE(id.empty()) << capture.output;

  // Let the window's continuous batches (1 s) arrive, then compare.
  std::this_thread::sleep_until(std::chrono::system_clock::time_point(
      std::chrono::milliseconds(window + window_ms + 2500)));
  v1::ProfileFilter capture_filter;
  capture_filter.set_capture_id(id);
  v1::HotPathsResponse captured = HotPaths(capture_filter);
  v1::ProfileFilter continuous_filter;
  continuous_filter.set_service("demo");
  continuous_filter.mutable_range()->set_from_ms(window);
  continuous_filter.mutable_range()->set_to_ms(window + window_ms);
  v1::HotPathsResponse continuous = HotPaths(continuous_filter);
  ASSERT_GT(continuous.total_samples(), 0u);
  auto capture_stub = v1::Capture::NewStub(server_->Channel());
  v1::GetCaptureRequest get;
  get.set_capture_id(id);
  v1::CaptureRecord record;
  grpc::ClientContext get_context;
  ASSERT_TRUE(capture_stub->Get(&get_context, get, &record).ok());
  ASSERT_GT(record.end_ms(), record.start_ms());
  const double capture_cpu_s = demo_cpu.CpuBetween(record.start_ms(), record.end_ms()) / 1e9;
  const double window_cpu_s = demo_cpu.CpuBetween(window, window + window_ms) / 1e9;
  ASSERT_GT(capture_cpu_s, 0.5);
  ASSERT_GT(window_cpu_s, 1.0);
  const double capture_rate = captured.total_samples() / capture_cpu_s;
  const double continuous_rate = continuous.total_samples() / window_cpu_s;
  const double ratio = capture_rate / continuous_rate;
  RecordProperty("capture_samples", std::to_string(captured.total_samples()));
  RecordProperty("continuous_window_samples", std::to_string(continuous.total_samples()));
  RecordProperty("ratio", std::to_string(ratio));
  std::printf("capture %s: %lu samples over %.2f s of the demo's CPU (%.0f/s) at 499 Hz; "
              "continuous: %lu samples over %.2f CPU s (%.0f/s) at 99 Hz; ratio %.2f\n",
              id.c_str(), static_cast<unsigned long>(captured.total_samples()), capture_cpu_s,
              capture_rate, static_cast<unsigned long>(continuous.total_samples()),
              window_cpu_s, continuous_rate, ratio);
  EXPECT_GE(ratio, 4.0);
  EXPECT_LE(ratio, 6.0);
  ASSERT_GT(captured.paths_size(), 0);
  std::vector<std::string> hottest;
  for (const auto& f : captured.paths(0).frames()) hottest.push_back(f.function());
  EXPECT_THAT(hottest, ::testing::IsSupersetOf({"serve_forever", "tokenize"}));
  // Capture samples stay out of the continuous profile's hot paths: the continuous count
  // is near 99 Hz x threads, not 600 Hz.
  EXPECT_LT(continuous_rate * 2, capture_rate);

  // Stored and listed; `capture show` prints metadata and the result.
  CommandResult list = RunCommand(Cli({"captures"}), 10);
  EXPECT_EQ(list.exit_code, 0) << list.output;
  EXPECT_THAT(list.output, HasSubstr(id));
  EXPECT_THAT(list.output, HasSubstr("finished"));
  CommandResult show = RunCommand(Cli({"capture", "show", id, "--format", "top"}), 10);
  EXPECT_EQ(show.exit_code, 0) << show.output;
  EXPECT_THAT(show.output, HasSubstr("target:    demo"));
  EXPECT_THAT(show.output, HasSubstr("tokenize"));

  // The agent saw the session start and end.
  EXPECT_THAT(agent_->Output(), HasSubstr("capture " + id + " started"));
  EXPECT_THAT(agent_->Output(), HasSubstr("capture " + id + " finished"));
}

TEST_F(CaptureTest, UnknownTargetsFailFast) {
  ASSERT_NO_FATAL_FAILURE(StartAll());
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--service", "no-such-service"}, "no connected agent profiles service 'no-such-service'"},
      {{"--host", "no-such-host", "--pid", "1"}, "no connected agent profiles host 'no-such-host'"},
      {{"--host", "capture-host", "--pid", "999999"}, "pid 999999"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"capture", "--duration", "5s"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const auto started = Clock::now();
    CommandResult r = RunCommand(Cli(args), 10);
    const double took_s = std::chrono::duration<double>(Clock::now() - started).count();
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message));
    EXPECT_LT(took_s, 4.0) << r.output;  // refused at once, not after the capture's 5 s
  }
  // Same through the API: NOT_FOUND.
  v1::RunCaptureRequest request;
  request.set_service("no-such-service");
  request.set_duration_ms(5000);
  grpc::Status status;
  RunCapture(request, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  // Bad requests are refused, the server keeps serving.
  request.set_service("demo");
  request.set_duration_ms(0);
  RunCapture(request, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_TRUE(server_->process().running());
}

TEST_F(CaptureTest, CtrlCCancelsOnEveryAgentAndASecondCaptureIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartAll());
  ChildProcess capture(Cli({"capture", "--service", "demo", "--duration", "30s"}),
                       dir_.File("capture.log"));
  // Non-terminal progress: one line a second naming the capture.
  ASSERT_TRUE(capture.WaitForOutput("samples", 10)) << capture.Output();
  const std::string id = CaptureIdIn(capture.Output());
  ASSERT_FALSE(id.empty()) << capture.Output();

  // One capture per agent at a time: the second is refused, naming the running one.
  CommandResult second = RunCommand(
      Cli({"capture", "--host", "capture-host", "--pid", std::to_string(demo_->pid()),
           "--duration", "2s"}),
      10);
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_THAT(second.output, HasSubstr("already running capture " + id));

  const auto interrupted = Clock::now();
  kill(capture.pid(), SIGINT);
  EXPECT_EQ(capture.Wait(10), 130) << capture.Output();
  const double took_s = std::chrono::duration<double>(Clock::now() - interrupted).count();
  EXPECT_LT(took_s, 5.0);
  EXPECT_THAT(capture.Output(), HasSubstr("capture " + id + " cancelled (Ctrl-C)"));
  // The agent ended the session on the server's StopCapture.
  EXPECT_TRUE(agent_->WaitForOutput("capture " + id + " stopped by the server", 5))
      << agent_->Output();

  // Ended once the agent's last batch is stored: everything it sampled until the stop is kept.
  auto stub = v1::Capture::NewStub(server_->Channel());
  v1::GetCaptureRequest get;
  get.set_capture_id(id);
  v1::CaptureRecord record;
  const auto ended_by = Clock::now() + std::chrono::seconds(15);
  do {
    grpc::ClientContext context;
    context.set_deadline(Deadline(10));
    ASSERT_TRUE(stub->Get(&context, get, &record).ok());
    if (!record.finished()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (!record.finished() && Clock::now() < ended_by);
  EXPECT_TRUE(record.finished());
  EXPECT_THAT(record.error(), HasSubstr("cancelled"));
  EXPECT_LT(record.end_ms() - record.start_ms(), 20'000);
  std::smatch sampled, kept;
  const std::string agent_log = agent_->Output();
  ASSERT_TRUE(std::regex_search(
      agent_log, sampled, std::regex("capture " + id + " stopped by the server: ([0-9]+) samples")))
      << agent_log;
  CommandResult show = RunCommand(Cli({"capture", "show", id, "--format", "top"}), 10);
  ASSERT_TRUE(std::regex_search(show.output, kept, std::regex("([0-9,]+) samples\\)")))
      << show.output;
  std::string kept_digits = kept[1];
  std::erase(kept_digits, ',');
  EXPECT_EQ(kept_digits, std::string(sampled[1])) << show.output;

  // The agent is free again: a new capture on it runs.
  CommandResult third =
      RunCommand(Cli({"capture", "--service", "demo", "--duration", "1s", "--format", "top"}), 20);
  EXPECT_EQ(third.exit_code, 0) << third.output;
  EXPECT_THAT(third.output, HasSubstr("tokenize"));

  // Cancelled from another terminal: the samples it took are printed, headed by how long it
  // ran of the length asked for.
  ChildProcess fourth(Cli({"capture", "--service", "demo", "--duration", "30s", "--format",
                           "top"}),
                      dir_.File("capture4.log"));
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!std::regex_search(fourth.Output(), std::regex("s  [1-9][0-9,]* samples")) &&
         Clock::now() < deadline) {
    ASSERT_TRUE(fourth.running()) << fourth.Output();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string fourth_id = CaptureIdIn(fourth.Output());
  CommandResult cancel = RunCommand(Cli({"capture", "cancel", fourth_id}), 10);
  EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
  EXPECT_EQ(fourth.Wait(15), 1) << fourth.Output();
  EXPECT_THAT(fourth.Output(), ::testing::ContainsRegex("\\(demo, [0-9.]+s of 30s at 499 Hz, "));
  // The result printed counts the agent's last batch, shipped after the stop: the capture
  // ends only once it is stored.
  std::smatch fourth_sampled, fourth_printed;
  ASSERT_TRUE(agent_->WaitForOutput("capture " + fourth_id + " stopped by the server", 5));
  const std::string log_now = agent_->Output();
  ASSERT_TRUE(std::regex_search(
      log_now, fourth_sampled,
      std::regex("capture " + fourth_id + " stopped by the server: ([0-9]+) samples")))
      << log_now;
  const std::string fourth_out = fourth.Output();
  ASSERT_TRUE(std::regex_search(fourth_out, fourth_printed,
                                std::regex("of 30s at 499 Hz, ([0-9,]+) samples")))
      << fourth_out;
  std::string printed_digits = fourth_printed[1];
  std::erase(printed_digits, ',');
  EXPECT_EQ(printed_digits, std::string(fourth_sampled[1])) << fourth_out;
}

TEST_F(CaptureTest, CpuBudgetLowersTheRate) {
  // 0.1 % of a core: any sampling exceeds it.
  ASSERT_NO_FATAL_FAILURE(StartAll({"--capture-cpu-budget", "0.1"}));
  v1::RunCaptureRequest request;
  request.set_service("demo");
  request.set_duration_ms(4000);
  request.set_frequency_hz(499);
  grpc::Status status;
  std::vector<v1::CaptureProgress> progress = RunCapture(request, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_FALSE(progress.empty());
  const v1::CaptureProgress& last = progress.back();
  EXPECT_TRUE(last.finished());
  EXPECT_TRUE(last.error().empty()) << last.error();
  ASSERT_EQ(last.agent_size(), 1);
  const uint32_t effective = last.agent(0).effective_frequency_hz();
  RecordProperty("effective_hz", std::to_string(effective));
  std::printf("budget 0.1 %%: requested 499 Hz, effective %u Hz, %lu samples\n", effective,
              static_cast<unsigned long>(last.samples()));
  EXPECT_GT(effective, 0u);
  EXPECT_LT(effective, 499u);
  EXPECT_THAT(agent_->Output(), HasSubstr("budget 0.10 %"));
}

TEST_F(CaptureTest, CapturesExpireAfterTheRetention) {
  ASSERT_NO_FATAL_FAILURE(StartAll({}, {"--capture-retention", "3s"}));
  CommandResult capture =
      RunCommand(Cli({"capture", "--service", "demo", "--duration", "1s", "--format", "top"}), 20);
  ASSERT_EQ(capture.exit_code, 0) << capture.output;
  const std::string id = CaptureIdIn(capture.output);
  ASSERT_FALSE(id.empty()) << capture.output;
  CommandResult listed = RunCommand(Cli({"captures"}), 10);
  EXPECT_THAT(listed.output, HasSubstr(id));
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  listed = RunCommand(Cli({"captures"}), 10);
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, ::testing::Not(HasSubstr(id)));
  CommandResult show = RunCommand(Cli({"capture", "show", id}), 10);
  EXPECT_EQ(show.exit_code, 1) << show.output;
  EXPECT_THAT(show.output, HasSubstr("older than the capture retention"));
}

}  // namespace
}  // namespace strata::e2e
