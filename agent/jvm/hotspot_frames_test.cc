#include "agent/jvm/hotspot_frames.h"

#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"

namespace strata::agent::jvm {
namespace {

using symbols::JitFrameLayout;

std::vector<uint8_t> Bytes(std::string hex) {
  const std::string raw = absl::HexStringToBytes(absl::StrReplaceAll(hex, {{" ", ""}}));
  return std::vector<uint8_t>(raw.begin(), raw.end());
}

std::optional<JitFrameLayout> Decode(const std::string& hex) {
  const std::vector<uint8_t> code = Bytes(hex);
  return DecodeHotSpotEntry(code);
}

// The first bytes of methods an OpenJDK 17 JVM compiled (read from its code cache through
// its perf map), and the frames their code builds.
TEST(HotSpotFramesTest, EntryCodeOfCompiledMethodsGivesTheFrame) {
  // A static method: the stack bang, push rbp, sub rsp, 0x40.
  EXPECT_EQ(Decode("89 84 24 00 c0 fe ff 55 48 83 ec 40 4c 8b ee 8b 5e 0c 44 8b d3"),
            (JitFrameLayout{8, 12, 0x40 + 16}));
  // A virtual method: its inline cache check and alignment come first.
  EXPECT_EQ(Decode("44 8b 56 08 49 bb 00 00 00 e3 f5 7f 00 00 4d 03 d3 49 3b c2 0f 85 e6 7a a7 "
                   "ff 66 90 0f 1f 40 00 89 84 24 00 c0 fe ff 55 48 83 ec 60 48 89 34 24"),
            (JitFrameLayout{40, 44, 0x60 + 16}));
  // A frame too large for an 8-bit immediate.
  EXPECT_EQ(Decode("89 84 24 00 c0 fe ff 55 48 81 ec 90 00 00 00 48 85 f6 0f 84 14 0a 00 00"),
            (JitFrameLayout{8, 15, 0x90 + 16}));
  // C1 code that calls out before its verified entry.
  EXPECT_EQ(Decode("e8 fb 3d f4 17 66 66 66 0f 1f 84 00 00 00 00 00 89 84 24 00 c0 fe ff 55 48 "
                   "83 ec 40 48 8b 5e 38"),
            (JitFrameLayout{24, 28, 0x40 + 16}));
  // Made not entrant: a jump over the stack bang; the frames it has on stacks stay.
  EXPECT_EQ(Decode("44 8b 56 08 49 bb 00 00 00 e3 f5 7f 00 00 4d 03 d3 49 3b c2 0f 85 06 ac a8 "
                   "ff 66 90 0f 1f 40 00 e9 fb a1 a8 ff fe ff 55 48 81 ec d0 00 00 00 48"),
            (JitFrameLayout{40, 47, 0xd0 + 16}));
  // C2 without a stack bang: sub rsp, N then rbp stored at N - 8 (CFA = sp + N + 8).
  EXPECT_EQ(Decode("48 81 ec 38 00 00 00 48 89 6c 24 30 8b 46 0c"),
            (JitFrameLayout{7, 7, 0x38 + 8}));
  EXPECT_EQ(Decode("48 81 ec 18 01 00 00 48 89 ac 24 10 01 00 00"),
            (JitFrameLayout{7, 7, 0x118 + 8}));
  // ... and made not entrant.
  EXPECT_EQ(Decode("e9 00 10 00 00 00 00 48 89 6c 24 30"), (JitFrameLayout{7, 7, 0x38 + 8}));
  // ... and JDK 27's for a small frame (the short sub), before its entry barrier.
  EXPECT_EQ(Decode("48 83 ec 18 48 89 6c 24 10 66 66 90 41 81 7f 20 01 00 00 00"),
            (JitFrameLayout{4, 4, 0x18 + 8}));
  // rbp pushed and nothing allocated.
  EXPECT_EQ(Decode("89 84 24 00 c0 fe ff 55 8b 46 0c c3"), (JitFrameLayout{8, 8, 16}));
}

TEST(HotSpotFramesTest, CodeOfOtherShapesHasNoLayout) {
  // A frame pointer kept (native wrappers, -XX:+PreserveFramePointer): walked by it.
  EXPECT_FALSE(Decode("89 84 24 00 c0 fe ff 55 48 8b ec 48 83 ec 20"));
  EXPECT_FALSE(Decode("89 84 24 00 c0 fe ff 55 48 89 e5 48 83 ec 20"));
  // push rbp without HotSpot's stack bang before it.
  EXPECT_FALSE(Decode("90 90 90 90 90 90 90 55 48 83 ec 20"));
  // A bang with a positive displacement is no stack bang.
  EXPECT_FALSE(Decode("89 84 24 00 10 00 00 55 48 83 ec 20"));
  // An rbp store that does not match the allocation.
  EXPECT_FALSE(Decode("48 81 ec 38 00 00 00 48 89 6c 24 20"));
  EXPECT_FALSE(Decode("48 83 ec 18 48 89 6c 24 08"));
  // Cut short, odd or absurd sizes.
  EXPECT_FALSE(Decode("89 84 24 00 c0 fe"));
  EXPECT_FALSE(Decode("89 84 24 00 c0 fe ff 55 48 83 ec 21"));
  EXPECT_FALSE(Decode("89 84 24 00 c0 fe ff 55 48 83 ec f0"));
  EXPECT_FALSE(Decode("89 84 24 00 c0 fe ff 55 48 81 ec 00 00 00 40"));
  EXPECT_FALSE(Decode(""));
}

TEST(HotSpotFramesTest, OnlyCompiledMethodsAreDecoded) {
  EXPECT_TRUE(IsCompiledMethodName("long Spin.hotLoop(long)"));
  EXPECT_TRUE(IsCompiledMethodName("void java.util.DualPivotQuicksort.sort("
                                   "java.util.DualPivotQuicksort$Sorter, int[], int, int, int)"));
  EXPECT_TRUE(IsCompiledMethodName("java.lang.String[] java.util.regex.Pattern.split("
                                   "java.lang.CharSequence, int)"));
  EXPECT_TRUE(IsCompiledMethodName("void Service.lambda$main$0(long)"));
  EXPECT_FALSE(IsCompiledMethodName("StubRoutines (2)"));
  EXPECT_FALSE(IsCompiledMethodName("Interpreter"));
  EXPECT_FALSE(IsCompiledMethodName("I2C/C2I adapters"));
  EXPECT_FALSE(IsCompiledMethodName("new_instance Runtime1 stub"));
  EXPECT_FALSE(IsCompiledMethodName("JS:*strataFirst /app/a.js:1:1"));
  EXPECT_FALSE(IsCompiledMethodName("(long)"));
}

// The layout read from a process's memory: this test's own copy of a method's first bytes.
TEST(HotSpotFramesTest, LayoutIsReadFromTheProcess) {
  const std::vector<uint8_t> code = Bytes("89 84 24 00 c0 fe ff 55 48 83 ec 40 90 90");
  HotSpotFrames frames(std::make_unique<python::RemoteMemory>(getpid()));
  const uint64_t start = reinterpret_cast<uint64_t>(code.data());
  EXPECT_EQ(frames.Layout(start, code.size(), "long Spin.hotLoop(long)"),
            (JitFrameLayout{8, 12, 0x50}));
  EXPECT_FALSE(frames.Layout(start, code.size(), "StubRoutines (1)"));
  EXPECT_FALSE(frames.Layout(0x10, 64, "long Spin.hotLoop(long)"));  // unmapped
}

}  // namespace
}  // namespace strata::agent::jvm
