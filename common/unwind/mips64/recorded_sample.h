// Recorded MIPS64 samples (tests/mips64/programs/workload.c writes them under qemu) and the
// address space the recorded-stack tests and benchmarks unwind them in with the generic
// Unwind() (common/unwind/unwinder.h), exactly as the agent and the in-process sampler do.
#ifndef STRATA_COMMON_UNWIND_MIPS64_RECORDED_SAMPLE_H_
#define STRATA_COMMON_UNWIND_MIPS64_RECORDED_SAMPLE_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/elf/elf_file.h"
#include "common/unwind/mips64/function_table.h"
#include "common/unwind/unwind_types.h"
#include "common/unwind/unwinder.h"

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

// Layout of struct SampleHeader in tests/mips64/programs/workload.c.
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

// The address space of a statically linked recorded program: one module, loaded at its link
// addresses (bias 0), whose executable PT_LOAD segments are covered by `rules`.
class StaticModuleSpace final : public AddressSpace {
 public:
  StaticModuleSpace(const elf::ElfFile& elf, const RuleSource* rules) : rules_(rules) {
    for (const elf::LoadSegment& seg : elf.load_segments()) {
      if (seg.executable()) exec_.push_back({seg.vaddr, seg.vaddr + seg.memsz});
    }
  }
  bool Lookup(uint64_t pc, const RuleSource** rules, uint64_t* module_pc) const override {
    for (const elf::AddressRange& r : exec_) {
      if (r.Contains(pc)) {
        *rules = rules_;
        *module_pc = pc;
        return true;
      }
    }
    return false;
  }

 private:
  const RuleSource* rules_;
  std::vector<elf::AddressRange> exec_;
};

// Unwinds a recorded sample with the generic loop (common/unwind/unwinder.h).
inline UnwindResult UnwindRecorded(Arch arch, const AddressSpace& space, const RecordedSample& s,
                                   Frame* frames, size_t capacity) {
  UnwindOptions options;
  options.arch = arch;
  options.max_frames = capacity;
  return Unwind(options, s.regs, s.snapshot(), space, frames, capacity);
}

}  // namespace strata::unwind::mips64

#endif  // STRATA_COMMON_UNWIND_MIPS64_RECORDED_SAMPLE_H_
