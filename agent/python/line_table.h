// Line numbers of CPython code objects: the line a bytecode offset belongs to, decoded from
// the code object's line table as CPython's PyCode_Addr2Line does, for the three formats
// (agent/python/offsets.h, LineTableFormat). Tables come from the target's memory: a malformed
// one yields no line (-1), never a read past its end.
#ifndef STRATA_AGENT_PYTHON_LINE_TABLE_H_
#define STRATA_AGENT_PYTHON_LINE_TABLE_H_

#include <cstdint>
#include <string_view>

#include "agent/python/offsets.h"

namespace strata::agent::python {

// The line of the instruction at `byte_offset` (bytes from the start of the bytecode) of a code
// object whose first line is `first_line`; -1 when the table says the instruction has no line
// or does not cover it. A negative offset (a frame that has not started) is the first line.
int LineForOffset(LineTableFormat format, std::string_view table, int first_line,
                  int64_t byte_offset);

}  // namespace strata::agent::python

#endif  // STRATA_AGENT_PYTHON_LINE_TABLE_H_
