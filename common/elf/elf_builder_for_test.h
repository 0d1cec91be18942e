// Test support: minimal ELF64 little-endian images built from sections given as bytes, for
// tests of how the readers take files no linker would write (headers aliasing one table,
// symbols all naming one string). Header-only; tests only.
#ifndef STRATA_COMMON_ELF_ELF_BUILDER_FOR_TEST_H_
#define STRATA_COMMON_ELF_ELF_BUILDER_FOR_TEST_H_

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace strata::elf::testing {

// One Elf64_Sym: an `info` of STT_FUNC or STT_OBJECT (binding local), defined in section 1.
inline std::string SymbolBytes(uint32_t name_offset, uint8_t type, uint64_t value,
                               uint64_t size) {
  Elf64_Sym sym{};
  sym.st_name = name_offset;
  sym.st_info = ELF64_ST_INFO(STB_GLOBAL, type);
  sym.st_shndx = 1;
  sym.st_value = value;
  sym.st_size = size;
  return std::string(reinterpret_cast<const char*>(&sym), sizeof(sym));
}

class ElfBuilder {
 public:
  // Adds a section of `bytes` (placed after those added before); returns its index (the null
  // section is 0). `name_offset` is into the section-name table (SetSectionNames); `flags`
  // are SHF_*.
  uint32_t AddSection(uint32_t type, std::string bytes, uint32_t link = 0,
                      uint32_t name_offset = 0, uint64_t flags = 0) {
    Elf64_Shdr h{};
    h.sh_type = type;
    h.sh_flags = flags;
    h.sh_link = link;
    h.sh_name = name_offset;
    h.sh_entsize = type == SHT_SYMTAB || type == SHT_DYNSYM ? sizeof(Elf64_Sym) : 0;
    headers_.push_back(h);
    contents_.push_back(std::move(bytes));
    return static_cast<uint32_t>(headers_.size());
  }
  // Adds `count` headers repeating section `index`'s (same type, bytes and link).
  void AddAliases(uint32_t index, size_t count) {
    for (size_t i = 0; i < count; ++i) aliases_.push_back(index);
  }
  // Names the sections: `index` is the section holding the names (a SHT_STRTAB added).
  void SetSectionNames(uint32_t index) { names_index_ = index; }

  std::string Build() const {
    std::string image(sizeof(Elf64_Ehdr), '\0');
    std::vector<Elf64_Shdr> headers(1);  // the null section
    for (size_t i = 0; i < headers_.size(); ++i) {
      Elf64_Shdr h = headers_[i];
      h.sh_offset = image.size();
      h.sh_size = contents_[i].size();
      image += contents_[i];
      headers.push_back(h);
    }
    for (uint32_t index : aliases_) headers.push_back(headers[index]);
    while (image.size() % 8 != 0) image.push_back('\0');
    Elf64_Ehdr eh{};
    std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = ELFCLASS64;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_ident[EI_VERSION] = EV_CURRENT;
    eh.e_type = ET_DYN;
    eh.e_machine = EM_X86_64;
    eh.e_version = EV_CURRENT;
    eh.e_ehsize = sizeof(Elf64_Ehdr);
    eh.e_shoff = image.size();
    eh.e_shentsize = sizeof(Elf64_Shdr);
    eh.e_shnum = static_cast<uint16_t>(headers.size());
    eh.e_shstrndx = static_cast<uint16_t>(names_index_);
    std::memcpy(image.data(), &eh, sizeof(eh));
    image.append(reinterpret_cast<const char*>(headers.data()),
                 headers.size() * sizeof(Elf64_Shdr));
    return image;
  }

 private:
  std::vector<Elf64_Shdr> headers_;
  std::vector<std::string> contents_;
  std::vector<uint32_t> aliases_;
  uint32_t names_index_ = 0;
};

}  // namespace strata::elf::testing

#endif  // STRATA_COMMON_ELF_ELF_BUILDER_FOR_TEST_H_
