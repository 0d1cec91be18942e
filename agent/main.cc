// strata-agent: profiles the processes of this host that match its rules and ships their
// calling contexts to strata-server.
//
//   strata-agent --server HOST:PORT [--pid PID]... [--service NAME=REGEX]...
//                [--frequency HZ] [--interval SECONDS] [--unwind-verify full|boundary|off]
//                [--capture-cpu-budget PERCENT]
//                [--inproc auto|on|off] [--inproc-dir DIR]
//                [--spool-dir DIR] [--spool-max-bytes SIZE]
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "agent/core/capture_controller.h"
#include "agent/core/context_graph.h"
#include "agent/core/profiler.h"
#include "agent/core/shipper.h"
#include "agent/spool/spool.h"
#include "common/base/byte_size.h"
#include "common/labels/labels.h"
#include "common/rpc/client_security.h"
#include "common/base/config_file.h"
#include "spdlog/spdlog.h"

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

constexpr char kVersion[] = "0.1.0";
constexpr char kDefaultSpoolDir[] = "/var/lib/strata-agent/spool";

std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

int Run(int argc, char** argv) {
  CLI::App app{"strata-agent: continuous profiling agent"};
  std::string server = "127.0.0.1:7070";
  std::vector<int> pids;
  std::vector<std::string> service_flags;
  uint32_t frequency = 99;
  double interval_s = 10;
  uint32_t stack_bytes = 16 * 1024;
  std::string agent_id, host = Hostname(), log_level = "info";
  strata::rpc::ClientSecurityOptions security;
  std::string unwind_verify = "full";
  std::string inproc_mode = "auto", inproc_dir = "/dev/shm";
  double capture_cpu_budget_pct = 5;
  std::string spool_dir = kDefaultSpoolDir, spool_max = "256MiB";
  double flush_timeout_s = 5;
  app.add_option("--server", server, "strata-server address (host:port)")->capture_default_str();
  app.add_option("--pid", pids, "profile this process (repeatable)");
  app.add_option("--service", service_flags,
                 "NAME=REGEX: profile processes whose executable name or command line "
                 "matches REGEX as service NAME (repeatable; new processes are picked up)");
  std::vector<std::string> label_flags;
  app.add_option("--label", label_flags,
                 "KEY=VALUE: a label of every target (repeatable), e.g. region=eu-west; a "
                 "process's own STRATA_LABELS and derived labels (build_id, version, "
                 "container_id, pod, namespace) win over it");
  app.add_option("--frequency", frequency, "samples per second per thread")
      ->check(CLI::Range(1u, 10000u))
      ->capture_default_str();
  app.add_option("--interval", interval_s, "seconds between batches")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_option("--stack-bytes", stack_bytes, "bytes of stack copied per sample")
      ->check(CLI::Range(512u, 63u * 1024u))
      ->capture_default_str();
  strata::rpc::AddClientSecurityFlags(&app, &security);
  app.add_option("--agent-id", agent_id, "agent identity (default: host-<random>)");
  app.add_option("--host", host, "host label")->capture_default_str();
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  app.add_option("--unwind-verify", unwind_verify,
                 "incremental unwinding: full (re-check every reused frame against the new "
                 "stack bytes), boundary (check only the splice point) or off (unwind every "
                 "sample fully)")
      ->check(CLI::IsMember({"full", "boundary", "off"}))
      ->capture_default_str();
  app.add_option("--capture-cpu-budget", capture_cpu_budget_pct,
                 "percent of one core the agent may use while an ad hoc capture runs; the "
                 "capture's rate is lowered to stay under it")
      ->check(CLI::Range(0.001, 100.0))
      ->capture_default_str();
  app.add_option("--inproc", inproc_mode,
                 "stacks from processes running the in-process sampler (libstrata_inproc.so): "
                 "auto (their rings where present, perf events for the rest; rings only when "
                 "perf events are unavailable), on (rings only), off (perf events only)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--inproc-dir", inproc_dir,
                 "directory of the in-process samplers' rings (their STRATA_INPROC_DIR)")
      ->capture_default_str();
  app.add_option("--spool-dir", spool_dir,
                 "directory of the durable spool: batches not yet acknowledged by the server, "
                 "with the call graph they need, survive agent restarts, kill -9 and reboots "
                 "and are resent under the same identity ('' or 'none': in memory only)")
      ->capture_default_str();
  app.add_option("--spool-max-bytes", spool_max,
                 "disk the spool may use; past it the oldest batches are dropped (counted)")
      ->capture_default_str();
  app.add_option("--flush-timeout", flush_timeout_s,
                 "seconds to wait at shutdown for the server to acknowledge every batch (what "
                 "is left stays in the spool)")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  strata::base::AddConfigFile(app);
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  auto client_security = strata::rpc::ClientSecurity::Load(security);
  if (!client_security.ok()) {
    std::fprintf(stderr, "strata-agent: %s\n",
                 std::string(client_security.status().message()).c_str());
    return 2;
  }

  if (pids.empty() && service_flags.empty()) {
    std::fprintf(stderr, "strata-agent: nothing to profile: give --pid or --service\n");
    return 2;
  }
  strata::agent::ProfilerOptions options;
  options.frequency_hz = frequency;
  options.stack_bytes = stack_bytes & ~7u;
  options.unwind_verify = *strata::unwind::ParseVerifyMode(unwind_verify);  // checked above
  options.inproc = *strata::agent::ParseInprocMode(inproc_mode);              // checked above
  options.inproc_dir = inproc_dir;
  for (int pid : pids) options.pids.push_back(pid);
  for (const auto& flag : service_flags) {
    auto rule = strata::procfs::ParseServiceRule(flag);
    if (!rule.ok()) {
      std::fprintf(stderr, "strata-agent: --service %s: %s\n", flag.c_str(),
                   std::string(rule.status().message()).c_str());
      return 2;
    }
    options.service_rules.push_back(*rule);
  }
  std::map<std::string, std::string> agent_labels;
  for (const auto& flag : label_flags) {
    auto label = strata::labels::ParseLabel(flag);
    if (!label.ok()) {
      std::fprintf(stderr, "strata-agent: --label %s: %s\n", flag.c_str(),
                   std::string(label.status().message()).c_str());
      return 2;
    }
    agent_labels[label->first] = label->second;
  }

  auto spool_max_bytes = strata::base::ParseByteSize(spool_max);
  if (!spool_max_bytes.ok()) {
    std::fprintf(stderr, "strata-agent: --spool-max-bytes: %s\n",
                 std::string(spool_max_bytes.status().message()).c_str());
    return 2;
  }

  // Who this agent is: the identity of an earlier run that left batches in the spool, or a
  // new one (a new graph, sequence numbers from 1).
  std::random_device random;
  strata::agent::SpoolIdentity fresh;
  fresh.graph_id = (uint64_t{random()} << 32) | random();
  fresh.host = host;
  fresh.agent_id = agent_id.empty()
                       ? absl::StrFormat("%s-%08x", host, fresh.graph_id & 0xffffffff)
                       : agent_id;
  strata::agent::SpoolOptions spool_options;
  spool_options.dir = spool_dir == "none" ? "" : spool_dir;
  spool_options.max_bytes = *spool_max_bytes;
  spool_options.segment_bytes = std::clamp<uint64_t>(*spool_max_bytes / 16, 64 << 10, 4 << 20);
  spool_options.adopt = agent_id.empty();
  std::unique_ptr<strata::agent::ContextGraph> graph;
  auto restore = [&graph](const strata::agent::SpoolIdentity& resumed,
                          const strata::v1::GraphDelta& delta) {
    if (graph == nullptr) graph = std::make_unique<strata::agent::ContextGraph>(resumed.graph_id);
    return graph->Restore(delta);
  };
  strata::agent::SpoolRecovery recovery;
  auto spool = strata::agent::Spool::Open(spool_options, fresh, restore, &recovery);
  if (!spool.ok() && spool_dir == kDefaultSpoolDir && !absl::IsFailedPrecondition(spool.status())) {
    // Not running as the service (no access to the default place): keep the spool in memory.
    spdlog::warn("spool: {}; batches are kept in memory only (give --spool-dir)",
                 std::string(spool.status().message()));
    graph.reset();
    spool_options.dir.clear();
    spool = strata::agent::Spool::Open(spool_options, fresh, restore, &recovery);
  }
  if (!spool.ok()) {
    std::fprintf(stderr, "strata-agent: spool: %s\n", std::string(spool.status().message()).c_str());
    return 1;
  }
  const strata::agent::SpoolIdentity& identity = recovery.identity;
  if (graph == nullptr || !recovery.resumed) {
    graph = std::make_unique<strata::agent::ContextGraph>(identity.graph_id);
  }
  agent_id = identity.agent_id;
  if (recovery.resumed) {
    spdlog::info("spool {}: resuming as agent {} (graph {:x}): {} batches ({} samples) to "
                 "deliver, {} graph records", recovery.path, identity.agent_id,
                 identity.graph_id, recovery.batches, recovery.samples, recovery.graph_records);
  }
  for (size_t i = 0; i < (*spool)->size(); ++i) {
    spdlog::debug("recovered batch {} ({} samples)", (*spool)->entry(i).sequence,
                  (*spool)->entry(i).samples);
  }
  if (recovery.corrupt_records > 0 || recovery.orphaned_batches > 0) {
    spdlog::warn("spool {}: skipped {} torn or corrupt records and {} batches whose graph was "
                 "lost", recovery.path, recovery.corrupt_records, recovery.orphaned_batches);
  }
  auto profiler = strata::agent::Profiler::Create(options, graph.get());
  if (!profiler.ok()) {
    std::fprintf(stderr, "strata-agent: %s\n", profiler.status().ToString().c_str());
    return 1;
  }

  strata::agent::ShipperOptions ship;
  ship.server = server;
  ship.agent_id = agent_id;
  ship.host = host;
  ship.arch = std::string(strata::unwind::ArchName(strata::agent::kHostArch));
  ship.version = kVersion;
  ship.security = std::move(*client_security);
  ship.frequency_hz = frequency;
  ship.labels = std::move(agent_labels);
  ship.spool_corrupt_records = recovery.corrupt_records;
  ship.spool_orphaned_batches = recovery.orphaned_batches;
  strata::agent::Shipper shipper(ship, graph.get(), spool->get());
  strata::agent::CaptureControllerOptions capture_options;
  capture_options.cpu_budget = capture_cpu_budget_pct / 100;
  strata::agent::CaptureController captures(
      profiler->get(), capture_options,
      {[&shipper](strata::v1::SampleBatch b) { shipper.Enqueue(std::move(b)); },
       [&shipper](strata::v1::CaptureStatus s) { shipper.SendStatus(std::move(s)); }});
  // Control messages arrive on the shipper's reader thread; the main loop applies them.
  shipper.SetControlHandler(
      [&captures](const strata::v1::ServerMessage& m) { captures.HandleMessage(m); });
  shipper.Start();

  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  spdlog::info("strata-agent {} on {} ({}), shipping to {} every {} s at {} Hz", agent_id, host,
               ship.arch, server, interval_s, frequency);
  const absl::Duration interval = absl::Milliseconds(static_cast<int64_t>(interval_s * 1000));
  uint64_t sequence = recovery.last_sequence;  // a resumed incarnation numbers on
  absl::Time window_start = absl::Now();
  // Batches end on multiples of the interval, so agents' windows line up with each other.
  auto next_boundary = [&](absl::Time t) {
    const int64_t ms = absl::ToInt64Milliseconds(interval);
    return absl::FromUnixMillis((absl::ToUnixMillis(t) / ms + 1) * ms);
  };
  // Boundaries follow the wall clock (windows line up across agents); the wait for one
  // follows the monotonic clock: a wall clock stepped back an hour must not hold an hour of
  // samples in the agent (one stepped forward ships at once).
  absl::Time window_end;
  std::chrono::steady_clock::time_point window_deadline;
  auto plan_window = [&](absl::Time now) {
    window_end = next_boundary(now);
    window_deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(window_end - now);
  };
  plan_window(window_start);
  auto ship_window = [&](absl::Time end) {
    // After the clock went back, the window starts no later than it ends.
    const absl::Time start = std::min(window_start, end);
    auto batch = (*profiler)->TakeBatch(absl::ToUnixMillis(start), absl::ToUnixMillis(end),
                                        sequence + 1);
    if (!batch.ok()) {
      spdlog::error("building batch: {}", batch.status().ToString());
    } else if (batch->has_value()) {
      ++sequence;
      shipper.Enqueue(std::move(**batch));
    }
    window_start = end;
  };
  while (!g_stop.load()) {
    // Shorter waits while a capture runs: its batches go out every second.
    const absl::Duration max_wait =
        captures.running() > 0 ? absl::Milliseconds(50) : absl::Milliseconds(200);
    auto st = (*profiler)->Poll(std::min(
        max_wait, absl::FromChrono(window_deadline - std::chrono::steady_clock::now())));
    if (!st.ok()) spdlog::warn("sampling: {}", st.ToString());
    shipper.SetTargets((*profiler)->targets());
    const absl::Time now = absl::Now();
    captures.Tick(now, &sequence);
    if (now >= window_end || std::chrono::steady_clock::now() >= window_deadline ||
        (*profiler)->batch_full()) {
      ship_window(now);
      plan_window(now);
    }
  }
  captures.StopAll(absl::Now(), &sequence);
  ship_window(absl::Now());
  const auto stats = (*profiler)->stats();
  spdlog::info("stopping: {} samples, {} frames, {} truncated, {} lost; flushing", stats.samples,
               stats.unwound_frames, stats.truncated, stats.lost);
  spdlog::info("unwinding ({}): {} frames walked, {} reused, {} verification failures",
               unwind_verify, stats.frames_walked, stats.frames_reused,
               stats.unwind_verify_failures);
  if (stats.inproc_targets > 0 || stats.inproc_stacks > 0) {
    spdlog::info("in-process rings: {} stacks, {} targets", stats.inproc_stacks,
                 stats.inproc_targets);
  }
  const bool flushed =
      shipper.Flush(absl::Milliseconds(static_cast<int64_t>(flush_timeout_s * 1000)));
  shipper.Stop();
  const strata::agent::ShipperStats shipped = shipper.stats();
  if (shipped.spool.batches_dropped > 0) {
    spdlog::warn("spool: dropped {} batches ({} samples) past --spool-max-bytes",
                 shipped.spool.batches_dropped, shipped.spool.samples_dropped);
  }
  if (!flushed) {
    if ((*spool)->path().empty()) {
      spdlog::warn("server did not acknowledge every batch before shutdown: {} batches lost "
                   "(the spool is in memory)", shipped.spool.batches);
    } else {
      spdlog::warn("server did not acknowledge every batch before shutdown: {} batches stay in "
                   "the spool {} and go out when the agent starts again",
                   shipped.spool.batches, (*spool)->path());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
