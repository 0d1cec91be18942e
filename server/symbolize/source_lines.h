// server/symbolize: source lines and inlined frames of an address, from the DWARF of one module
// (its separate debug file, or the binary itself when unstripped). The symbolizer names a frame
// by the ELF symbol containing it; SourceLines says what that code is in the source: which
// functions were inlined there, and the file:line of each, as `addr2line -i -f -C` prints them.
//
// A SourceLines owns the open file (a read-only mapping), its libelf and libdw handles and a
// table of compilation-unit address ranges built at Open (.debug_aranges is optional: clang
// leaves it out). A unit's out-of-line functions are indexed by address on its first lookup,
// the ELF symbol table on first need; libdw keeps the line tables it decodes. All live as long
// as the object; a lookup walks only the DIEs of the function containing the address.
#ifndef STRATA_SERVER_SYMBOLIZE_SOURCE_LINES_H_
#define STRATA_SERVER_SYMBOLIZE_SOURCE_LINES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace strata::server::symbolize {

// One frame of source at an address: a function and where in it.
struct SourceFrame {
  std::string function;  // demangled (C++), else the DWARF name
  std::string file;      // path as DWARF gives it, joined with the CU's comp_dir when relative
  uint32_t line = 0;     // 0: unknown
  bool inlined = false;  // true: this function's code was inlined into the next (outer) frame
  // The function's DW_AT_decl_line (0: unknown) and its name as the linker knows it (the
  // mangled DW_AT_linkage_name, else DW_AT_name): what LLVM sample profiles are keyed by.
  uint32_t decl_line = 0;
  std::string linkage_name;
};

// DWARF (.debug_info, .debug_line) of one module's debug file or unstripped binary, read with
// elfutils' libdw. Thread-safe (calls are serialized: libdw's lookups are not).
class SourceLines {
 public:
  // InvalidArgument when the file has no DWARF (.debug_info); NotFound/Internal on I/O errors.
  static absl::StatusOr<std::unique_ptr<SourceLines>> Open(const std::string& path);
  ~SourceLines();
  SourceLines(const SourceLines&) = delete;
  SourceLines& operator=(const SourceLines&) = delete;

  // The source frames at `address` (an ELF virtual address of the module), innermost first, as
  // `addr2line -i -f -C` prints them: the innermost inlined function with the address's own
  // file:line, then each function it was inlined into with the call site's file:line
  // (DW_AT_call_file/DW_AT_call_line), ending with the out-of-line function. Empty when no
  // DWARF covers the address. For a return address, callers pass address - 1.
  // Functions DWARF gives no linkage name (anonymous namespaces, lambdas) carry a bare
  // DW_AT_name ("operator()"); for the out-of-line one the ELF symbol at its entry (.symtab,
  // demangled) names it instead, as addr2line and llvm-symbolizer do. Code a unit covers with
  // no function DIE gives one frame named by the ELF symbol containing it, if any.
  std::vector<SourceFrame> Frames(uint64_t address) const;

  // DW_AT_decl_line of the out-of-line function (DW_TAG_subprogram) containing `address`, also
  // when the address is in code inlined into it: what LLVM sample profiles count line offsets
  // from. For a lambda, which gcc gives none, its closure type's. 0 when unknown.
  uint32_t FunctionDeclLine(uint64_t address) const;

 private:
  struct Impl;  // the file, its libelf and libdw handles, the unit index: libdw types stay here

  explicit SourceLines(std::unique_ptr<Impl> impl);

  mutable absl::Mutex mu_;
  const std::unique_ptr<Impl> impl_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace strata::server::symbolize

#endif  // STRATA_SERVER_SYMBOLIZE_SOURCE_LINES_H_
