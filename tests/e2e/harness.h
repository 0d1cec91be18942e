// End-to-end test harness: runs the real binaries (strata-server, strata-agent, strata, the
// workloads) as child processes on loopback, with their output captured to files in a
// per-test temp dir. Child processes are killed when their ChildProcess goes out of scope.
#ifndef STRATA_TESTS_E2E_HARNESS_H_
#define STRATA_TESTS_E2E_HARNESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/testing/temp_dir.h"
#include "strata/v1/query.grpc.pb.h"

namespace strata::e2e {

// Absolute path of a binary built into build/bin.
std::string BinPath(const std::string& name);

class ChildProcess {
 public:
  // Starts `argv[0]` (absolute path) with stdout+stderr to `log_path`; `env` entries are
  // added to the environment.
  ChildProcess(std::vector<std::string> argv, std::string log_path,
               std::map<std::string, std::string> env = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  // Sends `signal` and waits up to `timeout_s`; SIGKILL after that. Returns the exit status
  // (as from waitpid), or -1.
  int Stop(int signal = 15, double timeout_s = 10);
  // Sends SIGSTOP and waits up to `timeout_s` until the process has stopped: kill() returns
  // before every thread has, and a thread not yet stopped may still answer a request sent
  // meanwhile. False if it did not stop (or exited).
  bool Pause(double timeout_s = 10);
  // Sends SIGCONT.
  void Resume();
  // Waits for exit up to `timeout_s`; returns the exit code, or -1 on timeout / signal.
  int Wait(double timeout_s);
  std::string Output() const;
  // Waits until the output contains `text`; false on timeout or exit.
  bool WaitForOutput(const std::string& text, double timeout_s);

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  int status_ = -1;
  bool reaped_ = false;
};

// strata-server on 127.0.0.1 with an ephemeral gRPC port (unless `extra_args` gives
// --listen: a restart on the port its agents know), HTTP off unless asked. `launcher` goes in
// front of the command (e.g. prlimit and its flags).
class ServerProcess {
 public:
  explicit ServerProcess(const std::string& data_dir, const std::string& log_path,
                         std::vector<std::string> extra_args = {},
                         std::vector<std::string> launcher = {});
  int port() const { return port_; }
  // The HTTP port, when started with an --http address ("HTTP on port N"); 0 otherwise.
  int http_port() const { return http_port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  ChildProcess& process() { return *process_; }
  std::shared_ptr<grpc::Channel> Channel() const;

 private:
  std::unique_ptr<ChildProcess> process_;
  int port_ = 0;
  int http_port_ = 0;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs a command to completion (bounded by `timeout_s`).
CommandResult RunCommand(std::vector<std::string> argv, double timeout_s = 60);

// Whether headless Chromium is installed (the web UI tests run in it, or skip that part).
bool ChromiumInstalled();
// The start of a headless Chromium command line, with its profile in `profile_dir`; a test
// appends its flags (--dump-dom, ...) and the URL.
std::string HeadlessChromium(const std::string& profile_dir);

// The samples an agent counted in its run, from its "stopping: N samples" line (0 if none).
uint64_t AgentSampleCount(const std::string& agent_log);

// What an agent shipped, from its last "batches: N cpu (B bytes)" line; {0, 0} if none.
struct ShippedBatches {
  uint64_t batches = 0;
  uint64_t bytes = 0;
};
ShippedBatches AgentShippedBatches(const std::string& agent_log);

// User + system CPU seconds a live process has used (/proc/PID/stat); 0 if unreadable.
double ProcessCpuSeconds(pid_t pid);

// A file's whole content; empty when it cannot be read.
std::string ReadWholeFile(const std::string& path);

// "agent: X us of CPU per sample (start-up included), Y bytes per batch, Z per sample", from
// the agent's CPU (ProcessCpuSeconds before it stopped) and its log after it stopped.
std::string AgentCostReport(double agent_cpu_s, const std::string& agent_log);

// A service's total samples over all time (ListServices); 0 when unknown or unreachable.
uint64_t ServiceTotal(const std::string& address, const std::string& service);

// Every hot path of `service` over all time (a failed call is a test failure, and an empty
// response is returned).
v1::HotPathsResponse QueryHotPaths(const std::string& address, const std::string& service);

// Function names of a path, outermost first.
std::vector<std::string> FrameNames(const v1::HotPath& path);
// The same without the kernel's frames: a sample taken while the thread was in the kernel on
// the way back to user code (an interrupt's exit, a preemption there) is still the user
// path's time, and the demo counts it in its own CPU time.
std::vector<std::string> UserFrameNames(const v1::HotPath& path);

// Which of demo_service's three paths a stack is, by its frames from serve_forever inwards.
enum class DemoPath { kTokenize, kDeflate, kFib, kOther };
DemoPath ClassifyDemoPath(const std::vector<std::string>& names);

// demo_service's own account of its serving threads' CPU time per path, in percent of the
// three paths' sum (the "done" line it prints when stopped with SIGTERM): what a profile's
// shares are checked against. nullopt when the output holds no such line.
struct DemoShares {
  double tokenize = 0, deflate = 0, fib = 0;
};
std::optional<DemoShares> DemoSharesFrom(const std::string& demo_output);

}  // namespace strata::e2e

#endif  // STRATA_TESTS_E2E_HARNESS_H_
