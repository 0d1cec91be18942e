// Tests of the .gopclntab reader: binaries built by the build with Debian's golang-go (Go 1.19)
// and with bookworm-backports' Go 1.21, 1.22 and 1.23 (STRATA_GO_TOOLCHAINS; unstripped,
// stripped, PIE, MIPS64 of both byte orders) and unstable's Go 1.27 (x86-64 only; its linker
// leaves the table's textStart 0) checked against each release's own debug/gosym
// (a dump tool built alongside), the runtime's own stack symbolization and `go tool objdump`;
// hand-made tables in the Go 1.16 and 1.20+ layouts; malformed tables.
#include "common/elf/go_pclntab.h"

#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string_view>
#include <cstdlib>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/elf/elf_builder_for_test.h"
#include "common/testing/shell_output.h"

namespace strata::elf {
namespace {

std::string RunCommand(const std::string& cmd) { return strata::testing::ShellOutput(cmd); }

// ---- Hand-made tables in the documented layouts (runtime/symtab.go of Go 1.16 and 1.20) ----

class TableWriter {
 public:
  TableWriter(bool big_endian, uint8_t ptr_size) : be_(big_endian), ptr_(ptr_size) {}
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Int(v, 4); }
  void Ptr(uint64_t v) { Int(v, ptr_); }
  void Int(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) {
      const int shift = be_ ? 8 * (n - 1 - i) : 8 * i;
      out_.push_back(static_cast<char>(v >> shift));
    }
  }
  void Bytes(std::string_view s) { out_.append(s); }
  void Align(size_t a) { while (out_.size() % a) out_.push_back(0); }
  size_t size() const { return out_.size(); }
  std::string& str() { return out_; }
  void PatchPtr(size_t at, uint64_t v) {
    TableWriter w(be_, ptr_);
    w.Ptr(v);
    out_.replace(at, ptr_, w.str());
  }

 private:
  bool be_;
  uint8_t ptr_;
  std::string out_;
};

void Uvarint(std::string* out, uint32_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// A pc-value table: (value, length in bytes) runs from the function's entry.
std::string PcValueTable(const std::vector<std::pair<int32_t, uint32_t>>& runs, uint8_t quantum) {
  std::string t;
  int32_t prev = -1;
  for (auto [value, length] : runs) {
    const int32_t d = value - prev;
    Uvarint(&t, static_cast<uint32_t>((d << 1) ^ (d >> 31)));
    Uvarint(&t, length / quantum);
    prev = value;
  }
  t.push_back(0);
  return t;
}

struct FixtureFunc {
  std::string name;
  uint32_t offset;  // from the text start
  uint32_t size;
  std::vector<std::pair<int32_t, uint32_t>> sp, line;
  uint8_t flags;
};

constexpr uint64_t kTableVaddr = 0x500000;
constexpr uint64_t kText = 0x401000;

// main.work (frame 0x18 after its 4-byte prologue, lines 10 and 12), runtime.goexit (a root:
// TOPFRAME in 1.20, by name in 1.16), runtime.systemstack (SPWRITE in 1.20).
std::vector<FixtureFunc> FixtureFuncs() {
  return {
      {"main.work", 0x0, 0x40, {{0, 4}, {0x18, 0x38}, {0, 4}}, {{10, 0x10}, {12, 0x30}}, 0},
      {"runtime.goexit", 0x40, 0x10, {{0, 0x10}}, {{400, 0x10}}, GoPclntab::kFlagTopFrame},
      {"runtime.systemstack", 0x50, 0x20, {{0, 0x8}, {8, 0x18}}, {{500, 0x20}},
       GoPclntab::kFlagSpWrite},
  };
}

// `funcs`: a function of empty name is given the first function's name (the same bytes).
std::string MakeTable(GoPclntab::Version version, bool be, uint8_t ptr, uint8_t quantum,
                      const std::vector<FixtureFunc>& funcs = FixtureFuncs()) {
  const bool v116 = version == GoPclntab::Version::kGo116;
  TableWriter w(be, ptr);
  w.U32(v116 ? 0xfffffffa : 0xfffffff1);
  w.U8(0);
  w.U8(0);
  w.U8(quantum);
  w.U8(ptr);
  w.Ptr(funcs.size());
  w.Ptr(1);  // nfiles
  if (!v116) w.Ptr(kText);
  const size_t offsets_at = w.size();
  for (int i = 0; i < 5; ++i) w.Ptr(0);  // patched below
  // funcnametab
  const size_t names = w.size();
  std::vector<uint32_t> name_off;
  for (const FixtureFunc& f : funcs) {
    if (f.name.empty() && !name_off.empty()) {
      name_off.push_back(name_off.front());
      continue;
    }
    name_off.push_back(static_cast<uint32_t>(w.size() - names));
    w.Bytes(f.name);
    w.U8(0);
  }
  // cutab: CU 0's file 0 is filetab offset 0.
  w.Align(4);
  const size_t cutab = w.size();
  w.U32(0);
  const size_t filetab = w.size();
  w.Bytes("/src/main.go");
  w.U8(0);
  // pctab: offset 0 means "no table".
  const size_t pctab = w.size();
  w.U8(0);
  std::vector<uint32_t> sp_off, file_off, line_off;
  for (const FixtureFunc& f : funcs) {
    sp_off.push_back(static_cast<uint32_t>(w.size() - pctab));
    w.Bytes(PcValueTable(f.sp, quantum));
    file_off.push_back(static_cast<uint32_t>(w.size() - pctab));
    w.Bytes(PcValueTable({{0, f.size}}, quantum));
    line_off.push_back(static_cast<uint32_t>(w.size() - pctab));
    w.Bytes(PcValueTable(f.line, quantum));
  }
  // pclntable: the function table, then the _func records.
  w.Align(ptr);
  const size_t pcln = w.size();
  const size_t entry_bytes = v116 ? 2 * ptr : 8;
  const size_t funcs_at = (funcs.size() + 1) * entry_bytes;  // relative to pcln
  // Go 1.16 aligns each record to the pointer size.
  const size_t record = v116 ? (ptr + 36 + ptr - 1) / ptr * ptr : 44;
  for (size_t i = 0; i <= funcs.size(); ++i) {
    const uint32_t off = i < funcs.size() ? funcs[i].offset : funcs.back().offset + funcs.back().size;
    const uint64_t funcoff = funcs_at + std::min(i, funcs.size() - 1) * record;
    if (v116) {
      w.Ptr(kText + off);
      w.Ptr(funcoff);
    } else {
      w.U32(off);
      w.U32(static_cast<uint32_t>(funcoff));
    }
  }
  for (size_t i = 0; i < funcs.size(); ++i) {
    const FixtureFunc& f = funcs[i];
    if (v116) w.Ptr(kText + f.offset);
    else w.U32(f.offset);
    w.U32(name_off[i]);
    w.U32(0);  // args
    w.U32(0);  // deferreturn
    w.U32(sp_off[i]);
    w.U32(file_off[i]);
    w.U32(line_off[i]);
    w.U32(0);  // npcdata
    w.U32(0);  // cuOffset
    if (!v116) w.U32(f.offset);  // startLine
    w.U8(0);   // funcID
    w.U8(v116 ? 0 : f.flags);
    w.U8(0);
    w.U8(0);   // nfuncdata
    if (v116) w.Align(ptr);
  }
  w.PatchPtr(offsets_at, names);
  w.PatchPtr(offsets_at + ptr, cutab);
  w.PatchPtr(offsets_at + 2 * ptr, filetab);
  w.PatchPtr(offsets_at + 3 * ptr, pctab);
  w.PatchPtr(offsets_at + 4 * ptr, pcln);
  return w.str();
}

struct FixtureCase {
  GoPclntab::Version version;
  bool big_endian;
  uint8_t ptr_size;
  uint8_t quantum;
};

class HandMadeTableTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(HandMadeTableTest, DecodesFunctionsSpDeltasLinesAndRoots) {
  const FixtureCase c = GetParam();
  const std::string table = MakeTable(c.version, c.big_endian, c.ptr_size, c.quantum);
  absl::StatusOr<std::unique_ptr<GoPclntab>> t =
      GoPclntab::Parse(table, kTableVaddr, c.big_endian, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->version(), c.version);
  EXPECT_EQ((*t)->ptr_size(), c.ptr_size);
  const auto& fs = (*t)->functions();
  ASSERT_EQ(fs.size(), 3u);
  EXPECT_EQ(fs[0].name, "main.work");
  EXPECT_EQ(fs[0].entry, kText);
  EXPECT_EQ(fs[0].end, kText + 0x40);
  EXPECT_FALSE(fs[0].root);
  EXPECT_EQ(fs[1].name, "runtime.goexit");
  EXPECT_TRUE(fs[1].root);
  EXPECT_TRUE(fs[2].root);
  if (c.version == GoPclntab::Version::kGo120) {
    EXPECT_EQ(fs[1].flags, GoPclntab::kFlagTopFrame);
    EXPECT_EQ(fs[2].flags, GoPclntab::kFlagSpWrite);
  }
  EXPECT_EQ((*t)->FindFunction(kText + 0x20), 0);
  EXPECT_EQ((*t)->FindFunction(kText + 0x45), 1);
  EXPECT_EQ((*t)->FindFunction(kText + 0x70), -1);
  EXPECT_EQ((*t)->FindFunction(kText - 1), -1);

  std::vector<GoPclntab::PcValueRange> sp = (*t)->SpDeltas(fs[0]);
  ASSERT_EQ(sp.size(), 3u);
  EXPECT_EQ(sp[0].start, kText);
  EXPECT_EQ(sp[0].end, kText + 4);
  EXPECT_EQ(sp[0].value, 0);
  EXPECT_EQ(sp[1].value, 0x18);
  EXPECT_EQ(sp[2].start, kText + 0x3c);

  std::vector<GoPclntab::SourceFrame> at = (*t)->Symbolize(fs[0], kText + 0x20);
  ASSERT_EQ(at.size(), 1u);
  EXPECT_EQ(at[0].function, "main.work");
  EXPECT_EQ(at[0].file, "/src/main.go");
  EXPECT_EQ(at[0].line, 12);
  EXPECT_EQ((*t)->Symbolize(fs[0], kText + 0x4)[0].line, 10);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HandMadeTableTest,
    ::testing::Values(FixtureCase{GoPclntab::Version::kGo116, false, 8, 1},
                      FixtureCase{GoPclntab::Version::kGo116, true, 8, 4},
                      FixtureCase{GoPclntab::Version::kGo116, true, 4, 4},
                      FixtureCase{GoPclntab::Version::kGo120, false, 8, 1},
                      FixtureCase{GoPclntab::Version::kGo120, true, 8, 4},
                      FixtureCase{GoPclntab::Version::kGo120, false, 4, 4}));

// STRATA_GOPCLNTAB_SEEDS=DIR: writes the hand-made tables as fuzz/gopclntab_fuzzer inputs
// (a flags byte, then the table) -- how fuzz/corpus/gopclntab was made.
TEST(GoPclntabTest, WritesFuzzSeedsWhenAsked) {
  const char* dir = getenv("STRATA_GOPCLNTAB_SEEDS");
  if (dir == nullptr) GTEST_SKIP() << "STRATA_GOPCLNTAB_SEEDS not set";
  int n = 0;
  for (const FixtureCase& c : {FixtureCase{GoPclntab::Version::kGo116, false, 8, 1},
                               FixtureCase{GoPclntab::Version::kGo116, true, 4, 4},
                               FixtureCase{GoPclntab::Version::kGo120, false, 8, 1},
                               FixtureCase{GoPclntab::Version::kGo120, true, 8, 4}}) {
    const std::string seed = std::string(1, static_cast<char>((c.big_endian ? 1 : 0) |
                                                             (c.quantum == 4 ? 2 : 0))) +
                             MakeTable(c.version, c.big_endian, c.ptr_size, c.quantum);
    FILE* f = fopen(absl::StrCat(dir, "/handmade_", n++).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    fwrite(seed.data(), 1, seed.size(), f);
    fclose(f);
  }
}

// Every function naming one name of 1 MiB: its end was sought, and the name copied by
// AddGoFunctionSymbols, per function (100 GB for these 100,000); refused as corrupt now.
TEST(GoPclntabTest, FunctionsAllNamingOneLongNameAreRefused) {
  std::vector<FixtureFunc> funcs;
  for (uint32_t i = 0; i < 100000; ++i) {
    funcs.push_back({i == 0 ? std::string(1 << 20, 'f') : "", 16 * i, 16, {{0, 16}}, {{1, 16}},
                     0});
  }
  const std::string table = MakeTable(GoPclntab::Version::kGo120, false, 8, 1, funcs);
  const absl::Time start = absl::Now();
  auto parsed = GoPclntab::Parse(table, kTableVaddr, false, nullptr);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("function names"), std::string::npos)
      << parsed.status();
  // Two of them are a table.
  funcs.resize(2);
  parsed = GoPclntab::Parse(MakeTable(GoPclntab::Version::kGo120, false, 8, 1, funcs),
                            kTableVaddr, false, nullptr);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)->functions().size(), 2u);
  EXPECT_EQ((*parsed)->functions()[1].name.size(), size_t{1} << 20);
}

// Loaded data full of what looks like a table's header, under 60,000 section headers aliasing
// it: the fallback parses a few of them and scans the bytes once, not per header.
TEST(GoPclntabTest, TheMagicNumberFallbackIsBounded) {
  std::string header;
  for (int i = 0; i < 8; ++i) header += "\xf1\xff\xff\xff\x00\x00\x01\x08"[i];
  std::string data;
  while (data.size() < (1 << 20)) data += header + std::string(56, '\x7f');
  testing::ElfBuilder b;
  const uint32_t section = b.AddSection(SHT_PROGBITS, data, 0, 0, SHF_ALLOC);
  b.AddAliases(section, 60000);
  auto elf = ElfFile::FromBytes(b.Build());
  ASSERT_TRUE(elf.ok()) << elf.status();
  const absl::Time start = absl::Now();
  auto found = GoPclntab::Find(**elf);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(absl::IsNotFound(found.status())) << found.status();
  EXPECT_NE(found.status().message().find("first 8"), std::string::npos) << found.status();
  // Without header-like words, the aliases are scanned to the file's size, then given up.
  testing::ElfBuilder plain;
  plain.AddAliases(plain.AddSection(SHT_PROGBITS, std::string(1 << 20, '\x7f'), 0, 0, SHF_ALLOC),
                   60000);
  elf = ElfFile::FromBytes(plain.Build());
  ASSERT_TRUE(elf.ok()) << elf.status();
  const absl::Time plain_start = absl::Now();
  EXPECT_TRUE(absl::IsNotFound(GoPclntab::Find(**elf).status()));
  EXPECT_LT(absl::Now() - plain_start, absl::Seconds(5));  // minutes before
}

TEST(GoPclntabTest, MalformedTablesAreErrorsNotCrashes) {
  const std::string good = MakeTable(GoPclntab::Version::kGo120, false, 8, 1);
  EXPECT_FALSE(GoPclntab::Parse("", kTableVaddr, false, nullptr).ok());
  EXPECT_FALSE(GoPclntab::Parse(good.substr(0, 20), kTableVaddr, false, nullptr).ok());
  std::string bad_magic = good;
  bad_magic[0] = 0x12;
  EXPECT_FALSE(GoPclntab::Parse(bad_magic, kTableVaddr, false, nullptr).ok());
  std::string bad_ptr = good;
  bad_ptr[7] = 3;
  EXPECT_FALSE(GoPclntab::Parse(bad_ptr, kTableVaddr, false, nullptr).ok());
  // Every truncation and many single-byte corruptions: an error or a table, never a crash,
  // and whatever decodes is bounded.
  for (size_t n = 0; n < good.size(); n += 3) {
    auto t = GoPclntab::Parse(good.substr(0, n), kTableVaddr, false, nullptr);
    if (t.ok()) {
      for (const auto& f : (*t)->functions()) {
        (*t)->SpDeltas(f);
        (*t)->Symbolize(f, f.entry);
      }
    }
  }
  for (size_t i = 8; i < good.size(); ++i) {
    std::string c = good;
    c[i] = static_cast<char>(c[i] ^ 0xa5);
    auto t = GoPclntab::Parse(c, kTableVaddr, false, nullptr);
    if (t.ok()) {
      for (const auto& f : (*t)->functions()) {
        (*t)->SpDeltas(f);
        (*t)->Symbolize(f, f.entry + 1);
      }
    }
  }
}

// ---- Real Go binaries ----

#ifdef STRATA_GO_DIR

// A test binary is named by its build: "VARIANT" (Go 1.19, the host's `go`) or
// "goVERSION_VARIANT" (a STRATA_GO_TOOLCHAINS toolchain), e.g. "go1.23_amd64_pie".
std::string GoVersionOf(const std::string& build) {
  if (build.rfind("go", 0) != 0) return "1.19";
  return build.substr(2, build.find('_') - 2);
}

// The `go` that built `build`; empty when its toolchain could not be fetched.
std::string GoToolOf(const std::string& build) {
  const std::string version = GoVersionOf(build);
  if (version == "1.19") return STRATA_GO;
  for (absl::string_view entry : absl::StrSplit(STRATA_GO_TOOLCHAINS, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    if (kv.first == version) return kv.second;
  }
  return "";
}

std::string GoBinary(const std::string& build) {
  return std::string(STRATA_GO_DIR) + "/pclntab_subject_" + build;
}

// Why the binaries of `build` are not there (empty when they are).
std::string MissingGoBuild(const std::string& build) {
  if (GoToolOf(build).empty()) {
    return absl::StrCat("no Go ", GoVersionOf(build), " toolchain: not in STRATA_GO_VERSIONS, "
                        "or deploy/cross/make-go-root.sh could not fetch it (CMake's output)");
  }
  struct stat st;
  return stat(GoBinary(build).c_str(), &st) == 0 ? "" : GoBinary(build) + " not built";
}

struct TruthFunc {
  uint64_t entry, end;
  std::string name;
  std::vector<std::tuple<uint64_t, std::string, int>> lines;
};

// Go 1.19's debug/gosym reads no 1.20+ tables: each release's binaries are read by its own.
std::vector<TruthFunc> GosymTruth(const std::string& build) {
  std::vector<TruthFunc> out;
  const std::string version = GoVersionOf(build);
  const std::string truth = std::string(STRATA_GO_DIR) + "/pclntab_truth" +
                            (version == "1.19" ? "" : "_go" + version);
  std::istringstream in(RunCommand(truth + " " + GoBinary(build)));
  std::string line;
  while (std::getline(in, line)) {
    // Names may hold spaces (type..eq.struct { ... }): the name is the rest of the line.
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 3));
    if (f[0] == "F" && f.size() == 4) {
      out.push_back({std::stoull(f[1], nullptr, 16), std::stoull(f[2], nullptr, 16), f[3], {}});
    } else if (f[0] == "L" && f.size() == 4 && !out.empty()) {
      out.back().lines.emplace_back(std::stoull(f[1], nullptr, 16), f[2], std::stoi(f[3]));
    }
  }
  return out;
}

class GoBinaryTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoBinaryTest, MatchesDebugGosym) {
  if (std::string missing = MissingGoBuild(GetParam()); !missing.empty()) GTEST_SKIP() << missing;
  const std::string path = GoBinary(GetParam());
  absl::StatusOr<std::unique_ptr<ElfFile>> elf = ElfFile::Open(path);
  ASSERT_TRUE(elf.ok()) << elf.status();
  absl::StatusOr<std::unique_ptr<GoPclntab>> table = GoPclntab::Find(**elf);
  ASSERT_TRUE(table.ok()) << table.status();
  // Go 1.19 writes the 1.18 layout, 1.21-1.23 the 1.20 one.
  EXPECT_EQ((*table)->version(), GoVersionOf(GetParam()) == "1.19" ? GoPclntab::Version::kGo118
                                                                   : GoPclntab::Version::kGo120);
  EXPECT_NE((*table)->gofunc(), 0u) << "moduledata not found";
  const std::vector<TruthFunc> truth = GosymTruth(GetParam());
  ASSERT_GT(truth.size(), 500u);
  const auto& funcs = (*table)->functions();
  ASSERT_EQ(funcs.size(), truth.size());
  size_t roots = 0;
  for (size_t i = 0; i < truth.size(); ++i) {
    const GoPclntab::Function& f = funcs[i];
    ASSERT_EQ(f.entry, truth[i].entry) << i;
    ASSERT_EQ(f.name, truth[i].name) << i;
    // Our end is where the function's code ends; gosym's is the next entry.
    ASSERT_LE(f.end, truth[i].end) << f.name;
    ASSERT_GT(f.end, f.entry) << f.name;
    roots += f.root;
    for (const auto& [pc, file, line] : truth[i].lines) {
      if (pc >= f.end) continue;  // padding after the code: gosym says line -1
      std::vector<GoPclntab::SourceFrame> frames = (*table)->Symbolize(f, pc);
      ASSERT_FALSE(frames.empty());
      // gosym knows no inlining: its file:line is the innermost frame's. Where it has no
      // line (below 1: the go:textfips* markers of Go 1.24+), neither has the parser.
      if (line < 1) {
        EXPECT_EQ(frames.front().line, 0) << f.name << " @" << std::hex << pc;
        continue;
      }
      EXPECT_EQ(frames.front().file, file) << f.name << " @" << std::hex << pc;
      EXPECT_EQ(frames.front().line, line) << f.name << " @" << std::hex << pc;
    }
  }
  auto is_root = [&](std::string_view name) {
    for (const auto& f : funcs) {
      if (f.name == name) return f.root;
    }
    ADD_FAILURE() << name << " not found";
    return false;
  };
  EXPECT_TRUE(is_root("runtime.goexit"));
  EXPECT_TRUE(is_root("runtime.mstart"));
  EXPECT_TRUE(is_root("runtime.rt0_go"));
  EXPECT_TRUE(is_root("runtime.systemstack"));
  EXPECT_TRUE(is_root("runtime.mcall"));
  EXPECT_TRUE(is_root("runtime.morestack"));
  EXPECT_FALSE(is_root("main.main"));
  EXPECT_FALSE(is_root("runtime.main"));
  EXPECT_LT(roots, 40u);
  // funcIDs are each release's own numbers (Go 1.22 inserted FuncID_corostart before goexit).
  const std::string version = GoVersionOf(GetParam());
  for (const auto& f : funcs) {
    if (f.name == "runtime.goexit") {
      EXPECT_EQ(f.func_id, version >= "1.22" ? 8 : 7) << version;
    }
    if (f.name == "main.main") {
      EXPECT_EQ(f.func_id, 0);
    }
  }
}

// The SP delta right after the prologue's stack adjustment is the adjustment, as `go tool
// objdump` of the release that built the binary shows it (x86-64: SUBQ $n, SP; MIPS64: ADDV
// $-n, R29), plus the frame pointer pushed before it (Go 1.21+ on x86-64: PUSHQ BP; MOVQ SP,
// BP; SUBQ $n, SP, where 1.19 stored BP inside the frame after the SUBQ).
class GoDisassemblyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoDisassemblyTest, SpDeltaMatchesPrologueDisassembly) {
  if (std::string missing = MissingGoBuild(GetParam()); !missing.empty()) GTEST_SKIP() << missing;
  const std::string path = GoBinary(GetParam());
  auto elf = ElfFile::Open(path);
  ASSERT_TRUE(elf.ok());
  auto table = GoPclntab::Find(**elf);
  ASSERT_TRUE(table.ok());
  const std::string dump = RunCommand(
      absl::StrCat(GoToolOf(GetParam()), " tool objdump -s '^(main|crypto/sha256|fmt)\\.' ", path));
  const std::regex text_re(R"(^TEXT (\S+)\(SB\))");
  const std::regex insn_re(R"(^\s+\S*:\d+\s+0x([0-9a-f]+)\s+\S+\s+(.*)$)");
  const std::regex adjust_re(R"(^(SUBQ \$0x([0-9a-f]+), SP|ADDV \$-(\d+), R29)\b)");
  std::istringstream in(dump);
  std::string line, current;
  bool want_next = false, checked_this = false;
  uint64_t expect = 0, pushed = 0;
  size_t checked = 0, pushed_bp = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, text_re)) {
      current = m[1];
      want_next = checked_this = false;
      pushed = 0;
      continue;
    }
    if (!std::regex_match(line, m, insn_re)) continue;
    const uint64_t pc = std::stoull(m[1], nullptr, 16);
    const std::string insn = m[2];
    if (want_next) {
      const int64_t fi = (*table)->FindFunction(pc);
      ASSERT_GE(fi, 0);
      bool found = false;
      for (const auto& r : (*table)->SpDeltas((*table)->functions()[fi])) {
        if (pc >= r.start && pc < r.end) {
          EXPECT_EQ(static_cast<uint64_t>(r.value), expect) << current << " @" << std::hex << pc;
          found = true;
        }
      }
      EXPECT_TRUE(found) << current;
      ++checked;
      want_next = false;
      checked_this = true;
      continue;
    }
    std::smatch a;
    if (!checked_this && insn.rfind("PUSHQ BP", 0) == 0) pushed = 8;
    if (!checked_this && std::regex_search(insn, a, adjust_re)) {
      expect = pushed + (a[2].matched ? std::stoull(a[2], nullptr, 16) : std::stoull(a[3]));
      pushed_bp += pushed != 0;
      want_next = true;
    }
  }
  EXPECT_GT(checked, 20u);
  // Each release's prologue (a check of the check).
  if (GoVersionOf(GetParam()) == "1.19") {
    EXPECT_EQ(pushed_bp, 0u);
  } else {
    EXPECT_GT(pushed_bp, checked / 2);
  }
}

// Stripping and byte order change no code: every function's SP deltas (relative to its entry)
// are those of the unstripped build for the same architecture, and a function's MIPS64 deltas
// are the same in both byte orders. (go tool objdump has no MIPS64 and needs symbols.) The
// parameter is the builds' prefix: "" (Go 1.19) or "goVERSION_".
class GoBuildsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoBuildsTest, SpDeltasAgreeAcrossStrippingAndByteOrder) {
  const std::string prefix = GetParam();
  if (std::string missing = MissingGoBuild(prefix + "amd64"); !missing.empty()) {
    GTEST_SKIP() << missing;
  }
  auto deltas = [&](const std::string& suffix) {
    const std::string variant = prefix + suffix;
    std::map<std::string, std::vector<std::tuple<uint64_t, uint64_t, int32_t>>> out;
    auto elf = ElfFile::Open(GoBinary(variant));
    EXPECT_TRUE(elf.ok());
    if (!elf.ok()) return out;
    auto table = GoPclntab::Find(**elf);
    EXPECT_TRUE(table.ok());
    if (!table.ok()) return out;
    for (const auto& f : (*table)->functions()) {
      auto& v = out[std::string(f.name)];
      for (const auto& r : (*table)->SpDeltas(f)) v.emplace_back(r.start - f.entry, r.end - f.entry, r.value);
    }
    return out;
  };
  EXPECT_EQ(deltas("amd64"), deltas("amd64_stripped"));
  EXPECT_EQ(deltas("amd64_pie"), deltas("amd64_pie_stripped"));
  const auto mle = deltas("mips64le");
  EXPECT_EQ(mle, deltas("mips64le_stripped"));
  const auto mbe = deltas("mips64");
  size_t same = 0;
  for (const auto& [name, d] : mle) {
    auto it = mbe.find(name);
    if (it != mbe.end() && it->second == d) ++same;
  }
  EXPECT_GT(same, mle.size() * 9 / 10);
}

// The builds of one release (`prefix` as in GoBuildsTest).
std::vector<std::string> GoBuilds(const std::string& prefix) {
  std::vector<std::string> out;
  for (const char* v : {"amd64", "amd64_stripped", "amd64_pie", "amd64_pie_stripped", "mips64le",
                        "mips64le_stripped", "mips64"}) {
    out.push_back(prefix + v);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Go119Amd64, GoDisassemblyTest, ::testing::Values("amd64", "amd64_pie"));
INSTANTIATE_TEST_SUITE_P(Go119, GoBinaryTest, ::testing::ValuesIn(GoBuilds("")));
INSTANTIATE_TEST_SUITE_P(Go119, GoBuildsTest, ::testing::Values(""));
INSTANTIATE_TEST_SUITE_P(Go12xAmd64, GoDisassemblyTest,
                         ::testing::Values("go1.21_amd64", "go1.21_amd64_pie", "go1.22_amd64",
                                           "go1.22_amd64_pie", "go1.23_amd64", "go1.23_amd64_pie"));
INSTANTIATE_TEST_SUITE_P(Go121, GoBinaryTest, ::testing::ValuesIn(GoBuilds("go1.21_")));
INSTANTIATE_TEST_SUITE_P(Go122, GoBinaryTest, ::testing::ValuesIn(GoBuilds("go1.22_")));
INSTANTIATE_TEST_SUITE_P(Go123, GoBinaryTest, ::testing::ValuesIn(GoBuilds("go1.23_")));
INSTANTIATE_TEST_SUITE_P(Go12x, GoBuildsTest, ::testing::Values("go1.21_", "go1.22_", "go1.23_"));
INSTANTIATE_TEST_SUITE_P(Go127, GoBinaryTest, ::testing::ValuesIn(GoBuilds("go1.27_")));
INSTANTIATE_TEST_SUITE_P(Go127Amd64, GoDisassemblyTest,
                         ::testing::Values("go1.27_amd64", "go1.27_amd64_pie"));

// The runtime's own symbolization of its stack (runtime.CallersFrames, inlined calls
// included) against the parser's, pc by pc.
void ExpectRuntimeFrames(const std::string& binary, const std::string& run) {
  auto elf = ElfFile::Open(binary);
  ASSERT_TRUE(elf.ok());
  auto table = GoPclntab::Find(**elf);
  ASSERT_TRUE(table.ok());
  struct Truth {
    uint64_t pc;
    std::string function, file;
    int line;
  };
  std::vector<Truth> truth;
  std::istringstream in(RunCommand(run + " frames"));
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() == 4) truth.push_back({std::stoull(f[0], nullptr, 16), f[1], f[2], std::stoi(f[3])});
  }
  ASSERT_GE(truth.size(), 5u);
  EXPECT_EQ(truth[1].function, "main.inlinedLeaf");  // the inlined call the test is about
  size_t i = 0;
  while (i < truth.size()) {
    // Frame.PC is already inside the call instruction (the return address less one).
    const uint64_t pc = truth[i].pc;
    const int64_t fi = (*table)->FindFunction(pc);
    ASSERT_GE(fi, 0) << truth[i].function;
    std::vector<GoPclntab::SourceFrame> ours = (*table)->Symbolize((*table)->functions()[fi], pc);
    // runtime.Callers skips itself, inlined into main.capture here.
    if (i == 0 && ours.size() > 1 && ours.front().function == "runtime.Callers") {
      ours.erase(ours.begin());
    }
    for (const GoPclntab::SourceFrame& f : ours) {
      ASSERT_LT(i, truth.size());
      EXPECT_EQ(f.function, truth[i].function);
      EXPECT_EQ(f.file, truth[i].file);
      EXPECT_EQ(f.line, truth[i].line) << f.function;
      ++i;
    }
  }
}

// The parameter is the builds' prefix, as in GoBuildsTest.
class GoRuntimeFramesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoRuntimeFramesTest, Amd64InlinedCallsAndLines) {
  const std::string build = GetParam() + "amd64";
  if (std::string missing = MissingGoBuild(build); !missing.empty()) GTEST_SKIP() << missing;
  ExpectRuntimeFrames(GoBinary(build), GoBinary(build));
}

TEST_P(GoRuntimeFramesTest, Mips64leUnderQemu) {
  const std::string build = GetParam() + "mips64le";
  if (std::string missing = MissingGoBuild(build); !missing.empty()) GTEST_SKIP() << missing;
  if (std::string(STRATA_QEMU_MIPS64EL).empty()) GTEST_SKIP() << "no qemu-mips64el";
  ExpectRuntimeFrames(GoBinary(build), absl::StrCat(STRATA_QEMU_MIPS64EL, " ", GoBinary(build)));
}

INSTANTIATE_TEST_SUITE_P(Go119, GoRuntimeFramesTest, ::testing::Values(""));
INSTANTIATE_TEST_SUITE_P(Go12x, GoRuntimeFramesTest,
                         ::testing::Values("go1.21_", "go1.22_", "go1.23_", "go1.27_"));

// A table whose section has another name is found by its header magic.
TEST(GoPclntabTest, FoundByMagicInARenamedSection) {
  char dir[] = "/tmp/strata_pclntab_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string renamed = std::string(dir) + "/renamed";
  RunCommand(absl::StrCat("objcopy --rename-section .gopclntab=.rodata.moved ",
                          GoBinary("amd64_stripped"), " ", renamed));
  auto elf = ElfFile::Open(renamed);
  ASSERT_TRUE(elf.ok()) << elf.status();
  EXPECT_EQ((*elf)->FindSection(".gopclntab"), nullptr);
  auto original = ElfFile::Open(GoBinary("amd64_stripped"));
  ASSERT_TRUE(original.ok());
  auto expected = GoPclntab::Find(**original);
  auto found = GoPclntab::Find(**elf);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)->vaddr(), (*expected)->vaddr());
  EXPECT_EQ((*found)->functions().size(), (*expected)->functions().size());
  std::remove(renamed.c_str());
  rmdir(dir);
}

TEST(GoPclntabTest, NotFoundInNonGoBinary) {
  auto elf = ElfFile::Open("/proc/self/exe");
  ASSERT_TRUE(elf.ok());
  EXPECT_TRUE(absl::IsNotFound(GoPclntab::Find(**elf).status()));
}

#endif  // STRATA_GO_DIR

}  // namespace
}  // namespace strata::elf
