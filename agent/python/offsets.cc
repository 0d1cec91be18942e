#include "agent/python/offsets.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata::agent::python {
namespace {

// Values printed by print_offsets.c from the headers of 3.8.18, 3.9.18, 3.10.13, 3.11.7
// (identical for Debian's 3.11.2), 3.12.1 and 3.13.0; 3.14's and 3.15's from the
// _Py_DebugOffsets of Debian's 3.14.10 and 3.15.2.
Offsets Version38And39(int minor) {
  Offsets o;
  o.minor = minor;
  o.layout = FrameLayout::kFrameObject;
  o.line_table = LineTableFormat::kLnotab;
  o.runtime_interpreters_head = 32;
  o.interp_threads_head = 8;  // tstate_head
  o.interp_next = 0;
  o.tstate_next = 8;
  o.tstate_thread_id = 176;
  o.tstate_frame = 24;
  o.frame_code = 32;
  o.frame_previous = 24;  // f_back
  o.frame_instr = 104;    // f_lasti
  o.frame_size = 112;
  o.code_name = 112;
  o.code_filename = 104;
  o.code_firstlineno = 40;
  o.code_linetable = 120;  // co_lnotab
  o.code_size = 128;
  o.unicode_ascii_data = 48;
  o.unicode_compact_data = 72;
  return o;
}

Offsets Version310() {
  Offsets o = Version38And39(10);
  o.line_table = LineTableFormat::kLinetable310;
  o.frame_instr = 96;  // f_lasti, in code units
  o.frame_size = 104;
  return o;
}

Offsets Version311() {
  Offsets o;
  o.minor = 11;
  o.layout = FrameLayout::kInterpreterFrameIsEntry;
  o.line_table = LineTableFormat::kLocations311;
  o.runtime_interpreters_head = 40;
  o.interp_threads_head = 16;
  o.interp_next = 0;
  o.tstate_next = 8;
  o.tstate_thread_id = 152;
  o.tstate_native_thread_id = 160;
  o.tstate_frame = 56;  // cframe
  o.cframe_frame = 8;   // _PyCFrame.current_frame
  o.frame_code = 32;
  o.frame_previous = 48;
  o.frame_instr = 56;  // prev_instr
  o.frame_is_entry = 68;
  o.frame_owner = 69;
  o.frame_size = 72;
  o.code_name = 120;
  o.code_qualname = 128;
  o.code_filename = 112;
  o.code_firstlineno = 72;
  o.code_linetable = 136;
  o.code_adaptive = 184;
  o.code_size = 144;
  o.unicode_ascii_data = 48;
  o.unicode_compact_data = 72;
  return o;
}

Offsets Version312() {
  Offsets o;
  o.minor = 12;
  o.layout = FrameLayout::kInterpreterFrameCStack;
  o.line_table = LineTableFormat::kLocations311;
  o.runtime_interpreters_head = 40;
  o.interp_threads_head = 72;
  o.interp_next = 0;
  o.tstate_next = 8;
  o.tstate_thread_id = 136;
  o.tstate_native_thread_id = 144;
  o.tstate_frame = 56;  // cframe
  o.cframe_frame = 0;   // _PyCFrame.current_frame
  o.frame_code = 0;
  o.frame_previous = 8;
  o.frame_instr = 56;  // prev_instr
  o.frame_owner = 70;
  o.frame_size = 72;
  o.code_name = 120;
  o.code_qualname = 128;
  o.code_filename = 112;
  o.code_firstlineno = 68;
  o.code_linetable = 136;
  o.code_adaptive = 192;
  o.code_size = 144;
  o.unicode_ascii_data = 40;
  o.unicode_compact_data = 56;
  return o;
}

Offsets Version313() {
  Offsets o = Version312();
  o.minor = 13;
  o.runtime_interpreters_head = 632;
  o.interp_threads_head = 7344;
  o.interp_next = 7264;
  o.tstate_thread_id = 152;
  o.tstate_native_thread_id = 160;
  o.tstate_frame = 72;  // current_frame
  o.cframe_frame = kNoOffset;
  o.frame_code = 0;     // f_executable
  o.frame_instr = 56;   // instr_ptr
  o.code_adaptive = 200;
  return o;
}

// 3.14: f_executable is a _PyStackRef (tagged: see kStackRefTagBits); the native eval call's
// entry frame is owned by FRAME_OWNED_BY_INTERPRETER, which took the value CSTACK had (3).
Offsets Version314() {
  Offsets o = Version313();
  o.minor = 14;
  o.runtime_interpreters_head = 808;
  o.interp_next = 7272;
  o.frame_owner = 74;
  o.frame_size = 80;
  o.code_adaptive = 208;
  return o;
}

// 3.15: as 3.14 (FRAME_OWNED_BY_CSTACK is gone; the entry frame's owner is still 3), the
// runtime, interpreter and thread states laid out anew.
Offsets Version315() {
  Offsets o = Version314();
  o.minor = 15;
  o.runtime_interpreters_head = 936;
  o.interp_threads_head = 7336;
  o.interp_next = 7264;
  o.tstate_thread_id = 176;
  o.tstate_native_thread_id = 184;
  return o;
}

// Where 3.13's, 3.14's and 3.15's _Py_DebugOffsets keep the fields the reader takes (the index
// of the uint64 field, the cookie being field 0), from Include/internal/pycore_runtime.h (3.13)
// and pycore_debug_offsets.h (3.14: threads_main, code_object_generation and tlbc_generation in
// the interpreter's part, stackpointer and tlbc_index in the frame's, co_tlbc in the code's;
// 3.15: three frame pointers after current_frame and four fields after status in the thread's
// part, an exception stack item's part, four more fields in the type object's). The 3.15
// indices were placed by the values Debian's 3.15.2 holds there (each struct's size, then
// offsets inside it); the struct has more fields past the last index read.
struct DebugLayout {
  int minor;
  size_t fields;  // the uint64 fields to read: up to the last one used
  size_t runtime_size, interpreters_head;
  size_t interp_size, interp_next, interp_threads_head;
  size_t tstate_size, tstate_next, tstate_current_frame, tstate_thread_id,
      tstate_native_thread_id;
  size_t frame_size, frame_previous, frame_executable, frame_instr_ptr, frame_owner;
  size_t code_size, code_filename, code_name, code_qualname, code_linetable, code_firstlineno,
      code_adaptive;
  size_t object_size, object_type;
  size_t bytes_size, bytes_ob_size, bytes_sval;
  size_t unicode_size, unicode_state, unicode_length, unicode_ascii_size;
};

constexpr DebugLayout kDebugLayouts[] = {
    {13, 73, 3, 5, 6, 8, 9, 19, 21, 23, 24, 25, 28, 29, 30, 31, 33,
     34, 35, 36, 37, 38, 39, 43, 44, 45, 64, 65, 66, 67, 68, 69, 70},
    {14, 95, 3, 5, 6, 8, 9, 22, 24, 26, 27, 28, 31, 32, 33, 34, 36,
     39, 40, 41, 42, 43, 44, 48, 50, 51, 74, 75, 76, 77, 78, 79, 80},
    {15, 93, 3, 5, 6, 8, 9, 22, 24, 26, 30, 31, 39, 40, 41, 42, 44,
     47, 48, 49, 50, 51, 52, 56, 58, 59, 86, 87, 88, 89, 90, 91, 92},
};

}  // namespace

absl::StatusOr<Offsets> OffsetsForVersion(int major, int minor) {
  if (major == 3) {
    switch (minor) {
      case 8:
      case 9:
        return Version38And39(minor);
      case 10:
        return Version310();
      case 11:
        return Version311();
      case 12:
        return Version312();
      case 13:
        return Version313();
      case 14:
        return Version314();
      case 15:
        return Version315();
      default:
        break;
    }
  }
  return absl::UnimplementedError(
      absl::StrCat("CPython ", major, ".", minor, " is not supported (3.8 to 3.15 are)"));
}

absl::StatusOr<Offsets> OffsetsFromDebugOffsets(std::string_view bytes) {
  if (bytes.size() < 3 * 8) return absl::InvalidArgumentError("_Py_DebugOffsets: too short");
  if (bytes.substr(0, kDebugCookie.size()) != kDebugCookie) {
    return absl::InvalidArgumentError("_Py_DebugOffsets: no xdebugpy cookie");
  }
  // Native-endian uint64 fields, in the order of the version's struct (kDebugLayouts).
  auto field = [&](size_t index) {
    uint64_t v;
    std::memcpy(&v, bytes.data() + 8 * index, sizeof(v));
    return v;
  };
  const uint64_t version = field(1);
  const int major = static_cast<int>(version >> 24);
  const int minor = static_cast<int>((version >> 16) & 0xff);
  const DebugLayout* layout = nullptr;
  for (const DebugLayout& l : kDebugLayouts) {
    if (major == 3 && minor == l.minor) layout = &l;
  }
  if (layout == nullptr) {
    return absl::UnimplementedError(absl::StrCat("_Py_DebugOffsets of CPython ", major, ".",
                                                 minor, ": only 3.13's to 3.15's are known"));
  }
  if (bytes.size() < 8 * layout->fields) {
    return absl::InvalidArgumentError("_Py_DebugOffsets: too short");
  }
  if (field(2) != 0) return absl::UnimplementedError("free-threaded CPython is not supported");
  absl::StatusOr<Offsets> table = OffsetsForVersion(major, minor);
  if (!table.ok()) return table.status();
  Offsets o = *table;
  const DebugLayout& l = *layout;
  // Each offset must lie inside the size its own struct gives (a torn or foreign table).
  const uint64_t interp_size = field(l.interp_size), tstate_size = field(l.tstate_size),
                 frame_size = field(l.frame_size), code_size = field(l.code_size);
  auto within = [](uint64_t offset, uint64_t width, uint64_t size, uint32_t* out) {
    if (offset + width > size || offset > UINT32_MAX) return false;
    *out = static_cast<uint32_t>(offset);
    return true;
  };
  bool ok =
      within(field(l.interpreters_head), 8, field(l.runtime_size),
             &o.runtime_interpreters_head) &&
      within(field(l.interp_next), 8, interp_size, &o.interp_next) &&
      within(field(l.interp_threads_head), 8, interp_size, &o.interp_threads_head) &&
      within(field(l.tstate_next), 8, tstate_size, &o.tstate_next) &&
      within(field(l.tstate_current_frame), 8, tstate_size, &o.tstate_frame) &&
      within(field(l.tstate_thread_id), 8, tstate_size, &o.tstate_thread_id) &&
      within(field(l.tstate_native_thread_id), 8, tstate_size, &o.tstate_native_thread_id) &&
      within(field(l.frame_previous), 8, frame_size, &o.frame_previous) &&
      within(field(l.frame_executable), 8, frame_size, &o.frame_code) &&
      within(field(l.frame_instr_ptr), 8, frame_size, &o.frame_instr) &&
      within(field(l.frame_owner), 1, frame_size, &o.frame_owner) &&
      within(field(l.code_filename), 8, code_size, &o.code_filename) &&
      within(field(l.code_name), 8, code_size, &o.code_name) &&
      within(field(l.code_qualname), 8, code_size, &o.code_qualname) &&
      within(field(l.code_linetable), 8, code_size, &o.code_linetable) &&
      within(field(l.code_firstlineno), 4, code_size, &o.code_firstlineno) &&
      within(field(l.code_adaptive), 0, code_size, &o.code_adaptive) &&
      within(field(l.object_type), 8, field(l.object_size), &o.object_type) &&
      within(field(l.bytes_ob_size), 8, field(l.bytes_size), &o.varobject_size) &&
      within(field(l.bytes_sval), 0, field(l.bytes_size), &o.bytes_sval) &&
      within(field(l.unicode_state), 4, field(l.unicode_size), &o.unicode_state) &&
      within(field(l.unicode_length), 8, field(l.unicode_size), &o.unicode_length) &&
      within(field(l.unicode_ascii_size), 0, field(l.unicode_size), &o.unicode_ascii_data);
  if (!ok) return absl::InvalidArgumentError("_Py_DebugOffsets: an offset outside its struct");
  o.cframe_frame = kNoOffset;
  // PyCompactUnicodeObject adds utf8_length and utf8 to PyASCIIObject (3.12+: no wstr).
  o.unicode_compact_data = o.unicode_ascii_data + 16;
  // What the reader copies of a frame and a code object: up to the last field it uses.
  o.frame_size = std::max({o.frame_previous + 8, o.frame_code + 8, o.frame_instr + 8,
                           o.frame_owner + 1});
  o.code_size = std::max({o.code_filename, o.code_name, o.code_qualname, o.code_linetable,
                          o.object_type}) + 8;
  o.code_size = std::max(o.code_size, o.code_firstlineno + 4);
  // The reader copies these per frame; real structs keep the fields near their start.
  if (o.frame_size > kMaxCopiedStruct || o.code_size > kMaxCopiedStruct) {
    return absl::InvalidArgumentError("_Py_DebugOffsets: frame or code fields too far in");
  }
  return o;
}

}  // namespace strata::agent::python
