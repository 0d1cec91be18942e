// Profile types end to end: a real strata-server on loopback fed by an agent stream spoken
// with the generated stubs (graph, CPU and off-CPU batches), queried with the real strata
// CLI. CPU, off-CPU and wall queries see their own samples in raw windows and in the minute
// and hour rollups, after a restart too; a batch with a reserved label is refused without
// losing what was accepted; the pprof export carries the time of the profile's type.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "server/ingest/fake_agent.h"
#include "strata/v1/ingest.grpc.pb.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

using server::ingest::FakeAgent;

constexpr int64_t kHourMs = 3'600'000;

std::string Rfc3339(int64_t ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMillis(ms), absl::UTCTimeZone());
}

// One agent stream: Hello and Welcome, the FakeAgent's graph, then batches one at a time.
class AgentStream {
 public:
  AgentStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& agent_id,
              uint32_t frequency_hz)
      : stub_(v1::Ingest::NewStub(channel)) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stream_ = stub_->Connect(&context_);
    v1::AgentMessage m;
    v1::Hello* hello = m.mutable_hello();
    hello->set_agent_id(agent_id);
    hello->set_host("host-1");
    hello->set_arch("x86_64");
    hello->set_version("test");
    hello->set_graph_id(1);
    hello->set_frequency_hz(frequency_hz);
    EXPECT_TRUE(stream_->Write(m));
    v1::ServerMessage welcome;
    EXPECT_TRUE(stream_->Read(&welcome) && welcome.has_welcome()) << welcome.DebugString();
    welcome_ = welcome.welcome();
  }
  ~AgentStream() {
    stream_->WritesDone();
    v1::ServerMessage unread;
    while (stream_->Read(&unread)) {
    }
    (void)stream_->Finish();
  }
  void SendGraph(const FakeAgent& agent) {
    v1::AgentMessage m;
    *m.mutable_graph_delta() = agent.Delta(welcome_.known_nodes(), welcome_.known_edges());
    EXPECT_TRUE(stream_->Write(m));
  }
  // The server's Ack or IngestError for `batch`.
  v1::ServerMessage Send(const v1::SampleBatch& batch) {
    v1::AgentMessage m;
    *m.mutable_sample_batch() = batch;
    EXPECT_TRUE(stream_->Write(m));
    v1::ServerMessage answer;
    while (stream_->Read(&answer)) {
      if (answer.has_ack() || answer.has_error()) return answer;
    }
    ADD_FAILURE() << "the stream ended";
    return answer;
  }

 private:
  std::unique_ptr<v1::Ingest::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>> stream_;
  v1::Welcome welcome_;
};

class ProfileTypesE2eTest : public ::testing::Test {
 protected:
  void Start() {
    server_ = std::make_unique<ServerProcess>(
        dir_.path() + "/data", absl::StrCat(dir_.path(), "/server-", starts_++, ".log"));
    ASSERT_NE(server_->port(), 0) << server_->process().Output();
  }
  void Restart() {
    server_->process().Stop();
    Start();
  }
  CommandResult Cli(std::vector<std::string> args) {
    std::vector<std::string> argv{BinPath("strata"), "--server", server_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(std::move(argv));
  }
  // total_samples of `strata top --type TYPE` over [from, to).
  uint64_t Total(const std::string& type, int64_t from_ms, int64_t to_ms) {
    CommandResult r = Cli({"--json", "top", "-s", "svc", "--type", type, "--from",
                           Rfc3339(from_ms), "--to", Rfc3339(to_ms)});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::smatch m;
    if (!std::regex_search(r.output, m, std::regex(R"("total_samples":\s*"?(\d+))"))) {
      ADD_FAILURE() << r.output;
      return 0;
    }
    return std::stoull(m[1]);
  }
  // A batch of target 1 (service "svc") in the window at `start_ms`.
  static v1::SampleBatch Batch(uint64_t sequence, const FakeAgent& agent, int64_t start_ms,
                               std::vector<v1::ContextCount> contexts,
                               v1::ProfileType profile = v1::PROFILE_CPU) {
    v1::SampleBatch b = server::ingest::Batch(sequence, agent.graph.num_edges(),
                                              std::move(contexts));
    b.mutable_targets(0)->set_service("svc");
    b.set_start_ms(start_ms);
    b.set_end_ms(start_ms + 10'000);
    b.set_profile(profile);
    return b;
  }

  strata::testing::TempDir dir_{"profile_types_e2e"};
  std::unique_ptr<ServerProcess> server_;
  int starts_ = 0;
};

TEST_F(ProfileTypesE2eTest, TypesAreSeparateProfilesThroughRollupsAndRestarts) {
  Start();
  // Two hours ago, five minutes into the hour: whole-hour and whole-minute ranges around the
  // batches read the rollups.
  const int64_t hour = (base::NowMs() / kHourMs - 2) * kHourMs;
  const int64_t window = hour + 5 * 60'000;
  FakeAgent agent;
  agent.Function("schedule", "[kernel.kallsyms]");
  auto cpu = agent.Context({"main", "work"}, 30);
  auto off_cpu = agent.Context({"main", "wait", "schedule"}, 70);
  {
    AgentStream stream(server_->Channel(), "agent-1", 100);
    stream.SendGraph(agent);
    v1::ServerMessage answer = stream.Send(Batch(1, agent, window, {cpu}));
    ASSERT_TRUE(answer.has_ack()) << answer.DebugString();
    answer = stream.Send(Batch(2, agent, window, {off_cpu}, v1::PROFILE_OFF_CPU));
    ASSERT_TRUE(answer.has_ack()) << answer.DebugString();

    // An agent may not name the profile type itself, nor use any other reserved key.
    v1::SampleBatch forged = Batch(3, agent, window, {cpu});
    (*forged.mutable_targets(0)->mutable_labels())["__x"] = "1";
    answer = stream.Send(forged);
    ASSERT_TRUE(answer.has_error()) << answer.DebugString();
    EXPECT_EQ(answer.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_NE(answer.error().message().find("reserved"), std::string::npos)
        << answer.error().message();
    // The stream goes on; a later CPU batch adds to what was accepted.
    answer = stream.Send(Batch(4, agent, window + 10'000, {agent.Context({"main", "work"}, 5)}));
    ASSERT_TRUE(answer.has_ack()) << answer.DebugString();
  }

  const int64_t raw_from = window, raw_to = window + 20'000;
  EXPECT_EQ(Total("cpu", raw_from, raw_to), 35u);
  EXPECT_EQ(Total("off-cpu", raw_from, raw_to), 70u);
  EXPECT_EQ(Total("wall", raw_from, raw_to), 105u);

  CommandResult paths = Cli({"hot-paths", "-s", "svc", "--type", "off-cpu", "--from",
                             Rfc3339(raw_from), "--to", Rfc3339(raw_to)});
  EXPECT_EQ(paths.exit_code, 0) << paths.output;
  // Kernel frames are marked.
  EXPECT_NE(paths.output.find("main > wait > schedule [k]"), std::string::npos) << paths.output;
  EXPECT_EQ(paths.output.find("main > work"), std::string::npos) << paths.output;

  CommandResult top = Cli({"top", "-s", "svc", "--type", "wall", "--from", Rfc3339(raw_from),
                          "--to", Rfc3339(raw_to)});
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_NE(top.output.find("schedule [k]"), std::string::npos) << top.output;
  EXPECT_NE(top.output.find("work "), std::string::npos) << top.output;

  CommandResult bad = Cli({"top", "-s", "svc", "--type", "gpu"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--type"), std::string::npos) << bad.output;

  // pprof: counts, and the off-CPU time at the rate the agent said in its Hello (the server
  // knows it while it runs): 70 periods at 100 Hz are 700 ms.
  const std::string out = dir_.path() + "/off-cpu.pb.gz";
  CommandResult exported = Cli({"export", "-s", "svc", "--type", "off-cpu", "-o", out, "--from",
                                Rfc3339(raw_from), "--to", Rfc3339(raw_to)});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  if (RunCommand({"/bin/sh", "-c", "command -v go"}).exit_code == 0) {
    CommandResult pprof = RunCommand(
        {"/usr/bin/env", "HOME=" + dir_.path(), "GOCACHE=" + dir_.path() + "/gocache", "go",
         "tool", "pprof", "-top", "-sample_index=off-cpu", "-symbolize=none", out},
        120);
    ASSERT_EQ(pprof.exit_code, 0) << pprof.output;
    EXPECT_NE(pprof.output.find("Type: off-cpu"), std::string::npos) << pprof.output;
    EXPECT_NE(pprof.output.find("700ms"), std::string::npos) << pprof.output;
  } else {
    std::printf("go is not installed: the pprof file is not read back\n");
  }

  // After a restart every count is in the store; the minute and hour rollups keep the split.
  Restart();
  for (auto [from, to] : {std::pair{raw_from, raw_to}, std::pair{window, window + 60'000},
                          std::pair{hour, hour + kHourMs}}) {
    SCOPED_TRACE(absl::StrCat(Rfc3339(from), " .. ", Rfc3339(to)));
    EXPECT_EQ(Total("cpu", from, to), 35u);
    EXPECT_EQ(Total("off-cpu", from, to), 70u);
    EXPECT_EQ(Total("wall", from, to), 105u);
  }
}

// Stack quality from stored stacks with known truncation and unnamed frames, and the agents'
// unwinding counters persisted with their batches (still there after a restart).
TEST_F(ProfileTypesE2eTest, QualityReportsStacksAndAgentCounters) {
  Start();
  const int64_t window = (base::NowMs() / kHourMs - 1) * kHourMs;
  FakeAgent agent;
  agent.Function("main", "/usr/bin/app", "\xab\xcd\x01");
  agent.Function("work", "/usr/bin/app", "\xab\xcd\x01");
  agent.Function("libc.so.6+0x1234", "/usr/lib/x86_64-linux-gnu/libc.so.6", "123456");
  auto complete = agent.Context({"main", "work"}, 6);
  auto truncated = agent.Context({"libc.so.6+0x1234", "work"}, 4, /*truncated=*/true);
  {
    AgentStream stream(server_->Channel(), "agent-q", 99);
    stream.SendGraph(agent);
    v1::SampleBatch b = Batch(1, agent, window, {complete, truncated});
    v1::UnwindCounters* u = b.add_unwind();
    u->set_target_id(1);
    u->set_stacks(10);
    u->set_truncated(4);
    u->set_verify_failures(2);
    u->set_jit_frames_cfi(3);
    u->set_jit_frames_fp(1);
    u->set_lost(5);
    v1::ServerMessage answer = stream.Send(b);
    ASSERT_TRUE(answer.has_ack()) << answer.DebugString();
    // Counters of a target the batch does not name are refused with the batch.
    v1::SampleBatch bad = Batch(2, agent, window, {complete});
    bad.add_unwind()->set_target_id(9);
    answer = stream.Send(bad);
    ASSERT_TRUE(answer.has_error()) << answer.DebugString();
  }
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run == 0 ? "running" : "after a restart");
    if (run == 1) Restart();
    CommandResult r = Cli({"--json", "quality", "-s", "svc", "--from", Rfc3339(window), "--to",
                           Rfc3339(window + 60'000)});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto field = [&](const std::string& name) {
      std::smatch m;
      EXPECT_TRUE(std::regex_search(r.output, m,
                                    std::regex("\"" + name + R"(":\s*"?([0-9.]+))")))
          << name << ": " << r.output;
      return m.empty() ? std::string() : std::string(m[1]);
    };
    EXPECT_EQ(field("samples"), "10");
    EXPECT_EQ(field("truncated_samples"), "4");
    EXPECT_EQ(field("complete_pct"), "60");
    EXPECT_EQ(field("frames"), "20");
    EXPECT_EQ(field("unnamed_frames"), "4");
    EXPECT_EQ(field("unnamed_pct"), "20");
    EXPECT_EQ(field("max_truncated_depth"), "2");
    EXPECT_EQ(field("agent_stacks"), "10");
    EXPECT_EQ(field("agent_truncated"), "4");
    EXPECT_EQ(field("verify_failures"), "2");
    EXPECT_EQ(field("jit_frames_cfi"), "3");
    EXPECT_EQ(field("jit_frames_fp"), "1");
    EXPECT_EQ(field("lost_samples"), "5");
    EXPECT_NE(r.output.find("/usr/lib/debug/.build-id/12/3456.debug"), std::string::npos)
        << r.output;

    CommandResult table = Cli({"quality", "-s", "svc", "--from", Rfc3339(window), "--to",
                               Rfc3339(window + 60'000)});
    ASSERT_EQ(table.exit_code, 0) << table.output;
    // The binary with unnamed frames comes first.
    const size_t libc = table.output.find("/usr/lib/x86_64-linux-gnu/libc.so.6");
    EXPECT_NE(libc, std::string::npos) << table.output;
    EXPECT_LT(libc, table.output.find("/usr/bin/app")) << table.output;
    EXPECT_NE(table.output.find("agents            10 stacks, 4 truncated"), std::string::npos)
        << table.output;
    if (run == 1) continue;
    // Narrowed to the complete stacks: the stack figures follow the selection, the agents'
    // counters (kept per batch) stay the whole service's, and the line says so.
    CommandResult narrowed = Cli({"quality", "-s", "svc", "--focus", "^main$", "--from",
                                  Rfc3339(window), "--to", Rfc3339(window + 60'000)});
    ASSERT_EQ(narrowed.exit_code, 0) << narrowed.output;
    EXPECT_NE(narrowed.output.find(", 6 samples)"), std::string::npos) << narrowed.output;
    EXPECT_NE(narrowed.output.find("agents            (the whole service's) 10 stacks, 4 "
                                   "truncated"),
              std::string::npos)
        << narrowed.output;
  }
}

}  // namespace
}  // namespace strata::e2e
