// Decoding of the DWARF call-frame records in .eh_frame, .eh_frame_hdr and .debug_frame:
// CIEs (augmentation, alignment factors, initial instructions) and FDEs (pc range plus
// instruction bytes). This module only splits the sections into records and resolves
// pointer encodings; interpreting the CFA instructions is the unwinder's job
// (common/unwind/x86_64/cfi_table.*). It also gives function ranges for stripped modules.
//
// Views in Cie/Fde point into the ElfFile's image and live as long as it.
#ifndef STRATA_COMMON_ELF_CFI_RECORDS_H_
#define STRATA_COMMON_ELF_CFI_RECORDS_H_

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/elf/elf_file.h"

namespace strata::elf {

// DW_EH_PE_* pointer encodings.
inline constexpr uint8_t kPeOmit = 0xff;
inline constexpr uint8_t kPeIndirect = 0x80;

enum class CfiSectionKind : uint8_t { kEhFrame, kDebugFrame };

struct Cie {
  uint64_t code_align = 1;
  int64_t data_align = 0;
  uint64_t ra_register = 0;
  uint8_t fde_encoding = 0;  // DW_EH_PE_absptr unless 'R'
  uint8_t lsda_encoding = kPeOmit;
  bool has_augmentation_data = false;  // 'z'
  bool signal_frame = false;           // 'S'
  uint8_t address_size = 8;
  std::string_view augmentation;
  std::string_view initial_instructions;
};

struct Fde {
  uint64_t pc_start = 0;
  uint64_t pc_end = 0;  // exclusive
  std::string_view instructions;
  uint64_t cie_offset = 0;  // offset of the CIE inside its section
};

// Counters of what was skipped while walking a CFI section.
struct CfiWalkStats {
  uint64_t cies = 0;
  uint64_t fdes = 0;
  uint64_t bad_records = 0;  // malformed CIE/FDE skipped (unknown encoding, truncated, ...)
};

// Reads a pointer of `encoding` at the reader's position. `field_vaddr` is the vaddr of the
// byte under the cursor (pcrel base); `data_base` is the datarel base (.eh_frame_hdr start
// for the header, .got for FDEs). Indirect pointers are read from the file's image.
bool ReadEncodedPointer(const ElfFile& elf, ByteReader* reader, uint8_t encoding,
                        uint64_t field_vaddr, uint64_t data_base, uint64_t* out);

// Walks every FDE of one CFI section (.eh_frame through .eh_frame_hdr when present, else
// linearly; or .debug_frame) and calls `visit` with each FDE and its CIE. Returns an error
// only when the section itself is unusable; bad individual records are counted and skipped.
absl::Status ForEachFde(const ElfFile& elf, CfiSectionKind kind,
                        const std::function<void(const Cie&, const Fde&)>& visit,
                        CfiWalkStats* stats);

// Function ranges described by FDEs in .eh_frame and .debug_frame, sorted by start, with
// duplicates removed. The function starts of a stripped module.
std::vector<AddressRange> FdeRanges(const ElfFile& elf);

}  // namespace strata::elf

#endif  // STRATA_COMMON_ELF_CFI_RECORDS_H_
