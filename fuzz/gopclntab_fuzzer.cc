// Fuzz target: Go's .gopclntab as the agent reads it from a Go binary on a host's disk
// (common/elf/go_pclntab.h) and compiles it into unwind rules (common/unwind/go/go_rules.h),
// and as the server reads it from an uploaded binary for lines and inlined calls.
//
// Input: u8 flags (bit 0: big-endian, bit 1: rules for MIPS64 rather than x86-64), then the
// table's bytes (its header first, as in the section). Oracles besides the sanitizers:
// functions are sorted and non-empty; FindFunction(pc) returns a function that contains pc;
// SP delta ranges lie inside their function, in order; a function's row is found for pcs
// inside it.
#include <cstdint>
#include <string_view>

#include "common/elf/go_pclntab.h"
#include "common/unwind/go/go_rules.h"
#include "fuzz/fuzz_util.h"

namespace {

namespace elf = strata::elf;
namespace unwind = strata::unwind;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::InputReader in(data, size);
  const uint8_t flags = in.U8();
  const bool big_endian = flags & 1;
  const std::string_view table = in.Bytes(in.remaining());
  auto parsed = elf::GoPclntab::Parse(table, 0x500000, big_endian, nullptr);
  if (!parsed.ok()) return 0;
  const elf::GoPclntab& t = **parsed;
  const auto& funcs = t.functions();
  for (size_t i = 0; i < funcs.size(); ++i) {
    const elf::GoPclntab::Function& f = funcs[i];
    STRATA_FUZZ_CHECK(f.entry <= f.end, "function %zu ends before it starts", i);
    STRATA_FUZZ_CHECK(i == 0 || funcs[i - 1].entry <= f.entry, "functions out of order at %zu", i);
    uint64_t last = f.entry;
    for (const auto& r : t.SpDeltas(f)) {
      STRATA_FUZZ_CHECK(r.start == last && r.end >= r.start, "SP range out of order in %zu", i);
      last = r.end;
    }
    if (i < 64) {
      (void)t.Symbolize(f, f.entry);
      (void)t.Symbolize(f, f.entry + (f.end - f.entry) / 2);
    }
  }
  for (uint64_t pc : {funcs.empty() ? 0 : funcs.front().entry, t.text_start(), t.vaddr()}) {
    const int64_t i = t.FindFunction(pc);
    STRATA_FUZZ_CHECK(i < 0 || (funcs[i].entry <= pc && pc < funcs[i].end),
                      "FindFunction(%#llx) returned a function without it",
                      static_cast<unsigned long long>(pc));
  }
  const unwind::Arch arch = (flags & 2) ? (big_endian ? unwind::Arch::kMips64Be
                                                      : unwind::Arch::kMips64El)
                                        : unwind::Arch::kX86_64;
  auto rules = unwind::go::GoRuleSource::Build(arch, t, nullptr);
  for (size_t i = 0; i < funcs.size() && i < 256; ++i) {
    for (bool innermost : {true, false}) {
      unwind::UnwindRow row;
      (void)rules->FindRow(funcs[i].entry + 1, innermost, &row);
    }
    (void)rules->IsPlausibleReturnAddress(funcs[i].entry + 1);
  }
  return 0;
}
