// SourceLines on workloads with known inlining (testdata/inline_workload.cc at -O2 -g, as DWARF 4
// and DWARF 5), checked against binutils' addr2line on every byte of their functions, and on a
// split debug file, stripped and non-ELF files and corrupted DWARF.
#include "server/symbolize/source_lines.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/elf/elf_file.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::server::symbolize {
namespace {

namespace fs = std::filesystem;
using ::testing::AnyOf;
using ::testing::HasSubstr;

struct Workload {
  const char* name;
  const char* path;
};

void PrintTo(const Workload& w, std::ostream* os) { *os << w.name; }

constexpr char kOuterName[] = "InlineWorkloadOuter";

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Hex(uint64_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Standard output of `command`; nullopt when it cannot run or exits non-zero.
std::optional<std::string> Run(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  if (pclose(pipe) != 0) return std::nullopt;
  return out;
}

std::vector<std::string> TextLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// 1-based numbers of the source lines containing `needle`.
std::set<uint32_t> LinesContaining(const std::vector<std::string>& source,
                                   const std::string& needle) {
  std::set<uint32_t> out;
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i].find(needle) != std::string::npos) out.insert(static_cast<uint32_t>(i + 1));
  }
  return out;
}

// One frame as addr2line prints it ("??" and line 0 for unknown become empty and 0).
struct Addr2lineFrame {
  std::string function;
  std::string file;
  uint32_t line = 0;
};

// `addr2line -a -i -f -C` on `addresses`, one run: the frames of each address.
std::map<uint64_t, std::vector<Addr2lineFrame>> Addr2line(const std::string& path,
                                                          const std::vector<uint64_t>& addresses) {
  std::string command = absl::StrCat(STRATA_TEST_ADDR2LINE, " -a -i -f -C -e '", path, "'");
  for (uint64_t a : addresses) absl::StrAppend(&command, " ", Hex(a));
  std::optional<std::string> out = Run(command);
  if (!out.has_value()) {
    ADD_FAILURE() << "failed: " << command.substr(0, 200);
    return {};
  }
  std::map<uint64_t, std::vector<Addr2lineFrame>> result;
  std::vector<Addr2lineFrame>* frames = nullptr;
  const std::vector<std::string> lines = TextLines(*out);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("0x", 0) == 0) {
      frames = &result[std::stoull(lines[i], nullptr, 16)];
      continue;
    }
    if (frames == nullptr || i + 1 >= lines.size()) break;
    Addr2lineFrame f;
    f.function = lines[i] == "??" ? "" : lines[i];
    std::string location = lines[++i];
    if (size_t d = location.find(" (discriminator"); d != std::string::npos) location.resize(d);
    const size_t colon = location.rfind(':');
    f.file = location.substr(0, colon);
    if (f.file == "??") f.file.clear();
    if (colon != std::string::npos) {
      const std::string number = location.substr(colon + 1);
      if (!number.empty() && number.find_first_not_of("0123456789") == std::string::npos) {
        f.line = static_cast<uint32_t>(std::stoul(number));
      }
    }
    frames->push_back(std::move(f));
  }
  return result;
}

std::string Render(const std::vector<Addr2lineFrame>& frames) {
  std::string out;
  for (const Addr2lineFrame& f : frames) {
    absl::StrAppend(&out, "\n    ", f.function.empty() ? "??" : f.function, " @ ",
                    f.file.empty() ? "??" : Basename(f.file), ":", f.line);
  }
  return out;
}

std::vector<Addr2lineFrame> AsAddr2line(const std::vector<SourceFrame>& frames) {
  std::vector<Addr2lineFrame> out;
  for (const SourceFrame& f : frames) out.push_back({f.function, f.file, f.line});
  return out;
}

std::optional<elf::FunctionSymbol> FindFunction(const std::string& path,
                                                const std::string& name_part) {
  auto elf = elf::ElfFile::Open(path);
  if (!elf.ok()) return std::nullopt;
  auto symbols = (*elf)->ReadFunctionSymbols();
  if (!symbols.ok()) return std::nullopt;
  for (const elf::FunctionSymbol& s : *symbols) {
    if (s.size > 0 && s.name.find(name_part) != std::string::npos) return s;
  }
  return std::nullopt;
}

// Writes a copy of `path` made by objcopy (`objcopy FLAGS IN OUT`) or strip (`-o OUT`).
void RunTool(const std::string& tool, const std::string& flags, const std::string& path,
             const std::string& out) {
  const bool strip = tool.find("strip") != std::string::npos;
  const std::string command =
      absl::StrCat(tool, " ", flags, " '", path, "' ", strip ? "-o " : "", "'", out, "'");
  ASSERT_TRUE(Run(command).has_value()) << command;
}

class SourceLinesTest : public ::testing::TestWithParam<Workload> {
 protected:
  void SetUp() override {
    path_ = GetParam().path;
    source_ = TextLines(ReadBytes(STRATA_INLINE_WORKLOAD_SOURCE));
    header_ = TextLines(ReadBytes(
        (fs::path(STRATA_INLINE_WORKLOAD_SOURCE).parent_path() / "inline_workload.h").string()));
    ASSERT_FALSE(source_.empty());
    ASSERT_FALSE(header_.empty());
    std::optional<elf::FunctionSymbol> outer = FindFunction(path_, kOuterName);
    std::optional<elf::FunctionSymbol> main = FindFunction(path_, "main");
    // gcc demangles a lambda as `Checksum(...)::{lambda(unsigned int)#1}::operator()`, clang as
    // `Checksum(...)::$_0::operator()` (deploy/sanitize.sh builds the workload with clang).
    std::optional<elf::FunctionSymbol> lambda = FindFunction(path_, "::operator()(");
    ASSERT_TRUE(outer.has_value() && main.has_value() && lambda.has_value()) << path_;
    ASSERT_EQ(main->name, "main");
    outer_ = *outer;
    main_ = *main;
    lambda_ = *lambda;
    // Checksum's own symbol, not its lambda's.
    auto elf = elf::ElfFile::Open(path_);
    ASSERT_TRUE(elf.ok());
    auto symbols = (*elf)->ReadFunctionSymbols();
    ASSERT_TRUE(symbols.ok());
    for (const elf::FunctionSymbol& s : *symbols) {
      if (s.size > 0 && s.name.find("Checksum(") != std::string::npos &&
          s.name.find("::operator()(") == std::string::npos) {
        checksum_ = s;
      }
    }
    ASSERT_GT(checksum_.size, 0u);
    absl::StatusOr<std::unique_ptr<SourceLines>> lines = SourceLines::Open(path_);
    ASSERT_TRUE(lines.ok()) << lines.status().ToString();
    lines_ = std::move(*lines);
  }

  // Every byte of the workload's functions.
  std::vector<uint64_t> Addresses() const {
    std::vector<uint64_t> out;
    for (const elf::FunctionSymbol* f : {&outer_, &main_, &checksum_, &lambda_}) {
      for (uint64_t a = f->start; a < f->start + f->size; ++a) out.push_back(a);
    }
    return out;
  }

  const std::string& SymbolAt(uint64_t address) const {
    for (const elf::FunctionSymbol* f : {&outer_, &checksum_, &lambda_}) {
      if (address >= f->start && address - f->start < f->size) return f->name;
    }
    return main_.name;
  }

  std::string path_;
  std::vector<std::string> source_;
  std::vector<std::string> header_;
  elf::FunctionSymbol outer_;
  elf::FunctionSymbol main_;
  elf::FunctionSymbol checksum_;  // in an anonymous namespace: no linkage name in DWARF
  elf::FunctionSymbol lambda_;    // its lambda's operator(), out of line
  std::unique_ptr<SourceLines> lines_;
};

TEST_P(SourceLinesTest, FramesMatchAddr2lineOnEveryByte) {
  const std::vector<uint64_t> addresses = Addresses();
  const std::map<uint64_t, std::vector<Addr2lineFrame>> expected = Addr2line(path_, addresses);
  ASSERT_EQ(expected.size(), addresses.size());
  // Names addr2line gives innermost frames anywhere.
  std::set<std::string> innermost_names;
  for (const auto& [address, frames] : expected) {
    if (!frames.empty()) innermost_names.insert(frames[0].function);
  }
  int mismatches = 0;
  int quirks = 0;
  int inlined = 0;
  for (uint64_t address : addresses) {
    const std::vector<SourceFrame> frames = lines_->Frames(address);
    std::vector<Addr2lineFrame> got = AsAddr2line(frames);
    std::vector<Addr2lineFrame> want = expected.at(address);
    for (auto* list : {&got, &want}) {
      for (Addr2lineFrame& f : *list) f.file = Basename(f.file);
    }
    // binutils names an inlined function that has no linkage name (here: those in an anonymous
    // namespace) by the ELF symbol containing the address, the first time it meets it, and by
    // its DW_AT_name after that. Accept that when addr2line uses the DWARF name elsewhere.
    if (!got.empty() && !want.empty() && got.size() > 1 && got[0].function != want[0].function &&
        want[0].function == SymbolAt(address) && innermost_names.count(got[0].function) > 0) {
      want[0].function = got[0].function;
      ++quirks;
    }
    const std::string got_text = Render(got);
    const std::string want_text = Render(want);
    if (got_text != want_text && ++mismatches <= 20) {
      ADD_FAILURE() << Hex(address) << ":\n  SourceLines:" << got_text << "\n  addr2line:"
                    << want_text;
    }
    for (size_t i = 0; i < frames.size(); ++i) {
      EXPECT_EQ(frames[i].inlined, i + 1 < frames.size()) << Hex(address) << " frame " << i;
    }
    if (frames.size() > 1) ++inlined;
  }
  EXPECT_EQ(mismatches, 0) << "of " << addresses.size() << " addresses";
  EXPECT_GT(inlined, 50) << "the workload's helpers were not inlined";
  std::printf("%zu addresses, %d in inlined code, %d named by addr2line's first-lookup quirk\n",
              addresses.size(), inlined, quirks);
}

TEST_P(SourceLinesTest, InlinedHelpersAppearWithTheirCallSites) {
  const std::set<uint32_t> leaf_calls = LinesContaining(source_, "HeaderLeaf(sink");
  const std::set<uint32_t> middle_calls = LinesContaining(source_, "Middle(sink");
  const std::set<uint32_t> upper_calls = LinesContaining(source_, "Upper(sink");
  ASSERT_FALSE(leaf_calls.empty() || middle_calls.empty() || upper_calls.empty());
  const uint32_t leaf_first = *LinesContaining(header_, "const unsigned h =").begin();
  const uint32_t leaf_last = *LinesContaining(header_, "return h ^").begin();

  int full_chains = 0;
  for (uint64_t address = outer_.start; address < outer_.start + outer_.size; ++address) {
    const std::vector<SourceFrame> frames = lines_->Frames(address);
    if (frames.size() != 4 || frames[0].function.find("HeaderLeaf") == std::string::npos) {
      continue;
    }
    SCOPED_TRACE(Hex(address));
    EXPECT_EQ(frames[0].function,
              "strata_inline_workload::HeaderLeaf(unsigned int volatile*, unsigned int)");
    EXPECT_EQ(Basename(frames[0].file), "inline_workload.h");
    EXPECT_GE(frames[0].line, leaf_first);
    EXPECT_LE(frames[0].line, leaf_last);
    // Anonymous namespace: gcc gives DW_AT_name only, clang a linkage name too.
    EXPECT_THAT(frames[1].function,
                AnyOf("Middle", "strata_inline_workload::(anonymous namespace)::Middle(unsigned "
                                "int volatile*, unsigned int)"));
    EXPECT_EQ(Basename(frames[1].file), "inline_workload.cc");
    EXPECT_EQ(leaf_calls.count(frames[1].line), 1u) << frames[1].line;
    EXPECT_THAT(frames[2].function,
                AnyOf("Upper", "strata_inline_workload::(anonymous namespace)::Upper(unsigned "
                               "int volatile*, unsigned int)"));
    EXPECT_EQ(middle_calls.count(frames[2].line), 1u) << frames[2].line;
    EXPECT_EQ(frames[3].function,
              "strata_inline_workload::InlineWorkloadOuter(unsigned int volatile*, unsigned int)");
    EXPECT_EQ(upper_calls.count(frames[3].line), 1u) << frames[3].line;
    EXPECT_TRUE(frames[0].inlined && frames[1].inlined && frames[2].inlined);
    // Declaration lines and linker names of every frame (LLVM sample profiles' keys).
    auto first = [](const std::vector<std::string>& text, const char* needle) {
      const std::set<uint32_t> lines = LinesContaining(text, needle);
      return lines.empty() ? 0u : *lines.begin();
    };
    EXPECT_EQ(frames[0].decl_line, first(header_, "inline unsigned HeaderLeaf("));
    EXPECT_EQ(frames[1].decl_line, first(source_, "inline unsigned Middle("));
    EXPECT_EQ(frames[2].decl_line, first(source_, "inline unsigned Upper("));
    EXPECT_EQ(frames[3].decl_line, first(source_, "unsigned InlineWorkloadOuter("));
    EXPECT_EQ(frames[0].linkage_name, "_ZN22strata_inline_workload10HeaderLeafEPVjj");
    EXPECT_THAT(frames[1].linkage_name,
                AnyOf("Middle", "_ZN22strata_inline_workload12_GLOBAL__N_16MiddleEPVjj"));
    EXPECT_EQ(frames[3].linkage_name, "_ZN22strata_inline_workload19InlineWorkloadOuterEPVjj");
    EXPECT_FALSE(frames[3].inlined);
    // Absolute: the unit's comp_dir joined with a relative name, if DWARF gave one.
    EXPECT_EQ(frames[3].file.front(), '/') << frames[3].file;
    ++full_chains;
  }
  EXPECT_GT(full_chains, 10) << "HeaderLeaf <- Middle <- Upper <- " << kOuterName
                             << " not found in " << path_;
}

// gcc gives these no DW_AT_linkage_name, only a bare DW_AT_name ("Checksum", "operator()"),
// and describes the lambda inside its closure type inside Checksum's DIE (clang gives both
// linkage names; the frames take the symbols' names either way).
TEST_P(SourceLinesTest, OutOfLineFunctionsWithoutLinkageNamesTakeTheirSymbolsName) {
  for (const elf::FunctionSymbol* f : {&checksum_, &lambda_}) {
    for (uint64_t address = f->start; address < f->start + f->size; ++address) {
      const std::vector<SourceFrame> frames = lines_->Frames(address);
      ASSERT_FALSE(frames.empty()) << Hex(address);
      EXPECT_EQ(frames.back().function, f->name) << Hex(address);
      EXPECT_FALSE(frames.back().inlined);
      EXPECT_EQ(Basename(frames.back().file), "inline_workload.cc") << Hex(address);
    }
  }
  EXPECT_THAT(lambda_.name, HasSubstr("Checksum("));
  const std::set<uint32_t> lambda_decl = LinesContaining(source_, "auto step = [sink]");
  ASSERT_EQ(lambda_decl.size(), 1u);
  EXPECT_EQ(lines_->FunctionDeclLine(lambda_.start), *lambda_decl.begin());
  EXPECT_EQ(lines_->Frames(lambda_.start).back().decl_line, *lambda_decl.begin());
}

TEST_P(SourceLinesTest, SplitDebugFileGivesTheSameFrames) {
  testing::TempDir dir("strata_source_lines");
  const std::string debug = dir.File("workload.debug");
  RunTool(STRATA_TEST_OBJCOPY, "--only-keep-debug", path_, debug);
  auto elf = elf::ElfFile::Open(debug);
  ASSERT_TRUE(elf.ok()) << elf.status().ToString();
  const elf::Section* text = (*elf)->FindSection(".text");
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(text->type, 8u) << ".text of a debug file is SHT_NOBITS";

  absl::StatusOr<std::unique_ptr<SourceLines>> split = SourceLines::Open(debug);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  int compared = 0;
  for (uint64_t address : Addresses()) {
    const std::vector<SourceFrame> want = lines_->Frames(address);
    const std::vector<SourceFrame> got = (*split)->Frames(address);
    ASSERT_EQ(got.size(), want.size()) << Hex(address);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].function, want[i].function) << Hex(address);
      EXPECT_EQ(got[i].file, want[i].file) << Hex(address);
      EXPECT_EQ(got[i].line, want[i].line) << Hex(address);
      EXPECT_EQ(got[i].inlined, want[i].inlined) << Hex(address);
    }
    EXPECT_EQ((*split)->FunctionDeclLine(address), lines_->FunctionDeclLine(address));
    compared += !got.empty();
  }
  EXPECT_GT(compared, 0);
}

TEST_P(SourceLinesTest, AddressesOutsideAnyUnitHaveNoFrames) {
  for (uint64_t address : {uint64_t{0}, uint64_t{1}, uint64_t{0xffffffff00000000},
                           ~uint64_t{0}}) {
    EXPECT_THAT(lines_->Frames(address), ::testing::IsEmpty()) << Hex(address);
    EXPECT_EQ(lines_->FunctionDeclLine(address), 0u) << Hex(address);
  }
  // The C runtime's startup code, linked in without DWARF (when addr2line agrees).
  int checked = 0;
  for (const char* name : {"_start", "_init", "_fini"}) {
    std::optional<elf::FunctionSymbol> f = FindFunction(path_, name);
    if (!f.has_value() || f->name != name) continue;
    const auto expected = Addr2line(path_, {f->start});
    if (expected.count(f->start) == 0 || expected.at(f->start).size() != 1 ||
        !expected.at(f->start)[0].file.empty()) {
      continue;
    }
    EXPECT_THAT(lines_->Frames(f->start), ::testing::IsEmpty()) << name;
    ++checked;
  }
  std::printf("%d startup functions without DWARF checked\n", checked);
}

TEST_P(SourceLinesTest, FunctionDeclLineIsTheOutOfLineFunctionsDeclaration) {
  const std::set<uint32_t> outer_decl =
      LinesContaining(source_, absl::StrCat("unsigned ", kOuterName, "("));
  const std::set<uint32_t> main_decl = LinesContaining(source_, "int main(");
  ASSERT_EQ(outer_decl.size(), 1u);
  ASSERT_EQ(main_decl.size(), 1u);
  int in_inlined_code = 0;
  for (uint64_t address = outer_.start; address < outer_.start + outer_.size; ++address) {
    EXPECT_EQ(lines_->FunctionDeclLine(address), *outer_decl.begin()) << Hex(address);
    in_inlined_code += lines_->Frames(address).size() > 1;
  }
  EXPECT_GT(in_inlined_code, 0);
  for (uint64_t address = main_.start; address < main_.start + main_.size; ++address) {
    EXPECT_EQ(lines_->FunctionDeclLine(address), *main_decl.begin()) << Hex(address);
  }
  const std::set<uint32_t> checksum_decl = LinesContaining(source_, "unsigned Checksum(");
  ASSERT_EQ(checksum_decl.size(), 1u);
  EXPECT_EQ(lines_->FunctionDeclLine(checksum_.start), *checksum_decl.begin());
}

TEST_P(SourceLinesTest, ConcurrentLookupsAgree) {
  const std::vector<uint64_t> addresses = Addresses();
  std::vector<std::vector<SourceFrame>> want;
  for (uint64_t a : addresses) want.push_back(lines_->Frames(a));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < addresses.size(); ++i) {
        const size_t k = (i * 7 + t * 13) % addresses.size();
        const std::vector<SourceFrame> got = lines_->Frames(addresses[k]);
        if (Render(AsAddr2line(got)) != Render(AsAddr2line(want[k]))) ++mismatches;
        (void)lines_->FunctionDeclLine(addresses[k]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Corrupted debug sections and truncated files: Open fails or lookups return whatever they
// find; nothing crashes or hangs (the test would die).
TEST_P(SourceLinesTest, CorruptDwarfGivesErrorsOrResultsNeverCrashes) {
  const std::string original = ReadBytes(path_);
  auto elf = elf::ElfFile::Open(path_);
  ASSERT_TRUE(elf.ok());
  std::vector<elf::Section> sections;
  for (const elf::Section& s : (*elf)->sections()) {
    if (s.name.rfind(".debug_", 0) == 0 && s.type != 8 && s.size > 0 &&
        s.offset + s.size <= original.size()) {
      sections.push_back(s);
    }
  }
  ASSERT_GE(sections.size(), 3u);
  testing::TempDir dir("strata_source_lines");
  const std::string corrupt = dir.File("corrupt");
  std::vector<uint64_t> probes;
  for (uint64_t a : Addresses()) {
    if (a % 3 == 0) probes.push_back(a);
  }
  std::mt19937_64 rng(20240611);
  int opened = 0, rejected = 0;
  auto check = [&](const std::string& bytes) {
    WriteBytes(corrupt, bytes);
    absl::StatusOr<std::unique_ptr<SourceLines>> lines = SourceLines::Open(corrupt);
    if (!lines.ok()) {
      EXPECT_FALSE(lines.status().message().empty());
      ++rejected;
      return;
    }
    ++opened;
    for (uint64_t a : probes) {
      (void)(*lines)->Frames(a);
      (void)(*lines)->FunctionDeclLine(a);
    }
  };
  for (const elf::Section& s : sections) {
    SCOPED_TRACE(s.name);
    for (int round = 0; round < 24; ++round) {
      std::string bytes = original;
      const int flips = 1 << (round % 7);  // 1 .. 64 bytes
      for (int i = 0; i < flips; ++i) {
        bytes[s.offset + rng() % s.size] = static_cast<char>(rng());
      }
      check(bytes);
    }
    std::string bytes = original;
    std::fill(bytes.begin() + s.offset, bytes.begin() + s.offset + s.size, '\0');
    check(bytes);
    std::fill(bytes.begin() + s.offset, bytes.begin() + s.offset + s.size, '\xff');
    check(bytes);
  }
  for (int round = 0; round < 16; ++round) {
    check(original.substr(0, rng() % original.size()));
  }
  std::printf("%d corrupt files opened, %d rejected\n", opened, rejected);
}

INSTANTIATE_TEST_SUITE_P(Dwarf, SourceLinesTest,
                         ::testing::Values(Workload{"Dwarf5", STRATA_INLINE_WORKLOAD_DWARF5},
                                           Workload{"Dwarf4", STRATA_INLINE_WORKLOAD_DWARF4}),
                         [](const ::testing::TestParamInfo<Workload>& info) {
                           return std::string(info.param.name);
                         });

TEST(SourceLinesOpenTest, WorkloadsUseTheDwarfVersionsTheirNamesSay) {
  // The first unit header's version field (bytes 4-5 of .debug_info, 32-bit DWARF).
  for (const auto& [path, version] : {std::pair{STRATA_INLINE_WORKLOAD_DWARF4, 4},
                                      std::pair{STRATA_INLINE_WORKLOAD_DWARF5, 5}}) {
    auto elf = elf::ElfFile::Open(path);
    ASSERT_TRUE(elf.ok());
    const elf::Section* info = (*elf)->FindSection(".debug_info");
    ASSERT_NE(info, nullptr);
    absl::StatusOr<std::string_view> data = (*elf)->SectionData(*info);
    ASSERT_TRUE(data.ok() && data->size() > 6);
    EXPECT_EQ(static_cast<uint8_t>((*data)[4]) | static_cast<uint8_t>((*data)[5]) << 8, version)
        << path;
  }
}

TEST(SourceLinesOpenTest, RejectsStrippedFiles) {
  testing::TempDir dir("strata_source_lines");
  for (const char* flags : {"--strip-all", "--strip-debug"}) {
    const std::string stripped = dir.File(absl::StrCat("stripped", flags));
    RunTool(STRATA_TEST_STRIP, flags, STRATA_INLINE_WORKLOAD_DWARF5, stripped);
    absl::StatusOr<std::unique_ptr<SourceLines>> lines = SourceLines::Open(stripped);
    ASSERT_FALSE(lines.ok()) << flags;
    EXPECT_EQ(lines.status().code(), absl::StatusCode::kInvalidArgument) << flags;
    EXPECT_THAT(lines.status().message(), HasSubstr(".debug_info")) << flags;
  }
}

TEST(SourceLinesOpenTest, RejectsFilesThatAreNotElf) {
  testing::TempDir dir("strata_source_lines");
  for (const std::string& bytes : {std::string("not an ELF file\n"), std::string()}) {
    const std::string path = dir.File("text");
    WriteBytes(path, bytes);
    absl::StatusOr<std::unique_ptr<SourceLines>> lines = SourceLines::Open(path);
    ASSERT_FALSE(lines.ok());
    EXPECT_EQ(lines.status().code(), absl::StatusCode::kInvalidArgument)
        << lines.status().ToString();
  }
}

TEST(SourceLinesOpenTest, MissingFileIsNotFound) {
  testing::TempDir dir("strata_source_lines");
  absl::StatusOr<std::unique_ptr<SourceLines>> lines = SourceLines::Open(dir.File("absent"));
  ASSERT_FALSE(lines.ok());
  EXPECT_EQ(lines.status().code(), absl::StatusCode::kNotFound) << lines.status().ToString();
}

}  // namespace
}  // namespace strata::server::symbolize
