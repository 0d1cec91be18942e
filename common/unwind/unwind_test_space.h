// Test support: an AddressSpace over the modules loaded in the current process (from
// dl_iterate_phdr), each with its compiled rule source. Tests and benchmarks only; the agent
// uses agent/symbols' ProcessAddressSpace.
#ifndef STRATA_COMMON_UNWIND_UNWIND_TEST_SPACE_H_
#define STRATA_COMMON_UNWIND_UNWIND_TEST_SPACE_H_

#include <link.h>

#include <memory>
#include <string>
#include <vector>

#include "common/elf/elf_file.h"
#include "common/unwind/rule_source.h"
#include "common/unwind/unwinder.h"

namespace strata::unwind::testing {

class SelfAddressSpace final : public AddressSpace {
 public:
  // `with_rules` false: every module has no rules (exercises the frame-pointer fallback).
  explicit SelfAddressSpace(bool with_rules = true) : with_rules_(with_rules) {
    dl_iterate_phdr([](dl_phdr_info* info, size_t, void* data) {
      auto* self = static_cast<SelfAddressSpace*>(data);
      std::string path = info->dlpi_name != nullptr && info->dlpi_name[0] != '\0'
                             ? info->dlpi_name : "/proc/self/exe";
      Module m;
      m.path = path;
      m.bias = info->dlpi_addr;
      for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
          m.ranges.push_back({info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz});
        }
      }
      if (auto elf = elf::ElfFile::Open(path); elf.ok()) {
        if (self->with_rules_) {
          if (auto rules = MakeRuleSource(Arch::kX86_64, **elf); rules.ok()) m.rules = std::move(*rules);
        }
      } else if (path.find("vdso") == std::string::npos && path.find("linux-vdso") == std::string::npos) {
        return 0;
      }
      self->modules_.push_back(std::move(m));
      return 0;
    }, this);
  }

  bool Lookup(uint64_t pc, const RuleSource** rules, uint64_t* module_pc) const override {
    for (const Module& m : modules_) {
      for (const elf::AddressRange& r : m.ranges) {
        if (r.Contains(pc)) {
          *rules = m.rules.get();
          *module_pc = pc - m.bias;
          return true;
        }
      }
    }
    return false;
  }

  const RuleSource* RulesFor(const std::string& path_part) const {
    for (const Module& m : modules_) {
      if (m.path.find(path_part) != std::string::npos) return m.rules.get();
    }
    return nullptr;
  }

 private:
  struct Module {
    std::string path;
    uint64_t bias = 0;
    std::vector<elf::AddressRange> ranges;
    std::unique_ptr<RuleSource> rules;
  };
  bool with_rules_;
  std::vector<Module> modules_;
};

}  // namespace strata::unwind::testing

#endif  // STRATA_COMMON_UNWIND_UNWIND_TEST_SPACE_H_
