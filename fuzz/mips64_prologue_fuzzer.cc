// Fuzz target: MIPS64 prologue/epilogue analysis (common/unwind/mips64/prologue_analyzer.h)
// and the PrologueTable built from it (function_table.h): the code bytes of a module on a
// host's disk, decoded into unwind rows when the agent loads the module.
//
// Input: u8 flags (bit 0: big-endian, bit 1: analyze as a PLT stub), u64 address of the
// code, u8 function count (0-15; 0: the whole code is one function of unknown size), per
// function u16 offset from the code start, u16 size (0: unknown), u8 FunctionRange flags;
// then the code bytes. Little-endian framing. (Offsets stay within 64 KiB of the code so
// that an input costs microseconds: far-apart functions, whose page index the table bounds
// at 2^26 entries, are the ELF target's business.)
// Oracles besides the sanitizers, the properties the headers promise: rows start at offset
// 0, are strictly increasing, cover only the function and never repeat the previous row;
// the page-indexed and binary-search function lookups agree.
#include <cstdint>
#include <span>
#include <vector>

#include "common/unwind/mips64/function_table.h"
#include "common/unwind/mips64/prologue_analyzer.h"
#include "fuzz/fuzz_util.h"

namespace {

namespace m = strata::unwind::mips64;

void CheckRows(std::span<const m::RowRange> rows, uint64_t size_bytes, const char* what) {
  if (size_bytes == 0) return;
  STRATA_FUZZ_CHECK(!rows.empty() && rows.front().offset == 0, "%s: rows do not start at 0",
                    what);
  for (size_t i = 1; i < rows.size(); ++i) {
    STRATA_FUZZ_CHECK(rows[i].offset > rows[i - 1].offset && rows[i].offset < size_bytes,
                      "%s: row %zu at offset %u (previous %u, size %llu)", what, i,
                      rows[i].offset, rows[i - 1].offset,
                      static_cast<unsigned long long>(size_bytes));
    STRATA_FUZZ_CHECK(!m::SameRow(rows[i - 1], rows[i]), "%s: rows %zu and %zu are the same",
                      what, i - 1, i);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::InputReader in(data, size);
  const uint8_t flags = in.U8();
  const bool big_endian = flags & 1;
  const bool stub = flags & 2;
  const uint64_t base = in.U64() & ~uint64_t{3};
  const size_t nfuncs = in.U8() % 16;
  std::vector<m::FunctionRange> functions;
  for (size_t i = 0; i < nfuncs; ++i) {
    m::FunctionRange f;
    f.start = base + in.U16();
    f.size = in.U16();
    f.flags = in.U8() & 3;
    functions.push_back(f);
  }
  const std::string_view code = in.Rest();
  std::vector<uint32_t> words;
  for (size_t i = 0; i + 4 <= code.size(); i += 4) {
    words.push_back(m::LoadWord(reinterpret_cast<const uint8_t*>(code.data()) + i, big_endian));
  }

  m::AnalysisStats stats;
  std::vector<m::RowRange> rows = m::AnalyzeFunctionAt(words, base, stub, &stats);
  CheckRows(rows, 4 * words.size(), "AnalyzeFunctionAt");
  STRATA_FUZZ_CHECK(stats.instructions == words.size(), "%u instructions analyzed of %zu",
                    stats.instructions, words.size());

  if (functions.empty()) functions.push_back({base, 0, m::FunctionRange::kNone});
  const m::CodeRegion region{base, reinterpret_cast<const uint8_t*>(code.data()), code.size()};
  const auto arch = big_endian ? strata::unwind::Arch::kMips64Be : strata::unwind::Arch::kMips64El;
  std::unique_ptr<m::PrologueTable> table =
      m::PrologueTable::Build(arch, functions, std::span<const m::CodeRegion>(&region, 1));
  std::vector<uint64_t> probes = {base, base + code.size(), base - 4};
  for (size_t i = 0; i < table->num_functions(); ++i) {
    const uint64_t start = table->function_start(i);
    const uint64_t end = table->function_end(i);
    STRATA_FUZZ_CHECK(start < end, "function %zu is empty", i);
    if (i > 0) {
      STRATA_FUZZ_CHECK(table->function_end(i - 1) <= start, "functions %zu and %zu overlap",
                        i - 1, i);
    }
    auto frows = table->function_rows(i);
    if (!frows.empty()) STRATA_FUZZ_CHECK(frows.front().offset == 0, "function %zu rows", i);
    probes.insert(probes.end(), {start, start + (end - start) / 2, end - 1, end, start - 1});
  }
  for (uint64_t pc : probes) {
    const int64_t a = table->FindFunction(pc);
    const int64_t b = table->FindFunctionBinarySearch(pc);
    STRATA_FUZZ_CHECK(a == b, "FindFunction(%#llx) = %lld, binary search says %lld",
                      static_cast<unsigned long long>(pc), static_cast<long long>(a),
                      static_cast<long long>(b));
    if (a >= 0) {
      STRATA_FUZZ_CHECK(table->function_start(a) <= pc && pc < table->function_end(a),
                        "FindFunction(%#llx) returned a function not containing it",
                        static_cast<unsigned long long>(pc));
    }
    strata::unwind::UnwindRow row;
    (void)table->FindRow(pc, true, &row);
    (void)table->FindRow(pc, false, &row);
    (void)table->IsPlausibleReturnAddress(pc);
  }
  return 0;
}
