#include "tests/e2e/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

extern char** environ;

namespace strata::e2e {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string BinPath(const std::string& name) { return std::string(STRATA_BIN_DIR) + "/" + name; }

ChildProcess::ChildProcess(std::vector<std::string> argv, std::string log_path,
                           std::map<std::string, std::string> env)
    : log_path_(std::move(log_path)) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    setpgid(0, 0);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) Stop(SIGKILL, 5);
}

bool ChildProcess::running() {
  if (reaped_ || pid_ <= 0) return false;
  int status;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    reaped_ = true;
    status_ = status;
    return false;
  }
  return true;
}

int ChildProcess::Wait(double timeout_s) {
  const double deadline = Now() + timeout_s;
  while (running() && Now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!reaped_) return -1;
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
}

int ChildProcess::Stop(int signal, double timeout_s) {
  if (!running()) return reaped_ ? status_ : -1;
  kill(pid_, signal);
  const double deadline = Now() + timeout_s;
  while (running() && Now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!reaped_) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    status_ = status;
  }
  return status_;
}

bool ChildProcess::Pause(double timeout_s) {
  if (!running()) return false;
  kill(pid_, SIGSTOP);
  const double deadline = Now() + timeout_s;
  while (Now() < deadline) {
    int status;
    // The parent hears of the stop once the last thread of the process has stopped.
    const pid_t changed = waitpid(pid_, &status, WUNTRACED | WNOHANG);
    if (changed == pid_ && WIFSTOPPED(status)) return true;
    if (changed == pid_) {
      reaped_ = true;
      status_ = status;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

void ChildProcess::Resume() {
  if (pid_ > 0 && !reaped_) kill(pid_, SIGCONT);
}

std::string ChildProcess::Output() const { return ReadFile(log_path_); }

bool ChildProcess::WaitForOutput(const std::string& text, double timeout_s) {
  const double deadline = Now() + timeout_s;
  while (Now() < deadline) {
    if (Output().find(text) != std::string::npos) return true;
    if (!running()) return Output().find(text) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

ServerProcess::ServerProcess(const std::string& data_dir, const std::string& log_path,
                             std::vector<std::string> extra_args,
                             std::vector<std::string> launcher) {
  std::vector<std::string> argv = std::move(launcher);
  argv.push_back(BinPath("strata-server"));
  // A port of its own unless the test gives one (a restart on the port its agents know).
  if (std::find(extra_args.begin(), extra_args.end(), "--listen") == extra_args.end()) {
    argv.insert(argv.end(), {"--listen", "127.0.0.1:0"});
  }
  for (std::string arg : {std::string("--http"), std::string(), std::string("--data"), data_dir}) {
    argv.push_back(std::move(arg));
  }
  for (auto& a : extra_args) argv.push_back(std::move(a));
  process_ = std::make_unique<ChildProcess>(std::move(argv), log_path);
  const std::string marker = "ready on port ";
  if (!process_->WaitForOutput(marker, 30)) return;
  const std::string out = process_->Output();
  const size_t at = out.rfind(marker) + marker.size();
  (void)absl::SimpleAtoi(out.substr(at, out.find('\n', at) - at), &port_);
  // Printed before "ready" by a server with HTTP on.
  const std::string http_marker = "HTTP on port ";
  if (const size_t h = out.rfind(http_marker); h != std::string::npos) {
    const size_t from = h + http_marker.size();
    (void)absl::SimpleAtoi(out.substr(from, out.find('\n', from) - from), &http_port_);
  }
}

std::shared_ptr<grpc::Channel> ServerProcess::Channel() const {
  return grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
}

CommandResult RunCommand(std::vector<std::string> argv, double timeout_s) {
  static int counter = 0;
  const std::string log = "/tmp/strata_cmd_" + std::to_string(getpid()) + "_" +
                          std::to_string(counter++) + ".log";
  CommandResult result;
  {
    ChildProcess child(std::move(argv), log);
    result.exit_code = child.Wait(timeout_s);
    if (result.exit_code == -1) child.Stop(SIGKILL, 1);
    result.output = child.Output();
  }
  unlink(log.c_str());
  return result;
}

uint64_t AgentSampleCount(const std::string& agent_log) {
  const size_t at = agent_log.find("stopping: ");
  uint64_t samples = 0;
  if (at == std::string::npos ||
      !absl::SimpleAtoi(agent_log.substr(at + 10, agent_log.find(' ', at + 10) - at - 10),
                        &samples)) {
    return 0;
  }
  return samples;
}

ShippedBatches AgentShippedBatches(const std::string& agent_log) {
  ShippedBatches shipped;
  const size_t at = agent_log.rfind("batches: ");
  if (at == std::string::npos) return shipped;
  const std::vector<std::string> words =
      absl::StrSplit(agent_log.substr(at + 9, agent_log.find('\n', at) - at - 9), ' ');
  if (words.size() < 3 || words[1] != "cpu" || !absl::SimpleAtoi(words[0], &shipped.batches) ||
      !absl::SimpleAtoi(absl::StripPrefix(words[2], "("), &shipped.bytes)) {
    return ShippedBatches();
  }
  return shipped;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

double ProcessCpuSeconds(pid_t pid) {
  const std::string stat = ReadWholeFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 > stat.size()) return 0;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
  double utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string AgentCostReport(double agent_cpu_s, const std::string& agent_log) {
  const double samples = static_cast<double>(std::max<uint64_t>(1, AgentSampleCount(agent_log)));
  const ShippedBatches shipped = AgentShippedBatches(agent_log);
  return absl::StrCat("agent: ", agent_cpu_s * 1e6 / samples,
                      " us of CPU per sample (start-up included), ",
                      shipped.bytes / std::max<uint64_t>(1, shipped.batches), " bytes per batch, ",
                      static_cast<double>(shipped.bytes) / samples, " per sample");
}

bool ChromiumInstalled() {
  return RunCommand({"/bin/sh", "-c", "command -v chromium"}).exit_code == 0;
}

std::string HeadlessChromium(const std::string& profile_dir) {
  return "chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
         "--disable-background-networking --disable-component-update --disable-sync "
         "--virtual-time-budget=15000 --window-size=1280,900 --user-data-dir=" + profile_dir;
}

uint64_t ServiceTotal(const std::string& address, const std::string& service) {
  auto stub = v1::Query::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListServicesRequest req;
  v1::ListServicesResponse resp;
  if (!stub->ListServices(&ctx, req, &resp).ok()) return 0;
  for (const auto& s : resp.services()) {
    if (s.name() == service) return s.total_samples();
  }
  return 0;
}

v1::HotPathsResponse QueryHotPaths(const std::string& address, const std::string& service) {
  auto stub =
      v1::Query::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::HotPathsRequest request;
  request.mutable_filter()->set_service(service);
  request.set_limit(100000);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::HotPathsResponse response;
  grpc::Status status = stub->HotPaths(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

std::vector<std::string> FrameNames(const v1::HotPath& path) {
  std::vector<std::string> names;
  for (const auto& f : path.frames()) names.push_back(f.function());
  return names;
}

std::vector<std::string> UserFrameNames(const v1::HotPath& path) {
  std::vector<std::string> names;
  for (const auto& f : path.frames()) {
    if (f.kind() != v1::FRAME_KERNEL) names.push_back(f.function());
  }
  return names;
}

DemoPath ClassifyDemoPath(const std::vector<std::string>& names) {
  auto at = std::find(names.begin(), names.end(), "serve_forever");
  if (at == names.end()) return DemoPath::kOther;
  std::vector<std::string> tail(at + 1, names.end());
  using V = std::vector<std::string>;
  if (tail == V{"handle_request", "parse_request", "tokenize"}) return DemoPath::kTokenize;
  if (tail == V{"handle_request", "compress_response", "deflate_block"}) return DemoPath::kDeflate;
  if (tail.size() >= 2 && tail[0] == "recompute_stats" &&
      std::all_of(tail.begin() + 1, tail.end(), [](const std::string& n) { return n == "fib"; })) {
    return DemoPath::kFib;
  }
  return DemoPath::kOther;
}

std::optional<DemoShares> DemoSharesFrom(const std::string& demo_output) {
  const size_t line = demo_output.rfind("demo_service done:");
  if (line == std::string::npos) return std::nullopt;
  const std::string done = demo_output.substr(line, demo_output.find('\n', line) - line);
  auto field = [&](const std::string& name, double* value) {
    const size_t at = done.find(" " + name + "=");
    if (at == std::string::npos) return false;
    const size_t from = at + name.size() + 2;
    return absl::SimpleAtod(done.substr(from, done.find(' ', from) - from), value);
  };
  DemoShares shares;
  if (!field("tokenize_pct", &shares.tokenize) || !field("deflate_pct", &shares.deflate) ||
      !field("fib_pct", &shares.fib)) {
    return std::nullopt;
  }
  return shares;
}

}  // namespace strata::e2e
