// strata-agent: profiles the processes of this host that match its rules and ships their
// calling contexts to strata-server.
//
//   strata-agent --server HOST:PORT[,HOST:PORT...] [--pid PID]... [--service NAME=REGEX]...
//                [--frequency HZ] [--interval SECONDS] [--unwind-verify full|boundary|off]
//                [--capture-cpu-budget PERCENT]
//                [--sampling per-cpu|per-thread] [--inproc auto|on|off] [--inproc-dir DIR]
//                [--kernel-stacks auto|on|off] [--off-cpu] [--off-cpu-threshold-us US]
//                [--python-frames on|off] [--python-read-period-ms MS]
//                [--jvm-perf-map SERVICE|*]... [--jvm-perf-map-period SECONDS]
//                [--spool-dir DIR] [--spool-max-bytes SIZE]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "agent/core/capture_controller.h"
#include "agent/core/context_graph.h"
#include "agent/core/interval_loop.h"
#include "agent/core/profiler.h"
#include "agent/core/shipper.h"
#include "agent/spool/spool.h"
#include "common/base/byte_size.h"
#include "common/labels/labels.h"
#include "common/rpc/client_security.h"
#include "common/unwind/host_arch.h"
#include "common/base/config_file.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"

namespace {

std::atomic<bool> g_stop{false};
// The profiler's wake-up descriptor: the main loop may sleep until the next interval, and the
// signal may be delivered to another thread.
int g_wake_fd = -1;
void OnSignal(int) {
  g_stop.store(true);
  const uint64_t one = 1;
  if (g_wake_fd >= 0) (void)!write(g_wake_fd, &one, sizeof(one));
}

constexpr char kVersion[] = "0.1.0";
constexpr char kDefaultSpoolDir[] = "/var/lib/strata-agent/spool";

std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

struct Flags {
  std::string server = "127.0.0.1:7070";
  std::vector<int> pids;
  std::vector<std::string> service_flags;
  std::vector<std::string> label_flags;
  uint32_t frequency = 99;
  double interval_s = 10;
  uint32_t stack_bytes = 16 * 1024;
  std::string agent_id, host = Hostname(), log_level = "info";
  strata::rpc::ClientSecurityOptions security;
  std::string unwind_verify = "full";
  std::string inproc_mode = "auto", inproc_dir = "/dev/shm";
  std::string sampling = "auto";
  std::string kernel_stacks = "auto";
  bool off_cpu = false;
  double off_cpu_threshold_us = 100;
  std::string python_frames = "on";
  double python_read_period_ms = 1;
  std::vector<std::string> jvm_perf_map_services;
  double jvm_perf_map_period_s = 60;
  double capture_cpu_budget_pct = 5;
  std::string spool_dir = kDefaultSpoolDir, spool_max = "256MiB";
  double flush_timeout_s = 5;
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--server", f.server,
                 "strata-server address (host:port), or the nodes of a cluster separated by "
                 "commas (host:port,host:port,...): tried in turn, and a node that does not "
                 "own this host redirects the agent to those that do")
      ->capture_default_str();
  app.add_option("--pid", f.pids, "profile this process (repeatable)");
  app.add_option("--service", f.service_flags,
                 "NAME=REGEX: profile processes whose executable name or command line "
                 "matches REGEX as service NAME (repeatable; new processes are picked up)");
  app.add_option("--label", f.label_flags,
                 "KEY=VALUE: a label of every target (repeatable), e.g. region=eu-west; a "
                 "process's own STRATA_LABELS and derived labels (build_id, version, "
                 "container_id, pod, namespace) win over it");
  app.add_option("--frequency", f.frequency, "samples per second per thread")
      ->check(CLI::Range(1u, 10000u))
      ->capture_default_str();
  app.add_option("--interval", f.interval_s, "seconds between batches")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_option("--stack-bytes", f.stack_bytes, "bytes of stack copied per sample")
      ->check(CLI::Range(512u, 63u * 1024u))
      ->capture_default_str();
  strata::rpc::AddClientSecurityFlags(&app, &f.security);
  app.add_option("--agent-id", f.agent_id, "agent identity (default: host-<random>)");
  app.add_option("--host", f.host, "host label")->capture_default_str();
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error");
  app.add_option("--unwind-verify", f.unwind_verify,
                 "incremental unwinding: full (re-check every reused frame against the new "
                 "stack bytes), boundary (check only the splice point) or off (unwind every "
                 "sample fully)")
      ->check(CLI::IsMember({"full", "boundary", "off"}))
      ->capture_default_str();
  app.add_option("--capture-cpu-budget", f.capture_cpu_budget_pct,
                 "percent of one core the agent may use while an ad hoc capture runs; the "
                 "capture's rate is lowered to stay under it")
      ->check(CLI::Range(0.001, 100.0))
      ->capture_default_str();
  app.add_option("--inproc", f.inproc_mode,
                 "stacks from processes running the in-process sampler (libstrata_inproc.so): "
                 "auto (their rings where present, perf events for the rest; rings only when "
                 "perf events are unavailable), on (rings only), off (perf events only)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--sampling", f.sampling,
                 "what one perf event samples: per-cpu (one event per CPU, filtered to the "
                 "targets: cost and descriptors follow the CPUs, not the threads; needs "
                 "CAP_PERFMON or kernel.perf_event_paranoid <= 0) or per-thread (one event per "
                 "target thread); auto: per-cpu where allowed, else per-thread")
      ->check(CLI::IsMember({"auto", "per-cpu", "per-thread"}))
      ->capture_default_str();
  app.add_option("--kernel-stacks", f.kernel_stacks,
                 "kernel call chains below the user frames of each sample, named from "
                 "/proc/kallsyms (also counts CPU time spent in the kernel): auto (where the "
                 "kernel allows kernel-mode events, i.e. CAP_PERFMON or "
                 "kernel.perf_event_paranoid <= 1, and shows kallsyms addresses), on (fail "
                 "where it cannot), off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_flag("--off-cpu", f.off_cpu,
               "also record off-CPU profiles: where target threads block, sleep or wait to "
               "run, weighted by the time until they run again (context-switch events; needs "
               "CAP_PERFMON or kernel.perf_event_paranoid <= 1)");
  app.add_option("--off-cpu-threshold-us", f.off_cpu_threshold_us,
                 "off-CPU intervals shorter than this many microseconds are not counted "
                 "(bounds what frequent short waits add to batches)")
      ->check(CLI::Range(0.0, 60e6))
      ->capture_default_str();
  app.add_option("--python-frames", f.python_frames,
                 "Python functions (CPython 3.8 to 3.13) in place of the interpreter's "
                 "eval-loop frames, read from its thread states (needs ptrace access to the "
                 "targets: CAP_SYS_PTRACE or the same user)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--python-read-period-ms", f.python_read_period_ms,
                 "while Python targets are profiled, their samples are recorded (and their "
                 "Python frames read) at most this many milliseconds after they were taken")
      ->check(CLI::Range(0.1, 10000.0))
      ->capture_default_str();
  app.add_option("--jvm-perf-map", f.jvm_perf_map_services,
                 "HotSpot JVMs (JDK 17+) of this service ('*': of every service) are asked for "
                 "perf maps of their JIT code through the attach mechanism, as `jcmd PID "
                 "Compiler.perfmap` does, without a restart or a JDK on the host (repeatable)");
  app.add_option("--jvm-perf-map-period", f.jvm_perf_map_period_s,
                 "longest time between two perf maps of a JVM (asked at doubling intervals "
                 "from 1 s, and within a second when its JIT code has unnamed frames)")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  app.add_option("--inproc-dir", f.inproc_dir,
                 "directory of the in-process samplers' rings (their STRATA_INPROC_DIR)")
      ->capture_default_str();
  app.add_option("--spool-dir", f.spool_dir,
                 "directory of the durable spool: batches not yet acknowledged by the server, "
                 "with the call graph they need, survive agent restarts, kill -9 and reboots "
                 "and are resent under the same identity ('' or 'none': in memory only)")
      ->capture_default_str();
  app.add_option("--spool-max-bytes", f.spool_max,
                 "disk the spool may use; past it the oldest batches are dropped (counted)")
      ->capture_default_str();
  app.add_option("--flush-timeout", f.flush_timeout_s,
                 "seconds to wait at shutdown for the server to acknowledge every batch (what "
                 "is left stays in the spool)")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  strata::base::AddConfigFile(app);
}

// The flags' profiling options; a usage error names the flag.
absl::StatusOr<strata::agent::ProfilerOptions> ProfilerOptionsFrom(const Flags& f) {
  strata::agent::ProfilerOptions options;
  options.frequency_hz = f.frequency;
  options.stack_bytes = f.stack_bytes & ~7u;
  options.unwind_verify = *strata::unwind::ParseVerifyMode(f.unwind_verify);  // checked by CLI11
  options.inproc = *strata::agent::ParseInprocMode(f.inproc_mode);              // checked by CLI11
  options.inproc_dir = f.inproc_dir;
  options.sampling = *strata::agent::ParseSamplingMode(f.sampling);  // checked by CLI11
  options.kernel_stacks = *strata::agent::ParseKernelStacksMode(f.kernel_stacks);  // by CLI11
  options.off_cpu = f.off_cpu;
  options.off_cpu_threshold = absl::Microseconds(f.off_cpu_threshold_us);
  options.python_frames = f.python_frames == "on";
  options.python_read_period = absl::Microseconds(f.python_read_period_ms * 1000);
  options.jvm_perf_maps.services = f.jvm_perf_map_services;
  options.jvm_perf_maps.max_period = absl::Seconds(f.jvm_perf_map_period_s);
  for (int pid : f.pids) options.pids.push_back(pid);
  for (const auto& flag : f.service_flags) {
    auto rule = strata::agent::procfs::ParseServiceRule(flag);
    if (!rule.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--service ", flag, ": ", rule.status().message()));
    }
    options.service_rules.push_back(*rule);
  }
  return options;
}

absl::StatusOr<std::map<std::string, std::string>> AgentLabels(const Flags& f) {
  std::map<std::string, std::string> agent_labels;
  for (const auto& flag : f.label_flags) {
    auto label = strata::labels::ParseLabel(flag);
    if (!label.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--label ", flag, ": ", label.status().message()));
    }
    agent_labels[label->first] = label->second;
  }
  return agent_labels;
}

struct OpenedSpool {
  std::unique_ptr<strata::agent::spool::Spool> spool;
  std::unique_ptr<strata::agent::ContextGraph> graph;
  strata::agent::spool::SpoolRecovery recovery;
};

// Who this agent is: the identity of an earlier run that left batches in the spool, or a
// new one (a new graph, sequence numbers from 1).
absl::StatusOr<OpenedSpool> OpenSpool(const Flags& f, uint64_t max_bytes) {
  std::random_device random;
  strata::agent::spool::SpoolIdentity fresh;
  fresh.graph_id = (uint64_t{random()} << 32) | random();
  fresh.host = f.host;
  fresh.agent_id = f.agent_id.empty()
                       ? absl::StrFormat("%s-%08x", f.host, fresh.graph_id & 0xffffffff)
                       : f.agent_id;
  strata::agent::spool::SpoolOptions spool_options;
  spool_options.dir = f.spool_dir == "none" ? "" : f.spool_dir;
  spool_options.max_bytes = max_bytes;
  spool_options.segment_bytes = std::clamp<uint64_t>(max_bytes / 16, 64 << 10, 4 << 20);
  spool_options.adopt = f.agent_id.empty();
  OpenedSpool opened;
  auto restore = [&opened](const strata::agent::spool::SpoolIdentity& resumed,
                           const strata::v1::GraphDelta& delta) {
    if (opened.graph == nullptr) {
      opened.graph = std::make_unique<strata::agent::ContextGraph>(resumed.graph_id);
    }
    return opened.graph->Restore(delta);
  };
  auto spool = strata::agent::spool::Spool::Open(spool_options, fresh, restore, &opened.recovery);
  if (!spool.ok() && f.spool_dir == kDefaultSpoolDir &&
      !absl::IsFailedPrecondition(spool.status())) {
    // Not running as the service (no access to the default place): keep the spool in memory.
    spdlog::warn("spool: {}; batches are kept in memory only (give --spool-dir)",
                 std::string(spool.status().message()));
    opened.graph.reset();
    spool_options.dir.clear();
    spool = strata::agent::spool::Spool::Open(spool_options, fresh, restore, &opened.recovery);
  }
  if (!spool.ok()) return spool.status();
  opened.spool = std::move(*spool);
  const strata::agent::spool::SpoolRecovery& recovery = opened.recovery;
  const strata::agent::spool::SpoolIdentity& identity = recovery.identity;
  if (opened.graph == nullptr || !recovery.resumed) {
    opened.graph = std::make_unique<strata::agent::ContextGraph>(identity.graph_id);
  }
  if (recovery.resumed) {
    spdlog::info("spool {}: resuming as agent {} (graph {:x}): {} batches ({} samples) to "
                 "deliver, {} graph records", recovery.path, identity.agent_id,
                 identity.graph_id, recovery.batches, recovery.samples, recovery.graph_records);
  }
  for (size_t i = 0; i < opened.spool->size(); ++i) {
    spdlog::debug("recovered batch {} ({} samples)", opened.spool->entry(i).sequence,
                  opened.spool->entry(i).samples);
  }
  if (recovery.corrupt_records > 0 || recovery.orphaned_batches > 0) {
    spdlog::warn("spool {}: skipped {} torn or corrupt records and {} batches whose graph was "
                 "lost", recovery.path, recovery.corrupt_records, recovery.orphaned_batches);
  }
  return opened;
}

void LogSamplingSummary(const strata::agent::ProfilerStats& stats, const std::string& verify) {
  spdlog::info("stopping: {} samples, {} frames, {} truncated, {} lost; flushing", stats.samples,
               stats.unwound_frames, stats.truncated, stats.lost);
  spdlog::info("unwinding ({}): {} frames walked, {} reused, {} verification failures", verify,
               stats.frames_walked, stats.frames_reused, stats.unwind_verify_failures);
  spdlog::info("sampling: {} perf events, {} wake-ups, {} target scans, {} samples of other "
               "processes dropped", stats.perf_events, stats.wakeups, stats.rescans,
               stats.filtered);
  if (stats.kernel_stacks) spdlog::info("kernel stacks: {} kernel frames", stats.kernel_frames);
  if (stats.off_cpu_switches > 0) {
    spdlog::info("off-CPU: {} switch-outs, {} counted ({:.3f} s), {} under the threshold, {} "
                 "unpaired", stats.off_cpu_switches, stats.off_cpu_counted,
                 static_cast<double>(stats.off_cpu_ns) / 1e9, stats.off_cpu_short,
                 stats.off_cpu_unpaired);
  }
  if (stats.python_reads > 0) {
    spdlog::info("python: {} stacks with {} Python frames, {} stale ({} changed while read, {} "
                 "not matching the sample); {} reads {:.3f} ms after their sample on average "
                 "(max {:.3f} ms)", stats.python_stacks, stats.python_frames, stats.python_stale,
                 stats.python_torn, stats.python_mismatch, stats.python_reads,
                 static_cast<double>(stats.python_read_delay_ns) / 1e6 /
                     static_cast<double>(stats.python_reads),
                 static_cast<double>(stats.python_read_delay_max_ns) / 1e6);
  }
  if (stats.inproc_targets > 0 || stats.inproc_stacks > 0) {
    spdlog::info("in-process rings: {} stacks, {} targets", stats.inproc_stacks,
                 stats.inproc_targets);
  }
}

// Waits up to `timeout` for the server to acknowledge every batch, then says what is left.
void FlushAndStop(strata::agent::Shipper& shipper, const strata::agent::spool::Spool& spool,
                  absl::Duration timeout) {
  const bool flushed = shipper.Flush(timeout);
  shipper.Stop();
  const strata::agent::ShipperStats shipped = shipper.stats();
  if (shipped.spool.batches_dropped > 0) {
    spdlog::warn("spool: dropped {} batches ({} samples) past --spool-max-bytes",
                 shipped.spool.batches_dropped, shipped.spool.samples_dropped);
  }
  if (flushed) return;
  if (spool.path().empty()) {
    spdlog::warn("server did not acknowledge every batch before shutdown: {} batches lost "
                 "(the spool is in memory)", shipped.spool.batches);
  } else {
    spdlog::warn("server did not acknowledge every batch before shutdown: {} batches stay in "
                 "the spool {} and go out when the agent starts again",
                 shipped.spool.batches, spool.path());
  }
}

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "strata-agent: %s\n", message.c_str());
  return code;
}

int Run(int argc, char** argv) {
  CLI::App app{"strata-agent: continuous profiling agent"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  auto client_security = strata::rpc::ClientSecurity::Load(flags.security);
  if (!client_security.ok()) return Fail(2, std::string(client_security.status().message()));
  if (flags.pids.empty() && flags.service_flags.empty()) {
    return Fail(2, "nothing to profile: give --pid or --service");
  }
  auto options = ProfilerOptionsFrom(flags);
  if (!options.ok()) return Fail(2, std::string(options.status().message()));
  auto agent_labels = AgentLabels(flags);
  if (!agent_labels.ok()) return Fail(2, std::string(agent_labels.status().message()));
  auto servers = strata::agent::ParseServerList(flags.server);
  if (!servers.ok()) return Fail(2, absl::StrCat("--server: ", servers.status().message()));
  auto spool_max_bytes = strata::base::ParseByteSize(flags.spool_max);
  if (!spool_max_bytes.ok()) {
    return Fail(2, absl::StrCat("--spool-max-bytes: ", spool_max_bytes.status().message()));
  }
  auto opened = OpenSpool(flags, *spool_max_bytes);
  if (!opened.ok()) return Fail(1, absl::StrCat("spool: ", opened.status().message()));
  const strata::agent::spool::SpoolRecovery& recovery = opened->recovery;
  auto profiler = strata::agent::Profiler::Create(*options, opened->graph.get());
  if (!profiler.ok()) return Fail(1, profiler.status().ToString());

  strata::agent::ShipperOptions ship;
  ship.servers = *std::move(servers);
  ship.agent_id = recovery.identity.agent_id;
  ship.host = flags.host;
  ship.arch = std::string(strata::unwind::ArchName(strata::unwind::kHostArch));
  ship.version = kVersion;
  ship.security = std::move(*client_security);
  ship.frequency_hz = flags.frequency;
  ship.labels = *std::move(agent_labels);
  ship.spool_corrupt_records = recovery.corrupt_records;
  ship.spool_orphaned_batches = recovery.orphaned_batches;
  strata::agent::Shipper shipper(ship, opened->graph.get(), opened->spool.get());
  strata::agent::CaptureControllerOptions capture_options;
  capture_options.cpu_budget = flags.capture_cpu_budget_pct / 100;
  strata::agent::CaptureController captures(
      profiler->get(), capture_options,
      {[&shipper](strata::v1::SampleBatch b) { shipper.Enqueue(std::move(b)); },
       [&shipper](strata::v1::CaptureStatus s) { shipper.SendStatus(std::move(s)); }});
  // Control messages arrive on the shipper's reader thread; the main loop applies them.
  shipper.SetControlHandler([&captures, &profiler](const strata::v1::ServerMessage& m) {
    captures.HandleMessage(m);
    (*profiler)->Wake();
  });
  shipper.Start();

  g_wake_fd = (*profiler)->wake_fd();
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  spdlog::info("strata-agent {} on {} ({}), shipping to {} every {} s at {} Hz", ship.agent_id,
               flags.host, ship.arch, flags.server, flags.interval_s, flags.frequency);
  strata::agent::IntervalLoop loop(
      absl::Milliseconds(static_cast<int64_t>(flags.interval_s * 1000)),
      recovery.last_sequence,  // a resumed incarnation numbers on
      profiler->get(), &shipper, &captures);
  loop.Run(g_stop);
  LogSamplingSummary((*profiler)->stats(), flags.unwind_verify);
  const strata::agent::ShippedBatches& shipped = loop.shipped();
  spdlog::info("batches: {} cpu ({} bytes), {} off-cpu ({} bytes)", shipped.cpu_batches,
               shipped.cpu_bytes, shipped.off_cpu_batches, shipped.off_cpu_bytes);
  FlushAndStop(shipper, *opened->spool,
               absl::Milliseconds(static_cast<int64_t>(flags.flush_timeout_s * 1000)));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles, a debugging aid
  // that showed as 2-3 % of the agent's CPU.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return Run(argc, argv);
}
