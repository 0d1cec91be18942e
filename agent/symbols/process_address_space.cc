#include "agent/symbols/process_address_space.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/procfs/procfs.h"
#include "common/base/frame_kind.h"

namespace strata::agent::symbols {
namespace {

std::string BaseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

constexpr uint64_t kMaxVdsoBytes = 1 << 20;

// Executable memory no file backs: what JIT compilers generate code into. (The kernel's
// [vdso], [vsyscall] and [uprobes] are named otherwise.)
bool IsAnonymousCode(const MappingInfo& m) {
  return m.path.empty() || m.path.starts_with("[anon:");
}

}  // namespace

namespace {

MappingInfo ToMappingInfo(procfs::Mapping m) {
  MappingInfo info;
  info.start = m.start;
  info.end = m.end;
  info.offset = m.offset;
  info.exec = m.exec;
  info.inode = m.inode;
  info.path = std::move(m.path);
  return info;
}

absl::StatusOr<std::string> ReadMapsText(pid_t pid) {
  absl::StatusOr<std::string> text = procfs::ReadProcFile(absl::StrCat("/proc/", pid, "/maps"));
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("cannot read /proc/", pid, "/maps"));
  return text;
}

}  // namespace

absl::StatusOr<std::vector<MappingInfo>> ReadProcMaps(pid_t pid) {
  absl::StatusOr<std::string> text = ReadMapsText(pid);
  if (!text.ok()) return text.status();
  std::vector<MappingInfo> out;
  for (procfs::Mapping& m : procfs::ParseMaps(*text)) out.push_back(ToMappingInfo(std::move(m)));
  return out;
}

absl::StatusOr<std::vector<MappingInfo>> ReadExecutableMappings(pid_t pid) {
  absl::StatusOr<std::string> text = ReadMapsText(pid);
  if (!text.ok()) return text.status();
  std::vector<MappingInfo> out;
  std::string_view rest = *text;
  while (!rest.empty()) {
    const size_t newline = rest.find('\n');
    const std::string_view line = rest.substr(0, newline);
    rest.remove_prefix(newline == std::string_view::npos ? rest.size() : newline + 1);
    // "start-end perms ...": the third permission is 'x' for code.
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.size() < space + 4 || line[space + 3] != 'x') {
      continue;
    }
    if (std::optional<procfs::Mapping> m = procfs::ParseMapsLine(line)) {
      out.push_back(ToMappingInfo(*std::move(m)));
    }
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const Module>> ProcessAddressSpace::OpenModule(const MappingInfo& m) {
  if (m.path == "[vdso]") {
    if (m.end - m.start > kMaxVdsoBytes) return absl::OutOfRangeError("vdso too large");
    int fd = open(absl::StrCat("/proc/", pid_, "/mem").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::PermissionDeniedError("cannot read vdso");
    std::string bytes(m.end - m.start, '\0');
    ssize_t n = pread(fd, bytes.data(), bytes.size(), static_cast<off_t>(m.start));
    close(fd);
    if (n != static_cast<ssize_t>(bytes.size())) return absl::DataLossError("short vdso read");
    absl::StatusOr<std::unique_ptr<elf::ElfFile>> elf = elf::ElfFile::FromBytes(std::move(bytes));
    if (!elf.ok()) return elf.status();
    return cache_->Adopt(*std::move(elf), m.path);
  }
  // The process may live in another mount namespace, or the file may have been replaced.
  const std::string candidates[] = {
      absl::StrCat("/proc/", pid_, "/root", m.path),
      absl::StrFormat("/proc/%d/map_files/%x-%x", pid_, m.start, m.end),
      m.path,
  };
  absl::Status last = absl::NotFoundError(m.path);
  for (const std::string& candidate : candidates) {
    absl::StatusOr<std::shared_ptr<const Module>> module = cache_->Get(candidate, m.path, m.inode);
    if (module.ok()) return module;
    last = module.status();
  }
  return last;
}

absl::Status ProcessAddressSpace::Refresh(const std::vector<MappingInfo>& mappings) {
  std::vector<Region> regions;
  std::vector<JitRegion> jit_regions;
  failed_modules_ = 0;
  absl::Status first_error;
  for (const MappingInfo& m : mappings) {
    if (!m.exec) continue;
    if (IsAnonymousCode(m)) {
      jit_regions.push_back({m.start, m.end});
      continue;
    }
    if (m.path[0] != '/' && m.path != "[vdso]") continue;
    absl::StatusOr<std::shared_ptr<const Module>> module = OpenModule(m);
    if (!module.ok()) {
      // Code in a memory file that is no ELF image: JIT code mapped twice (writable and
      // executable), as .NET does.
      if (m.path.starts_with("/memfd:")) {
        jit_regions.push_back({m.start, m.end});
        continue;
      }
      ++failed_modules_;
      if (first_error.ok()) first_error = module.status();
      continue;
    }
    std::optional<uint64_t> vaddr = (*module)->elf->FileOffsetToVaddr(m.offset);
    if (!vaddr) {
      ++failed_modules_;
      if (first_error.ok()) first_error = absl::InvalidArgumentError(
          absl::StrCat(m.path, ": offset ", m.offset, " not in a loadable segment"));
      continue;
    }
    regions.push_back({m.start, m.end, static_cast<int64_t>(m.start - *vaddr), *std::move(module)});
  }
  std::sort(regions.begin(), regions.end(), [](const Region& a, const Region& b) { return a.start < b.start; });
  std::sort(jit_regions.begin(), jit_regions.end(),
            [](const JitRegion& a, const JitRegion& b) { return a.start < b.start; });
  KeepUnmapped(regions, jit_regions);
  regions_ = std::move(regions);
  jit_regions_ = std::move(jit_regions);
  if (!jit_regions_.empty()) UpdatePerfMap(/*retry=*/false);
  if (regions_.empty() && !first_error.ok()) return first_error;
  return absl::OkStatus();
}

absl::Status ProcessAddressSpace::Refresh() {
  absl::StatusOr<std::vector<MappingInfo>> mappings = ReadExecutableMappings(pid_);
  if (!mappings.ok()) return mappings.status();
  return Refresh(*mappings);
}

void ProcessAddressSpace::KeepUnmapped(const std::vector<Region>& regions,
                                       const std::vector<JitRegion>& jit_regions) {
  auto overlaps_new = [&](const Region& old) {
    auto it = std::lower_bound(regions.begin(), regions.end(), old.end,
                               [](const Region& r, uint64_t end) { return r.start < end; });
    if (it != regions.begin() && std::prev(it)->end > old.start) return true;
    auto jit = std::lower_bound(jit_regions.begin(), jit_regions.end(), old.end,
                                [](const JitRegion& r, uint64_t end) { return r.start < end; });
    return jit != jit_regions.begin() && std::prev(jit)->end > old.start;
  };
  // What is mapped again, or mapped over, is looked up where it is now.
  std::erase_if(unmapped_, overlaps_new);
  for (const Region& old : regions_) {
    if (overlaps_new(old)) continue;
    // The newest unmap of a range replaces an older one of it.
    std::erase_if(unmapped_,
                  [&](const Region& r) { return r.start < old.end && old.start < r.end; });
    unmapped_.push_back(old);
  }
  if (unmapped_.size() > kMaxUnmappedRegions) {
    unmapped_.erase(unmapped_.begin(), unmapped_.end() - kMaxUnmappedRegions);
  }
}

const ProcessAddressSpace::Region* ProcessAddressSpace::Find(uint64_t pc) const {
  auto it = std::upper_bound(regions_.begin(), regions_.end(), pc,
                             [](uint64_t v, const Region& r) { return v < r.start; });
  if (it != regions_.begin() && pc < std::prev(it)->end) return &*std::prev(it);
  // In no current mapping: the sample may predate an unmap (a rare path: kept regions are few).
  for (auto r = unmapped_.rbegin(); r != unmapped_.rend(); ++r) {
    if (r->start <= pc && pc < r->end) return &*r;
  }
  return nullptr;
}

const ProcessAddressSpace::JitRegion* ProcessAddressSpace::FindJit(uint64_t pc) const {
  auto it = std::upper_bound(jit_regions_.begin(), jit_regions_.end(), pc,
                             [](uint64_t v, const JitRegion& r) { return v < r.start; });
  if (it == jit_regions_.begin()) return nullptr;
  --it;
  return pc < it->end ? &*it : nullptr;
}

void ProcessAddressSpace::SetPerfMap(std::string open_path, std::string map_path) {
  perf_map_paths_ = PerfMapPaths{std::move(open_path), std::move(map_path)};
  perf_map_.reset();
}

bool ProcessAddressSpace::PerfMapEntryAt(uint64_t pc, PerfMap::Symbol* out) const {
  if (perf_map_ != nullptr && perf_map_->map().Lookup(pc, out)) return true;
  UpdatePerfMap(/*retry=*/true);  // code newer than the last read (or the map not read yet)
  return perf_map_ != nullptr && perf_map_->map().Lookup(pc, out);
}

bool ProcessAddressSpace::ReadPerfMapAgain() const {
  // Anonymous executable memory of a process that writes no map (and is not a JVM, asked for
  // one) is not looked for five times a second.
  if (jit_layouts_ == nullptr && (perf_map_ == nullptr || perf_map_->map().size() == 0)) {
    return false;
  }
  const uint64_t generation = perf_map_generation_;
  UpdatePerfMap(/*retry=*/true);
  return perf_map_generation_ != generation;
}

void ProcessAddressSpace::UpdatePerfMap(bool retry) const {
  const auto now = std::chrono::steady_clock::now();
  if (retry && perf_map_ != nullptr && now - perf_map_read_at_ < kPerfMapRetry) return;
  perf_map_read_at_ = now;
  if (perf_map_ == nullptr) {
    PerfMapPaths paths = perf_map_paths_ ? *perf_map_paths_ : PerfMapPathsOf(pid_);
    perf_map_ = std::make_unique<PerfMapFile>(std::move(paths.open_path),
                                              std::move(paths.map_path));
  }
  // No file is the common case (a runtime not asked to write one): the frames stay "[jit]".
  const size_t entries = perf_map_->map().size();
  perf_map_->Update().IgnoreError();
  if (perf_map_->map().size() != entries) ++perf_map_generation_;
}

const Module* ProcessAddressSpace::ModuleAt(uint64_t pc, uint64_t* module_pc) const {
  const Region* r = Find(pc);
  if (r == nullptr) return nullptr;
  *module_pc = pc - r->bias;
  return r->module.get();
}

bool ProcessAddressSpace::Lookup(uint64_t pc, const unwind::RuleSource** rules,
                                 uint64_t* module_pc) const {
  const Region* r = Find(pc);
  if (r == nullptr) return false;
  *rules = r->module->rules.get();
  *module_pc = pc - r->bias;
  return true;
}

namespace {

// The rows of one JIT code object's frame (JitFrameLayout), for pcs as offsets into it.
class JitLayoutRules final : public unwind::RuleSource {
 public:
  explicit JitLayoutRules(const JitFrameLayout& layout) : layout_(layout) {}

  bool FindRow(uint64_t offset, bool innermost, unwind::UnwindRow* row) const override {
    using Row = unwind::UnwindRow;
    const uint64_t at = innermost || offset == 0 ? offset : offset - 1;
    *row = {Row::CfaBase::kSp, Row::RaRule::kAtCfaOffset, Row::FpRule::kAtCfaOffset,
            unwind::StackSwitch::kNone, static_cast<int32_t>(layout_.frame_bytes), -8, -16};
    if (at < layout_.entry) {  // nothing pushed yet
      row->cfa_offset = 8;
      row->fp_rule = Row::FpRule::kSame;
      row->fp_offset = 0;
    } else if (at < layout_.body) {  // rbp pushed, the frame not allocated yet
      row->cfa_offset = 16;
    }
    return true;
  }

 private:
  JitFrameLayout layout_;
};

}  // namespace

void ProcessAddressSpace::SetJitFrameLayouts(std::unique_ptr<JitFrameLayouts> layouts) {
  jit_layouts_ = std::move(layouts);
  jit_rules_.clear();
}

size_t ProcessAddressSpace::jit_layouts_known() const {
  size_t n = 0;
  for (const auto& [start, rules] : jit_rules_) n += rules != nullptr;
  return n;
}

bool ProcessAddressSpace::LookupJit(uint64_t pc, const unwind::RuleSource** rules,
                                    uint64_t* module_pc) const {
  if (FindJit(pc) == nullptr) return false;
  *rules = nullptr;
  *module_pc = pc;
  PerfMap::Symbol symbol;
  if (perf_map_ == nullptr || !perf_map_->map().Lookup(pc, &symbol)) {
    ++unnamed_jit_pcs_;  // code newer than the map: its frame's layout is not known either
    return true;
  }
  if (jit_layouts_ == nullptr) return true;
  // Code memory is reused: a layout holds only as long as the map that placed its code.
  if (perf_map_->bytes_read() != jit_rules_map_bytes_) {
    jit_rules_.clear();
    jit_rules_map_bytes_ = perf_map_->bytes_read();
  }
  auto [it, inserted] = jit_rules_.try_emplace(symbol.start);
  if (inserted) {
    std::optional<JitFrameLayout> layout =
        jit_layouts_->Layout(symbol.start, symbol.end - symbol.start, symbol.name);
    if (layout) it->second = std::make_unique<JitLayoutRules>(*layout);
  }
  if (it->second == nullptr) return true;
  *rules = it->second.get();
  *module_pc = pc - symbol.start;
  return true;
}

SymbolizedPc ProcessAddressSpace::Symbolize(uint64_t pc) const {
  SymbolizedPc out;
  uint64_t module_pc = 0;
  const Module* module = ModuleAt(pc, &module_pc);
  if (module == nullptr && FindJit(pc) != nullptr) {
    out.module_pc = pc;
    PerfMap::Symbol symbol;
    if (PerfMapEntryAt(pc, &symbol)) {
      out.module_path = base::JitModuleName(perf_map_->map_path());
      out.function_name = std::string(symbol.name);
      out.function_start = symbol.start;
      out.known_function = true;
    } else {
      ++unnamed_jit_pcs_;
      out.module_path = base::JitModuleName("");
      out.function_name = absl::StrFormat("%s+0x%x", base::kJitModule, pc);
      out.function_start = pc;
    }
    return out;
  }
  if (module == nullptr) {
    out.function_name = absl::StrFormat("[unknown]+0x%x", pc);
    out.function_start = pc;
    return out;
  }
  out.module_path = module->path;
  out.build_id = module->build_id_hex;
  out.module_pc = module_pc;
  const elf::SymbolTable::Function* f = module->symbols.Lookup(module_pc);
  if (f == nullptr) {
    out.function_start = module_pc;
    out.function_name = absl::StrFormat("%s+0x%x", BaseName(module->path), module_pc);
    return out;
  }
  out.function_start = f->start;
  out.function_end = f->end > f->start ? f->end : 0;
  out.known_function = true;
  out.is_plt = f->is_plt();
  if (!f->name.empty()) {
    out.function_name = std::string(f->name);
  } else {
    out.function_name = absl::StrFormat("%s+0x%x%s", BaseName(module->path), f->start,
                                        f->is_plt() ? "@plt" : "");
  }
  return out;
}

}  // namespace strata::agent::symbols
