#include "agent/app/agent_app.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agent/core/interval_loop.h"
#include "agent/procfs/procfs.h"
#include "common/base/crc32c.h"
#include "common/base/log.h"
#include "common/rpc/grpc_timers.h"
#include "common/unwind/host_arch.h"

namespace strata::agent::app {
namespace {

constexpr char kVersion[] = "0.1.0";

struct OpenedSpool {
  std::unique_ptr<spool::Spool> spool;
  std::unique_ptr<ContextGraph> graph;
  spool::SpoolRecovery recovery;
};

// Who this agent is: the identity of an earlier run that left batches in the spool, or a
// new one (a new graph, sequence numbers from 1).
absl::StatusOr<OpenedSpool> OpenSpool(const AgentSpoolOptions& options, const std::string& host) {
  std::random_device random;
  spool::SpoolIdentity fresh;
  fresh.graph_id = (uint64_t{random()} << 32) | random();
  fresh.host = host;
  fresh.agent_id = options.agent_id.empty() ? GeneratedAgentId(host) : options.agent_id;
  spool::SpoolOptions spool_options = options.spool;
  OpenedSpool opened;
  auto restore = [&opened](const spool::SpoolIdentity& resumed,
                           const v1::GraphDelta& delta) {
    if (opened.graph == nullptr) {
      opened.graph = std::make_unique<ContextGraph>(resumed.graph_id);
    }
    return opened.graph->Restore(delta);
  };
  auto opened_spool = spool::Spool::Open(spool_options, fresh, restore, &opened.recovery);
  if (!opened_spool.ok() && options.memory_fallback &&
      !absl::IsFailedPrecondition(opened_spool.status())) {
    // Not running as the service (no access to the default place): keep the spool in memory.
    LogWarn("spool: {}; batches are kept in memory only (give --spool-dir)",
                 std::string(opened_spool.status().message()));
    opened.graph.reset();
    spool_options.dir.clear();
    opened_spool = spool::Spool::Open(spool_options, fresh, restore, &opened.recovery);
  }
  if (!opened_spool.ok()) return opened_spool.status();
  opened.spool = std::move(*opened_spool);
  const spool::SpoolRecovery& recovery = opened.recovery;
  const spool::SpoolIdentity& identity = recovery.identity;
  if (opened.graph == nullptr || !recovery.resumed) {
    opened.graph = std::make_unique<ContextGraph>(identity.graph_id);
  }
  if (recovery.resumed) {
    LogInfo("spool {}: resuming as agent {} (graph {:x}): {} batches ({} samples) to "
                 "deliver, {} graph records", recovery.path, identity.agent_id,
                 identity.graph_id, recovery.batches, recovery.samples, recovery.graph_records);
  }
  for (size_t i = 0; i < opened.spool->size(); ++i) {
    LogDebug("recovered batch {} ({} samples)", opened.spool->entry(i).sequence,
                  opened.spool->entry(i).samples);
  }
  if (recovery.corrupt_records > 0 || recovery.orphaned_batches > 0) {
    LogWarn("spool {}: skipped {} torn or corrupt records and {} batches whose graph was "
                 "lost", recovery.path, recovery.corrupt_records, recovery.orphaned_batches);
  }
  return opened;
}

void LogSamplingSummary(const ProfilerStats& stats, const std::string& verify) {
  LogInfo("stopping: {} samples, {} frames, {} truncated, {} lost; flushing", stats.samples,
               stats.unwound_frames, stats.truncated, stats.lost);
  LogInfo("unwinding ({}): {} frames walked, {} reused, {} verification failures", verify,
               stats.frames_walked, stats.frames_reused, stats.unwind_verify_failures);
  if (stats.stacks_refilled > 0) {
    LogInfo("{} stacks copied short by the kernel (pages not resident) completed from memory",
            stats.stacks_refilled);
  }
  if (stats.stack_crossings + stats.stack_crossings_failed > 0) {
    LogInfo("stack switches: {} crossed, {} not crossed", stats.stack_crossings,
                 stats.stack_crossings_failed);
  }
  LogInfo("sampling: {} perf events, {} wake-ups, {} target scans, {} samples of other "
               "processes dropped ({} in the kernel)", stats.perf_events, stats.wakeups,
               stats.rescans, stats.filtered, stats.filtered_in_kernel);
  if (stats.filter_runs > 0) {
    // With a Python capture chained, its runs are part of these.
    LogInfo("in-kernel filter: {} runs, {:.0f} ns each", stats.filter_runs,
            static_cast<double>(stats.filter_ns) / static_cast<double>(stats.filter_runs));
  }
  if (stats.kernel_stacks) LogInfo("kernel stacks: {} kernel frames", stats.kernel_frames);
  if (stats.off_cpu_switches > 0) {
    LogInfo("off-CPU: {} switch-outs, {} counted ({:.3f} s), {} under the threshold, {} "
                 "unpaired", stats.off_cpu_switches, stats.off_cpu_counted,
                 static_cast<double>(stats.off_cpu_ns) / 1e9, stats.off_cpu_short,
                 stats.off_cpu_unpaired);
  }
  if (stats.python_reads > 0) {
    const uint64_t delayed = stats.python_reads - stats.python_captured;
    LogInfo("python: {} stacks with {} Python frames, {} stale ({} changed while read, {} "
            "not matching the sample); {} copied at the sample, {} reads {:.3f} ms after "
            "their sample on average (max {:.3f} ms)", stats.python_stacks,
            stats.python_frames, stats.python_stale, stats.python_torn,
            stats.python_mismatch, stats.python_captured, delayed,
            delayed == 0 ? 0.0
                         : static_cast<double>(stats.python_read_delay_ns) / 1e6 /
                               static_cast<double>(delayed),
            static_cast<double>(stats.python_read_delay_max_ns) / 1e6);
  }
  if (stats.java_frames > 0 || stats.java_unnamed > 0 || stats.java_inlined > 0) {
    LogInfo("java: {} interpreted frames named by their method (those a thread's next stack "
            "kept not counted again), {} left as the interpreter's, {} frames of inlined calls",
            stats.java_frames, stats.java_unnamed, stats.java_inlined);
  }
  if (stats.python_capture && (stats.capture.threads > 0 || stats.capture.snapshots > 0)) {
    LogInfo("python capture: {} snapshots, {} used, {} of samples that never came, {} samples "
            "without one, {} threads; program: {} runs, {:.0f} ns each ({}), {} perf events "
            "without it", stats.capture.snapshots, stats.capture.found,
            stats.capture.unmatched, stats.capture.missing, stats.capture.threads,
            stats.capture_runs.count,
            stats.capture_runs.count == 0 ? 0.0
                                          : static_cast<double>(stats.capture_runs.ns) /
                                                static_cast<double>(stats.capture_runs.count),
            stats.capture_runs.count == 0 ? "kernel.bpf_stats_enabled=1 counts them"
                                          : "kernel.bpf_stats_enabled",
            stats.programs_not_attached);
  }
  if (stats.inproc_targets > 0 || stats.unwound_stacks > 0) {
    LogInfo("in-process rings: {} stacks, {} targets", stats.unwound_stacks,
                 stats.inproc_targets);
  }
}

// Waits up to `timeout` for the server to acknowledge every batch, then says what is left.
void FlushAndStop(Shipper& shipper, const spool::Spool& spool,
                  absl::Duration timeout) {
  const bool flushed = shipper.Flush(timeout);
  shipper.Stop();
  const ShipperStats shipped = shipper.stats();
  if (shipped.spool.batches_dropped > 0) {
    LogWarn("spool: dropped {} batches ({} samples) past --spool-max-bytes",
                 shipped.spool.batches_dropped, shipped.spool.samples_dropped);
  }
  if (flushed) return;
  if (spool.path().empty()) {
    LogWarn("server did not acknowledge every batch before shutdown: {} batches lost "
                 "(the spool is in memory)", shipped.spool.batches);
  } else {
    // Batches the disk refused are only in memory, and a spool whose graph was abandoned is
    // not resumed: neither goes out after a restart.
    const size_t resumable = spool.ResumableBatches();
    LogWarn("server did not acknowledge every batch before shutdown: {} batches stay in "
            "the spool {} and go out when the agent starts again{}",
            resumable, spool.path(),
            resumable == shipped.spool.batches
                ? ""
                : absl::StrCat("; ", shipped.spool.batches - resumable,
                               " more are lost (the disk refused them or their call graph)"));
  }
}

}  // namespace

std::string GeneratedAgentId(const std::string& host) {
  absl::StatusOr<std::string> boot_id = procfs::ReadProcFile("/proc/sys/kernel/random/boot_id");
  const pid_t pid = getpid();
  absl::StatusOr<uint64_t> start_time = procfs::ReadStartTime(pid);
  // Agents in containers of one host can share a pid (1) and a start tick: their PID
  // namespaces differ.
  char pid_namespace[64] = {};
  (void)!readlink("/proc/self/ns/pid", pid_namespace, sizeof pid_namespace - 1);
  uint32_t tag;
  if (boot_id.ok() && start_time.ok()) {
    tag = base::Crc32c(absl::StrCat(*boot_id, " ", pid_namespace, " ", pid, " ", *start_time));
  } else {
    tag = std::random_device()();
  }
  return absl::StrFormat("%s-%08x", host, tag);
}

absl::StatusOr<std::unique_ptr<AgentApp>> AgentApp::Create(AgentOptions options) {
  auto security = rpc::ClientSecurity::Load(options.security);
  if (!security.ok()) return security.status();
  options.shipper.security = *std::move(security);
  return std::unique_ptr<AgentApp>(new AgentApp(std::move(options)));
}

AgentApp::AgentApp(AgentOptions options) : options_(std::move(options)) {}

AgentApp::~AgentApp() {
  // The shipper's thread hands control messages to the captures, destroyed first.
  if (shipper_ != nullptr) shipper_->Stop();
}

absl::Status AgentApp::Start() {
  auto opened = OpenSpool(options_.spool, options_.shipper.host);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("spool: ", opened.status().message()));
  }
  spool_ = std::move(opened->spool);
  graph_ = std::move(opened->graph);
  recovery_ = std::move(opened->recovery);
  auto profiler = Profiler::Create(options_.profiler, graph_.get());
  if (!profiler.ok()) return absl::Status(profiler.status().code(), profiler.status().ToString());
  profiler_ = std::move(*profiler);

  ShipperOptions ship = options_.shipper;
  ship.agent_id = recovery_.identity.agent_id;
  ship.arch = std::string(unwind::ArchName(unwind::kHostArch));
  ship.version = kVersion;
  ship.spool_corrupt_records = recovery_.corrupt_records;
  ship.spool_orphaned_batches = recovery_.orphaned_batches;
  shipper_ = std::make_unique<Shipper>(std::move(ship), graph_.get(), spool_.get());
  captures_ = std::make_unique<CaptureController>(
      profiler_.get(), options_.captures,
      CaptureController::Sink{
          [this](v1::SampleBatch b) { shipper_->Enqueue(std::move(b)); },
          [this](v1::CaptureStatus s) { shipper_->SendStatus(std::move(s)); }});
  // Control messages arrive on the shipper's thread; the main loop applies them.
  shipper_->SetControlHandler([this](const v1::ServerMessage& m) {
    captures_->HandleMessage(m);
    profiler_->Wake();
  });
  // The shipper's thread, awake anyway for every batch, runs gRPC's timers: gRPC's own timer
  // threads would wake at least once a second.
  if (absl::Status timers = rpc::RunGrpcTimersOnCaller(); !timers.ok()) {
    LogInfo("gRPC's timers stay on gRPC's threads: {}", timers.ToString());
  }
  shipper_->Start();
  return absl::OkStatus();
}

int AgentApp::Run(const std::atomic<bool>& stop) {
  const ShipperOptions& ship = options_.shipper;
  LogInfo("strata-agent {} on {} ({}), shipping to {} every {} s at {} Hz",
               recovery_.identity.agent_id, ship.host, unwind::ArchName(unwind::kHostArch),
               absl::StrJoin(ship.servers, ","), absl::ToDoubleSeconds(options_.interval),
               ship.frequency_hz);
  IntervalLoop loop(options_.interval,
                    // A resumed incarnation numbers on; a new one from 1 (the server
                    // refuses a first batch numbered 2^20 or more above nothing).
                    recovery_.resumed ? recovery_.last_sequence : 0,
                    profiler_.get(), shipper_.get(), captures_.get());
  // Each on its own thread, so a slow endpoint never holds up sampling; a fetch gets at most
  // half an interval.
  std::vector<std::unique_ptr<requests::RequestsScraper>> scrapers;
  for (const requests::MetricSource& source : options_.requests_metrics) {
    scrapers.push_back(std::make_unique<requests::RequestsScraper>(
        source, options_.interval, std::min(options_.interval / 2, absl::Seconds(5))));
    loop.AddRequestsScraper(scrapers.back().get());
  }
  loop.Run(stop);
  for (const auto& scraper : scrapers) {
    const requests::ScraperStats s = scraper->stats();
    LogInfo("requests metric {}: {} scrapes, {} failed, {} counter resets",
                 scraper->source().name, s.scrapes, s.failures, s.resets);
  }
  LogSamplingSummary(profiler_->stats(),
                     std::string(unwind::VerifyModeName(options_.profiler.unwind_verify)));
  const ShippedBatches& shipped = loop.shipped();
  LogInfo("batches: {} cpu ({} bytes), {} off-cpu ({} bytes)", shipped.cpu_batches,
               shipped.cpu_bytes, shipped.off_cpu_batches, shipped.off_cpu_bytes);
  FlushAndStop(*shipper_, *spool_, options_.flush_timeout);
  if (loop.new_graph_due()) {
    const bool server_ahead = shipper_->ServerAhead();
    if ((server_ahead || shipper_->GraphPastServerLimits()) && !spool_->empty()) {
      LogError("dropping {} batches that {}: the next start would resume that graph for good",
               spool_->size(),
               server_ahead ? "the server would decode as other stacks (it is ahead of them)"
                            : "need call graph past the server's limits (it refuses that graph)");
      spool_->DropAll();
    }
    if (server_ahead) return kRunAgain;  // the shipper said why
    const ShipperStats shipped = shipper_->stats();
    LogWarn("the call graph ({} nodes, {} edges) passed half of the server's limits ({} "
            "nodes, {} edges): starting again with a new graph",
            graph_->num_nodes(), graph_->num_edges(), shipped.server_max_graph_nodes,
            shipped.server_max_graph_edges);
    return kRunAgain;
  }
  return 0;
}

}  // namespace strata::agent::app
