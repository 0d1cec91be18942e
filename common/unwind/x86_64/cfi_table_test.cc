// Checks the compiled CFI rows against libdw's interpretation of the same CFI
// (dwarf_cfi_addrframe), the reference, at many pcs of this executable and of libc.
#include "common/unwind/x86_64/cfi_table.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <ucontext.h>
#include <libelf.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/elf/cfi_records.h"
#include "common/elf/elf_file.h"
#include "common/unwind/rule_source.h"
#include "gtest/gtest.h"

namespace strata::unwind::x86_64 {
namespace {

std::string LibPath(const std::string& name) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    size_t slash = line.find('/');
    if (slash != std::string::npos && line.find(name) != std::string::npos) return line.substr(slash);
  }
  return "";
}

// libdw's view of one pc, reduced to what a row can say.
struct Reference {
  bool found = false;
  bool cfa_is_reg = false;
  uint64_t cfa_reg = 0;
  int64_t cfa_offset = 0;
  std::string cfa_expr;     // raw ops when not reg+offset
  int ra_kind = 0;          // 0 undefined, 1 at CFA+off, 2 same, 3 other
  int64_t ra_offset = 0;
  int fp_kind = 0;
  int64_t fp_offset = 0;
  bool signal_frame = false;
  // Signal frames: libdw's expressions reduced to "at/[rsp + N]" (-1 when not of that form).
  int64_t sig_cfa = -1, sig_rip = -1, sig_rbp = -1;
};

// `ops` as DW_OP_breg7 N [DW_OP_deref], after the DW_OP_call_frame_cfa libdw puts in front of
// a DW_CFA_expression's ops; N or -1.
int64_t RspOffset(const Dwarf_Op* ops, size_t nops, bool deref) {
  if (nops > 0 && ops[0].atom == DW_OP_call_frame_cfa) { ++ops; --nops; }
  if (nops != (deref ? 2u : 1u) || ops[0].atom != DW_OP_breg7) return -1;
  if (deref && ops[1].atom != DW_OP_deref) return -1;
  return static_cast<int64_t>(ops[0].number);
}

int64_t SignalRegister(Dwarf_Frame* frame, int regno) {
  Dwarf_Op ops_mem[3];
  Dwarf_Op* ops = nullptr;
  size_t nops = 0;
  if (dwarf_frame_register(frame, regno, ops_mem, &ops, &nops) != 0 || ops == nullptr) return -1;
  return RspOffset(ops, nops, false);
}

// Decodes dwarf_frame_register's expression: {call_frame_cfa [, plus_uconst N | consts N, plus]}.
void DecodeRegister(Dwarf_Frame* frame, int regno, int* kind, int64_t* offset) {
  Dwarf_Op ops_mem[3];
  Dwarf_Op* ops = nullptr;
  size_t nops = 0;
  int rc = dwarf_frame_register(frame, regno, ops_mem, &ops, &nops);
  *offset = 0;
  if (rc != 0) { *kind = 3 + rc * 10; return; }  // value rule or error
  // libdw: undefined leaves *ops pointing at ops_mem; "same value" sets it to NULL.
  if (nops == 0) { *kind = ops == nullptr ? 2 : 0; return; }
  if (ops[0].atom != DW_OP_call_frame_cfa) { *kind = 3; return; }
  if (nops == 1) { *kind = 1; return; }
  if (nops == 2 && ops[1].atom == DW_OP_plus_uconst) {
    *kind = 1; *offset = static_cast<int64_t>(ops[1].number); return;
  }
  if (nops == 3 && ops[2].atom == DW_OP_plus &&
      (ops[1].atom == DW_OP_consts || ops[1].atom == DW_OP_const1s || ops[1].atom == DW_OP_const2s ||
       ops[1].atom == DW_OP_const4s || ops[1].atom == DW_OP_const8s)) {
    *kind = 1; *offset = static_cast<int64_t>(ops[1].number); return;
  }
  *kind = 3;
}

Reference QueryLibdw(Dwarf_CFI* cfi, uint64_t pc) {
  Reference ref;
  Dwarf_Frame* frame = nullptr;
  if (dwarf_cfi_addrframe(cfi, pc, &frame) != 0) return ref;
  ref.found = true;
  Dwarf_Addr start, end;
  bool signalp = false;
  dwarf_frame_info(frame, &start, &end, &signalp);
  ref.signal_frame = signalp;
  Dwarf_Op* ops = nullptr;
  size_t nops = 0;
  if (dwarf_frame_cfa(frame, &ops, &nops) == 0) {
    if (nops == 1 && ops[0].atom == DW_OP_bregx) {
      ref.cfa_is_reg = true;
      ref.cfa_reg = ops[0].number;
      ref.cfa_offset = static_cast<int64_t>(ops[0].number2);
    } else {
      for (size_t i = 0; i < nops; ++i) ref.cfa_expr += std::to_string(ops[i].atom) + ",";
    }
  }
  DecodeRegister(frame, 16, &ref.ra_kind, &ref.ra_offset);
  DecodeRegister(frame, 6, &ref.fp_kind, &ref.fp_offset);
  if (signalp) {
    if (dwarf_frame_cfa(frame, &ops, &nops) == 0) ref.sig_cfa = RspOffset(ops, nops, true);
    ref.sig_rip = SignalRegister(frame, 16);
    ref.sig_rbp = SignalRegister(frame, 6);
  }
  free(frame);
  return ref;
}

struct CompareCounts {
  int rows = 0;
  int plt_rows = 0;
  int unrepresentable = 0;
  int signal_rows = 0;
};

// Compares our row with libdw's at `pc`; returns a description of a mismatch or "".
std::string Compare(const CfiTable& table, const Reference& ref, uint64_t pc, CompareCounts* counts) {
  UnwindRow row;
  bool ours = table.FindRowUncached(pc, /*innermost=*/true, &row);
  UnwindRow cached;
  bool ours_cached = table.FindRow(pc, true, &cached);
  if (ours != ours_cached || (ours && cached.cfa_offset != row.cfa_offset)) return "cache disagrees";
  if (!ref.found) return ours ? "row where libdw has none" : "";
  if (!ours) return "no row where libdw has one";
  if (ref.signal_frame) {
    // libdw's rule: CFA = [rsp + a], rip at rsp + b, rbp at rsp + c; ours must say the same.
    ++counts->signal_rows;
    if (row.ra_rule != UnwindRow::RaRule::kSignalFrame || row.cfa_base != UnwindRow::CfaBase::kSp) {
      return "signal frame not compiled to a signal-frame row";
    }
    if (row.cfa_offset != ref.sig_cfa || row.ra_offset != ref.sig_rip ||
        (ref.sig_rbp >= 0) != (row.fp_rule == UnwindRow::FpRule::kAtCfaOffset) ||
        (ref.sig_rbp >= 0 && row.fp_offset != ref.sig_rbp)) {
      return "signal row mismatch: ours sp@" + std::to_string(row.cfa_offset) + " pc@" +
             std::to_string(row.ra_offset) + " fp@" + std::to_string(row.fp_offset) +
             " libdw " + std::to_string(ref.sig_cfa) + "/" + std::to_string(ref.sig_rip) + "/" +
             std::to_string(ref.sig_rbp);
    }
    return "";
  }
  if (row.cfa_base == UnwindRow::CfaBase::kUndefined) {
    ++counts->unrepresentable;
    // Only acceptable when libdw's rule is beyond a row too.
    bool beyond = !ref.cfa_is_reg || ref.signal_frame || (ref.cfa_reg != 6 && ref.cfa_reg != 7) ||
                  ref.ra_kind == 2 || ref.ra_kind == 3 || ref.fp_kind == 3;
    return beyond ? "" : "marked unrepresentable but libdw has a plain rule";
  }
  if (!ref.cfa_is_reg) {
    // The PLT expression: rsp + 8 + ((pc & 15) >= 11) * 8.
    if (ref.cfa_expr.empty()) return "libdw gave no CFA";
    ++counts->plt_rows;
    int64_t expected = 8 + ((pc & 15) >= 11 ? 8 : 0);
    if (row.cfa_base != UnwindRow::CfaBase::kSp || row.cfa_offset != expected) {
      return "PLT row mismatch: " + std::to_string(row.cfa_offset) + " expr " + ref.cfa_expr;
    }
  } else {
    ++counts->rows;
    UnwindRow::CfaBase base = ref.cfa_reg == 7 ? UnwindRow::CfaBase::kSp : UnwindRow::CfaBase::kFp;
    if (row.cfa_base != base || row.cfa_offset != ref.cfa_offset) {
      return "CFA mismatch: ours " + std::to_string(row.cfa_offset) + " libdw r" +
             std::to_string(ref.cfa_reg) + "+" + std::to_string(ref.cfa_offset);
    }
  }
  if (ref.ra_kind == 0) {
    if (row.ra_rule != UnwindRow::RaRule::kUndefined) return "RA should be undefined";
  } else if (row.ra_rule != UnwindRow::RaRule::kAtCfaOffset || row.ra_offset != ref.ra_offset) {
    return "RA mismatch: libdw kind " + std::to_string(ref.ra_kind) + " ours " + std::to_string(static_cast<int>(row.ra_rule));
  }
  if (ref.fp_kind == 1) {
    if (row.fp_rule != UnwindRow::FpRule::kAtCfaOffset || row.fp_offset != ref.fp_offset) return "rbp mismatch";
  } else if (row.fp_rule != UnwindRow::FpRule::kSame) {
    return "rbp should be unchanged";
  }
  return "";
}

void CompareModule(const std::string& path, CompareCounts* counts, CfiStats* stats_out) {
  auto elf = elf::ElfFile::Open(path);
  ASSERT_TRUE(elf.ok()) << elf.status();
  auto table = CfiTable::Build(**elf);
  ASSERT_TRUE(table.ok()) << table.status();
  *stats_out = (*table)->stats();

  elf_version(EV_CURRENT);
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  Elf* e = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  ASSERT_NE(e, nullptr);
  Dwarf_CFI* cfi = dwarf_getcfi_elf(e);
  ASSERT_NE(cfi, nullptr);

  std::vector<elf::AddressRange> fdes = elf::FdeRanges(**elf);
  // .plt (not always covered by an FDE in FdeRanges' sense: it is, via its expression FDE).
  int mismatches = 0;
  for (size_t i = 0; i < fdes.size(); ++i) {
    const elf::AddressRange& f = fdes[i];
    uint64_t len = f.end - f.start;
    for (uint64_t off = 0; off < len; off += (off < 48 || len - off < 24) ? 1 : 7) {
      uint64_t pc = f.start + off;
      Reference ref = QueryLibdw(cfi, pc);
      std::string diff = Compare(**table, ref, pc, counts);
      if (!diff.empty() && ++mismatches <= 10) {
        ADD_FAILURE() << path << " pc 0x" << std::hex << pc << ": " << diff;
      }
    }
    // Just past the end: a gap unless the next FDE starts there.
    if (i + 1 < fdes.size() && fdes[i + 1].start > f.end) {
      UnwindRow row;
      EXPECT_FALSE((*table)->FindRow(f.end, true, &row)) << std::hex << f.end;
    }
  }
  EXPECT_EQ(mismatches, 0);
  dwarf_cfi_end(cfi);
  elf_end(e);
  close(fd);
}

TEST(CfiTableTest, SelfMatchesLibdw) {
  CompareCounts counts;
  CfiStats stats;
  CompareModule("/proc/self/exe", &counts, &stats);
  EXPECT_GT(counts.rows, 10000);
  EXPECT_GT(counts.plt_rows, 0) << "lazy-binding .plt expression not seen";
  EXPECT_EQ(stats.bad_records, 0u);
  EXPECT_EQ(stats.bad_instructions, 0u);
  std::cout << "self: " << stats.ToString() << "\n";
}

TEST(CfiTableTest, LibcMatchesLibdw) {
  std::string libc = LibPath("libc.so");
  ASSERT_FALSE(libc.empty());
  CompareCounts counts;
  CfiStats stats;
  CompareModule(libc, &counts, &stats);
  EXPECT_GT(counts.rows, 50000);
  EXPECT_GT(stats.signal_frames, 0u) << "__restore_rt is a signal frame";
  // Every signal FDE of glibc compiles to a signal-frame row matching libdw's rule, and its
  // offsets are the kernel's ucontext layout.
  EXPECT_EQ(stats.signal_frame_rows, stats.signal_frames);
  EXPECT_EQ(stats.unsupported_signal_frames, 0u);
  EXPECT_GT(counts.signal_rows, 0);
  EXPECT_EQ(stats.bad_records, 0u);
  // Each CIE's initial instructions run once, not once per FDE (3 CIEs, thousands of FDEs).
  EXPECT_EQ(stats.cie_programs_run, stats.cies);
  EXPECT_GT(stats.fdes, 10 * stats.cies);
  std::cout << "libc: " << stats.ToString() << " unrepresentable pcs sampled "
            << counts.unrepresentable << "\n";
}

// __restore_rt's row, found through the trampoline's address as a return address (the
// handler "returns" to it, so the unwinder looks up pc - 1, the nop glibc puts in front):
// the interrupted rip/rsp/rbp sit at uc_mcontext.gregs[REG_*] of the ucontext at rsp.
TEST(CfiTableTest, RestoreRtRowIsTheKernelLayout) {
  std::string libc = LibPath("libc.so");
  ASSERT_FALSE(libc.empty());
  auto elf = elf::ElfFile::Open(libc);
  ASSERT_TRUE(elf.ok());
  auto table = CfiTable::Build(**elf);
  ASSERT_TRUE(table.ok());
  // sigaction() reports the restorer glibc installs: __restore_rt.
  struct sigaction old_action;
  ASSERT_EQ(sigaction(SIGUSR2, nullptr, &old_action), 0);
  struct sigaction action = {};
  action.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGUSR2, &action, nullptr), 0);
  struct sigaction installed;
  ASSERT_EQ(sigaction(SIGUSR2, nullptr, &installed), 0);
  sigaction(SIGUSR2, &old_action, nullptr);
  constexpr int kSaRestorer = 0x04000000;  // the kernel's SA_RESTORER; glibc's headers hide it
  ASSERT_NE(installed.sa_flags & kSaRestorer, 0);
  Dl_info info;
  ASSERT_NE(dladdr(reinterpret_cast<void*>(installed.sa_restorer), &info), 0);
  const uint64_t restorer = reinterpret_cast<uint64_t>(installed.sa_restorer) -
                            reinterpret_cast<uint64_t>(info.dli_fbase);
  UnwindRow row;
  ASSERT_TRUE((*table)->FindRow(restorer, /*innermost=*/false, &row));
  EXPECT_EQ(row.ra_rule, UnwindRow::RaRule::kSignalFrame);
  EXPECT_EQ(row.cfa_base, UnwindRow::CfaBase::kSp);
  EXPECT_EQ(row.ra_offset, offsetof(ucontext_t, uc_mcontext.gregs[REG_RIP]));
  EXPECT_EQ(row.cfa_offset, offsetof(ucontext_t, uc_mcontext.gregs[REG_RSP]));
  EXPECT_EQ(row.fp_rule, UnwindRow::FpRule::kAtCfaOffset);
  EXPECT_EQ(row.fp_offset, offsetof(ucontext_t, uc_mcontext.gregs[REG_RBP]));
  // Inside the trampoline (an exact pc: a sample taken there) the row is the same.
  UnwindRow inner;
  ASSERT_TRUE((*table)->FindRow(restorer + 7, /*innermost=*/true, &inner));
  EXPECT_EQ(inner.ra_rule, UnwindRow::RaRule::kSignalFrame);
  EXPECT_EQ(inner.ra_offset, row.ra_offset);
}

TEST(CfiTableTest, CallerLookupUsesPcMinusOne) {
  auto elf = elf::ElfFile::Open("/proc/self/exe");
  ASSERT_TRUE(elf.ok());
  auto table = CfiTable::Build(**elf);
  ASSERT_TRUE(table.ok());
  std::vector<elf::AddressRange> fdes = elf::FdeRanges(**elf);
  // At an FDE's first byte a return address belongs to the previous function (or nothing).
  int checked = 0;
  for (const elf::AddressRange& f : fdes) {
    UnwindRow inner, caller, last;
    ASSERT_TRUE((*table)->FindRow(f.start, true, &inner));
    bool prev = (*table)->FindRowUncached(f.start - 1, true, &last);
    bool got = (*table)->FindRow(f.start, false, &caller);
    ASSERT_EQ(got, prev);
    if (got) {
      EXPECT_EQ(caller.cfa_offset, last.cfa_offset);
    }
    if (++checked > 200) break;
  }
}

TEST(CfiTableTest, FactoryRejectsUnsupportedArchitecture) {
  auto elf = elf::ElfFile::Open("/proc/self/exe");
  ASSERT_TRUE(elf.ok());
  auto arch = ArchOf(**elf);
  ASSERT_TRUE(arch.ok());
  EXPECT_EQ(*arch, Arch::kX86_64);
  auto rules = MakeRuleSource(Arch::kX86_64, **elf);
  EXPECT_TRUE(rules.ok()) << rules.status();
  auto mips = MakeRuleSource(Arch::kMips64El, **elf);
  ASSERT_FALSE(mips.ok());
  EXPECT_NE(mips.status().message().find("architecture mismatch"), std::string::npos)
      << mips.status();
  // An ELF for another machine (e_machine patched to AArch64).
  std::ifstream in("/proc/self/exe", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  bytes[18] = static_cast<char>(183);
  bytes[19] = 0;
  auto other = elf::ElfFile::FromBytes(bytes);
  ASSERT_TRUE(other.ok());
  auto unsupported = MakeRuleSource(Arch::kX86_64, **other);
  ASSERT_FALSE(unsupported.ok());
  EXPECT_NE(unsupported.status().message().find("unsupported architecture"), std::string::npos)
      << unsupported.status();
}

TEST(CfiTableTest, CorruptCfiNeverCrashes) {
  std::ifstream in(LibPath("libc.so"), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string original = ss.str();
  auto parsed = elf::ElfFile::FromBytes(original);
  ASSERT_TRUE(parsed.ok());
  const elf::Section* eh = (*parsed)->FindSection(".eh_frame");
  const elf::Section* hdr = (*parsed)->FindSection(".eh_frame_hdr");
  ASSERT_TRUE(eh != nullptr && hdr != nullptr);
  uint64_t state = 7;
  for (int iter = 0; iter < 30; ++iter) {
    std::string bytes = original;
    for (int k = 0; k < 64; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const elf::Section* s = (state >> 63) ? eh : hdr;
      bytes[s->offset + (state >> 20) % s->size] = static_cast<char>(state >> 8);
    }
    auto elf = elf::ElfFile::FromBytes(std::move(bytes));
    ASSERT_TRUE(elf.ok());
    auto table = CfiTable::Build(**elf);
    if (!table.ok()) continue;
    UnwindRow row;
    for (uint64_t pc = 0x20000; pc < 0x40000; pc += 97) (*table)->FindRow(pc, true, &row);
  }
}

}  // namespace
}  // namespace strata::unwind::x86_64
