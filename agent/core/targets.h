// Target discovery: which processes the agent profiles (explicit pids and processes matching
// the service rules, via procfs::ProcessTracker), the target table, and each target's view of
// its mappings (its symbols::ProcessAddressSpace, refreshed from /proc/PID/maps or from the
// stack source that serves it). Owns the targets, their address spaces and the module cache
// they share; attaching targets to stack sources is the Profiler's.
//
// Single-threaded: the agent's main loop.
#ifndef STRATA_AGENT_CORE_TARGETS_H_
#define STRATA_AGENT_CORE_TARGETS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/jvm/jvm_perf_maps.h"
#include "agent/procfs/process_events.h"
#include "agent/procfs/process_tracker.h"
#include "agent/procfs/service_matcher.h"
#include "agent/sources/stack_source.h"
#include "agent/symbols/module_cache.h"
#include "agent/symbols/process_address_space.h"
#include "common/labels/labels.h"
#include "strata/v1/ingest.pb.h"

namespace strata::agent {

struct DiscoveryOptions {
  // Processes matching a rule, and processes that name themselves with STRATA_SERVICE.
  // Without rules nothing is discovered: only `pids` are profiled.
  std::vector<procfs::ServiceRule> service_rules;
  std::vector<pid_t> pids;  // explicit targets (service: STRATA_SERVICE or executable name)
  // Follow the kernel's process events (procfs/process_events.h) where it reports them to this
  // agent; else, and when false, /proc is scanned on a period.
  bool process_events = true;
  // JVM targets of these services are asked for perf maps of their JIT code
  // (jvm/jvm_perf_maps.h); "*" for every JVM.
  jvm::JvmPerfMapOptions jvm_perf_maps;
};

// The matcher that decides which processes besides `pids` the agent profiles. STRATA_SERVICE
// makes a process a target only when the agent discovers processes (it has service rules):
// an agent given only --pid profiles exactly those processes, not every process on the host
// that happens to name itself.
absl::StatusOr<procfs::ServiceMatcher> MakeTargetMatcher(const DiscoveryOptions& options);

struct Target {
  uint32_t id = 0;
  pid_t pid = 0;
  std::string service;
  std::string executable;
  labels::LabelSet labels;  // computed once, when the process became a target
  std::unique_ptr<symbols::ProcessAddressSpace> space;
  sources::StackSource* source = nullptr;  // what samples it (null: nothing can)
  size_t maps_hash = 0;
  // Bumped on every mapping change: caches of resolved pcs and unwound frames are stale.
  uint64_t maps_epoch = 0;
  size_t perf_map_entries = 0;  // the JIT perf map's size in this epoch
  absl::Time maps_read_at = absl::InfinitePast();  // the last read, whatever it found
  // RefreshSoon's wait since the last read: doubles while reads find nothing new.
  absl::Duration no_module_wait = absl::ZeroDuration();
  absl::Time added_at = absl::InfinitePast();  // when NewTarget read its mappings first
  uint32_t new_target_rereads = 0;  // of TargetDiscovery::kNewTargetRereads done
  uint32_t intervals_unchecked = 0;  // since the last periodic look at the mappings
  bool jvm = false;                  // libjvm.so is mapped: HotSpot
};

class TargetDiscovery {
 public:
  // NotFound when an explicit pid does not exist; the matcher's errors.
  static absl::StatusOr<std::unique_ptr<TargetDiscovery>> Create(const DiscoveryOptions& options);

  // Processes and threads that appeared and went since the last scan: from the process events
  // pending (reading /proc only for the processes they name), or from all of /proc.
  absl::StatusOr<procfs::ProcessChanges> Scan();
  // True when the kernel reports process and thread changes (events_fd() is readable when
  // there are some): Scan() then needs calling only when it is, or on a period while
  // has_pending().
  bool watches_events() const { return events_ != nullptr; }
  int events_fd() const { return events_ != nullptr ? events_->fd() : -1; }
  bool has_pending() const { return tracker_.has_pending(); }

  // A target for `process` sampled by `source`, with its mappings read; not in the table
  // until Insert().
  std::unique_ptr<Target> NewTarget(const procfs::TrackedProcess& process,
                                    sources::StackSource* source);
  void Insert(std::unique_ptr<Target> target);
  // Drops the target; batches still name it until DropRetired().
  void Remove(pid_t pid);
  Target* Find(pid_t pid);

  // Re-reads the target's mappings (from /proc, or from its source) if they changed; true
  // when they did.
  bool RefreshMappings(Target& target);
  // Once per shipping interval: RefreshMappings, for /proc-read targets without JIT code only
  // every kMapsCheckIntervals intervals. Their new modules refresh them at once (a pc in no
  // known module: RefreshSoon), so the periodic read only catches a module replaced where
  // another was; and a process's maps list two mappings per thread, so with thousands of
  // threads each read costs the kernel milliseconds. JIT code's perf maps grow between
  // mapping changes, and in-process sources report their changes cheaply: every interval.
  void RefreshMappingsPeriodically(Target& target);
  static constexpr uint32_t kMapsCheckIntervals = 6;
  // At each of the main loop's wake-ups: the JVM targets whose perf maps are wanted tell
  // JvmPerfMaps how much JIT code their maps did not name, so that a JVM is asked for a new map
  // within about a second of compiling code, not at the next shipping interval.
  void AskJvmsForPerfMaps();
  // A pc in no known module usually means a library was mapped since the last read: reads the
  // mappings again unless the last read was within the target's no_module_wait (10 ms,
  // doubling up to 1 s while the reads find nothing new, as for code no mapping names).
  // True when the mappings changed (the sample is worth unwinding again).
  bool RefreshSoon(Target& target);
  static constexpr absl::Duration kMinNoModuleWait = absl::Milliseconds(10);
  static constexpr absl::Duration kMaxNoModuleWait = absl::Seconds(1);
  // A process found at its exec (or fork) is read before its dynamic loader mapped its
  // libraries, and a short-lived one may be gone before its samples are drained (about a
  // second later) and a pc in no module could read its mappings again: new targets are read
  // again at these delays after they were added.
  static constexpr absl::Duration kNewTargetRereads[] = {
      absl::Milliseconds(10), absl::Milliseconds(100), absl::Seconds(1)};
  // The rereads of new targets due by `now`; returns when the next one is due (InfiniteFuture:
  // none left).
  absl::Time RereadNewTargets(absl::Time now);
  // The target is served by `source` from now on; its mappings are re-read.
  void SetSource(Target& target, sources::StackSource* source);

  const absl::flat_hash_map<pid_t, std::unique_ptr<Target>>& all() const { return targets_; }
  std::vector<v1::Target> targets() const;
  // Changes whenever a target is inserted or removed.
  uint64_t generation() const { return generation_; }
  // Targets removed whose samples may still wait in an aggregator (continuous, off-CPU or a
  // capture's): every batch names them with the current ones, or the server would refuse
  // the batch for its contexts of an unknown target.
  const std::vector<v1::Target>& retired() const { return retired_; }
  // Forgets the retired targets no aggregator holds samples of (`referenced` says which do).
  void DropRetired(absl::FunctionRef<bool(uint32_t target_id)> referenced);
  uint64_t refreshes() const { return refreshes_; }
  // Null when no service's JVMs are asked for perf maps.
  const jvm::JvmPerfMaps* jvm_perf_maps() const { return jvm_perf_maps_.get(); }

 private:
  TargetDiscovery(procfs::ProcessTracker tracker, std::unique_ptr<procfs::ProcessEvents> events,
                  std::unique_ptr<jvm::JvmPerfMaps> jvm_perf_maps)
      : tracker_(std::move(tracker)),
        events_(std::move(events)),
        jvm_perf_maps_(std::move(jvm_perf_maps)) {}

  procfs::ProcessTracker tracker_;
  std::unique_ptr<procfs::ProcessEvents> events_;  // null: /proc scans only
  procfs::ProcessEventBatch batch_;                // reused by every Scan()
  symbols::ModuleCache modules_;
  absl::flat_hash_map<pid_t, std::unique_ptr<Target>> targets_;
  std::vector<v1::Target> retired_;
  uint32_t next_target_id_ = 1;
  uint64_t generation_ = 0;
  uint64_t refreshes_ = 0;
  absl::Time next_new_target_reread_ = absl::InfiniteFuture();
  std::unique_ptr<jvm::JvmPerfMaps> jvm_perf_maps_;  // null: none asked
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_TARGETS_H_
