#include "common/unwind/go/go_rules.h"

#include <algorithm>
#include <string_view>

namespace strata::unwind::go {
namespace {

// The stack-switching functions Go's traceback follows onto the other stack
// (runtime/traceback.go, and its cgo call and callback paths).
StackSwitch SwitchOf(std::string_view name) {
  if (name == "runtime.systemstack") return StackSwitch::kSystemStack;
  if (name == "runtime.morestack" || name == "runtime.mcall") {
    return StackSwitch::kGoroutineContext;
  }
  if (name == "runtime.asmcgocall") return StackSwitch::kCgoCall;
  if (name == "runtime.cgocallback") return StackSwitch::kCgoCallback;
  return StackSwitch::kNone;
}

// runtime/cgo's crosscall2 (C calling Go) on MIPS64 saves the return address among the C
// callee-saved registers, at 8*14(R29), not at 0(R29) as Go's own frames do; Go's traceback
// never steps out of it (a callback's goroutine goes on at its saved state), the walk does,
// into the C code that called back.
uint16_t ReturnAddressAtSp(Arch arch, std::string_view name) {
  return arch != Arch::kX86_64 && name == "crosscall2" ? 8 * 14 : 0;
}

}  // namespace

UnwindRow GoRow(Arch arch, int32_t sp_delta, bool saved_fp) {
  UnwindRow row;
  row.cfa_base = UnwindRow::CfaBase::kSp;
  row.fp_rule = UnwindRow::FpRule::kSame;
  if (arch == Arch::kX86_64) {
    row.ra_rule = UnwindRow::RaRule::kAtCfaOffset;
    row.cfa_offset = sp_delta + 8;
    row.ra_offset = -8;
    if (saved_fp && sp_delta >= 8) {
      row.fp_rule = UnwindRow::FpRule::kAtCfaOffset;
      row.fp_offset = -16;
    }
  } else if (sp_delta == 0) {  // link register: no frame, the return address is in r31
    row.ra_rule = UnwindRow::RaRule::kInRegister;
    row.cfa_offset = 0;
  } else {
    row.ra_rule = UnwindRow::RaRule::kAtCfaOffset;
    row.cfa_offset = sp_delta;
    row.ra_offset = -sp_delta;  // 0(SP)
  }
  return row;
}

std::unique_ptr<GoRuleSource> GoRuleSource::Build(Arch arch, const elf::GoPclntab& table,
                                                  std::unique_ptr<RuleSource> fallback) {
  std::unique_ptr<GoRuleSource> rules(new GoRuleSource());
  rules->arch_ = arch;
  rules->fallback_ = std::move(fallback);
  rules->funcs_.reserve(table.functions().size());
  for (const elf::GoPclntab::Function& f : table.functions()) {
    Func func{f.entry, f.end, static_cast<uint32_t>(rules->runs_.size()), 0, f.root,
              (f.flags & elf::GoPclntab::kFlagAsm) == 0,
              f.root ? SwitchOf(f.name) : StackSwitch::kNone, ReturnAddressAtSp(arch, f.name)};
    // A stack switch keeps its SP deltas: crossings step it again on the other stack.
    if (!f.root || func.stack_switch != StackSwitch::kNone) {
      for (const elf::GoPclntab::PcValueRange& r : table.SpDeltas(f)) {
        // A negative delta or one beyond any real frame is a corrupt table: no rule there.
        if (r.value < 0 || r.value > (1 << 24) || r.start < f.entry) continue;
        // Adjacent ranges with the same delta are one run.
        if (func.num_runs > 0 && rules->runs_.back().sp == r.value) continue;
        rules->runs_.push_back({static_cast<uint32_t>(r.start - f.entry), r.value});
        ++func.num_runs;
      }
      if (func.num_runs == 0) ++rules->stats_.without_table;
    }
    if (!rules->funcs_.empty() && rules->funcs_.back().end > func.start) continue;  // overlap
    rules->stats_.roots += f.root;
    rules->stats_.stack_switches += func.stack_switch != StackSwitch::kNone;
    rules->funcs_.push_back(func);
  }
  rules->stats_.functions = rules->funcs_.size();
  rules->stats_.runs = rules->runs_.size();
  rules->IndexBuckets();
  return rules;
}

void GoRuleSource::IndexBuckets() {
  bucket_first_.clear();
  if (funcs_.empty()) return;
  const uint64_t text_start = funcs_.front().start;
  const uint64_t buckets = ((funcs_.back().end - 1 - text_start) >> kBucketShift) + 1;
  // Real text holds several functions per bucket; a span far beyond that is a corrupt table,
  // searched without the index rather than given one sized by its bogus addresses.
  if (buckets > 16 * funcs_.size() + 1024) return;
  bucket_first_.reserve(buckets + 1);
  uint32_t i = 0;
  for (uint64_t b = 0; b < buckets; ++b) {
    const uint64_t bucket_start = text_start + (b << kBucketShift);
    while (funcs_[i].end <= bucket_start) ++i;  // the last function ends after every bucket
    bucket_first_.push_back(i);
  }
  bucket_first_.push_back(static_cast<uint32_t>(funcs_.size() - 1));
}

const GoRuleSource::Func* GoRuleSource::FindFunc(uint64_t pc) const {
  if (funcs_.empty() || pc < funcs_.front().start || pc >= funcs_.back().end) return nullptr;
  auto first = funcs_.begin();
  auto last = funcs_.end();
  if (!bucket_first_.empty()) {
    const uint64_t b = (pc - funcs_.front().start) >> kBucketShift;
    first = funcs_.begin() + bucket_first_[b];
    last = funcs_.begin() + bucket_first_[b + 1] + 1;
  }
  auto it = std::upper_bound(first, last, pc,
                             [](uint64_t a, const Func& f) { return a < f.start; });
  if (it == first) return nullptr;
  --it;
  return pc < it->end ? &*it : nullptr;
}

GoRuleSource::Location GoRuleSource::Locate(uint64_t pc) const {
  const bool cacheable = !funcs_.empty() && pc >= funcs_.front().start &&
                         LookupCache::Cacheable(pc - funcs_.front().start);
  const uint64_t offset = cacheable ? pc - funcs_.front().start : 0;
  uint32_t value;
  if (cacheable && cache_.Find(offset, &value)) {
    if (value == kNotInFunc) return {};
    const Func* f = &funcs_[value >> kRunBits];
    const uint32_t run = value & kNoRunInFunc;
    return {f, run == kNoRunInFunc ? kNoRun : f->first_run + run};
  }
  Location where;
  where.func = FindFunc(pc);
  if (where.func != nullptr && where.func->num_runs > 0) {
    const Run* first = runs_.data() + where.func->first_run;
    const Run* last = first + where.func->num_runs;
    const uint32_t in_func = static_cast<uint32_t>(pc - where.func->start);
    const Run* r = std::upper_bound(first, last, in_func,
                                    [](uint32_t o, const Run& run) { return o < run.start; });
    if (r != first) where.run = static_cast<uint32_t>(r - 1 - runs_.data());
  }
  if (!cacheable) return where;
  if (where.func == nullptr) {
    cache_.Store(offset, kNotInFunc);
    return where;
  }
  const uint64_t func_index = static_cast<uint64_t>(where.func - funcs_.data());
  const uint32_t run_in_func =
      where.run == kNoRun ? kNoRunInFunc : where.run - where.func->first_run;
  // Functions and runs past the value's fields are searched every time.
  if (func_index < (uint64_t{1} << (32 - kRunBits)) - 1 && run_in_func <= kNoRunInFunc) {
    cache_.Store(offset, static_cast<uint32_t>(func_index << kRunBits | run_in_func));
  }
  return where;
}

bool GoRuleSource::FindRow(uint64_t pc, bool innermost, UnwindRow* row) const {
  // A return address may be the first byte after its function (a call as its last
  // instruction): the call itself is at pc - 1.
  const Location where = Locate(innermost ? pc : pc - 1);
  const Func* f = where.func;
  if (f == nullptr) return fallback_ != nullptr && fallback_->FindRow(pc, innermost, row);
  if (f->root && (f->stack_switch == StackSwitch::kNone || f->num_runs == 0)) {
    *row = UnwindRow{};
    row->cfa_base = UnwindRow::CfaBase::kSp;
    row->ra_rule = UnwindRow::RaRule::kUndefined;
    return true;
  }
  if (where.run == kNoRun) return false;
  // The prologue stores rbp only after moving SP: certain at call sites, not at every pc of
  // the interrupted frame.
  *row = GoRow(arch_, runs_[where.run].sp, f->compiled && !innermost);
  if (f->ra_at_sp != 0 && row->ra_rule == UnwindRow::RaRule::kAtCfaOffset) {
    row->ra_offset = -row->cfa_offset + f->ra_at_sp;
  }
  if (f->stack_switch != StackSwitch::kNone) {
    row->ra_rule = UnwindRow::RaRule::kStackSwitch;
    row->stack_switch = f->stack_switch;
  }
  return true;
}

bool GoRuleSource::IsPlausibleReturnAddress(uint64_t return_address) const {
  if (Locate(return_address - 1).func != nullptr) return true;
  return fallback_ == nullptr || fallback_->IsPlausibleReturnAddress(return_address);
}

absl::StatusOr<std::unique_ptr<RuleSource>> BuildRuleSource(Arch arch, const elf::ElfFile& elf,
                                                            std::unique_ptr<RuleSource> fallback) {
  absl::StatusOr<std::unique_ptr<elf::GoPclntab>> table = elf::GoPclntab::Find(elf);
  if (!table.ok()) return table.status();
  return std::unique_ptr<RuleSource>(GoRuleSource::Build(arch, **table, std::move(fallback)));
}

}  // namespace strata::unwind::go
