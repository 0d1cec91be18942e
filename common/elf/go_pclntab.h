// Go's runtime symbol table (.gopclntab) read from a Go executable: for every Go function its
// entry pc, end, name, special-function marks (funcID, TOPFRAME/SPWRITE flags), and the
// pc-value tables the Go runtime itself unwinds and symbolizes with -- SP delta (pcsp),
// file and line (pcfile, pcln) and the inline tree (FUNCDATA_InlTree + PCDATA_InlTreeIndex).
//
// Go binaries carry no .eh_frame and a stripped one (-ldflags=-s -w) has no .symtab, but the
// runtime needs this table for its own tracebacks, so every Go binary has it: the section
// .gopclntab (.data.rel.ro.gopclntab in PIE builds), found otherwise by its header magic.
// Header formats: Go 1.16-1.17 (magic 0xfffffffa), 1.18-1.19 (0xfffffff0), 1.20+
// (0xfffffff1); either byte order and pointer size (x86-64, MIPS64 big and little endian).
// The layout follows the Go sources: runtime/symtab.go, internal/abi/symtab.go (1.21+),
// cmd/link/internal/ld/pcln.go.
//
// Who owns what: a GoPclntab owns nothing but views into the ElfFile it was read from (which
// must outlive it). Every read is bounds-checked: a corrupt table gives an error or an empty
// answer, never a crash. Decoding is for building tables (unwind rules, symbol tables) and for
// the server's symbolization, not for a per-sample path.
#ifndef STRATA_COMMON_ELF_GO_PCLNTAB_H_
#define STRATA_COMMON_ELF_GO_PCLNTAB_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/elf/elf_file.h"

namespace strata::elf {

class GoPclntab {
 public:
  enum class Version : uint8_t { kGo116, kGo118, kGo120 };

  // Flags of a function (funcFlag, Go 1.17+; 0 in older tables).
  static constexpr uint8_t kFlagTopFrame = 1;  // a stack root (goexit, mstart, rt0_go)
  static constexpr uint8_t kFlagSpWrite = 2;   // writes SP arbitrarily (stack switches)
  static constexpr uint8_t kFlagAsm = 4;       // written in assembly

  struct Function {
    uint64_t entry = 0;  // ELF vaddr
    uint64_t end = 0;    // exclusive: the end of its pcsp table's last range
    std::string_view name;
    // The release's funcID numbering (runtime/symtab.go, internal/abi/symtab.go since 1.21).
    // Releases with one table layout number them differently (1.22 inserted corostart after
    // cgocallback: goexit is 7 in 1.19-1.21, 8 in 1.22+), so it is kept, not interpreted:
    // roots come from the flags.
    uint8_t func_id = 0;
    uint8_t flags = 0;
    // A stack root for unwinding: TOPFRAME or SPWRITE, or (tables without flags) one of the
    // runtime's root or stack-switching functions by name.
    bool root = false;
    uint32_t func_offset = 0;  // of its _func record inside the function table
  };

  // One range of a pc-value table: [start, end) has `value`.
  struct PcValueRange {
    uint64_t start = 0;
    uint64_t end = 0;
    int32_t value = 0;
  };

  // A source position; for inlined calls, one per frame, innermost first.
  struct SourceFrame {
    std::string_view function;
    std::string_view file;
    int32_t line = 0;
    bool inlined = false;  // an inlined call inside the next frame's function
  };

  // Finds and parses the table of a Go executable. NotFound when the file has none (not Go);
  // other errors for a table that is there but malformed.
  static absl::StatusOr<std::unique_ptr<GoPclntab>> Find(const ElfFile& elf);
  // Parses a table image at `vaddr` (tests, fixtures). `elf` (may be null) is used for the
  // inline trees, which live outside the table.
  static absl::StatusOr<std::unique_ptr<GoPclntab>> Parse(std::string_view table, uint64_t vaddr,
                                                          bool big_endian, const ElfFile* elf);

  Version version() const { return version_; }
  uint8_t ptr_size() const { return ptr_size_; }
  uint8_t pc_quantum() const { return min_lc_; }
  uint64_t vaddr() const { return vaddr_; }
  uint64_t text_start() const { return text_start_; }
  // The go.func.* base the Go 1.18+ funcdata offsets are relative to, found through the
  // runtime's moduledata; 0 when not found (then there are no inline trees).
  uint64_t gofunc() const { return gofunc_; }

  const std::vector<Function>& functions() const { return functions_; }
  // Index of the function containing `pc`, or -1.
  int64_t FindFunction(uint64_t pc) const;

  // The function's SP delta ranges (bytes the function has pushed below its entry SP, not
  // counting the return address a CALL pushed on x86-64). Empty on a malformed table.
  std::vector<PcValueRange> SpDeltas(const Function& f) const;
  // File and line at `pc` of function `f`, then the inlined calls (innermost first).
  std::vector<SourceFrame> Symbolize(const Function& f, uint64_t pc) const;

 private:
  GoPclntab() = default;
  absl::Status ParseHeader();
  absl::Status ParseFunctions();
  void FindGoFunc(std::string_view moduledata);
  // The runtime's moduledata (runtime/symtab.go) in `elf`'s writable data, from its start to
  // the end of its section, found by its first two words (the pcHeader's address and
  // funcnametab's); empty when there is none (or only a PIE's, whose words wait for
  // relocations).
  std::string_view FindModuledata(const ElfFile& elf) const;
  // Reads the pc-value table at `offset` (into pctab) of function `f` into ranges.
  // `budget` (optional): steps left for all tables decoded with it; false when exhausted.
  // Decoding ends early (true) after the range holding `stop_at`.
  bool DecodeTable(const Function& f, uint32_t offset, std::vector<PcValueRange>* out,
                   size_t* budget = nullptr, uint64_t stop_at = UINT64_MAX) const;
  std::optional<int32_t> ValueAt(const Function& f, uint32_t offset, uint64_t pc) const;
  uint32_t FuncField(const Function& f, size_t field_offset) const;  // 0 when out of range
  uint32_t PcdataOffset(const Function& f, uint32_t table) const;
  uint64_t FuncdataAddress(const Function& f, uint32_t index) const;  // 0: none
  // The name at `nameoff` of funcnametab (empty when unterminated); `scanned`: bytes looked at.
  std::string_view NameAt(uint32_t nameoff, size_t* scanned = nullptr) const;
  std::string_view FileName(const Function& f, int32_t file_index) const;
  uint64_t Word(size_t offset) const;  // pointer-sized, 0 when out of range

  std::string_view data_;
  uint64_t vaddr_ = 0;
  bool big_endian_ = false;
  const ElfFile* elf_ = nullptr;
  Version version_ = Version::kGo118;
  uint8_t ptr_size_ = 8;
  uint8_t min_lc_ = 1;
  uint64_t nfunc_ = 0;
  uint64_t text_start_ = 0;
  uint64_t funcname_off_ = 0, cu_off_ = 0, filetab_off_ = 0, pctab_off_ = 0, pcln_off_ = 0;
  uint64_t gofunc_ = 0;
  std::vector<Function> functions_;  // sorted by entry
};

std::string_view GoPclntabVersionName(GoPclntab::Version v);  // "1.16", "1.18", "1.20"

// Names the Go functions of `table` in `symbols` (a module's ELF function symbols): symbols at
// a Go function's entry are replaced by the table's (same function, the runtime's name: .symtab
// adds ABI suffixes such as ".abi0"), the others are added. Returns how many were added.
size_t AddGoFunctionSymbols(const GoPclntab& table, std::vector<FunctionSymbol>* symbols);

// Cheap pre-check before GoPclntab::Find: the file has a Go section (.gopclntab in any form,
// .gosymtab or the Go build ID note).
bool LooksLikeGo(const ElfFile& elf);

}  // namespace strata::elf

#endif  // STRATA_COMMON_ELF_GO_PCLNTAB_H_
