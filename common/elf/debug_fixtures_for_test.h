// Test support for the debug-file tests (common/elf, agent/symbols): the fixtures that
// make_debug_fixtures.sh builds (STRATA_DEBUG_FIXTURES, see common/elf/CMakeLists.txt), a
// scratch directory to lay out target roots in, and the host's libc with its debug file.
// Header-only; tests only.
#ifndef STRATA_COMMON_ELF_DEBUG_FIXTURES_FOR_TEST_H_
#define STRATA_COMMON_ELF_DEBUG_FIXTURES_FOR_TEST_H_

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "common/testing/temp_dir.h"

#include "common/elf/debug_file.h"
#include "common/elf/elf_file.h"

namespace strata::elf::testing {

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes `bytes` to `path`, creating its directories.
inline bool WriteFile(const std::string& path, std::string_view bytes) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

// A target root for the tests: the project's temporary directory.
using TempDir = ::strata::testing::TempDir;

// The fixtures' directory, "" when they were not built (no xz or binutils).
inline std::string FixturesDir() {
#ifdef STRATA_DEBUG_FIXTURES
  return STRATA_DEBUG_FIXTURES;
#else
  return "";
#endif
}
inline std::string Fixture(std::string_view name) {
  return FixturesDir() + "/" + std::string(name);
}

// The fixtures' two functions.
inline constexpr std::string_view kLocalFunction = "strata_debug_fixture_local";
inline constexpr std::string_view kExportedFunction = "strata_debug_fixture_exported";

// Start of the function `name` in `elf`'s symbol tables, 0 when absent.
inline uint64_t FunctionStart(const ElfFile& elf, std::string_view name) {
  absl::StatusOr<std::vector<FunctionSymbol>> symbols = elf.ReadFunctionSymbols();
  if (!symbols.ok()) return 0;
  for (const FunctionSymbol& s : *symbols) {
    if (s.name == name) return s.start;
  }
  return 0;
}

// `bytes` (an ELF image) with `section`'s contents passed through `edit`.
template <typename Edit>
std::string EditSection(const std::string& bytes, std::string_view section, Edit edit) {
  absl::StatusOr<std::unique_ptr<ElfFile>> elf = ElfFile::FromBytes(bytes);
  if (!elf.ok()) return {};
  const Section* s = (*elf)->FindSection(section);
  if (s == nullptr || s->offset + s->size > bytes.size()) return {};
  std::string out = bytes;
  std::string data = out.substr(s->offset, s->size);
  edit(data);
  out.replace(s->offset, s->size, data.substr(0, s->size));
  return out;
}

// The host's libc.so.6: mapped into this process, or in a multiarch directory (an emulated
// static test binary maps none, but can still read the host's). "" when not found.
inline std::string SystemLibcPath() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    size_t slash = line.find('/');
    if (slash != std::string::npos && line.ends_with("/libc.so.6")) return line.substr(slash);
  }
  for (const char* p : {"/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                        "/lib/mips64el-linux-gnuabi64/libc.so.6",
                        "/usr/lib/mips64el-linux-gnuabi64/libc.so.6"}) {
    if (access(p, R_OK) == 0) return p;
  }
  return "";
}

// Why the host's libc debug file (libc6-dbg) cannot be used, "" when it can; `libc` receives
// the libc path.
inline std::string SystemLibcDebugFileMissing(std::string* libc) {
  *libc = SystemLibcPath();
  if (libc->empty()) return "no libc.so.6 found";
  absl::StatusOr<std::unique_ptr<ElfFile>> elf = ElfFile::Open(*libc);
  if (!elf.ok()) return std::string(elf.status().message());
  if ((*elf)->FindSection(".symtab") != nullptr) return *libc + " has its own .symtab";
  std::string debug = BuildIdDebugPath(kDebugDir, (*elf)->BuildIdHex());
  if (debug.empty()) return *libc + " has no build ID";
  if (access(debug.c_str(), R_OK) != 0) {
    return debug + " is absent (install libc6-dbg for " + *libc + ")";
  }
  return "";
}

}  // namespace strata::elf::testing

#endif  // STRATA_COMMON_ELF_DEBUG_FIXTURES_FOR_TEST_H_
