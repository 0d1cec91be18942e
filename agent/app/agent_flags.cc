#include "agent/app/agent_flags.h"

#include <unistd.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/base/byte_size.h"
#include "common/labels/labels.h"

namespace strata::agent::app {

std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// A CLI11 check from a parser of one value: a config file's value it refuses is then reported
// as FILE:LINE, by --print-config too, instead of when the agent starts.
template <typename Parse>
CLI::Validator ParsedBy(Parse parse, const char* what) {
  return CLI::Validator(
      [parse](std::string& value) -> std::string {
        auto parsed = parse(value);
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      },
      what);
}

void AddAgentFlags(CLI::App& app, AgentFlags& f) {
  app.add_option("--server", f.server,
                 "strata-server address (host:port), or the nodes of a cluster separated by "
                 "commas (host:port,host:port,...): tried in turn, and a node that does not "
                 "own this host redirects the agent to those that do")
      ->capture_default_str();
  app.add_option("--pid", f.pids, "profile this process (repeatable)");
  app.add_option("--service", f.service_flags,
                 "NAME=REGEX: profile processes whose executable name or command line "
                 "matches REGEX as service NAME (repeatable; new processes are picked up)")
      ->check(ParsedBy(&procfs::ParseServiceRule, "NAME=REGEX"));
  app.add_option("--label", f.label_flags,
                 "KEY=VALUE: a label of every target (repeatable), e.g. region=eu-west; a "
                 "process's own STRATA_LABELS and derived labels (build_id, version, "
                 "container_id, pod, namespace) win over it")
      ->check(ParsedBy(&labels::ParseLabel, "KEY=VALUE"));
  app.add_option("--frequency", f.frequency, "samples per second per thread")
      ->check(CLI::Range(1u, 10000u))
      ->capture_default_str();
  app.add_option("--interval", f.interval_s, "seconds between batches")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_option("--stack-bytes", f.stack_bytes, "bytes of stack copied per sample")
      ->check(CLI::Range(512u, 63u * 1024u))
      ->capture_default_str();
  app.add_option("--max-frames", f.max_frames,
                 "user frames unwound per stack (deeper stacks end there, truncated; each "
                 "sampled thread's unwinding state grows with it)")
      ->check(CLI::Range(kMaxFramesFloor, kMaxFramesCeiling))
      ->capture_default_str();
  rpc::AddClientSecurityFlags(&app, &f.security);
  app.add_option("--agent-id", f.agent_id,
                 "agent identity (default: host-<8 hex digits>, kept for the process's life)");
  app.add_option("--host", f.host, "host label")->capture_default_str();
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
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
  app.add_option("--frame-walk", f.frame_walk,
                 "x86-64: each CPU-time sample also carries the kernel's frame-pointer walk "
                 "of the user stack, which crosses Go's system-stack switches as they were at "
                 "the sample (costs the target one walk of its frame pointers per sample)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--python-frames", f.python_frames,
                 "Python functions (CPython 3.8 to 3.15) in place of the interpreter's "
                 "eval-loop frames, read from its thread states (needs ptrace access to the "
                 "targets: CAP_SYS_PTRACE or the same user)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--python-capture", f.python_capture,
                 "Python frames copied by the kernel at each sample (a BPF program on the "
                 "perf events: needs root and Linux 5.8+), instead of read from the target's "
                 "memory after it; auto: where the kernel allows")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--python-read-period-ms", f.python_read_period_ms,
                 "Python targets whose samples are not delivered one by one (an interpreter "
                 "loaded after the target was found, in-process rings, ad hoc captures): "
                 "their samples are recorded (and their Python frames read) at most this many "
                 "milliseconds after they were taken")
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
  app.add_option("--requests-metric", f.requests_metrics,
                 "[SERVICE=]http://HOST:PORT/PATH#NAME{label=\"value\"}: a Prometheus counter "
                 "of the requests served, scraped every interval and shipped with the batch for "
                 "CPU per request in comparisons (SERVICE: of the targets; default: the one "
                 "service profiled; repeatable, one per service)");
}

namespace {

// The flags' profiling options; a usage error names the flag.
absl::StatusOr<ProfilerOptions> ProfilerOptionsFrom(const AgentFlags& f) {
  ProfilerOptions options;
  options.frequency_hz = f.frequency;
  options.stack_bytes = f.stack_bytes & ~7u;
  options.max_frames = f.max_frames;
  // The modes' texts were checked by CLI11.
  options.unwind_verify = *unwind::ParseVerifyMode(f.unwind_verify);
  options.inproc = *ParseInprocMode(f.inproc_mode);
  options.inproc_dir = f.inproc_dir;
  options.sampling = *ParseSamplingMode(f.sampling);
  options.kernel_stacks = *ParseKernelStacksMode(f.kernel_stacks);
  options.off_cpu = f.off_cpu;
  options.off_cpu_threshold = absl::Microseconds(f.off_cpu_threshold_us);
  options.python_frames = f.python_frames == "on";
  options.python_capture = *ParsePythonCaptureMode(f.python_capture);
  options.frame_walk = f.frame_walk == "on";
  options.python_read_period = absl::Microseconds(f.python_read_period_ms * 1000);
  options.jvm_perf_maps.services = f.jvm_perf_map_services;
  options.jvm_perf_maps.max_period = absl::Seconds(f.jvm_perf_map_period_s);
  for (int pid : f.pids) options.pids.push_back(pid);
  for (const auto& flag : f.service_flags) {
    auto rule = procfs::ParseServiceRule(flag);
    if (!rule.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--service ", flag, ": ", rule.status().message()));
    }
    options.service_rules.push_back(*rule);
  }
  return options;
}

absl::StatusOr<std::map<std::string, std::string>> AgentLabels(const AgentFlags& f) {
  std::map<std::string, std::string> agent_labels;
  for (const auto& flag : f.label_flags) {
    auto label = labels::ParseLabel(flag);
    if (!label.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--label ", flag, ": ", label.status().message()));
    }
    agent_labels[label->first] = label->second;
  }
  return agent_labels;
}

}  // namespace

absl::StatusOr<AgentOptions> AgentOptionsFromFlags(const AgentFlags& f) {
  if (f.pids.empty() && f.service_flags.empty()) {
    return absl::InvalidArgumentError("nothing to profile: give --pid or --service");
  }
  AgentOptions options;
  options.log_level = f.log_level;
  auto profiler = ProfilerOptionsFrom(f);
  if (!profiler.ok()) return profiler.status();
  options.profiler = *std::move(profiler);
  auto labels = AgentLabels(f);
  if (!labels.ok()) return labels.status();
  auto servers = ParseServerList(f.server);
  if (!servers.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--server: ", servers.status().message()));
  }
  auto spool_max_bytes = base::ParseByteSize(f.spool_max);
  if (!spool_max_bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spool-max-bytes: ", spool_max_bytes.status().message()));
  }
  for (const std::string& flag : f.requests_metrics) {
    auto source = requests::ParseMetricSource(flag);
    if (!source.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--requests-metric: ", source.status().message()));
    }
    options.requests_metrics.push_back(*std::move(source));
  }
  if (options.requests_metrics.size() > 1) {
    for (const requests::MetricSource& source : options.requests_metrics) {
      if (source.service.empty()) {
        return absl::InvalidArgumentError(
            "--requests-metric: with several, each names its SERVICE= first");
      }
    }
  }
  options.shipper.servers = *std::move(servers);
  options.shipper.host = f.host;
  options.shipper.frequency_hz = f.frequency;
  options.shipper.labels = *std::move(labels);
  options.security = f.security;
  spool::SpoolOptions& spool = options.spool.spool;
  spool.dir = f.spool_dir == "none" ? "" : f.spool_dir;
  spool.max_bytes = *spool_max_bytes;
  spool.segment_bytes = std::clamp<uint64_t>(*spool_max_bytes / 16, 64 << 10, 4 << 20);
  spool.adopt = f.agent_id.empty();
  options.spool.memory_fallback = f.spool_dir == kDefaultSpoolDir;
  options.spool.agent_id = f.agent_id;
  options.captures.cpu_budget = f.capture_cpu_budget_pct / 100;
  options.interval = absl::Milliseconds(static_cast<int64_t>(f.interval_s * 1000));
  options.flush_timeout = absl::Milliseconds(static_cast<int64_t>(f.flush_timeout_s * 1000));
  return options;
}

}  // namespace strata::agent::app
