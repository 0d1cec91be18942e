// The symbolizer and the upload store on real debug files: this test binary's own, split off
// with objcopy --only-keep-debug (what Debian's dh_strip does for -dbgsym packages).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/elf/debug_file.h"
#include "common/elf/elf_file.h"
#include "common/elf/go_pclntab.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/symbolize/debuginfo_store.h"
#include "server/symbolize/symbolizer.h"

extern "C" __attribute__((noinline, used)) int StrataSymbolizeTestMarker(int x) { return x * 3; }

namespace strata::server::symbolize {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string SelfPath() { return fs::read_symlink("/proc/self/exe").string(); }

std::string SelfBuildId() {
  auto elf = elf::ElfFile::Open(SelfPath());
  return elf.ok() ? (*elf)->BuildIdHex() : "";
}

// The marker's ELF vaddr, from the unstripped test binary's own symbol table.
uint64_t MarkerOffset() {
  auto elf = elf::ElfFile::Open(SelfPath());
  if (!elf.ok()) return 0;
  auto symbols = (*elf)->ReadFunctionSymbols();
  if (!symbols.ok()) return 0;
  for (const auto& s : *symbols) {
    if (s.name == "StrataSymbolizeTestMarker") return s.start;
  }
  return 0;
}

// Writes this binary's debug file (symbols and DWARF, no code) to `out`.
void SplitDebugFile(const std::string& out) {
  fs::create_directories(fs::path(out).parent_path());
  const std::string command =
      absl::StrCat("objcopy --only-keep-debug '", SelfPath(), "' '", out, "'");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

class SymbolizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    build_id_ = SelfBuildId();
    offset_ = MarkerOffset();
    ASSERT_FALSE(build_id_.empty()) << "the test binary has no build ID";
    ASSERT_NE(offset_, 0u);
  }
  testing::TempDir dir_{"strata_symbolize_test"};
  std::string build_id_;
  uint64_t offset_ = 0;
};

TEST_F(SymbolizeTest, NamesFromALocalDebugDirectoryByBuildId) {
  const std::string debug_dir = dir_.File("debug");
  SplitDebugFile(elf::BuildIdDebugPath(debug_dir, build_id_));
  Symbolizer symbolizer({.debug_dirs = {dir_.File("empty"), debug_dir}}, nullptr);
  const uint64_t generation = symbolizer.generation();
  // Any address inside the function names it; the start is what agents send.
  EXPECT_EQ(symbolizer.FunctionName(build_id_, offset_), "StrataSymbolizeTestMarker");
  EXPECT_EQ(symbolizer.FunctionName(build_id_, offset_ + 1), "StrataSymbolizeTestMarker");
  EXPECT_GT(symbolizer.generation(), generation);
  ASSERT_EQ(symbolizer.Loaded().size(), 1u);
  EXPECT_EQ(symbolizer.Loaded()[0].source, debug_dir);
  EXPECT_TRUE(symbolizer.Loaded()[0].has_dwarf);
  const SymbolizerStats stats = symbolizer.stats();
  EXPECT_EQ(stats.files_loaded, 1u);  // read once, then from memory
  EXPECT_EQ(stats.lookups, 2u);
  EXPECT_EQ(stats.named, 2u);
  // Another module's build ID: not found, remembered as missing, no name.
  EXPECT_EQ(symbolizer.FunctionName("00112233445566778899aabbccddeeff00112233", 0x1000),
            std::nullopt);
  EXPECT_THAT(symbolizer.Missing(), ::testing::ElementsAre("00112233445566778899aabbccddeeff00112233"));
  // Not hex: refused without a lookup.
  EXPECT_EQ(symbolizer.FunctionName("../../etc/passwd", 0), std::nullopt);
}

TEST_F(SymbolizeTest, ADebugFileOfAnotherBuildIdIsIgnored) {
  const std::string debug_dir = dir_.File("debug");
  // This binary's debug file placed under someone else's build ID.
  const std::string other = "aa" + std::string(build_id_.size() - 2, 'b');
  SplitDebugFile(elf::BuildIdDebugPath(debug_dir, other));
  Symbolizer symbolizer({.debug_dirs = {debug_dir}}, nullptr);
  EXPECT_EQ(symbolizer.FunctionName(other, offset_), std::nullopt);
  EXPECT_TRUE(symbolizer.Loaded().empty());
}

TEST_F(SymbolizeTest, AnUploadNamesWhatWasMissingAtOnce) {
  auto store = DebugInfoStore::Open(dir_.File("uploads"), 1 << 30);
  ASSERT_TRUE(store.ok()) << store.status();
  Symbolizer symbolizer({.debug_dirs = {}, .retry_after = absl::Hours(1)}, store->get());
  EXPECT_EQ(symbolizer.FunctionName(build_id_, offset_), std::nullopt);
  EXPECT_EQ(symbolizer.Missing().size(), 1u);

  auto temporary = (*store)->NewTemporary();
  ASSERT_TRUE(temporary.ok());
  SplitDebugFile(*temporary);
  auto stored = (*store)->Commit(*temporary, "self.debug", build_id_, 1234);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_FALSE(stored->replaced);
  EXPECT_EQ(stored->info.build_id, build_id_);
  EXPECT_TRUE(stored->info.has_dwarf);
  EXPECT_GT(stored->info.functions, 10u);
  // Missing build IDs are retried only after an hour here: the upload's Invalidate is what
  // makes the next lookup find it.
  const uint64_t generation = symbolizer.generation();
  EXPECT_EQ(symbolizer.FunctionName(build_id_, offset_), std::nullopt);
  symbolizer.Invalidate(build_id_);
  EXPECT_GT(symbolizer.generation(), generation);
  EXPECT_EQ(symbolizer.FunctionName(build_id_, offset_), "StrataSymbolizeTestMarker");
  EXPECT_EQ(symbolizer.Loaded()[0].source, "upload");

  const std::vector<DebugFileInfo> listed = (*store)->List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].build_id, build_id_);
  EXPECT_EQ(listed[0].file_name, "self.debug");
  EXPECT_EQ(listed[0].uploaded_ms, 1234);
  EXPECT_EQ(listed[0].functions, stored->info.functions);

  // The same build ID again replaces it.
  auto again = (*store)->NewTemporary();
  ASSERT_TRUE(again.ok());
  SplitDebugFile(*again);
  auto replaced = (*store)->Commit(*again, "self.debug", "", 5678);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_TRUE(replaced->replaced);
  EXPECT_EQ((*store)->List().size(), 1u);
}

// strata-server backup and restore copy the uploads beside the store's backup.
TEST_F(SymbolizeTest, UploadsAreBackedUpOnceAndRestored) {
  EXPECT_EQ(*CopyDebugFiles(dir_.File("none"), dir_.File("backup")), 0u);
  auto store = DebugInfoStore::Open(dir_.File("uploads"), 1 << 30);
  ASSERT_TRUE(store.ok()) << store.status();
  auto temporary = (*store)->NewTemporary();
  ASSERT_TRUE(temporary.ok());
  SplitDebugFile(*temporary);
  ASSERT_TRUE((*store)->Commit(*temporary, "self.debug", build_id_, 1234).ok());

  EXPECT_EQ(*CopyDebugFiles(dir_.File("uploads"), dir_.File("backup")), 1u);
  EXPECT_EQ(*CopyDebugFiles(dir_.File("uploads"), dir_.File("backup")), 0u) << "copied again";
  // A new upload of the same build ID (new metadata) is copied again.
  auto again = (*store)->NewTemporary();
  ASSERT_TRUE(again.ok());
  SplitDebugFile(*again);
  ASSERT_TRUE((*store)->Commit(*again, "self.debug", "", 5678).ok());
  EXPECT_EQ(*CopyDebugFiles(dir_.File("uploads"), dir_.File("backup")), 1u);

  EXPECT_EQ(*CopyDebugFiles(dir_.File("backup"), dir_.File("restored")), 1u);
  auto restored = DebugInfoStore::Open(dir_.File("restored"), 1 << 30);
  ASSERT_TRUE(restored.ok()) << restored.status();
  const std::vector<DebugFileInfo> listed = (*restored)->List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].build_id, build_id_);
  EXPECT_EQ(listed[0].uploaded_ms, 5678);
  EXPECT_EQ(listed[0].size_bytes, (*store)->List()[0].size_bytes);
  Symbolizer symbolizer({.debug_dirs = {}}, restored->get());
  EXPECT_EQ(symbolizer.FunctionName(build_id_, offset_), "StrataSymbolizeTestMarker");
}

TEST_F(SymbolizeTest, BadUploadsAreRefusedAndLeaveNothingBehind) {
  auto store = DebugInfoStore::Open(dir_.File("uploads"), 1 << 30);
  ASSERT_TRUE(store.ok()) << store.status();
  auto commit = [&](const std::string& bytes, std::string_view expected) {
    auto temporary = (*store)->NewTemporary();
    EXPECT_TRUE(temporary.ok());
    std::ofstream(*temporary, std::ios::binary) << bytes;
    return (*store)->Commit(*temporary, "bad", expected, 1);
  };
  auto not_elf = commit("this is not an ELF file", "");
  EXPECT_EQ(not_elf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_elf.status().message(), HasSubstr("ELF"));
  auto truncated = commit(std::string("\x7f" "ELF\x02\x01\x01", 7), "");
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);

  // A real file, but the caller expected another build ID.
  auto temporary = (*store)->NewTemporary();
  ASSERT_TRUE(temporary.ok());
  SplitDebugFile(*temporary);
  const std::string other(build_id_.size(), 'a');
  auto mismatch = (*store)->Commit(*temporary, "self.debug", other, 1);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.status().message(), HasSubstr(build_id_));

  // A stripped file without symbols nor DWARF names nothing.
  const std::string stripped = dir_.File("stripped");
  ASSERT_EQ(std::system(absl::StrCat("objcopy --strip-all '", SelfPath(), "' '", stripped, "'")
                            .c_str()),
            0);
  auto no_symbols_tmp = (*store)->NewTemporary();
  ASSERT_TRUE(no_symbols_tmp.ok());
  fs::copy_file(stripped, *no_symbols_tmp, fs::copy_options::overwrite_existing);
  auto no_symbols = (*store)->Commit(*no_symbols_tmp, "stripped", "", 1);
  EXPECT_EQ(no_symbols.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_symbols.status().message(), HasSubstr("neither function symbols"));

  EXPECT_TRUE((*store)->List().empty());
  EXPECT_TRUE(fs::is_empty(dir_.File("uploads/tmp")));
  // Leftovers of an interrupted upload are removed when the store opens again.
  std::ofstream(dir_.File("uploads/tmp/upload-1-1")) << "partial";
  auto reopened = DebugInfoStore::Open(dir_.File("uploads"), 1 << 30);
  ASSERT_TRUE(reopened.ok());
  EXPECT_TRUE(fs::is_empty(dir_.File("uploads/tmp")));
}

#ifdef STRATA_GO_DIR
// A stripped Go binary (no .symtab, no DWARF) as a debug file: its .gopclntab names its
// functions and gives the inlined calls and lines at an address. Go binaries are known by
// their Go build ID when they have no GNU one.
TEST(SymbolizeGoTest, StrippedGoBinaryGivesNamesInlinedCallsAndLines) {
  const std::string binary = std::string(STRATA_GO_DIR) + "/pclntab_subject_amd64_stripped";
  auto elf = elf::ElfFile::Open(binary);
  ASSERT_TRUE(elf.ok());
  const std::string build_id = (*elf)->BuildIdHex();
  ASSERT_FALSE(build_id.empty()) << "no Go build ID";
  auto table = elf::GoPclntab::Find(**elf);
  ASSERT_TRUE(table.ok());
  // A pc of main.caller inside the call it inlined (main.inlinedLeaf).
  const elf::GoPclntab::Function* caller = nullptr;
  for (const auto& f : (*table)->functions()) {
    if (f.name == "main.caller") caller = &f;
  }
  ASSERT_NE(caller, nullptr);
  uint64_t inlined_pc = 0;
  for (uint64_t pc = caller->entry; pc < caller->end && inlined_pc == 0; ++pc) {
    if ((*table)->Symbolize(*caller, pc).size() == 2) inlined_pc = pc;
  }
  ASSERT_NE(inlined_pc, 0u);

  testing::TempDir dir("strata_symbolize_go");
  const std::string debug_dir = dir.File("debug");
  const std::string path = elf::BuildIdDebugPath(debug_dir, build_id);
  fs::create_directories(fs::path(path).parent_path());
  fs::copy_file(binary, path);
  Symbolizer symbolizer({.debug_dirs = {debug_dir}}, nullptr);
  EXPECT_EQ(symbolizer.FunctionName(build_id, caller->entry), "main.caller");
  const std::vector<SourceFrame> frames = symbolizer.SourceFrames(build_id, inlined_pc);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].function, "main.inlinedLeaf");
  EXPECT_TRUE(frames[0].inlined);
  EXPECT_THAT(frames[0].file, ::testing::EndsWith("subject/main.go"));
  EXPECT_EQ(frames[0].line, 23u);
  EXPECT_EQ(frames[1].function, "main.caller");
  EXPECT_FALSE(frames[1].inlined);
  EXPECT_EQ(frames[1].line, 29u);
}

// A Go binary with .symtab and DWARF, both of which name an assembly function with its ABI
// suffix: its lines name it as the runtime's table and the agent do, without the suffix.
TEST(SymbolizeGoTest, AssemblyFunctionsAreNamedWithoutTheirAbiSuffix) {
  const std::string binary = std::string(STRATA_GO_DIR) + "/pclntab_subject_amd64";
  auto elf = elf::ElfFile::Open(binary);
  ASSERT_TRUE(elf.ok());
  ASSERT_NE((*elf)->FindSection(".debug_info"), nullptr);
  auto symbols = (*elf)->ReadFunctionSymbols();
  ASSERT_TRUE(symbols.ok());
  uint64_t entry = 0;
  for (const elf::FunctionSymbol& f : *symbols) {
    if (f.name == "internal/bytealg.IndexByteString.abi0") entry = f.start;
  }
  ASSERT_NE(entry, 0u) << "no assembly function in the subject";

  testing::TempDir dir("strata_symbolize_go_abi");
  const std::string path = elf::BuildIdDebugPath(dir.File("debug"), (*elf)->BuildIdHex());
  fs::create_directories(fs::path(path).parent_path());
  fs::copy_file(binary, path);
  Symbolizer symbolizer({.debug_dirs = {dir.File("debug")}}, nullptr);
  const std::vector<SourceFrame> frames = symbolizer.SourceFrames((*elf)->BuildIdHex(), entry);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].function, "internal/bytealg.IndexByteString");
  EXPECT_GT(frames[0].line, 0u);
  EXPECT_EQ(symbolizer.FunctionName((*elf)->BuildIdHex(), entry),
            "internal/bytealg.IndexByteString");
}
#endif

}  // namespace
}  // namespace strata::server::symbolize
