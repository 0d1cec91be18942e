// The documentation's runnable examples against a real server: strata-server on loopback
// (RocksDB in a temp dir, HTTP on), the demo workload as service `demo` and strata-agent on
// it, as deploy/quickstart.sh leaves them. Every ```sh runnable block of README.md and
// docs/**/*.md runs with bash -euo pipefail in a scratch directory, with the build's bin
// directory first on PATH, STRATA_SERVER set to the server's gRPC address and STRATA_HTTP to
// its HTTP base URL. A block that fails is reported as FILE:LINE of the failing command.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "tests/docs/runnable_blocks.h"
#include "tests/e2e/harness.h"

namespace strata::docs {
namespace {

using e2e::BinPath;
using e2e::ChildProcess;
using e2e::ServerProcess;

// How long one block may take; its commands' own waits (the CLI's --timeout) are longer, so a
// block that hangs is killed with everything it started.
constexpr double kBlockTimeoutS = 30;

// Printed by the ERR trap every block runs under: the failing command's line in the script.
constexpr char kFailureMarker[] = "docs-check: failed at line ";

// The line of the documentation that failed: bash's line in the script, whose first line is
// the trap and whose second is the first line after the block's opening fence.
int FailedDocLine(const RunnableBlock& block, const std::string& output) {
  const size_t at = output.rfind(kFailureMarker);
  int script_line = 0;
  if (at == std::string::npos) return block.line;
  const size_t from = at + sizeof(kFailureMarker) - 1;
  if (!absl::SimpleAtoi(output.substr(from, output.find(' ', from) - from), &script_line)) {
    return block.line;
  }
  return block.line + script_line - 1;
}

TEST(DocsTest, RunnableBlocksRunAgainstALocalServer) {
  auto blocks = FindRunnableBlocks(STRATA_SOURCE_DIR);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  ASSERT_FALSE(blocks->empty()) << "no ```sh runnable block in README.md or docs/";

  strata::testing::TempDir dir{"strata_docs"};
  ServerProcess server(dir.File("data"), dir.File("server.log"), {"--http", "127.0.0.1:0"});
  ASSERT_GT(server.port(), 0) << server.process().Output();
  ASSERT_GT(server.http_port(), 0) << server.process().Output();
  ChildProcess demo({BinPath("demo_service")}, dir.File("demo.log"), {{"STRATA_SERVICE", "demo"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(demo.pid()), "--interval", "1", "--spool-dir",
                      dir.File("spool")},
                     dir.File("agent.log"));
  // The examples query the demo's profile: wait until the server answers with samples of it
  // (a second of the demo's two busy threads at 99 Hz is about 200).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (e2e::ServiceTotal(server.address(), "demo") < 100) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "no samples of the demo reached the server\n" << agent.Output();
    ASSERT_TRUE(agent.running()) << agent.Output();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  const std::string work = dir.File("work");
  std::filesystem::create_directories(work);
  const std::string bin_dir = std::filesystem::path(BinPath("strata")).parent_path().string();
  const char* path = std::getenv("PATH");
  for (size_t i = 0; i < blocks->size(); ++i) {
    const RunnableBlock& block = (*blocks)[i];
    const std::string script = absl::StrCat("trap 'echo \"", kFailureMarker,
                                            "$LINENO (exit $?)\" >&2' ERR\n", block.script);
    ChildProcess bash({"/usr/bin/env", "-C", work,
                       absl::StrCat("PATH=", bin_dir, ":", path ? path : "/usr/bin:/bin"),
                       absl::StrCat("STRATA_SERVER=", server.address()),
                       absl::StrCat("STRATA_HTTP=http://127.0.0.1:", server.http_port()),
                       "/bin/bash", "-euo", "pipefail", "-c", script},
                      dir.File(absl::StrCat("block", i, ".log")));
    const int exit_code = bash.Wait(kBlockTimeoutS);
    if (exit_code == 0) continue;
    const bool timed_out = bash.running();
    if (timed_out) kill(-bash.pid(), SIGKILL);  // the block's process group
    bash.Stop(SIGKILL, 5);
    const std::string output = bash.Output();
    ADD_FAILURE() << block.file << ":" << FailedDocLine(block, output) << ": runnable block (at line "
                  << block.line << ") "
                  << (timed_out ? absl::StrCat("did not finish in ", kBlockTimeoutS, " s")
                                : absl::StrCat("failed, exit ", exit_code))
                  << "\n"
                  << block.script << "--- output:\n"
                  << output;
  }
  RecordProperty("blocks", static_cast<int>(blocks->size()));
  EXPECT_TRUE(agent.running()) << agent.Output();
  EXPECT_TRUE(server.process().running()) << server.process().Output();
}

}  // namespace
}  // namespace strata::docs
