// agent/python (strata::agent::python): CPython's frames read from a target's memory, so that
// the agent can show the Python functions a `_PyEval_EvalFrameDefault` native frame was running.
//
//   offsets.h      (this header) where the fields the reader follows live, per CPython version
//   line_table.h   pc (bytecode offset) -> line, for the three line-table formats
//   remote_memory.h  reads of another process's memory
//   runtime.h      finds the interpreter in a process (symbols, version) and reads a thread's
//                  Python frames, grouped by the native eval-loop call running them
//
// The layouts come from each version's headers (Include/cpython/pystate.h, code.h,
// frameobject.h, Include/internal/pycore_frame.h, pycore_interp.h, pycore_runtime.h); they were
// printed with offsetof() by agent/python/print_offsets.c compiled against each version's
// headers (64-bit, the same on x86-64 and MIPS64 n64). 3.13 to 3.15 carry their own table
// (_Py_DebugOffsets at the start of _PyRuntime), which is read from the target and preferred.
#ifndef STRATA_AGENT_PYTHON_OFFSETS_H_
#define STRATA_AGENT_PYTHON_OFFSETS_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata::agent::python {

// How a version's frames are linked and which native eval call runs them.
enum class FrameLayout : uint8_t {
  // 3.8 - 3.10: PyFrameObject chain from tstate->frame through f_back; every frame runs in a
  // _PyEval_EvalFrameDefault call of its own; f_lasti is the last instruction's offset (bytes
  // in 3.8/3.9, code units in 3.10).
  kFrameObject,
  // 3.11: _PyInterpreterFrame chain from tstate->cframe->current_frame through previous; one
  // native call runs several frames, the outermost of them marked is_entry.
  kInterpreterFrameIsEntry,
  // 3.12 - 3.15: as 3.11, but each native call pushes a shim frame owned by the C stack
  // (owner == kFrameOwnedByCStack) below the frames it runs.
  kInterpreterFrameCStack,
};

enum class LineTableFormat : uint8_t {
  kLnotab,         // 3.8, 3.9: co_lnotab (byte offset delta, signed line delta) pairs
  kLinetable310,   // 3.10: co_linetable (byte offset delta, signed line delta, -128: none)
  kLocations311,   // 3.11+: co_linetable location entries (Objects/locations.md)
};

// The owner of a native call's shim frame: FRAME_OWNED_BY_CSTACK in 3.12 and 3.13,
// FRAME_OWNED_BY_INTERPRETER from 3.14, which took its value (pycore_frame.h,
// pycore_interpframe_structs.h); 3.14 also ends every thread's chain with such a frame.
inline constexpr uint8_t kFrameOwnedByCStack = 3;
// 3.14's f_executable is a _PyStackRef: the object's address with a reference-counting tag in
// its low bit. Objects are at least 8-byte aligned, so clearing these bits is right for every
// version's code pointer.
inline constexpr uint64_t kStackRefTagBits = 7;
// The most the reader copies of one frame or code object (Offsets::frame_size, code_size).
inline constexpr uint32_t kMaxCopiedStruct = 256;
inline constexpr uint32_t kNoOffset = UINT32_MAX;

struct Offsets {
  int major = 3;
  int minor = 0;
  FrameLayout layout = FrameLayout::kFrameObject;
  LineTableFormat line_table = LineTableFormat::kLnotab;
  // _PyRuntimeState
  uint32_t runtime_interpreters_head = 0;
  // PyInterpreterState
  uint32_t interp_threads_head = 0;  // tstate_head before 3.11, threads.head since
  uint32_t interp_next = 0;
  // PyThreadState
  uint32_t tstate_next = 0;
  uint32_t tstate_thread_id = 0;          // pthread_t
  uint32_t tstate_native_thread_id = kNoOffset;  // the kernel's tid (3.11+)
  // The thread's current frame: *(tstate + tstate_frame) directly (3.8-3.10: PyFrameObject*,
  // 3.13: _PyInterpreterFrame*), or through tstate->cframe (3.11, 3.12) when cframe_frame is
  // set: *(*(tstate + tstate_frame) + cframe_frame).
  uint32_t tstate_frame = 0;
  uint32_t cframe_frame = kNoOffset;
  // The frame (PyFrameObject or _PyInterpreterFrame)
  uint32_t frame_code = 0;
  uint32_t frame_previous = 0;
  uint32_t frame_instr = 0;  // f_lasti (int), prev_instr or instr_ptr (pointer)
  uint32_t frame_owner = kNoOffset;     // 3.11+ (char)
  uint32_t frame_is_entry = kNoOffset;  // 3.11 (bool)
  uint32_t frame_size = 0;              // bytes read per frame (all of the above inside)
  // PyCodeObject
  uint32_t code_name = 0;
  uint32_t code_qualname = kNoOffset;  // 3.11+
  uint32_t code_filename = 0;
  uint32_t code_firstlineno = 0;  // int
  uint32_t code_linetable = 0;    // co_lnotab before 3.10
  uint32_t code_adaptive = kNoOffset;  // 3.11+: the bytecode, inline in the code object
  uint32_t code_size = 0;  // bytes read per code object (every field above inside)
  // PyObject, PyVarObject, PyBytesObject, PyUnicodeObject
  uint32_t object_type = 8;
  uint32_t varobject_size = 16;
  uint32_t bytes_sval = 32;
  uint32_t unicode_length = 16;
  uint32_t unicode_state = 32;
  uint32_t unicode_ascii_data = 0;    // sizeof(PyASCIIObject): compact ASCII data
  uint32_t unicode_compact_data = 0;  // sizeof(PyCompactUnicodeObject): other compact data
};

// The table of a version, 3.8 to 3.15; an error for any other.
absl::StatusOr<Offsets> OffsetsForVersion(int major, int minor);

// 3.13's to 3.15's _Py_DebugOffsets (the first bytes of _PyRuntime, at least the fields read
// of them: kDebugOffsetsSize covers each version's): the version's table with every field the
// struct carries taken from it. Errors: no "xdebugpy" cookie, a version whose struct is not
// known, free-threaded builds, offsets outside the sizes the struct itself gives.
inline constexpr size_t kDebugOffsetsSize = 8 * 95;  // 3.14's struct: 95 uint64 fields
inline constexpr std::string_view kDebugCookie = "xdebugpy";
absl::StatusOr<Offsets> OffsetsFromDebugOffsets(std::string_view bytes);

}  // namespace strata::agent::python

#endif  // STRATA_AGENT_PYTHON_OFFSETS_H_
