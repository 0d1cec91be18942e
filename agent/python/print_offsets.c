// Prints the struct offsets agent/python/offsets.cc holds for one CPython version, from that
// version's own headers (not built with Strata). With an installed CPython 3.X:
//   gcc -I PREFIX/include/python3.X print_offsets.c -o print_offsets && ./print_offsets
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include <frameobject.h>
#if PY_VERSION_HEX >= 0x03090000
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#else
#include "internal/pycore_pystate.h"
#endif
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#endif
#define P(name, v) printf("    .%s = %zu,\n", name, (size_t)(v))
int main(void) {
  printf("  // %s\n", PY_VERSION);
  P("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
#if PY_VERSION_HEX >= 0x030B0000
  P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
#else
  P("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
#endif
  P("interp_next", offsetof(PyInterpreterState, next));
  P("tstate_next", offsetof(PyThreadState, next));
  P("tstate_thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030B0000
  P("tstate_native_thread_id", offsetof(PyThreadState, native_thread_id));
#endif
#if PY_VERSION_HEX >= 0x030D0000
  P("tstate_current_frame", offsetof(PyThreadState, current_frame));
#elif PY_VERSION_HEX >= 0x030B0000
  P("tstate_cframe", offsetof(PyThreadState, cframe));
  P("cframe_current_frame", offsetof(_PyCFrame, current_frame));
#else
  P("tstate_frame", offsetof(PyThreadState, frame));
#endif
#if PY_VERSION_HEX >= 0x030B0000
# if PY_VERSION_HEX >= 0x030D0000
  P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
  P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
# else
  P("frame_code", offsetof(_PyInterpreterFrame, f_code));
  P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
# endif
  P("frame_previous", offsetof(_PyInterpreterFrame, previous));
  P("frame_owner", offsetof(_PyInterpreterFrame, owner));
# if PY_VERSION_HEX < 0x030C0000
  P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
# endif
  P("frame_size", sizeof(_PyInterpreterFrame));
  P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
  P("code_qualname", offsetof(PyCodeObject, co_qualname));
  P("code_firsttraceable", offsetof(PyCodeObject, _co_firsttraceable));
#else
  P("frame_code", offsetof(PyFrameObject, f_code));
  P("frame_previous", offsetof(PyFrameObject, f_back));
  P("frame_instr", offsetof(PyFrameObject, f_lasti));
  P("frame_size", sizeof(PyFrameObject));
#endif
  P("code_name", offsetof(PyCodeObject, co_name));
  P("code_filename", offsetof(PyCodeObject, co_filename));
  P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX >= 0x030A0000
  P("code_linetable", offsetof(PyCodeObject, co_linetable));
#else
  P("code_linetable", offsetof(PyCodeObject, co_lnotab));
#endif
  P("code_size", sizeof(PyCodeObject));
  P("object_type", offsetof(PyObject, ob_type));
  P("varobject_size", offsetof(PyVarObject, ob_size));
  P("bytes_sval", offsetof(PyBytesObject, ob_sval));
  P("unicode_length", offsetof(PyASCIIObject, length));
  P("unicode_state", offsetof(PyASCIIObject, hash) + sizeof(Py_hash_t));
  P("unicode_ascii_data", sizeof(PyASCIIObject));
  P("unicode_compact_data", sizeof(PyCompactUnicodeObject));
  return 0;
}
