// Function names for modules shipped without their own symbol table, found the ways Linux
// distributions ship them:
//  - MiniDebugInfo (Fedora and others): `.gnu_debugdata` holds an xz-compressed ELF image whose
//    .symtab lists the local functions (.dynsym already names the exported ones);
//  - separate debug files (Debian's -dbg / -dbgsym packages, every distribution's debuginfo):
//    `<debug dir>/.build-id/ab/cdef....debug` by GNU build ID, or a name and CRC32 in
//    `.gnu_debuglink` looked up beside the module and under the debug directory.
// Only symbol tables are wanted from these files (ElfFile::ReadFunctionSymbols); nothing here
// reads DWARF. A debug file has the module's section headers with SHT_NOBITS code, so its
// symbols carry the module's own addresses.
//
// Functions return ElfFiles the caller owns; the agent copies the symbols out and drops the
// debug file at once (it keeps only the module's own file, for unwinding).
#ifndef STRATA_COMMON_ELF_DEBUG_FILE_H_
#define STRATA_COMMON_ELF_DEBUG_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/elf/elf_file.h"

namespace strata::elf {

// Where distributions install separate debug files, under the target's root.
inline constexpr std::string_view kDebugDir = "/usr/lib/debug";
// Bound on a decompressed .gnu_debugdata image (real ones are a few MiB at most).
inline constexpr size_t kMaxMiniDebugInfoBytes = size_t{64} << 20;

// "<debug_dir>/.build-id/ab/cdef....debug" for build ID hex "abcdef..."; empty when the
// build ID is shorter than 3 hex digits (or is not hex).
std::string BuildIdDebugPath(std::string_view debug_dir, std::string_view build_id_hex);

// The contents of .gnu_debuglink: the debug file's base name and the CRC32 of its bytes.
struct DebugLink {
  std::string name;
  uint32_t crc = 0;
};
// nullopt when `elf` has no .gnu_debuglink or it is malformed (no NUL, no CRC, or a name that
// is not a plain file name: empty, ".", ".." or containing '/').
std::optional<DebugLink> ReadDebugLink(const ElfFile& elf);

// CRC-32 as .gnu_debuglink computes it (zlib's crc32; continue with the previous result).
uint32_t Crc32(std::string_view bytes, uint32_t crc = 0);

// Decompresses xz data of at most `max_bytes` output. Errors: InvalidArgument (not xz,
// unsupported options), DataLoss (corrupt or truncated), ResourceExhausted (larger than
// `max_bytes`, or needing too much decoder memory).
absl::StatusOr<std::string> DecompressXz(std::string_view xz, size_t max_bytes);

// The ELF image in `elf`'s .gnu_debugdata. NotFound when there is none; the DecompressXz
// errors, or InvalidArgument when the contents are not an ELF file of `elf`'s machine.
absl::StatusOr<std::unique_ptr<ElfFile>> ReadMiniDebugInfo(
    const ElfFile& elf, size_t max_bytes = kMaxMiniDebugInfoBytes);

// Where a separate debug file for `module` may be, in search order, as paths in the target's
// file system (`module_path` is the module's path there, e.g. from /proc/PID/maps):
//   <kDebugDir>/.build-id/ab/cdef....debug        (when the module has a build ID)
//   <dir>/<name>, <dir>/.debug/<name>, <kDebugDir><dir>/<name>   (when it has a debug link)
// where <dir> is the directory of `module_path`.
std::vector<std::string> DebugFileCandidates(const ElfFile& module, std::string_view module_path);

struct DebugFile {
  std::unique_ptr<ElfFile> elf;
  std::string path;  // in the target's file system (one of DebugFileCandidates)
};

// Finds and opens the separate debug file of `module`, reading the candidates under `root`:
// the target's root as the agent reads it ("" for the agent's own, "/proc/PID/root" for a
// process in another mount namespace). A candidate is accepted only when it has a symbol
// table, the module's machine and the module's build ID, or, when the module has no build ID,
// the CRC32 its debug link names. NotFound (saying why each existing candidate was rejected)
// when none is accepted.
absl::StatusOr<DebugFile> OpenDebugFile(const ElfFile& module, std::string_view module_path,
                                        std::string_view root);

// The target's root as the agent reads it: `open_path` without the suffix `path` when it ends
// with it at a directory boundary ("/proc/42/root" for "/proc/42/root/usr/lib/libc.so.6" and
// "/usr/lib/libc.so.6"), else "" (the agent's own root).
std::string RootOf(std::string_view open_path, std::string_view path);

}  // namespace strata::elf

#endif  // STRATA_COMMON_ELF_DEBUG_FILE_H_
