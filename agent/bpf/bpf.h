// agent/bpf (strata::agent::bpf): the few pieces of the kernel's BPF the agent uses to read a
// target's memory at the moment of a sample (e.g. a Python thread's frame chain, which lies on
// the heap, not in the sample's stack copy), without libbpf or a BPF compiler:
//
//   - Insn and the builders below: a program is emitted instruction by instruction by the
//     module that owns it (agent/python/frame_capture.h), with the layout of what it reads as
//     data (map values), so one program serves every version of what it reads;
//   - CreateMap / LoadProgram / UpdateElement / DeleteElement: the bpf(2) commands, as
//     absl::Status (the verifier's log in the error of a refused program);
//   - RingReader: the consumer side of a BPF_MAP_TYPE_RINGBUF map, read through its mapping
//     (no system call per record).
//
// Loading programs needs CAP_BPF + CAP_PERFMON (root); kernels before 5.8 have no ring
// buffer. Callers treat every error as "not available here" and do without.
#ifndef STRATA_AGENT_BPF_BPF_H_
#define STRATA_AGENT_BPF_BPF_H_

#include <linux/bpf.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/unique_fd.h"

namespace strata::agent::bpf {

using Insn = bpf_insn;

// Registers: r0 return value, r1-r5 arguments (clobbered by calls), r6-r9 kept across calls,
// r10 the read-only frame pointer.
inline constexpr uint8_t kR0 = 0, kR1 = 1, kR2 = 2, kR3 = 3, kR4 = 4, kR5 = 5, kR6 = 6,
                         kR7 = 7, kR8 = 8, kR9 = 9, kFp = 10;

// dst = imm / dst = src / dst op= imm / dst op= src (64-bit ALU).
constexpr Insn MovImm(uint8_t dst, int32_t imm) {
  return {BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm};
}
constexpr Insn MovReg(uint8_t dst, uint8_t src) {
  return {BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0};
}
constexpr Insn AluImm(uint8_t op, uint8_t dst, int32_t imm) {
  return {static_cast<uint8_t>(BPF_ALU64 | op | BPF_K), dst, 0, 0, imm};
}
constexpr Insn AluReg(uint8_t op, uint8_t dst, uint8_t src) {
  return {static_cast<uint8_t>(BPF_ALU64 | op | BPF_X), dst, src, 0, 0};
}
// dst = *(size *)(src + off); *(size *)(dst + off) = src; *(size *)(dst + off) = imm.
// size: BPF_B, BPF_H, BPF_W, BPF_DW.
constexpr Insn Load(uint8_t size, uint8_t dst, uint8_t src, int16_t off) {
  return {static_cast<uint8_t>(BPF_LDX | BPF_MEM | size), dst, src, off, 0};
}
constexpr Insn Store(uint8_t size, uint8_t dst, uint8_t src, int16_t off) {
  return {static_cast<uint8_t>(BPF_STX | BPF_MEM | size), dst, src, off, 0};
}
constexpr Insn StoreImm(uint8_t size, uint8_t dst, int16_t off, int32_t imm) {
  return {static_cast<uint8_t>(BPF_ST | BPF_MEM | size), dst, 0, off, imm};
}
// if (dst op imm/src) goto pc + 1 + off. op: BPF_JEQ, BPF_JNE, BPF_JGT, ...; Jump32Imm
// compares the low 32 bits.
constexpr Insn JumpImm(uint8_t op, uint8_t dst, int32_t imm, int16_t off) {
  return {static_cast<uint8_t>(BPF_JMP | op | BPF_K), dst, 0, off, imm};
}
constexpr Insn Jump32Imm(uint8_t op, uint8_t dst, int32_t imm, int16_t off) {
  return {static_cast<uint8_t>(BPF_JMP32 | op | BPF_K), dst, 0, off, imm};
}
constexpr Insn JumpReg(uint8_t op, uint8_t dst, uint8_t src, int16_t off) {
  return {static_cast<uint8_t>(BPF_JMP | op | BPF_X), dst, src, off, 0};
}
constexpr Insn Jump(int16_t off) { return {BPF_JMP | BPF_JA, 0, 0, off, 0}; }
constexpr Insn Call(int32_t helper) { return {BPF_JMP | BPF_CALL, 0, 0, 0, helper}; }
constexpr Insn Exit() { return {BPF_JMP | BPF_EXIT, 0, 0, 0, 0}; }
// dst = the map `map_fd` (two instructions).
void LoadMap(std::vector<Insn>& program, uint8_t dst, int map_fd);

// A program under construction, with forward jumps to labels bound later.
class ProgramBuilder {
 public:
  using Label = size_t;
  Label NewLabel() {
    targets_.push_back(kUnbound);
    return targets_.size() - 1;
  }
  // The next instruction is `label`'s.
  void Bind(Label label) { targets_[label] = program_.size(); }
  void Add(Insn insn) { program_.push_back(insn); }
  // `jump` (any jump instruction) to `label`.
  void AddJump(Insn jump, Label label) {
    fixups_.push_back({program_.size(), label});
    program_.push_back(jump);
  }
  void AddMap(uint8_t dst, int map_fd) { LoadMap(program_, dst, map_fd); }
  // The program with every jump's offset set; empty when a label was left unbound or a jump
  // does not fit.
  std::vector<Insn> Build() &&;

 private:
  static constexpr size_t kUnbound = SIZE_MAX;
  struct Fixup {
    size_t at;
    Label label;
  };
  std::vector<Insn> program_;
  std::vector<size_t> targets_;
  std::vector<Fixup> fixups_;
};

absl::StatusOr<base::UniqueFd> CreateMap(bpf_map_type type, uint32_t key_size,
                                         uint32_t value_size, uint32_t max_entries,
                                         std::string_view name);
absl::Status UpdateElement(int map_fd, const void* key, const void* value);
absl::Status DeleteElement(int map_fd, const void* key);
// NotFound when the map holds no `key`.
absl::Status LookupElement(int map_fd, const void* key, void* value);
// A program of `type` (license GPL: the helpers that read user memory require it). The
// verifier's log is in the error of a program it refuses. `flags`: BPF_PROG_LOAD's
// prog_flags, e.g. BPF_F_STRICT_ALIGNMENT (checked as on architectures without efficient
// unaligned access, such as MIPS64).
absl::StatusOr<base::UniqueFd> LoadProgram(bpf_prog_type type, std::span<const Insn> program,
                                           std::string_view name, uint32_t flags = 0);

// What the kernel counted of a program's runs: only while kernel.bpf_stats_enabled is 1 (or
// some process holds BPF_ENABLE_STATS), else zeros.
struct ProgramRuns {
  uint64_t count = 0;
  uint64_t ns = 0;
};
absl::StatusOr<ProgramRuns> RunsOf(int program_fd);

// The consumer of a ring buffer map. Records are read in place: Next() hands out the record
// after the last one handed out; the kernel may reuse a record's space once Release() has
// moved past it. One thread.
class RingReader {
 public:
  static absl::StatusOr<RingReader> Map(int map_fd, uint32_t data_bytes);
  RingReader(RingReader&& other) noexcept;
  RingReader& operator=(RingReader&& other) = delete;
  ~RingReader();

  // The next committed record (its bytes, and its position for Release), or false when none.
  // Records the producer discarded are skipped.
  bool Next(std::span<const uint8_t>* record, uint64_t* position);
  // Gives the space of every record before `position` back to the producer (a position from
  // Next, or end() for all handed out).
  void Release(uint64_t position);
  uint64_t end() const { return read_; }

 private:
  RingReader(uint8_t* consumer, uint8_t* producer, uint32_t data_bytes, size_t page)
      : consumer_(consumer), producer_(producer), data_bytes_(data_bytes), page_(page) {}

  uint8_t* consumer_;  // one page: consumer_pos
  uint8_t* producer_;  // one page (producer_pos), then the data twice
  uint32_t data_bytes_;
  size_t page_;
  uint64_t read_ = 0;  // past the last record handed out
};

}  // namespace strata::agent::bpf

#endif  // STRATA_AGENT_BPF_BPF_H_
