// ModuleCache naming functions of stripped modules from MiniDebugInfo and separate debug
// files, read through a target root the way the agent reads /proc/PID/root. The fixtures
// (common/elf/make_debug_fixtures.sh) are built for the target architecture.
#include "agent/symbols/module_cache.h"

#include <string>

#include "common/elf/debug_file.h"
#include "common/elf/debug_fixtures_for_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::agent::symbols {
namespace {

using elf::testing::Fixture;
using elf::testing::kExportedFunction;
using elf::testing::kLocalFunction;
using elf::testing::ReadFile;
using elf::testing::TempDir;
using elf::testing::WriteFile;
using ::testing::HasSubstr;

constexpr char kLibPath[] = "/usr/lib/strata-test/libfixture.so";

std::string NameAt(const Module& module, uint64_t vaddr) {
  const elf::SymbolTable::Function* f = module.symbols.Lookup(vaddr);
  return f == nullptr ? std::string() : std::string(f->name);
}

uint64_t StartIn(const std::string& path, std::string_view name) {
  absl::StatusOr<std::unique_ptr<elf::ElfFile>> elf = elf::ElfFile::Open(path);
  return elf.ok() ? elf::testing::FunctionStart(**elf, name) : 0;
}

class ModuleCacheDebugTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (elf::testing::FixturesDir().empty()) {
      GTEST_SKIP() << "debug fixtures not built (needs xz, objcopy, strip and nm at configure time)";
    }
    local_ = StartIn(Fixture("full.so"), kLocalFunction);
    exported_ = StartIn(Fixture("full.so"), kExportedFunction);
    ASSERT_NE(local_, 0u);
    ASSERT_NE(exported_, 0u);
    absl::StatusOr<std::unique_ptr<elf::ElfFile>> full = elf::ElfFile::Open(Fixture("full.so"));
    ASSERT_TRUE(full.ok());
    build_id_debug_path_ = elf::BuildIdDebugPath(elf::kDebugDir, (*full)->BuildIdHex());
  }

  // Puts `fixture` at `path` in `root` and gets its module from a fresh cache, opened as
  // "<root><path>" (like /proc/PID/root/...) and known to the process as `path`.
  std::shared_ptr<const Module> Get(const TempDir& root, const std::string& fixture,
                                    const std::string& path = kLibPath) {
    EXPECT_TRUE(WriteFile(root.path() + path, ReadFile(Fixture(fixture))));
    cache_ = std::make_unique<ModuleCache>();
    absl::StatusOr<std::shared_ptr<const Module>> module = cache_->Get(root.path() + path, path, 0);
    EXPECT_TRUE(module.ok()) << module.status();
    return module.ok() ? *module : std::make_shared<const Module>();
  }

  uint64_t local_ = 0, exported_ = 0;
  std::string build_id_debug_path_;
  std::unique_ptr<ModuleCache> cache_;
};

TEST_F(ModuleCacheDebugTest, OwnSymtabComesFirst) {
  TempDir root;
  ASSERT_TRUE(WriteFile(root.path() + build_id_debug_path_, ReadFile(Fixture("stripped.debug"))));
  std::shared_ptr<const Module> m = Get(root, "full.so");
  EXPECT_EQ(m->symbols_source, "symtab");
  EXPECT_EQ(m->symbols_from, SymbolsSource::kSymtab);
  EXPECT_EQ(NameAt(*m, local_ + 1), kLocalFunction);
  EXPECT_EQ(cache_->symbols_sources().symtab, 1u);
}

TEST_F(ModuleCacheDebugTest, StrippedModuleWithoutDebugInfoHasDynsymOnly) {
  TempDir root;
  std::shared_ptr<const Module> m = Get(root, "stripped.so");
  EXPECT_EQ(m->symbols_source, "dynsym only");
  EXPECT_EQ(NameAt(*m, exported_), kExportedFunction);
  EXPECT_EQ(NameAt(*m, local_ + 1), "");
  EXPECT_TRUE(absl::IsNotFound(m->debug_status)) << m->debug_status;
  EXPECT_EQ(cache_->symbols_sources().dynsym_only, 1u);
}

// Two files of one build ID, the stripped one seen first (a stripped copy deployed beside
// the binary, another process's container image): the unstripped file's symbols replace the
// stripped one's module, for every file of the build ID from then on.
TEST_F(ModuleCacheDebugTest, AFileOfTheSameBuildIdWithSymbolsReplacesADynsymOnlyModule) {
  TempDir root;
  const std::string stripped_path = "/opt/copy/libfixture.so";
  ASSERT_TRUE(WriteFile(root.path() + stripped_path, ReadFile(Fixture("stripped.so"))));
  ASSERT_TRUE(WriteFile(root.path() + kLibPath, ReadFile(Fixture("full.so"))));
  ModuleCache cache;
  auto get = [&](const std::string& path) {
    absl::StatusOr<std::shared_ptr<const Module>> m = cache.Get(root.path() + path, path, 0);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *m : std::make_shared<const Module>();
  };
  std::shared_ptr<const Module> first = get(stripped_path);
  EXPECT_EQ(first->symbols_from, SymbolsSource::kDynsymOnly);
  EXPECT_EQ(NameAt(*first, local_ + 1), "");
  // Another stripped file of the build ID names nothing more: the module stays.
  const std::string second_copy = "/opt/copy2/libfixture.so";
  ASSERT_TRUE(WriteFile(root.path() + second_copy, ReadFile(Fixture("stripped.so"))));
  EXPECT_EQ(get(second_copy), first);
  std::shared_ptr<const Module> full = get(kLibPath);
  EXPECT_EQ(full->symbols_from, SymbolsSource::kSymtab);
  EXPECT_EQ(NameAt(*full, local_ + 1), kLocalFunction);
  EXPECT_EQ(cache.opens(), 3u);
  EXPECT_EQ(cache.size(), 1u);
  // From now on every file of the build ID, the stripped ones included, gets the named module,
  // without opening anything again.
  EXPECT_EQ(get(stripped_path), full);
  EXPECT_EQ(get(second_copy), full);
  const std::string third_copy = "/opt/copy3/libfixture.so";
  ASSERT_TRUE(WriteFile(root.path() + third_copy, ReadFile(Fixture("stripped.so"))));
  EXPECT_EQ(get(third_copy), full);
  EXPECT_EQ(cache.opens(), 3u);
}

// (a) Debian: a stripped library and its -dbgsym file under /usr/lib/debug/.build-id.
TEST_F(ModuleCacheDebugTest, NamesStaticFunctionFromBuildIdDebugFile) {
  TempDir root;
  const std::string stripped = ReadFile(Fixture("stripped.so"));
  ASSERT_TRUE(WriteFile(root.path() + build_id_debug_path_, ReadFile(Fixture("stripped.debug"))));
  std::shared_ptr<const Module> m = Get(root, "stripped.so");
  EXPECT_EQ(m->symbols_source, "debug file " + build_id_debug_path_);
  EXPECT_EQ(m->symbols_from, SymbolsSource::kDebugFile);
  EXPECT_EQ(NameAt(*m, local_ + 1), kLocalFunction);
  EXPECT_EQ(NameAt(*m, exported_), kExportedFunction);
  EXPECT_EQ(cache_->symbols_sources().debug_file, 1u);
  // The module keeps its own file (unwind rules); the debug file is not held.
  EXPECT_EQ(m->elf->image().size(), stripped.size());

  // Opened where the process's path is not a suffix: no root known, the agent's own
  // /usr/lib/debug has no such file.
  ModuleCache other;
  absl::StatusOr<std::shared_ptr<const Module>> elsewhere =
      other.Get(root.path() + kLibPath, "/somewhere/else.so", 0);
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_EQ((*elsewhere)->symbols_source, "dynsym only");
}

// (b) A module without build ID, its debug file found through .gnu_debuglink.
TEST_F(ModuleCacheDebugTest, NamesStaticFunctionFromDebugLinkWithoutBuildId) {
  TempDir root;
  const uint64_t local = StartIn(Fixture("nobid_full.so"), kLocalFunction);
  ASSERT_NE(local, 0u);
  ASSERT_TRUE(WriteFile(root.path() + "/opt/app/lib/.debug/nobid.so.debug",
                        ReadFile(Fixture("nobid.so.debug"))));
  std::shared_ptr<const Module> m = Get(root, "nobid.so", "/opt/app/lib/libnobid.so");
  EXPECT_TRUE(m->build_id_hex.empty());
  EXPECT_EQ(m->symbols_source, "debug file /opt/app/lib/.debug/nobid.so.debug");
  EXPECT_EQ(NameAt(*m, local + 1), kLocalFunction);
}

// (c) Debug files of other builds are not used.
TEST_F(ModuleCacheDebugTest, RejectsMismatchedDebugFiles) {
  {
    TempDir root;
    std::string other = elf::testing::EditSection(ReadFile(Fixture("stripped.debug")),
                                                  ".note.gnu.build-id",
                                                  [](std::string& d) { d.back() ^= 1; });
    ASSERT_TRUE(WriteFile(root.path() + build_id_debug_path_, other));
    std::shared_ptr<const Module> m = Get(root, "stripped.so");
    EXPECT_EQ(m->symbols_source, "dynsym only");
    EXPECT_EQ(NameAt(*m, local_ + 1), "");
    EXPECT_THAT(std::string(m->debug_status.message()), HasSubstr("build ID"));
  }
  {
    TempDir root;
    std::string debug = ReadFile(Fixture("nobid.so.debug"));
    debug.push_back('\0');  // still a valid ELF file, another CRC32
    ASSERT_TRUE(WriteFile(root.path() + "/opt/app/lib/.debug/nobid.so.debug", debug));
    std::shared_ptr<const Module> m = Get(root, "nobid.so", "/opt/app/lib/libnobid.so");
    EXPECT_EQ(m->symbols_source, "dynsym only");
    EXPECT_THAT(std::string(m->debug_status.message()), HasSubstr("CRC32"));
  }
}

// (d) Fedora: MiniDebugInfo, which comes before a separate debug file.
TEST_F(ModuleCacheDebugTest, NamesStaticFunctionFromMiniDebugInfo) {
  TempDir root;
  ASSERT_TRUE(WriteFile(root.path() + build_id_debug_path_, ReadFile(Fixture("stripped.debug"))));
  std::shared_ptr<const Module> m = Get(root, "mini.so");
  EXPECT_EQ(m->symbols_source, "minidebuginfo");
  EXPECT_EQ(m->symbols_from, SymbolsSource::kMiniDebugInfo);
  EXPECT_EQ(NameAt(*m, local_ + 1), kLocalFunction);
  EXPECT_EQ(NameAt(*m, exported_), kExportedFunction);
  EXPECT_EQ(cache_->symbols_sources().minidebuginfo, 1u);
}

TEST_F(ModuleCacheDebugTest, CorruptMiniDebugInfoIsReportedAndFallsThrough) {
  const std::string corrupt =
      elf::testing::EditSection(ReadFile(Fixture("mini.so")), ".gnu_debugdata", [](std::string& d) {
        for (size_t i = d.size() / 3; i < d.size() / 2; ++i) d[i] ^= 0x33;
      });
  ASSERT_FALSE(corrupt.empty());
  TempDir root;
  ASSERT_TRUE(WriteFile(root.path() + kLibPath, corrupt));
  ModuleCache cache;
  absl::StatusOr<std::shared_ptr<const Module>> m = cache.Get(root.path() + kLibPath, kLibPath, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->symbols_source, "dynsym only");
  EXPECT_THAT(std::string((*m)->debug_status.message()), HasSubstr(".gnu_debugdata"));
  EXPECT_EQ(NameAt(**m, exported_), kExportedFunction);

  // With a debug file beside it, that one names the function.
  ASSERT_TRUE(WriteFile(root.path() + build_id_debug_path_, ReadFile(Fixture("stripped.debug"))));
  ModuleCache again;
  m = again.Get(root.path() + kLibPath, kLibPath, 0);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->symbols_source, "debug file " + build_id_debug_path_);
  EXPECT_EQ(NameAt(**m, local_ + 1), kLocalFunction);
}

// (e) The real system: Debian's stripped libc.so.6 and libc6-dbg's debug file.
TEST(ModuleCacheSystemTest, HostLibcFunctionsNamedFromDebugFile) {
  std::string libc;
  if (std::string missing = elf::testing::SystemLibcDebugFileMissing(&libc); !missing.empty()) {
    GTEST_SKIP() << missing;
  }
  ModuleCache cache;
  absl::StatusOr<std::shared_ptr<const Module>> m = cache.Get(libc, libc, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string debug_path = elf::BuildIdDebugPath(elf::kDebugDir, (*m)->build_id_hex);
  EXPECT_EQ((*m)->symbols_source, "debug file " + debug_path);
  EXPECT_EQ(cache.symbols_sources().debug_file, 1u);
  // Where the debug file's symbol table puts them (libc's own file has no local names).
  const uint64_t start_thread = StartIn(debug_path, "start_thread");
  uint64_t clone3 = StartIn(debug_path, "__clone3");
  if (clone3 == 0) clone3 = StartIn(debug_path, "clone3");
  ASSERT_NE(start_thread, 0u);
  ASSERT_NE(clone3, 0u);
  EXPECT_EQ(StartIn(libc, "start_thread"), 0u);
  EXPECT_EQ(NameAt(**m, start_thread + 16), "start_thread");
  EXPECT_THAT(NameAt(**m, clone3 + 8), ::testing::AnyOf("__clone3", "clone3"));
#if defined(__x86_64__)
  EXPECT_NE((*m)->rules, nullptr) << (*m)->rules_status;  // from libc.so.6 itself
#endif
}

#ifdef STRATA_GO_DIR
// Go executables: stripped (-ldflags=-s -w, no .symtab) or not, their Go functions are named
// from .gopclntab with the runtime's names, and they unwind with Go's rules.
TEST(ModuleCacheGoTest, StrippedGoBinaryNamedLikeUnstripped) {
  ModuleCache cache;
  const std::string dir = STRATA_GO_DIR;
  auto full = cache.Get(dir + "/pclntab_subject_amd64", "/bin/subject", 1);
  auto stripped = cache.Get(dir + "/pclntab_subject_amd64_stripped", "/bin/subject-s", 2);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(stripped.ok()) << stripped.status();
  EXPECT_EQ((*full)->symbols_from, SymbolsSource::kSymtab);
  EXPECT_EQ((*stripped)->symbols_from, SymbolsSource::kGoPclntab);
  EXPECT_EQ((*stripped)->symbols_source, "gopclntab");
  EXPECT_EQ(cache.symbols_sources().go_pclntab, 1u);
  EXPECT_NE((*full)->rules, nullptr) << (*full)->rules_status;
  EXPECT_NE((*stripped)->rules, nullptr) << (*stripped)->rules_status;
  size_t compared = 0;
  for (const elf::SymbolTable::Function& f : (*full)->symbols.functions()) {
    if (!f.name.starts_with("main.") && !f.name.starts_with("crypto/sha256.") &&
        !f.name.starts_with("runtime.")) {
      continue;
    }
    if (f.name == "runtime.text" || f.name == "runtime.etext") {  // markers, not functions
      continue;
    }
    // The same code at the same addresses in both builds.
    EXPECT_EQ(NameAt(**stripped, f.start), std::string(f.name)) << std::hex << f.start;
    EXPECT_FALSE(f.name.ends_with(".abi0")) << f.name;
    ++compared;
  }
  EXPECT_GT(compared, 500u);
}
#endif

}  // namespace
}  // namespace strata::agent::symbols
