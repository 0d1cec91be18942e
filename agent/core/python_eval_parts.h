// The native frames that run a Python sample's frames where no symbol says so: the parts of
// CPython's eval loop a compiler split off (GCC's .cold) in a module without .symtab, such as
// Debian's python3.14, which runs most of its bytecode in its unnamed .cold part.
//
// From 3.12 every native eval call keeps its entry frame, the shim below the Python frames it
// runs, in its own stack frame; a read of the thread's chain gives those shims' addresses
// (python::Interpreter::entry_frames). The native frame whose stack holds one is that call's,
// and the function around its pc, found by its FDE, is part of the eval loop. StackRecorder
// calls this while the interpreter learns_eval_parts(), on reads with more groups of Python
// frames than eval-loop frames; the interpreter keeps what is found.
#ifndef STRATA_AGENT_CORE_PYTHON_EVAL_PARTS_H_
#define STRATA_AGENT_CORE_PYTHON_EVAL_PARTS_H_

#include <cstddef>
#include <span>

#include "agent/python/interpreter.h"
#include "agent/symbols/process_address_space.h"
#include "common/unwind/unwind_types.h"

namespace strata::agent {

// `frames`: the sample's native frames, innermost first, each with its stack pointer. For
// each of the interpreter's last read's entry frames, the frame i with frames[i].sp <= entry <
// frames[i + 1].sp; when its pc (less one, for a return address) is not in the eval loop yet,
// the function around it is proposed (Interpreter::ProposeEvalPart: a few reads must agree)
// if it is nameless (an FDE range) or a _PyEval_EvalFrameDefault part. Returns how many
// functions joined the eval loop.
size_t LearnEvalParts(python::Interpreter& interpreter,
                      const symbols::ProcessAddressSpace& space,
                      std::span<const unwind::Frame> frames);

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_PYTHON_EVAL_PARTS_H_
