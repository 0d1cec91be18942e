#include "agent/core/python_eval_parts.h"

#include <string_view>

#include "common/base/log.h"

namespace strata::agent {

size_t LearnEvalParts(python::Interpreter& interpreter,
                      const symbols::ProcessAddressSpace& space,
                      std::span<const unwind::Frame> frames) {
  size_t added = 0;
  for (const uint64_t entry : interpreter.entry_frames()) {
    for (size_t i = 0; i + 1 < frames.size(); ++i) {
      if (entry < frames[i].sp || entry >= frames[i + 1].sp) continue;
      const uint64_t pc = i == 0 ? frames[i].pc : frames[i].pc - 1;
      if (interpreter.InEvalLoop(pc)) break;
      uint64_t module_pc = 0;
      const symbols::Module* module = space.ModuleAt(pc, &module_pc);
      const elf::SymbolTable::Function* f =
          module != nullptr ? module->symbols.Lookup(module_pc) : nullptr;
      if (f == nullptr || f->end <= f->start ||
          !(f->name.empty() || f->name.starts_with(python::kEvalLoop))) {
        break;
      }
      const uint64_t bias = pc - module_pc;
      if (interpreter.ProposeEvalPart({f->start + bias, f->end + bias})) {
        ++added;
        LogInfo("eval loop: {}+{:#x}..{:#x} runs Python frames (found from their stacks; "
                "no symbol names it)",
                module->path, f->start, f->end);
      }
      break;
    }
  }
  return added;
}

}  // namespace strata::agent
