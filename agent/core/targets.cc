#include "agent/core/targets.h"

#include <algorithm>
#include <iterator>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "agent/core/target_labels.h"
#include "agent/golang/goroutine_stacks.h"
#include "agent/jvm/hotspot_attach.h"
#include "agent/jvm/hotspot_frames.h"
#include "agent/python/remote_memory.h"
#include "agent/procfs/procfs.h"
#include "common/base/log.h"
#include "common/unwind/host_arch.h"

namespace strata::agent {
namespace {

v1::Target TargetMessage(const Target& t) {
  v1::Target target;
  target.set_id(t.id);
  target.set_service(t.service);
  target.set_pid(static_cast<uint32_t>(t.pid));
  target.set_executable(t.executable);
  for (const auto& [k, v] : t.labels) (*target.mutable_labels())[k] = v;
  return target;
}

}  // namespace

absl::StatusOr<procfs::ServiceMatcher> MakeTargetMatcher(const DiscoveryOptions& options) {
  return procfs::ServiceMatcher::Create(options.service_rules,
                                        /*use_env_var=*/!options.service_rules.empty());
}

absl::StatusOr<std::unique_ptr<TargetDiscovery>> TargetDiscovery::Create(
    const DiscoveryOptions& options) {
  auto matcher = MakeTargetMatcher(options);
  if (!matcher.ok()) return matcher.status();
  // An explicit pid is named like a discovered process (a matching --service rule, or its
  // STRATA_SERVICE when there are rules), else by its STRATA_SERVICE or executable name.
  std::vector<std::pair<pid_t, std::string>> pinned;
  for (pid_t pid : options.pids) {
    auto exe = procfs::ReadExecutable(pid);
    if (!exe.ok()) {
      return absl::NotFoundError(absl::StrCat("--pid ", pid, ": no such process (",
                                              exe.status().message(), ")"));
    }
    auto env = procfs::ReadEnvironValue(pid, procfs::kServiceEnvVar);
    procfs::ProcessIdentity identity{*exe, procfs::ReadCommandLine(pid).value_or(std::vector<std::string>()),
                                     env.ok() ? *env : std::nullopt};
    std::optional<std::string> service = matcher->Match(identity);
    if (!service) {
      service = identity.env_service ? *identity.env_service
                                     : std::string(procfs::ExecutableBasename(*exe));
    }
    pinned.emplace_back(pid, *std::move(service));
  }
  procfs::ProcessTracker tracker(std::move(*matcher), {});
  for (auto& [pid, service] : pinned) tracker.Track(pid, std::move(service));
  // Opened before the first scan, so that nothing after that scan goes unseen.
  std::unique_ptr<procfs::ProcessEvents> events;
  if (options.process_events) {
    auto opened = procfs::ProcessEvents::Open();
    if (opened.ok()) {
      events = std::move(*opened);
    } else {
      LogInfo("process events unavailable ({}); scanning /proc on a period",
                   opened.status().ToString());
    }
  }
  std::unique_ptr<jvm::JvmPerfMaps> jvm_perf_maps;
  if (!options.jvm_perf_maps.services.empty()) {
    jvm_perf_maps = std::make_unique<jvm::JvmPerfMaps>(options.jvm_perf_maps);
  }
  return std::unique_ptr<TargetDiscovery>(
      new TargetDiscovery(std::move(tracker), std::move(events), std::move(jvm_perf_maps)));
}

absl::StatusOr<procfs::ProcessChanges> TargetDiscovery::Scan() {
  if (events_ == nullptr) return tracker_.Rescan();
  // Before the read, so that the /proc reads of this Update() (a process pinned since the last
  // scan) come after the kernel keeps its events.
  if (absl::Status st = events_->WatchOnly(tracker_.PidsOfInterest()); !st.ok()) {
    LogWarn("process events: {}; keeping every process's events", st.ToString());
  }
  batch_.Clear();
  if (absl::Status st = events_->Read(&batch_); !st.ok()) {
    LogWarn("process events: {}; scanning /proc on a period from now on", st.ToString());
    events_.reset();
    return tracker_.Rescan();
  }
  return tracker_.Update(batch_);
}

std::unique_ptr<Target> TargetDiscovery::NewTarget(const procfs::TrackedProcess& process,
                                                   sources::StackSource* source) {
  auto target = std::make_unique<Target>();
  target->id = next_target_id_++;
  target->pid = process.pid;
  target->service = process.service;
  target->executable = process.executable;
  std::vector<std::string> label_warnings;
  target->labels = TargetLabels(process, &label_warnings);
  for (const std::string& w : label_warnings) {
    LogWarn("pid {} ({}): {}", process.pid, process.executable, w);
  }
  target->space = std::make_unique<symbols::ProcessAddressSpace>(process.pid, &modules_);
  // Go's stack switches are crossed with the target's memory (only Go's rules ask).
  target->space->SetStackCrosser(std::make_unique<golang::GoroutineStacks>(
      unwind::kHostArch, std::make_unique<python::RemoteMemory>(process.pid)));
  target->source = source;
  RefreshMappings(*target);
  target->added_at = target->maps_read_at;
  next_new_target_reread_ =
      std::min(next_new_target_reread_, target->added_at + kNewTargetRereads[0]);
  return target;
}

void TargetDiscovery::Insert(std::unique_ptr<Target> target) {
  const pid_t pid = target->pid;
  targets_[pid] = std::move(target);
  ++generation_;
}

void TargetDiscovery::Remove(pid_t pid) {
  auto it = targets_.find(pid);
  if (it == targets_.end()) return;
  retired_.push_back(TargetMessage(*it->second));
  if (jvm_perf_maps_ != nullptr && it->second->jvm) jvm_perf_maps_->Forget(pid);
  targets_.erase(it);
  ++generation_;
  LogInfo("pid {} exited or changed; no longer profiled", pid);
}

Target* TargetDiscovery::Find(pid_t pid) {
  auto it = targets_.find(pid);
  return it == targets_.end() ? nullptr : it->second.get();
}

bool TargetDiscovery::RefreshMappings(Target& target) {
  // Sources that unwind in the target (in-process rings) publish its mappings: under
  // qemu-user /proc/PID/maps shows the emulator's mappings, not the guest's.
  const bool from_source = target.source != nullptr && target.source->ProvidesMappings();
  std::vector<symbols::MappingInfo> maps;
  size_t hash = 0;
  target.maps_read_at = absl::Now();
  if (from_source) {
    uint64_t generation = 0;
    auto source_maps = target.source->Mappings(target.pid, &generation);
    if (!source_maps.ok()) return false;
    maps = std::move(*source_maps);
    hash = absl::HashOf(generation);
  } else {
    auto proc_maps = symbols::ReadExecutableMappings(target.pid);
    // A process that exited (a zombie too) shows no mappings: its samples still to be
    // unwound need the ones read while it lived.
    if (!proc_maps.ok() || proc_maps->empty()) return false;
    maps = std::move(*proc_maps);
  }
  for (const auto& m : maps) {
    if (!from_source && !m.exec) continue;
    hash = absl::HashOf(hash, m.start, m.end, m.offset, m.inode, m.path);
  }
  if (hash == target.maps_hash && target.space->num_modules() > 0) {
    // JIT code: the perf map grows while the mappings stay. New entries name pcs that were
    // resolved as "[jit]+0x..." before: a new epoch resolves them again. (Against the size
    // of the last epoch: symbolizing an unnamed pc reads the map too.)
    if (target.space->num_jit_regions() == 0) return false;
    (void)target.space->Refresh(maps);
    const size_t entries = target.space->perf_map() ? target.space->perf_map()->size() : 0;
    if (entries == target.perf_map_entries) return false;
    target.perf_map_entries = entries;
    ++target.maps_epoch;
    return true;
  }
  target.maps_hash = hash;
  ++target.maps_epoch;
  if (auto st = target.space->Refresh(maps); !st.ok()) {
    LogWarn("pid {}: {}", target.pid, st.ToString());
  }
  target.perf_map_entries = target.space->perf_map() ? target.space->perf_map()->size() : 0;
  target.jvm = false;
  target.space->ForEachModule([&](const symbols::Module& m, int64_t) {
    target.jvm |= jvm::IsLibJvm(m.path);
  });
  // HotSpot's compiled methods keep no frame pointer: their frames are read from their entry
  // code (x86-64; elsewhere Debian's JDK has no JIT).
  if (target.jvm && unwind::kHostArch == unwind::Arch::kX86_64 &&
      !target.space->has_jit_frame_layouts()) {
    target.space->SetJitFrameLayouts(std::make_unique<jvm::HotSpotFrames>(
        std::make_unique<python::RemoteMemory>(target.pid)));
  }
  ++refreshes_;
  return true;
}

void TargetDiscovery::RefreshMappingsPeriodically(Target& target) {
  const bool from_source = target.source != nullptr && target.source->ProvidesMappings();
  if (!from_source && target.space->num_jit_regions() == 0 &&
      ++target.intervals_unchecked < kMapsCheckIntervals) {
    return;
  }
  target.intervals_unchecked = 0;
  RefreshMappings(target);
}

void TargetDiscovery::AskJvmsForPerfMaps() {
  if (jvm_perf_maps_ == nullptr) return;
  const absl::Time now = absl::Now();
  for (const auto& [pid, target] : targets_) {
    if (target->jvm && jvm_perf_maps_->Wants(target->service)) {
      jvm_perf_maps_->Tick(target->pid, now, target->space->unnamed_jit_pcs());
    }
  }
}

bool TargetDiscovery::RefreshSoon(Target& target) {
  if (absl::Now() - target.maps_read_at < target.no_module_wait) return false;
  const bool changed = RefreshMappings(target);
  target.no_module_wait = changed ? kMinNoModuleWait
                                  : std::clamp(2 * target.no_module_wait, kMinNoModuleWait,
                                               kMaxNoModuleWait);
  return changed;
}

absl::Time TargetDiscovery::RereadNewTargets(absl::Time now) {
  if (now < next_new_target_reread_) return next_new_target_reread_;
  constexpr uint32_t kRereads = std::size(kNewTargetRereads);
  next_new_target_reread_ = absl::InfiniteFuture();
  for (auto& [pid, target] : targets_) {
    if (target->new_target_rereads >= kRereads) continue;
    if (now >= target->added_at + kNewTargetRereads[target->new_target_rereads]) {
      RefreshMappings(*target);
      // Rereads that fell due together are one.
      while (target->new_target_rereads < kRereads &&
             now >= target->added_at + kNewTargetRereads[target->new_target_rereads]) {
        ++target->new_target_rereads;
      }
    }
    if (target->new_target_rereads < kRereads) {
      next_new_target_reread_ =
          std::min(next_new_target_reread_,
                   target->added_at + kNewTargetRereads[target->new_target_rereads]);
    }
  }
  return next_new_target_reread_;
}

void TargetDiscovery::SetSource(Target& target, sources::StackSource* source) {
  target.source = source;
  target.maps_hash = 0;
  RefreshMappings(target);
}

std::vector<v1::Target> TargetDiscovery::targets() const {
  std::vector<v1::Target> out;
  for (const auto& [pid, t] : targets_) out.push_back(TargetMessage(*t));
  return out;
}

void TargetDiscovery::DropRetired(absl::FunctionRef<bool(uint32_t target_id)> referenced) {
  std::erase_if(retired_, [&](const v1::Target& t) { return !referenced(t.id()); });
}

}  // namespace strata::agent
