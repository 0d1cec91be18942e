#include "agent/app/agent_flags.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "agent/app/agent_app.h"
#include "gtest/gtest.h"

namespace strata::agent::app {
namespace {

// The options a command line gives (after CLI11 has parsed it).
absl::StatusOr<AgentOptions> OptionsOf(std::vector<std::string> args) {
  CLI::App cli;
  AgentFlags flags;
  AddAgentFlags(cli, flags);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  cli.parse(args);
  return AgentOptionsFromFlags(flags);
}

TEST(AgentFlagsTest, SomethingToProfileIsRequired) {
  auto options = OptionsOf({});
  ASSERT_FALSE(options.ok());
  EXPECT_NE(options.status().message().find("nothing to profile"), std::string::npos);
}

TEST(AgentFlagsTest, FillsEveryComponentsOptions) {
  auto options = OptionsOf({"--pid", "42", "--service", "api=^api$", "--server",
                            "n1:7070, n2:7070", "--host", "h1", "--label", "region=eu",
                            "--frequency", "49", "--interval", "2.5", "--spool-dir", "none",
                            "--spool-max-bytes", "32MiB", "--capture-cpu-budget", "10",
                            "--unwind-verify", "boundary", "--flush-timeout", "1",
                            "--python-capture", "off"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->profiler.pids, std::vector<pid_t>{42});
  EXPECT_EQ(options->profiler.service_rules.size(), 1u);
  EXPECT_EQ(options->profiler.frequency_hz, 49u);
  EXPECT_EQ(options->profiler.unwind_verify, unwind::VerifyMode::kBoundary);
  EXPECT_EQ(options->profiler.python_capture, ProfilerOptions::PythonCapture::kOff);
  EXPECT_EQ(options->shipper.servers, (std::vector<std::string>{"n1:7070", "n2:7070"}));
  EXPECT_EQ(options->shipper.host, "h1");
  EXPECT_EQ(options->shipper.frequency_hz, 49u);
  EXPECT_EQ(options->shipper.labels.at("region"), "eu");
  EXPECT_EQ(options->spool.spool.dir, "");
  EXPECT_EQ(options->spool.spool.max_bytes, 32u << 20);
  EXPECT_EQ(options->spool.spool.segment_bytes, 2u << 20);
  EXPECT_TRUE(options->spool.spool.adopt);  // no --agent-id
  EXPECT_FALSE(options->spool.memory_fallback);
  EXPECT_DOUBLE_EQ(options->captures.cpu_budget, 0.1);
  EXPECT_EQ(options->interval, absl::Milliseconds(2500));
  EXPECT_EQ(options->flush_timeout, absl::Seconds(1));
}

TEST(AgentFlagsTest, MaxFramesBoundsTheUnwoundStack) {
  auto options = OptionsOf({"--pid", "1"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->profiler.max_frames, 256u);
  options = OptionsOf({"--pid", "1", "--max-frames", "600"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->profiler.max_frames, 600u);
  for (const char* out_of_range : {"0", "15", "1025", "-1", "many"}) {
    EXPECT_THROW(OptionsOf({"--pid", "1", "--max-frames", out_of_range}), CLI::ParseError)
        << out_of_range;
  }
}

// An unknown level would silence every line (spdlog's "off"), the warnings with it.
TEST(AgentFlagsTest, AnUnknownLogLevelIsRefused) {
  EXPECT_TRUE(OptionsOf({"--pid", "1", "--log-level", "warn"}).ok());
  for (const char* level : {"verbose", "Info", ""}) {
    EXPECT_THROW(OptionsOf({"--pid", "1", "--log-level", level}), CLI::ParseError) << level;
  }
}

TEST(AgentFlagsTest, TheDefaultSpoolFallsBackToMemory) {
  auto options = OptionsOf({"--pid", "1", "--agent-id", "a1"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->profiler.python_capture, ProfilerOptions::PythonCapture::kAuto);
  EXPECT_EQ(options->spool.spool.dir, kDefaultSpoolDir);
  EXPECT_TRUE(options->spool.memory_fallback);
  EXPECT_EQ(options->spool.agent_id, "a1");
  EXPECT_FALSE(options->spool.spool.adopt);
}

TEST(AgentFlagsTest, ErrorsNameTheFlag) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--server", "n1:7070,"},
           {"--server", "n1:7070,n2:99999"},
           {"--server", "n1:7070,n2"},
           {"--spool-max-bytes", "lots"},
           {"--requests-metric", "127.0.0.1:9100/metrics#reqs"}}) {
    auto options = OptionsOf({"--pid", "1", flag, value});
    ASSERT_FALSE(options.ok()) << flag;
    EXPECT_NE(options.status().message().find(flag), std::string::npos)
        << options.status().message();
  }
}

// Refused as the flags are parsed, so that a config file's bad rule or label is named with its
// line, by --print-config too.
TEST(AgentFlagsTest, ServiceRulesAndLabelsAreCheckedAsTheyAreParsed) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--label", "no-equals"}, {"--service", "no-regex"}, {"--service", "c=(unclosed"}}) {
    try {
      (void)OptionsOf({"--pid", "1", flag, value});
      ADD_FAILURE() << flag << " " << value << " was taken";
    } catch (const CLI::ParseError& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(OptionsOf({"--pid", "1", "--service", "c=^c$", "--label", "k=v"}).ok());
}

TEST(AgentFlagsTest, RequestsMetricsNameTheirServiceWhenSeveral) {
  auto one = OptionsOf({"--pid", "1", "--requests-metric", "http://127.0.0.1:9100/m#reqs"});
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->requests_metrics.size(), 1u);
  EXPECT_EQ(one->requests_metrics[0].port, 9100);
  EXPECT_EQ(one->requests_metrics[0].name, "reqs");
  EXPECT_FALSE(OptionsOf({"--pid", "1", "--requests-metric", "http://h:1/m#a",
                          "--requests-metric", "api=http://h:2/m#b"})
                   .ok());
  auto two = OptionsOf({"--pid", "1", "--requests-metric", "web=http://h:1/m#a",
                        "--requests-metric", "api=http://h:2/m#b"});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->requests_metrics[1].service, "api");
}

// A generated agent ID is the process's: the same on every call (and so after the process
// executes itself again, which keeps its pid and start time), another in another process.
TEST(GeneratedAgentIdTest, StaysWithTheProcessAndDiffersInAnother) {
  const std::string id = GeneratedAgentId("h1");
  ASSERT_EQ(id.size(), 3 + 8u) << id;
  EXPECT_EQ(id.substr(0, 3), "h1-");
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 3), std::string::npos) << id;
  EXPECT_EQ(GeneratedAgentId("h1"), id);
  EXPECT_EQ(GeneratedAgentId("h2"), "h2-" + id.substr(3));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string theirs = GeneratedAgentId("h1");
    _exit(write(fds[1], theirs.data(), theirs.size()) == static_cast<ssize_t>(theirs.size())
              ? 0
              : 1);
  }
  close(fds[1]);
  char buf[64];
  const ssize_t n = read(fds[0], buf, sizeof buf);
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_GT(n, 0);
  EXPECT_NE(std::string(buf, static_cast<size_t>(n)), id);
}

}  // namespace
}  // namespace strata::agent::app
