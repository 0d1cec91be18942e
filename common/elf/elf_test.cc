#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "common/elf/cfi_records.h"
#include "common/elf/elf_builder_for_test.h"
#include "common/elf/elf_file.h"
#include "common/elf/symbol_table.h"
#include "common/testing/sanitizers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/shell_output.h"
#include "common/testing/temp_dir.h"
#include "common/testing/emulation.h"

namespace strata::elf {
namespace {

extern "C" __attribute__((noinline)) int StrataElfTestMarker(int x) {
  asm volatile("" ::: "memory");
  return x * 7;
}

namespace demangle_ns {
__attribute__((noinline)) int Marked(double d) { asm volatile(""); return static_cast<int>(d); }
}  // namespace demangle_ns

std::string RunCommand(const std::string& cmd) { return strata::testing::ShellOutput(cmd); }

// This test executable's real path (realpath's buffer freed).
std::string SelfExe() {
  std::unique_ptr<char, decltype(&free)> path(realpath("/proc/self/exe", nullptr), &free);
  return path ? std::string(path.get()) : std::string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Load bias of the main executable.
uint64_t MainBias() {
  uint64_t bias = 0;
  dl_iterate_phdr([](dl_phdr_info* info, size_t, void* data) {
    *static_cast<uint64_t*>(data) = info->dlpi_addr;
    return 1;  // the first entry is the main program
  }, &bias);
  return bias;
}

std::string SelfPath() { return "/proc/self/exe"; }

std::string LibcPath() {
  std::string maps = ReadFile("/proc/self/maps");
  std::istringstream in(maps);
  std::string line;
  while (std::getline(in, line)) {
    size_t slash = line.find('/');
    if (slash != std::string::npos && line.find("libc.so") != std::string::npos) {
      return line.substr(slash);
    }
  }
  return "/lib/x86_64-linux-gnu/libc.so.6";
}

// `readelf -n` prints "Build ID: <hex>".
std::string ReadelfBuildId(const std::string& path) {
  std::string out = RunCommand("readelf -n '" + path + "' 2>/dev/null");
  size_t pos = out.find("Build ID: ");
  if (pos == std::string::npos) return "";
  size_t end = out.find('\n', pos);
  return out.substr(pos + 10, end - pos - 10);
}

TEST(ElfFileTest, SelfSymbolsAndBuildId) {
  STRATA_SKIP_UNDER_QEMU_USER();
  auto elf = ElfFile::Open(SelfPath());
  ASSERT_TRUE(elf.ok()) << elf.status();
  EXPECT_EQ((*elf)->machine(), kMachineX86_64);
  EXPECT_FALSE((*elf)->big_endian());
  EXPECT_NE((*elf)->FindSection(".text"), nullptr);
  EXPECT_EQ((*elf)->FindSection(".no_such_section"), nullptr);
  EXPECT_EQ((*elf)->BuildIdHex(), ReadelfBuildId(SelfExe()));
  EXPECT_EQ((*elf)->build_id().size(), 20u);

  auto table = SymbolTable::Build(**elf);
  ASSERT_TRUE(table.ok()) << table.status();
  uint64_t marker = reinterpret_cast<uint64_t>(&StrataElfTestMarker) - MainBias();
  const SymbolTable::Function* f = table->Lookup(marker + 3);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->start, marker);
  EXPECT_EQ(f->name, "StrataElfTestMarker");
  uint64_t marked = reinterpret_cast<uint64_t>(&demangle_ns::Marked) - MainBias();
  f = table->Lookup(marked);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->name, "strata::elf::(anonymous namespace)::demangle_ns::Marked(double)");
  EXPECT_EQ(table->Lookup(0), nullptr);
}

TEST(ElfFileTest, CodeBytesMatchMemory) {
  auto elf = ElfFile::Open(SelfPath());
  ASSERT_TRUE(elf.ok());
  uint64_t marker = reinterpret_cast<uint64_t>(&StrataElfTestMarker) - MainBias();
  auto bytes = (*elf)->ReadAt(marker, 8);
  ASSERT_TRUE(bytes.has_value());
  EXPECT_EQ(*bytes, std::string_view(reinterpret_cast<const char*>(&StrataElfTestMarker), 8));
  auto word = (*elf)->ReadU32At(marker);
  ASSERT_TRUE(word.has_value());
  uint32_t expected;
  std::memcpy(&expected, reinterpret_cast<const void*>(&StrataElfTestMarker), 4);
  EXPECT_EQ(*word, expected);
  EXPECT_FALSE((*elf)->ReadAt(~uint64_t{0} - 4, 8).has_value());
}

TEST(ElfFileTest, FileOffsetToVaddrMatchesMaps) {
  STRATA_SKIP_UNDER_QEMU_USER();
  auto elf = ElfFile::FromBytes(ReadFile(SelfPath()));  // not mapped: only the loader's maps
  ASSERT_TRUE(elf.ok());
  std::string self = SelfExe();
  std::istringstream in(ReadFile("/proc/self/maps"));
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.size() < self.size() || line.compare(line.size() - self.size(), self.size(), self) != 0) continue;
    uint64_t start, end, offset;
    char perms[5];
    ASSERT_EQ(sscanf(line.c_str(), "%lx-%lx %4s %lx", &start, &end, perms, &offset), 4);
    auto vaddr = (*elf)->FileOffsetToVaddr(offset);
    ASSERT_TRUE(vaddr.has_value()) << line;
    EXPECT_EQ(start - *vaddr, MainBias()) << line;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(ElfFileTest, LibcSymbolsBuildIdAndFdes) {
  std::string libc = LibcPath();
  auto elf = ElfFile::Open(libc);
  ASSERT_TRUE(elf.ok()) << elf.status();
  EXPECT_EQ((*elf)->BuildIdHex(), ReadelfBuildId(libc));
  auto table = SymbolTable::Build(**elf);
  ASSERT_TRUE(table.ok());
  bool found_malloc = false;
  for (const auto& f : table->functions()) found_malloc |= f.name == "malloc";
  EXPECT_TRUE(found_malloc);
  EXPECT_FALSE((*elf)->PltRanges().empty());
  std::vector<AddressRange> fdes = FdeRanges(**elf);
  EXPECT_GT(fdes.size(), 1000u);
  for (size_t i = 1; i < fdes.size(); ++i) ASSERT_LT(fdes[i - 1].start, fdes[i].start);
  // Every FDE lies inside an executable segment.
  for (const AddressRange& r : fdes) {
    bool inside = false;
    for (const LoadSegment& s : (*elf)->load_segments()) {
      inside |= s.executable() && r.start >= s.vaddr && r.end <= s.vaddr + s.memsz;
    }
    ASSERT_TRUE(inside) << std::hex << r.start;
  }
}

// An .eh_frame_hdr whose every entry names the same FDE (a corrupt or hostile file): each FDE
// is still visited once, from a walk of .eh_frame, not that one FDE once per entry.
TEST(ElfFileTest, AHeaderNamingOneFdeEverywhereFallsBackToTheWalk) {
  std::ifstream in(LibcPath(), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  auto count_fdes = [](const ElfFile& elf, std::set<uint64_t>* starts) {
    CfiWalkStats stats;
    EXPECT_TRUE(ForEachFde(elf, CfiSectionKind::kEhFrame,
                           [&](const Cie&, const Fde& fde) { starts->insert(fde.pc_start); },
                           &stats).ok());
    return stats.fdes;
  };
  std::set<uint64_t> original_starts;
  uint64_t original_fdes = 0;
  uint64_t hdr_offset = 0;
  {
    auto elf = ElfFile::FromBytes(bytes);
    ASSERT_TRUE(elf.ok());
    original_fdes = count_fdes(**elf, &original_starts);
    const Section* hdr = (*elf)->FindSection(".eh_frame_hdr");
    ASSERT_NE(hdr, nullptr);
    // version 1, sdata4/udata4 count, datarel sdata4 table: 12 header bytes, 8 per entry.
    ASSERT_EQ(static_cast<uint8_t>(bytes[hdr->offset + 3]), 0x3b);
    hdr_offset = hdr->offset;
  }
  ASSERT_GT(original_fdes, 1000u);
  uint32_t count;
  std::memcpy(&count, &bytes[hdr_offset + 8], 4);
  ASSERT_EQ(count, original_fdes);
  for (uint32_t i = 1; i < count; ++i) {  // every entry's FDE pointer = the first one's
    std::memcpy(&bytes[hdr_offset + 12 + 8 * i + 4], &bytes[hdr_offset + 12 + 4], 4);
  }
  auto patched = ElfFile::FromBytes(std::move(bytes));
  ASSERT_TRUE(patched.ok());
  std::set<uint64_t> starts;
  EXPECT_EQ(count_fdes(**patched, &starts), original_fdes);
  EXPECT_EQ(starts, original_starts);
}

// PLT stub names agree with objdump's "<name@plt>" labels.
TEST(ElfFileTest, PltEntriesMatchObjdump) {
  STRATA_SKIP_UNDER_QEMU_USER();
  std::string self = SelfExe();
  auto elf = ElfFile::Open(self);
  ASSERT_TRUE(elf.ok());
  auto plt = (*elf)->ReadPltEntries();
  ASSERT_TRUE(plt.ok()) << plt.status();
  std::map<uint64_t, std::string> ours;
  for (const PltEntry& e : *plt) {
    if (!e.target.empty()) ours[e.start] = e.target;
  }
  std::istringstream in(RunCommand("objdump -d -j .plt -j .plt.sec -j .plt.got '" + self + "' 2>/dev/null"));
  std::string line;
  int compared = 0;
  while (std::getline(in, line)) {
    // "0000000000012340 <malloc@plt>:"
    uint64_t addr;
    char name[512];
    if (sscanf(line.c_str(), "%lx <%511[^>]>:", &addr, name) != 2) continue;
    std::string n = name;
    size_t at = n.find("@plt");
    if (at == std::string::npos || at + 4 != n.size()) continue;
    n = n.substr(0, at);
    ASSERT_TRUE(ours.count(addr)) << std::hex << addr << " " << n;
    EXPECT_EQ(ours[addr], Demangle(n)) << std::hex << addr;
    ++compared;
  }
  EXPECT_GT(compared, 10);
  auto table = SymbolTable::Build(**elf);
  ASSERT_TRUE(table.ok());
  const SymbolTable::Function* f = table->Lookup(ours.begin()->first + 2);
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->is_plt());
  EXPECT_EQ(f->name, ours.begin()->second + "@plt");
}

TEST(ElfFileTest, StrippedModuleFallsBackToFdeRanges) {
  STRATA_SKIP_UNDER_QEMU_USER();
  std::string dir = ::testing::TempDir();
  std::string stripped = dir + "/stripped_self";
  std::string self = SelfExe();
  ASSERT_EQ(system(("strip -o '" + stripped + "' '" + self + "'").c_str()), 0);
  auto elf = ElfFile::Open(stripped);
  ASSERT_TRUE(elf.ok()) << elf.status();
  auto table = SymbolTable::Build(**elf);
  ASSERT_TRUE(table.ok());
  uint64_t marker = reinterpret_cast<uint64_t>(&StrataElfTestMarker) - MainBias();
  const SymbolTable::Function* f = table->Lookup(marker + 1);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->start, marker);
  EXPECT_EQ(f->origin, SymbolTable::Origin::kFde);
  EXPECT_TRUE(f->name.empty());
  unlink(stripped.c_str());
}

// A symbol whose size wraps past 2^64 (a corrupt file) is clamped, not taken for a symbol of
// unknown size (end == start) that would claim every address above it.
TEST(SymbolTableTest, WrappingSymbolSizeIsClamped) {
  std::vector<FunctionSymbol> symbols = {
      {0x1000, 0x100, "low", true, false},
      {0x9595959595959595ull, 0x9595959595959595ull, "wraps", true, false}};
  std::vector<PltEntry> plt = {{0xfffffffffffff000ull, 0x2000, "stub"}};
  SymbolTable table = SymbolTable::FromFunctions(std::move(symbols), {}, std::move(plt));
  for (const SymbolTable::Function& f : table.functions()) {
    EXPECT_GT(f.end, f.start) << f.name;
  }
  const SymbolTable::Function* f = table.Lookup(0x9595959595959595ull + 1);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->name, "wraps");
  EXPECT_EQ(table.Lookup(0x1100), nullptr);
}

// glibc's clone3: the child's half (thread_start) has an FDE of its own inside __clone3's
// symbol. That FDE must not hide the name; FDEs outside every symbol still count.
TEST(SymbolTableTest, FdeInsideASizedSymbolDoesNotShadowIt) {
  std::vector<FunctionSymbol> symbols = {{0x1098c0, 0x47, "__clone3", false, false},
                                         {0x2000, 0, "unsized", true, false}};
  std::vector<AddressRange> fdes = {{0x1098c0, 0x1098d7}, {0x1098e1, 0x1098f6},
                                    {0x1098f6, 0x109907}, {0x109910, 0x109994},
                                    {0x2010, 0x2020}};
  SymbolTable table = SymbolTable::FromFunctions(std::move(symbols), std::move(fdes), {});
  for (uint64_t pc : {0x1098c0u, 0x1098e1u, 0x1098ebu, 0x109906u}) {
    const SymbolTable::Function* f = table.Lookup(pc);
    ASSERT_NE(f, nullptr) << pc;
    EXPECT_EQ(f->name, "__clone3") << pc;
  }
  const SymbolTable::Function* f = table.Lookup(0x109920);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->origin, SymbolTable::Origin::kFde);
  EXPECT_EQ(f->start, 0x109910u);
  f = table.Lookup(0x2018);  // an unsized symbol covers nothing
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->origin, SymbolTable::Origin::kFde);
}

void ExerciseEverything(const ElfFile& elf) {
  (void)elf.BuildIdHex();
  (void)elf.ReadFunctionSymbols();
  (void)elf.ReadPltEntries();
  (void)FdeRanges(elf);
  (void)SymbolTable::Build(elf);
  for (const Section& s : elf.sections()) (void)elf.SectionData(s);
  for (const LoadSegment& s : elf.load_segments()) {
    (void)elf.ReadAt(s.vaddr, 64);
    (void)elf.FileOffsetToVaddr(s.offset);
  }
}

TEST(ElfFileTest, TruncatedFilesGiveErrorsNotCrashes) {
  std::string bytes = ReadFile(LibcPath());
  ASSERT_GT(bytes.size(), 100000u);
  EXPECT_FALSE(ElfFile::FromBytes("").ok());
  EXPECT_FALSE(ElfFile::FromBytes(bytes.substr(0, 63)).ok());
  std::string bad_magic = bytes;
  bad_magic[1] = 'X';
  EXPECT_FALSE(ElfFile::FromBytes(bad_magic).ok());
  std::string elf32 = bytes;
  elf32[4] = 1;
  EXPECT_FALSE(ElfFile::FromBytes(elf32).ok());
  // Section headers sit at the end of the file: any truncation loses them.
  for (size_t len : {size_t{64}, size_t{100}, size_t{4096}, bytes.size() / 2, bytes.size() - 1}) {
    auto elf = ElfFile::FromBytes(bytes.substr(0, len));
    EXPECT_FALSE(elf.ok()) << len;
  }
  // Through the file path as well.
  std::string path = ::testing::TempDir() + "/truncated_libc";
  {
    std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  }
  EXPECT_FALSE(ElfFile::Open(path).ok());
  unlink(path.c_str());
  EXPECT_FALSE(ElfFile::Open("/nonexistent/file").ok());
}

// A FIFO where a module was (a local user can put one in a target's root): an error at once,
// not an open waiting for a writer.
TEST(ElfFileTest, AFifoIsRefusedWithoutWaiting) {
  strata::testing::TempDir dir("strata_elf_fifo");
  const std::string path = dir.File("libfifo.so");
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  auto elf = ElfFile::Open(path);
  EXPECT_EQ(elf.status().code(), absl::StatusCode::kInvalidArgument) << elf.status();
}

TEST(ElfFileTest, SectionsPointingOutsideTheFileAreErrors) {
  std::string bytes = ReadFile(LibcPath());
  auto good = ElfFile::FromBytes(bytes);
  ASSERT_TRUE(good.ok());
  const Section* eh = (*good)->FindSection(".eh_frame");
  ASSERT_NE(eh, nullptr);
  // Find .eh_frame's header and make its size huge.
  uint64_t shoff;
  std::memcpy(&shoff, bytes.data() + 0x28, 8);
  size_t index = eh - (*good)->sections().data();
  uint64_t huge = uint64_t{1} << 40;
  std::memcpy(bytes.data() + shoff + index * 64 + 32, &huge, 8);
  auto bad = ElfFile::FromBytes(bytes);
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE((*bad)->SectionData(*(*bad)->FindSection(".eh_frame")).ok());
  EXPECT_TRUE(FdeRanges(**bad).empty());
}

TEST(ElfFileTest, CorruptedBytesNeverCrash) {
  std::string original = ReadFile("/proc/self/exe");
  auto parsed = ElfFile::FromBytes(original);
  ASSERT_TRUE(parsed.ok());
  // Corrupt the regions the parser reads: headers, symbol tables, CFI, relocations.
  std::vector<std::pair<uint64_t, uint64_t>> regions = {{0, 64}};
  for (const Section& s : (*parsed)->sections()) {
    if (s.name == ".eh_frame" || s.name == ".eh_frame_hdr" || s.name == ".dynsym" ||
        s.name == ".rela.plt" || s.name == ".symtab" || s.name == ".note.gnu.build-id") {
      regions.push_back({s.offset, s.size});
    }
  }
  uint64_t shoff;
  std::memcpy(&shoff, original.data() + 0x28, 8);
  regions.push_back({shoff, original.size() - shoff});
  std::mt19937_64 rng(42);
  for (int iter = 0; iter < strata::testing::Trials(150); ++iter) {
    std::string bytes = original;
    for (int k = 0; k < 24; ++k) {
      auto [off, size] = regions[rng() % regions.size()];
      if (size == 0) continue;
      size_t pos = off + rng() % size;
      if (pos < bytes.size()) bytes[pos] = static_cast<char>(rng());
    }
    auto elf = ElfFile::FromBytes(std::move(bytes));
    if (elf.ok()) ExerciseEverything(**elf);
  }
}

// A string table of one empty name and one name of 1 MiB, at offset 1.
std::string OneLongString(char c) { return std::string(1, '\0') + std::string(1 << 20, c) + '\0'; }

// Files no linker writes, where work per header or per symbol would multiply one string or
// one table by the count: each must cost about what its bytes do.
TEST(ElfFileTest, SectionNamesAreViewsNotCopiesPerHeader) {
  testing::ElfBuilder b;
  const uint32_t names = b.AddSection(SHT_STRTAB, OneLongString('n'));
  b.SetSectionNames(names);
  b.AddAliases(names, 60000);  // every header named at offset 0 ... of 1 MiB
  std::string image = b.Build();
  // Point every header's name at the 1 MiB string (the aliases repeat section 1's header).
  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof(eh));
  for (size_t i = 1; i < eh.e_shnum; ++i) {
    const uint32_t one = 1;
    std::memcpy(image.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), &one, sizeof(one));
  }
  auto elf = ElfFile::FromBytes(std::move(image));
  ASSERT_TRUE(elf.ok()) << elf.status();
  ASSERT_EQ((*elf)->sections().size(), 60002u);
  for (const Section& s : (*elf)->sections()) {
    if (&s == &(*elf)->sections()[0]) continue;
    ASSERT_EQ(s.name.size(), size_t{1} << 20);
    ASSERT_EQ(s.name.data(), (*elf)->sections()[1].name.data());
  }
}

TEST(ElfFileTest, SymbolsAllNamingOneLongStringAreRefused) {
  testing::ElfBuilder b;
  const uint32_t strings = b.AddSection(SHT_STRTAB, OneLongString('f'));
  std::string symbols = testing::SymbolBytes(0, STT_NOTYPE, 0, 0);
  for (int i = 0; i < 100000; ++i) {
    symbols += testing::SymbolBytes(1, STT_FUNC, 0x1000 + 16 * i, 16);
  }
  b.AddSection(SHT_SYMTAB, symbols, strings);
  auto elf = ElfFile::FromBytes(b.Build());
  ASSERT_TRUE(elf.ok()) << elf.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<FunctionSymbol>> read = (*elf)->ReadFunctionSymbols();
  EXPECT_TRUE(absl::IsResourceExhausted(read.status())) << read.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // 100 GB of names before
  // A few symbols naming it are a real (if odd) table.
  testing::ElfBuilder few;
  const uint32_t few_strings = few.AddSection(SHT_STRTAB, OneLongString('f'));
  symbols = testing::SymbolBytes(0, STT_NOTYPE, 0, 0);
  for (int i = 0; i < 3; ++i) symbols += testing::SymbolBytes(1, STT_FUNC, 0x1000 + 16 * i, 16);
  few.AddSection(SHT_SYMTAB, symbols, few_strings);
  elf = ElfFile::FromBytes(few.Build());
  ASSERT_TRUE(elf.ok()) << elf.status();
  read = (*elf)->ReadFunctionSymbols();
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), 3u);
}

TEST(ElfFileTest, HeadersAliasingOneSymbolTableReadItOnce) {
  testing::ElfBuilder b;
  std::string names(1, '\0'), symbols = testing::SymbolBytes(0, STT_NOTYPE, 0, 0);
  for (int i = 0; i < 1000; ++i) {
    symbols += testing::SymbolBytes(static_cast<uint32_t>(names.size()), STT_FUNC,
                                    0x1000 + 16 * i, 16);
    names += absl::StrCat("f", i, std::string(1, '\0'));
  }
  const uint32_t strings = b.AddSection(SHT_STRTAB, names);
  const uint32_t symtab = b.AddSection(SHT_SYMTAB, symbols, strings);
  b.AddAliases(symtab, 5000);
  auto elf = ElfFile::FromBytes(b.Build());
  ASSERT_TRUE(elf.ok()) << elf.status();
  EXPECT_EQ((*elf)->SymbolTableSections().size(), 1u);
  absl::StatusOr<std::vector<FunctionSymbol>> read = (*elf)->ReadFunctionSymbols();
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), 1000u);  // 5,001,000 before
}

TEST(ByteReaderTest, LebAndBounds) {
  ByteReader r(std::string_view("\xe5\x8e\x26\x7f\x80", 5), false);
  EXPECT_EQ(r.Uleb128(), 624485u);
  EXPECT_EQ(r.Sleb128(), -1);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.Uleb128(), 0u);  // 0x80 continues past the end
  EXPECT_FALSE(r.ok());
  ByteReader be(std::string_view("\x01\x02\x03\x04", 4), true);
  EXPECT_EQ(be.U32(), 0x01020304u);
  EXPECT_EQ(be.U8(), 0u);
  EXPECT_FALSE(be.ok());
  std::string ff(11, '\xff');
  ByteReader overlong(ff, false);
  overlong.Uleb128();
  EXPECT_FALSE(overlong.ok());
}

void CheckMipsFixture(const char* path, bool big_endian) {
  const std::string objdump =
      big_endian ? "mips64-linux-gnuabi64-objdump" : "mips64el-linux-gnuabi64-objdump";
  auto elf = ElfFile::Open(path);
  ASSERT_TRUE(elf.ok()) << elf.status();
  EXPECT_EQ((*elf)->machine(), kMachineMips);
  EXPECT_EQ((*elf)->big_endian(), big_endian);
  EXPECT_EQ((*elf)->BuildIdHex(), ReadelfBuildId(path));
  auto table = SymbolTable::Build(**elf);
  ASSERT_TRUE(table.ok());
  std::map<std::string, uint64_t> starts;
  for (const auto& f : table->functions()) starts[std::string(f.name)] = f.start;
  ASSERT_TRUE(starts.count("fixture_leaf"));
  ASSERT_TRUE(starts.count("fixture_caller"));
  // Symbol addresses agree with nm; FDEs (eh_frame, big/little endian) start at functions.
  std::string nm = RunCommand(std::string("nm '") + path + "' | grep ' fixture_leaf$'");
  EXPECT_EQ(std::stoull(nm, nullptr, 16), starts["fixture_leaf"]);
  std::vector<AddressRange> fdes = FdeRanges(**elf);
  ASSERT_GE(fdes.size(), 3u);
  bool leaf_fde = false;
  for (const AddressRange& r : fdes) leaf_fde |= r.start == starts["fixture_leaf"];
  EXPECT_TRUE(leaf_fde);
  // First instruction word, in the file's byte order, equals objdump's.
  std::string dis = RunCommand(objdump + " -d '" + path + "' | grep -A1 '<fixture_leaf>:' | tail -1");
  unsigned word = 0;
  ASSERT_EQ(sscanf(dis.c_str(), " %*x: %x", &word), 1) << dis;
  EXPECT_EQ((*elf)->ReadU32At(starts["fixture_leaf"]).value_or(0), word);
}

TEST(ElfFileTest, Mips64BigEndianFixture) {
#ifdef STRATA_MIPS64_FIXTURE
  CheckMipsFixture(STRATA_MIPS64_FIXTURE, true);
#else
  GTEST_SKIP() << "mips64-linux-gnuabi64-gcc not installed";
#endif
}

TEST(ElfFileTest, Mips64LittleEndianFixture) {
#ifdef STRATA_MIPS64EL_FIXTURE
  CheckMipsFixture(STRATA_MIPS64EL_FIXTURE, false);
#else
  GTEST_SKIP() << "mips64el-linux-gnuabi64-gcc not installed";
#endif
}

}  // namespace
}  // namespace strata::elf
