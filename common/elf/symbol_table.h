// Address -> function lookup for one module, built once from the module's ELF file:
// .symtab and .dynsym function symbols, FDE ranges for functions without a symbol
// (stripped modules), and PLT stubs named "target@plt". Immutable after Build(), so it can be
// shared by every process that maps the module.
#ifndef STRATA_COMMON_ELF_SYMBOL_TABLE_H_
#define STRATA_COMMON_ELF_SYMBOL_TABLE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/elf/elf_file.h"

namespace strata::elf {

class SymbolTable {
 public:
  enum class Origin : uint8_t { kSymtab, kDynsym, kFde, kPlt };

  struct Function {
    uint64_t start = 0;
    uint64_t end = 0;  // exclusive; == start when the size is unknown
    std::string_view name;  // empty for FDE-only functions
    Origin origin = Origin::kSymtab;
    bool is_plt() const { return origin == Origin::kPlt; }
  };

  static absl::StatusOr<SymbolTable> Build(const ElfFile& elf);
  // For tests and synthetic modules.
  static SymbolTable FromFunctions(std::vector<FunctionSymbol> symbols,
                                   std::vector<AddressRange> fde_ranges,
                                   std::vector<PltEntry> plt);

  // The function containing `vaddr`: the closest start at or below it, rejected when that
  // function's size is known and `vaddr` lies past its end. O(log n).
  const Function* Lookup(uint64_t vaddr) const;

  size_t size() const { return functions_.size(); }
  const std::vector<Function>& functions() const { return functions_; }

  SymbolTable() = default;
  SymbolTable(const SymbolTable&) = delete;
  SymbolTable& operator=(const SymbolTable&) = delete;
  SymbolTable(SymbolTable&&) = default;
  SymbolTable& operator=(SymbolTable&&) = default;

 private:
  std::vector<Function> functions_;  // sorted by start, one per start
  std::vector<char> names_;          // storage for Function::name (heap; stable on move)
};

}  // namespace strata::elf

#endif  // STRATA_COMMON_ELF_SYMBOL_TABLE_H_
