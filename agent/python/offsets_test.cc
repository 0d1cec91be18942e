#include "agent/python/offsets.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/python/interpreter.h"
#include "common/elf/elf_file.h"
#include "gtest/gtest.h"

namespace strata::agent::python {
namespace {

// 3.13's _Py_DebugOffsets as CPython 3.13.0 initializes it (values printed by
// print_offsets.c and in the struct's own order: pycore_runtime.h).
std::string DebugOffsets313() {
  std::vector<uint64_t> f(kDebugOffsetsSize / 8, 0);
  f[1] = 0x030D00F0;  // version
  f[3] = 1000; f[5] = 632;                                   // runtime: size, interpreters_head
  f[6] = 8000; f[8] = 7264; f[9] = 7344;                     // interp: size, next, threads_head
  f[19] = 400; f[21] = 8; f[23] = 72; f[24] = 152; f[25] = 160;  // tstate
  f[28] = 80; f[29] = 8; f[30] = 0; f[31] = 56; f[33] = 70;  // _PyInterpreterFrame
  f[34] = 208; f[35] = 112; f[36] = 120; f[37] = 128; f[38] = 136; f[39] = 68;
  f[43] = 200;                                               // code object
  f[44] = 16; f[45] = 8;                                     // PyObject
  f[64] = 40; f[65] = 16; f[66] = 32;                        // bytes
  f[67] = 40; f[68] = 32; f[69] = 16; f[70] = 40;            // unicode
  std::string bytes(kDebugOffsetsSize, '\0');
  std::memcpy(bytes.data(), f.data(), bytes.size());
  std::memcpy(bytes.data(), kDebugCookie.data(), kDebugCookie.size());
  return bytes;
}

// 3.14's _Py_DebugOffsets as Debian's CPython 3.14.10 (python3.14-minimal 3.14.10-1)
// initializes it: the first 95 fields of its .PyRuntime section, as they are.
std::string DebugOffsets314() {
  const std::vector<uint64_t> f = {
      0, 0x030E0AF0, 0, 316616, 784, 808, 225864, 7280, 7272, 7344, 7360, 7408, 7688, 7672,
      7680, 16, 7784, 0, 7800, 7792, 7992, 0, 832, 0, 8, 16, 72, 152, 160, 232, 32, 88, 8, 0,
      56, 80, 74, 64, 0, 216, 112, 120, 128, 136, 68, 52, 96, 104, 208, 0, 16, 8, 416, 24, 88,
      168, 40, 32, 16, 40, 24, 16, 200, 24, 40, 32, 48, 32, 40, 24, 16, 32, 16, 24, 40, 16, 32,
      64, 32, 16, 40, 264, 192, 160, 24, 72, 67, 0, 8, 24, 304, 8076, 0, 4, 512};
  std::string bytes(kDebugOffsetsSize, '\0');
  std::memcpy(bytes.data(), f.data(), std::min(bytes.size(), f.size() * 8));
  std::memcpy(bytes.data(), kDebugCookie.data(), kDebugCookie.size());
  return bytes;
}

// 3.15's as Debian's CPython 3.15.2 (python3.15-minimal 3.15.2-1) initializes it: the fields
// up to the last one read.
std::string DebugOffsets315() {
  const std::vector<uint64_t> f = {
      0, 0x030F02F0, 0, 346568, 912, 936, 226240, 7272, 7264, 7336, 7352, 7400, 7592, 7576,
      7584, 16, 7736, 0, 7752, 7744, 7944, 0, 888, 0, 8, 16, 72, 80, 88, 96, 176, 184, 256, 32,
      36, 40, 136, 288, 0, 88, 8, 0, 56, 80, 74, 64, 0, 216, 112, 120, 128, 136, 68, 52, 96,
      104, 208, 0, 16, 8, 424, 24, 88, 168, 32, 288, 944, 888, 40, 32, 16, 40, 24, 16, 200, 24,
      40, 32, 48, 32, 40, 24, 16, 32, 16, 24, 40, 16, 32, 64, 32, 16, 40};
  std::string bytes(kDebugOffsetsSize, '\0');
  std::memcpy(bytes.data(), f.data(), std::min(bytes.size(), f.size() * 8));
  std::memcpy(bytes.data(), kDebugCookie.data(), kDebugCookie.size());
  return bytes;
}

void ExpectSameReadFields(const Offsets& a, const Offsets& b) {
  EXPECT_EQ(a.runtime_interpreters_head, b.runtime_interpreters_head);
  EXPECT_EQ(a.interp_threads_head, b.interp_threads_head);
  EXPECT_EQ(a.interp_next, b.interp_next);
  EXPECT_EQ(a.tstate_next, b.tstate_next);
  EXPECT_EQ(a.tstate_frame, b.tstate_frame);
  EXPECT_EQ(a.tstate_thread_id, b.tstate_thread_id);
  EXPECT_EQ(a.tstate_native_thread_id, b.tstate_native_thread_id);
  EXPECT_EQ(a.frame_code, b.frame_code);
  EXPECT_EQ(a.frame_previous, b.frame_previous);
  EXPECT_EQ(a.frame_instr, b.frame_instr);
  EXPECT_EQ(a.frame_owner, b.frame_owner);
  EXPECT_EQ(a.code_name, b.code_name);
  EXPECT_EQ(a.code_qualname, b.code_qualname);
  EXPECT_EQ(a.code_filename, b.code_filename);
  EXPECT_EQ(a.code_firstlineno, b.code_firstlineno);
  EXPECT_EQ(a.code_linetable, b.code_linetable);
  EXPECT_EQ(a.code_adaptive, b.code_adaptive);
  EXPECT_EQ(a.unicode_ascii_data, b.unicode_ascii_data);
  EXPECT_EQ(a.unicode_compact_data, b.unicode_compact_data);
}

TEST(OffsetsTest, EveryVersionFrom38To315) {
  for (int minor = 8; minor <= 15; ++minor) {
    absl::StatusOr<Offsets> o = OffsetsForVersion(3, minor);
    ASSERT_TRUE(o.ok()) << minor;
    EXPECT_EQ(o->minor, minor);
    // The reader copies frame_size bytes of a frame and code_size of a code object: every
    // field it takes from them must lie inside.
    EXPECT_LE(o->frame_code + 8, o->frame_size);
    EXPECT_LE(o->frame_previous + 8, o->frame_size);
    EXPECT_LE(o->frame_instr + 4, o->frame_size);
    if (o->frame_owner != kNoOffset) {
      EXPECT_LT(o->frame_owner, o->frame_size);
    }
    if (o->frame_is_entry != kNoOffset) {
      EXPECT_LT(o->frame_is_entry, o->frame_size);
    }
    EXPECT_LE(o->code_name + 8, o->code_size);
    EXPECT_LE(o->code_filename + 8, o->code_size);
    EXPECT_LE(o->code_linetable + 8, o->code_size);
    EXPECT_LE(o->code_firstlineno + 4, o->code_size);
    if (o->code_qualname != kNoOffset) {
      EXPECT_LE(o->code_qualname + 8, o->code_size);
    }
    EXPECT_EQ(o->code_qualname != kNoOffset, minor >= 11);
    EXPECT_EQ(o->tstate_native_thread_id != kNoOffset, minor >= 11);
    EXPECT_EQ(o->layout == FrameLayout::kFrameObject, minor <= 10);
    EXPECT_EQ(o->layout == FrameLayout::kInterpreterFrameCStack, minor >= 12);
  }
  EXPECT_FALSE(OffsetsForVersion(3, 7).ok());
  EXPECT_FALSE(OffsetsForVersion(3, 16).ok());
  EXPECT_FALSE(OffsetsForVersion(2, 7).ok());
}

TEST(OffsetsTest, DebugOffsetsOf313MatchTheTable) {
  absl::StatusOr<Offsets> parsed = OffsetsFromDebugOffsets(DebugOffsets313());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectSameReadFields(*parsed, *OffsetsForVersion(3, 13));
  EXPECT_EQ(parsed->cframe_frame, kNoOffset);
}

// 3.14 inserted fields into the struct's thread, frame and code parts: each field read is
// taken from its own index, and the values are those the table for 3.14 holds.
TEST(OffsetsTest, DebugOffsetsOf314MatchTheTable) {
  absl::StatusOr<Offsets> parsed = OffsetsFromDebugOffsets(DebugOffsets314());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->minor, 14);
  ExpectSameReadFields(*parsed, *OffsetsForVersion(3, 14));
  EXPECT_EQ(parsed->tstate_frame, 72u);
  EXPECT_EQ(parsed->frame_owner, 74u);
  EXPECT_EQ(parsed->code_adaptive, 208u);
  EXPECT_EQ(parsed->layout, FrameLayout::kInterpreterFrameCStack);
  EXPECT_LE(parsed->frame_owner + 1, parsed->frame_size);
  // Read with 3.13's indices, the same bytes would be refused: 3.13's "thread state size"
  // (field 19) is 3.14's GIL holder offset, far smaller than the offsets checked against it.
  std::string as313 = DebugOffsets314();
  const uint64_t v313 = 0x030D00F0;
  std::memcpy(as313.data() + 8, &v313, 8);
  EXPECT_FALSE(OffsetsFromDebugOffsets(as313).ok());
}

// 3.15 laid the thread state's part out anew (thread ids after three more frame pointers).
TEST(OffsetsTest, DebugOffsetsOf315MatchTheTable) {
  absl::StatusOr<Offsets> parsed = OffsetsFromDebugOffsets(DebugOffsets315());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->minor, 15);
  ExpectSameReadFields(*parsed, *OffsetsForVersion(3, 15));
  EXPECT_EQ(parsed->tstate_thread_id, 176u);
  EXPECT_EQ(parsed->tstate_native_thread_id, 184u);
  EXPECT_EQ(parsed->runtime_interpreters_head, 936u);
}

TEST(OffsetsTest, DebugOffsetsRejected) {
  std::string bytes = DebugOffsets313();
  EXPECT_FALSE(OffsetsFromDebugOffsets(bytes.substr(0, 100)).ok());
  std::string cookie = bytes;
  cookie[0] = 'y';
  EXPECT_FALSE(OffsetsFromDebugOffsets(cookie).ok());
  std::string v316 = bytes;
  const uint64_t version = 0x031000A0;  // a struct not known yet
  std::memcpy(v316.data() + 8, &version, 8);
  EXPECT_EQ(OffsetsFromDebugOffsets(v316).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_FALSE(OffsetsFromDebugOffsets(DebugOffsets314().substr(0, 8 * 73)).ok());
  std::string free_threaded = bytes;
  free_threaded[16] = 1;
  EXPECT_FALSE(OffsetsFromDebugOffsets(free_threaded).ok());
  std::string outside = bytes;
  const uint64_t far = 4096;  // tstate current_frame past the thread state's size
  std::memcpy(outside.data() + 8 * 23, &far, 8);
  EXPECT_FALSE(OffsetsFromDebugOffsets(outside).ok());
  std::string far_in = bytes;
  const uint64_t code_struct = 100000, name_at = 90000;  // inside the struct, past the copy
  std::memcpy(far_in.data() + 8 * 34, &code_struct, 8);
  std::memcpy(far_in.data() + 8 * 36, &name_at, 8);
  EXPECT_FALSE(OffsetsFromDebugOffsets(far_in).ok());
}

// The real struct, as a CPython 3.13 library initializes it in its .data (when one is
// installed, e.g. by pyenv).
TEST(OffsetsTest, DebugOffsetsOfAnInstalled313) {
  std::string lib;
  for (const char* home : {static_cast<const char*>(getenv("HOME")), "/root"}) {
    if (home == nullptr) continue;
    const std::string p = std::string(home) + "/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0";
    if (std::filesystem::exists(p)) lib = p;
  }
  if (lib.empty()) GTEST_SKIP() << "no CPython 3.13 library installed";
  auto elf = elf::ElfFile::Open(lib);
  ASSERT_TRUE(elf.ok()) << elf.status();
  std::optional<uint64_t> runtime = FindObjectSymbol(**elf, "_PyRuntime");
  ASSERT_TRUE(runtime.has_value());
  std::string_view bytes = FileBytesAt(**elf, *runtime, kDebugOffsetsSize);
  ASSERT_EQ(bytes.size(), kDebugOffsetsSize);
  absl::StatusOr<Offsets> parsed = OffsetsFromDebugOffsets(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectSameReadFields(*parsed, *OffsetsForVersion(3, 13));
}

}  // namespace
}  // namespace strata::agent::python
