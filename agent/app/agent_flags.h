// strata-agent's flags: their names, defaults and help texts (AddAgentFlags), and the checks
// that turn them into AgentOptions (AgentOptionsFromFlags). Every flag of the agent is defined
// here.
#ifndef STRATA_AGENT_APP_AGENT_FLAGS_H_
#define STRATA_AGENT_APP_AGENT_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "agent/app/agent_options.h"
#include "common/rpc/client_security.h"

namespace strata::agent::app {

// This host's name ("localhost" when it has none): the default of --host.
std::string Hostname();

// --max-frames's range. At most 1024: with Python frames in place of eval-loop frames and a
// kernel chain below, a stack stays within the 4096 frames servers decode.
inline constexpr uint32_t kMaxFramesFloor = 16;
inline constexpr uint32_t kMaxFramesCeiling = 1024;

// What CLI11 fills in: the flags as written (for --help and config files) until
// AgentOptionsFromFlags parses them.
struct AgentFlags {
  std::string server = "127.0.0.1:7070";
  std::vector<int> pids;
  std::vector<std::string> service_flags;
  std::vector<std::string> label_flags;
  uint32_t frequency = 99;
  double interval_s = 10;
  uint32_t stack_bytes = 16 * 1024;
  uint32_t max_frames = 256;
  std::string agent_id, host = Hostname(), log_level = "info";
  rpc::ClientSecurityOptions security;
  std::string unwind_verify = "full";
  std::string inproc_mode = "auto", inproc_dir = "/dev/shm";
  std::string sampling = "auto";
  std::string kernel_stacks = "auto";
  bool off_cpu = false;
  double off_cpu_threshold_us = 100;
  std::string python_frames = "on";
  std::string python_capture = "auto";
  std::string frame_walk = "on";
  double python_read_period_ms = 1;
  std::vector<std::string> jvm_perf_map_services;
  double jvm_perf_map_period_s = 60;
  double capture_cpu_budget_pct = 5;
  std::string spool_dir = kDefaultSpoolDir, spool_max = "256MiB";
  double flush_timeout_s = 5;
  std::vector<std::string> requests_metrics;  // [SERVICE=]URL#NAME
};

// Adds the agent's flags to `app`, bound to `flags` (which must outlive the parse).
void AddAgentFlags(CLI::App& app, AgentFlags& flags);

// The options the parsed flags give; InvalidArgument with a message for the operator naming
// the flag. Reads no files: AgentApp loads what the options name.
absl::StatusOr<AgentOptions> AgentOptionsFromFlags(const AgentFlags& flags);

}  // namespace strata::agent::app

#endif  // STRATA_AGENT_APP_AGENT_FLAGS_H_
