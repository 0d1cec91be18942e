// agent/symbols (strata::agent::symbols): modules with their symbols and unwind rules
// (module_cache.h), the perf maps naming JIT code (perf_map.h) and each target's address space
// over them (this header). The agent's TargetDiscovery (agent/core) owns the cache and the
// address spaces.
//
// One target process's view of its modules: which module (and which of its unwind rules and
// symbols) covers each executable mapping. Implements unwind::AddressSpace for the unwinder
// and symbolizes pcs into (module, build ID, function start, name) for the calling-context
// graph. Refresh() re-reads the mapping list after dlopen/dlclose; modules come from a shared
// ModuleCache, so refreshing only opens files that are new.
//
// JIT code: anonymous executable mappings (no path, "[anon:NAME]", or a "/memfd:" file that
// is no ELF image, as .NET double-maps its code) are JIT regions. They have no module:
// Lookup() places their pcs in none and LookupJit() reports them, so the unwinder steps out
// of them by frame pointers, or by the frame layouts a runtime's own conventions give
// (SetJitFrameLayouts: HotSpot's compiled methods keep no frame pointer). Their functions are named from the process's perf map
// (perf_map.h), read when there are JIT regions, again on every Refresh() that finds the file
// changed (only the appended bytes), and on a pc the map does not cover yet (at most every
// kPerfMapRetry). A JIT pc symbolizes to module "[jit:/tmp/perf-N.map]" with the entry's name
// and start (module_pc and function_start are absolute addresses: there is no file), or to
// "[jit]" and "[jit]+0xPC" when no entry covers it.
//
// A module gone from the mappings at a Refresh() (dlclose, munmap, a process that exited) stays
// behind the current ones, at its old addresses, for pcs no current mapping covers: samples
// are unwound up to a second or more after they were taken, and those taken before the unmap
// ran its code. Such regions go when a new mapping overlaps them, and beyond the newest
// kMaxUnmappedRegions.
//
// Not thread-safe: Refresh() must not run concurrently with Lookup()/Symbolize().
#ifndef STRATA_AGENT_SYMBOLS_PROCESS_ADDRESS_SPACE_H_
#define STRATA_AGENT_SYMBOLS_PROCESS_ADDRESS_SPACE_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "agent/symbols/module_cache.h"
#include "agent/symbols/perf_map.h"
#include "common/base/frame_kind.h"
#include "common/unwind/unwinder.h"

namespace strata::agent::symbols {

// One line of /proc/PID/maps (field names as in agent/procfs's Mapping).
struct MappingInfo {
  uint64_t start = 0;
  uint64_t end = 0;
  uint64_t offset = 0;  // file offset of `start`
  bool exec = false;
  uint64_t inode = 0;
  std::string path;
};

// Parses /proc/PID/maps (used when no procfs reader is supplied, and by tests).
absl::StatusOr<std::vector<MappingInfo>> ReadProcMaps(pid_t pid);
// Only the executable mappings of /proc/PID/maps: what unwinding and symbolization use. The
// others are skipped unparsed; a process has two per thread (its stack and guard page), so
// with thousands of threads they are most of the file.
absl::StatusOr<std::vector<MappingInfo>> ReadExecutableMappings(pid_t pid);

struct SymbolizedPc {
  std::string module_path;    // empty when pc is in no known module
  std::string build_id;       // hex, empty when the module has none
  uint64_t module_pc = 0;     // ELF vaddr of pc in the module
  uint64_t function_start = 0;  // ELF vaddr of the function start (module-relative)
  uint64_t function_end = 0;    // ... and its end (exclusive); 0: the size is not known
  std::string function_name;  // demangled; "target@plt" for PLT stubs; "module+0x..." unknown
                              // JIT code: the perf map's name, or "[jit]+0x..." unknown
  bool known_function = false;
  bool is_plt = false;
};

// Crosses stack switches (unwind::AddressSpace::CrossStack) with the runtime's state in the
// process's memory: Go's goroutine stacks (agent/golang).
class StackCrosser {
 public:
  virtual ~StackCrosser() = default;
  virtual bool Cross(const unwind::StackCrossing& at, unwind::CrossedStack* to) const = 0;
};

// The frame of a JIT code object that keeps no frame pointer (x86-64), as its entry code
// builds it. Offsets are from the code object's start (its perf map entry's): before `entry`
// nothing is pushed (the return address is at sp); from `entry` to `body` the caller's rbp is;
// from `body` on the frame is whole: `frame_bytes` from sp to the CFA, the return address at
// CFA - 8 and the caller's rbp at CFA - 16 (both kinds of HotSpot entry code leave them there).
struct JitFrameLayout {
  uint32_t entry = 0;
  uint32_t body = 0;
  uint32_t frame_bytes = 0;
  bool operator==(const JitFrameLayout&) const = default;
};

// Frame layouts of a runtime's JIT code, from the code itself (agent/jvm/hotspot_frames.h).
// Asked once per code object the walk meets, again after the perf map changed.
class JitFrameLayouts {
 public:
  virtual ~JitFrameLayouts() = default;
  // The layout of the code object `name` at [start, start + size); nullopt where none is
  // known (the walk leaves it by frame pointers).
  virtual std::optional<JitFrameLayout> Layout(uint64_t start, uint64_t size,
                                               std::string_view name) const = 0;
};

class ProcessAddressSpace final : public unwind::AddressSpace {
 public:
  ProcessAddressSpace(pid_t pid, ModuleCache* cache) : pid_(pid), cache_(cache) {}

  // Replaces the module list from `mappings` (executable, file-backed ones are used).
  // Modules that cannot be opened are skipped and counted in failed_modules(); returns the
  // first such error only when no module at all could be opened.
  absl::Status Refresh(const std::vector<MappingInfo>& mappings);
  // Re-reads /proc/PID/maps and refreshes.
  absl::Status Refresh();

  bool Lookup(uint64_t pc, const unwind::RuleSource** rules,
              uint64_t* module_pc) const override;
  // JIT regions: with a layout for the code object at pc (SetJitFrameLayouts), its rules and
  // pc's offset in it; else no rules (null) and module_pc = pc.
  bool LookupJit(uint64_t pc, const unwind::RuleSource** rules,
                 uint64_t* module_pc) const override;
  SymbolizedPc Symbolize(uint64_t pc) const;
  // Through the crosser, when one is set (else no crossing: switches end the stack).
  bool CrossStack(const unwind::StackCrossing& at, unwind::CrossedStack* to) const override {
    return crosser_ != nullptr && crosser_->Cross(at, to);
  }
  void SetStackCrosser(std::unique_ptr<StackCrosser> crosser) { crosser_ = std::move(crosser); }
  const StackCrosser* stack_crosser() const { return crosser_.get(); }
  // Frame layouts of the process's JIT code (null: none; frame pointers only).
  void SetJitFrameLayouts(std::unique_ptr<JitFrameLayouts> layouts);
  bool has_jit_frame_layouts() const { return jit_layouts_ != nullptr; }
  // JIT code objects whose layout was asked for since the last change of the perf map, and
  // of those the ones that have one.
  size_t jit_layouts_asked() const { return jit_rules_.size(); }
  size_t jit_layouts_known() const;

  // Where the perf map is read (`open_path`) and the path that names its module (`map_path`,
  // as the process wrote it). Default: PerfMapPathsOf(pid). Takes effect at the next Refresh().
  void SetPerfMap(std::string open_path, std::string map_path);
  static constexpr std::chrono::milliseconds kPerfMapRetry{200};

  // The module mapped at `pc` and the pc's ELF vaddr, or null.
  const Module* ModuleAt(uint64_t pc, uint64_t* module_pc) const;
  // Every executable mapping's module with its load bias (absolute = ELF vaddr + bias), in
  // address order; a module mapped in several regions comes once per region.
  template <typename Fn>
  void ForEachModule(Fn&& fn) const {
    for (const Region& r : regions_) fn(*r.module, r.bias);
  }

  size_t num_modules() const { return regions_.size(); }
  // Regions unmapped since an earlier Refresh() that are still looked in (see above).
  size_t num_unmapped_regions() const { return unmapped_.size(); }
  static constexpr size_t kMaxUnmappedRegions = 64;
  size_t failed_modules() const { return failed_modules_; }
  size_t num_jit_regions() const { return jit_regions_.size(); }
  // The perf map read so far (null before the first JIT region).
  const PerfMap* perf_map() const { return perf_map_ ? &perf_map_->map() : nullptr; }
  // The perf map's entry around `pc`, the map read again first where it names nothing there
  // (code newer than the last read; at most every kPerfMapRetry), as Symbolize() does. False
  // where the map names nothing there.
  bool PerfMapEntryAt(uint64_t pc, PerfMap::Symbol* out) const;
  // The module its entries are named in (base::JitModuleName of the map's path; empty before
  // the first JIT region).
  std::string perf_map_module() const {
    return perf_map_ ? base::JitModuleName(perf_map_->map_path()) : std::string();
  }
  // How many reads of the perf map found entries it did not have: the names of JIT pcs
  // (Symbolize, PerfMapEntryAt) may have changed since this was last seen, though the mappings
  // did not.
  uint64_t perf_map_generation() const { return perf_map_generation_; }
  // JIT pcs Symbolize() or the unwinder (LookupJit) found in no perf map entry, since the
  // space was made: a runtime that writes its map on request (jvm/jvm_perf_maps.h) is asked
  // again when this grows.
  uint64_t unnamed_jit_pcs() const { return unnamed_jit_pcs_; }
  // Reads what the perf map gained, at most every kPerfMapRetry: true when it gained entries
  // (a walk that stopped at a JIT pc the map did not name may now go on).
  bool ReadPerfMapAgain() const;

 private:
  struct Region {
    uint64_t start;
    uint64_t end;
    int64_t bias;  // module_pc = pc - bias
    std::shared_ptr<const Module> module;
  };
  struct JitRegion {
    uint64_t start;
    uint64_t end;
  };
  // The current region at pc, else the newest unmapped one.
  const Region* Find(uint64_t pc) const;
  // Moves the regions of regions_ that `regions` and `jit_regions` (the new lists, sorted)
  // no longer hold to unmapped_, and drops the unmapped ones they overlap.
  void KeepUnmapped(const std::vector<Region>& regions,
                    const std::vector<JitRegion>& jit_regions);
  const JitRegion* FindJit(uint64_t pc) const;
  absl::StatusOr<std::shared_ptr<const Module>> OpenModule(const MappingInfo& m);
  // Reads what the perf map gained; with `retry`, only if kPerfMapRetry has passed since the
  // last read.
  void UpdatePerfMap(bool retry) const;

  pid_t pid_;
  ModuleCache* cache_;
  std::vector<Region> regions_;  // sorted by start, non-overlapping
  std::vector<Region> unmapped_;  // oldest first; overlapping none of regions_, jit_regions_
  std::vector<JitRegion> jit_regions_;  // sorted by start, non-overlapping
  size_t failed_modules_ = 0;
  std::optional<PerfMapPaths> perf_map_paths_;  // PerfMapPathsOf(pid_) unless set
  // Read lazily and from the const Symbolize(): a cache of the file, not the space's state.
  std::unique_ptr<StackCrosser> crosser_;
  std::unique_ptr<JitFrameLayouts> jit_layouts_;
  // The rules of each JIT code object met (by start; null: no layout), valid while the perf
  // map read has not changed (`jit_rules_map_bytes_`: its bytes_read() then).
  mutable absl::flat_hash_map<uint64_t, std::unique_ptr<unwind::RuleSource>> jit_rules_;
  mutable uint64_t jit_rules_map_bytes_ = 0;
  mutable std::unique_ptr<PerfMapFile> perf_map_;
  mutable uint64_t unnamed_jit_pcs_ = 0;
  mutable uint64_t perf_map_generation_ = 0;
  mutable std::chrono::steady_clock::time_point perf_map_read_at_{};
};

}  // namespace strata::agent::symbols

#endif  // STRATA_AGENT_SYMBOLS_PROCESS_ADDRESS_SPACE_H_
