// Recorded MIPS64 samples (programs/workload.c writes them under qemu) and the unwinding loop
// the recorded-stack tests and benchmarks run them through.
//
// The loop is the same walk the generic Unwind() (common/unwind/unwinder.h) performs with a
// MIPS64 RuleSource; it stays local to the tests until that implementation is in the tree.
#ifndef STRATA_TESTS_MIPS64_RECORDED_SAMPLE_H_
#define STRATA_TESTS_MIPS64_RECORDED_SAMPLE_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/unwind/mips64/function_table.h"
#include "common/unwind/unwind_types.h"

namespace strata::unwind::mips64 {

struct RecordedSample {
  Registers regs;
  uint64_t stack_start = 0;
  std::vector<uint8_t> stack;
  std::vector<int> ids;     // shadow stack, outermost first
  std::vector<bool> tail;   // entry was tail-called away
  StackSnapshot snapshot() const { return {stack_start, stack.data(), stack.size()}; }
};

inline uint64_t Swap64(uint64_t v, bool be) { return be ? __builtin_bswap64(v) : v; }
inline uint32_t Swap32(uint32_t v, bool be) { return be ? __builtin_bswap32(v) : v; }

// Layout of struct SampleHeader in programs/workload.c.
inline bool ReadRecordedSamples(const std::string& path, bool be, std::vector<RecordedSample>* out) {
  constexpr int kMaxD = 128;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  while (true) {
    uint64_t h[7];
    int32_t depth_pad[2];
    int32_t ids[kMaxD];
    uint8_t tail[kMaxD];
    if (!in.read(reinterpret_cast<char*>(h), sizeof h)) break;
    in.read(reinterpret_cast<char*>(depth_pad), sizeof depth_pad);
    in.read(reinterpret_cast<char*>(ids), sizeof ids);
    in.read(reinterpret_cast<char*>(tail), sizeof tail);
    if (!in || Swap64(h[0], be) != 0x53545241544d3634ull) return false;
    RecordedSample s;
    s.regs.pc = Swap64(h[1], be);
    s.regs.sp = Swap64(h[2], be);
    s.regs.fp = Swap64(h[3], be);
    s.regs.ra = Swap64(h[4], be);
    s.stack_start = Swap64(h[5], be);
    const uint64_t size = Swap64(h[6], be);
    const int depth = static_cast<int32_t>(Swap32(static_cast<uint32_t>(depth_pad[0]), be));
    if (size > (64u << 20) || depth < 0 || depth > kMaxD) return false;
    for (int i = 0; i < depth; ++i) {
      s.ids.push_back(static_cast<int32_t>(Swap32(static_cast<uint32_t>(ids[i]), be)));
      s.tail.push_back(tail[i] != 0);
    }
    s.stack.resize(size);
    if (!in.read(reinterpret_cast<char*>(s.stack.data()), static_cast<std::streamsize>(size))) return false;
    out->push_back(std::move(s));
  }
  return true;
}

// Walks from `s.regs` with `table`; returns the number of frames written.
inline size_t UnwindMips64(const PrologueTable& table, const RecordedSample& s, Frame* frames,
                           size_t capacity) {
  const bool be = IsBigEndian(table.arch());
  const StackSnapshot stack = s.snapshot();
  Registers r = s.regs;
  size_t n = 0;
  for (bool innermost = true; n < capacity; innermost = false) {
    frames[n++] = {r.pc, r.sp, 0};
    UnwindRow row;
    if (!table.FindRow(r.pc, innermost, &row)) break;
    if (row.ra_rule == UnwindRow::RaRule::kUndefined) break;
    const uint64_t cfa = (row.cfa_base == UnwindRow::CfaBase::kSp ? r.sp : r.fp) + row.cfa_offset;
    Registers caller = r;
    uint64_t slot = 0;
    if (row.ra_rule == UnwindRow::RaRule::kInRegister) {
      if (!innermost) break;
      caller.pc = r.ra;
    } else {
      slot = cfa + row.ra_offset;
      if (!stack.Read64(slot, be, &caller.pc)) break;
    }
    if (row.fp_rule == UnwindRow::FpRule::kAtCfaOffset &&
        !stack.Read64(cfa + row.fp_offset, be, &caller.fp)) {
      break;
    }
    caller.sp = cfa;
    frames[n - 1].ra_slot = slot;
    if (caller.pc == 0 || cfa < r.sp || !table.IsPlausibleReturnAddress(caller.pc)) break;
    if (cfa == r.sp && caller.pc == r.pc) break;
    r = caller;
  }
  return n;
}

}  // namespace strata::unwind::mips64

#endif  // STRATA_TESTS_MIPS64_RECORDED_SAMPLE_H_
